"""A db-engine bookie in process: its admin endpoints (info, entry location compaction), GC runs, over one
ledger directory and two."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bkctl.protocol import db_format as dbf
from bkctl.protocol import wire
from tests.server_net.live import in_thread, metadata_uri, start_bookie, twisted_test
from tests.server_net.test_gc import GC_FLAGS, gc_run, http, layout_call, read_all, write
from tests.server_net.test_java_metrics import check_names
from tests.server_net.test_service import client
from tests.test_inspect import invoke


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


@twisted_test
async def test_two_ledger_dirs_gc_each_and_answer_as_one(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    await in_thread(layout_call, uri, "create", [1, 2, 3, 4])
    dirs = [tmp_path / "b1" / "ledgers", tmp_path / "b1" / "ledgers1"]
    flags = {**GC_FLAGS, "ledgerDirectories": ",".join(map(str, dirs))}
    service = await start_bookie(tmp_path, uri=uri, ledgerStorageClass=dbf.STORAGE_CLASS, **flags)
    try:
        assert service.storage is not None and service.storage.store_count == 2
        await in_thread(write, service, [1, 2])  # ledger 1 in ledgers1/, ledger 2 in ledgers/
        await service.storage.checkpoint()
        await in_thread(write, service, [3, 4])
        await service.storage.checkpoint()
        before = {d: sorted((d / "current").glob("*.log")) for d in dirs}
        assert all(len(logs) > 2 for logs in before.values())
        await in_thread(layout_call, uri, "delete", [1, 2])
        report = await gc_run(service)
        assert report["ledgers_deleted"] == [1, 2] and report["errors"] == []
        after = {d: sorted((d / "current").glob("*.log")) for d in dirs}
        assert all(len(after[d]) < len(before[d]) for d in dirs), (before, after)
        for ledger_id in (3, 4):
            await in_thread(read_all, service, ledger_id)
        details = await in_thread(http, service, "GET", "/api/v1/bookie/gc_details")
        assert details[0]["totals"]["ledgers_deleted"] == 2 and details[0]["ledger_dirs"] == 2
        info = await in_thread(http, service, "GET", "/api/v1/bookie/info")
        assert info["ledger_dirs"] == [str(d) for d in dirs] and len(info["entry_log_ids"]) == 2
        compacting = await in_thread(http, service, "GET", "/api/v1/bookie/entry_location_compact")
        assert compacting == {str(d): False for d in dirs}
        text = await in_thread(_scrape, service)
        check_names(text)  # Java's names and types
        hits = int(re.findall(r'^bookie_read_cache_hits_count\{success="true"\} (\d+)$', text, re.M)[0])
        misses = int(re.findall(r'^bookie_read_cache_misses_count\{success="true"\} (\d+)$', text, re.M)[0])
        assert hits > 2500 and 0 < misses < 100  # 2 x 1500 entries read, 100 at a time read ahead
    finally:
        await service.stop()
    code, _, _, refused = invoke("bookie", "convert", "--to", "interleaved", "-l", str(dirs[0]))
    assert code == 2 and "2 ledger dirs" in str(refused)  # the cookie lists both


def _scrape(service: Any) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{service.http_port}/metrics", timeout=30) as answer:
        return str(answer.read().decode())
