"""A db-engine bookie in process: its admin endpoints (info, entry location compaction), a GC run."""

from __future__ import annotations

import urllib.error
from pathlib import Path

import pytest

from bkctl.protocol import db_format as dbf
from bkctl.protocol import wire
from tests.server_net.live import in_thread, start_bookie, twisted_test
from tests.server_net.test_gc import gc_run, http
from tests.server_net.test_service import client


@twisted_test
async def test_entry_location_compaction_endpoint_and_gc(tmp_path: Path) -> None:
    service = await start_bookie(
        tmp_path, httpServerPort="0", httpServerEnabled="true", ledgerStorageClass=dbf.STORAGE_CLASS
    )
    plain = await start_bookie(tmp_path, "b2", httpServerPort="0", httpServerEnabled="true")
    try:
        assert service.storage is not None

        def scenario() -> None:
            with client(service) as c:
                assert [r.rc for r in c.add_many(5, [b"x" * 100] * 50)] == [wire.ReturnCode.EOK] * 50
            assert http(service, "GET", "/api/v1/bookie/info")["storage"] == "db"
            path = "/api/v1/bookie/entry_location_compact"
            assert http(service, "PUT", path + "?wait=true", {"entryLocationRocksDBCompact": True}) == {
                "compacted": True
            }
            assert http(service, "GET", path) == {str(tmp_path / "b1" / "ledgers"): False}
            for bookie, body in ((service, {"x": 1}), (plain, {"entryLocationRocksDBCompact": True})):
                with pytest.raises(urllib.error.HTTPError) as refused:
                    http(bookie, "PUT", path, body)
                assert refused.value.code == 400

        await service.storage.checkpoint()
        await in_thread(scenario)
        report = await gc_run(service, force_major=True)
        assert report["errors"] == [] and report["entry_logs_compacted"] == []
    finally:
        await service.stop()
        await plain.stop()
