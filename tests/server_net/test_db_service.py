"""A db-engine bookie in process: its admin endpoints (info, entry location compaction), GC runs, over one
ledger directory and two; compaction of its entry logs with the locations moved in RocksDB (suspended,
resumed, reported), and Debian's `ldb` reading the locations db afterwards."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bkctl.protocol import db_format as dbf
from bkctl.protocol import wire
from bkctl.server.gc import GarbageCollector
from tests.server.test_db_storage import ldb_logs_named
from tests.server_net.live import in_thread, metadata_uri, start_bookie, twisted_test
from tests.server_net.test_gc import (
    GC_FLAGS,
    PART,
    _metrics,
    _read_parts,
    _write_part,
    entry_logs,
    gc_run,
    http,
    layout_call,
    read_all,
    restart_and_read,
    write,
)
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
    for given in ([dirs[0]], dirs[::-1]):  # the cookie lists both, in this order
        code, _, _, refused = invoke("bookie", "convert", "--to", "interleaved", *_dir_args(given))
        assert code == 2 and "give every one, in that order" in str(refused)


def _dir_args(dirs: list[Path]) -> list[str]:
    return [arg for d in dirs for arg in ("-l", str(d))]


def _scrape(service: Any) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{service.http_port}/metrics", timeout=30) as answer:
        return str(answer.read().decode())


@twisted_test
async def test_compaction_moves_locations_in_rocksdb(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    await in_thread(layout_call, uri, "create", [1, 2, 3, 4])
    flags = {**GC_FLAGS, "ledgerStorageClass": dbf.STORAGE_CLASS, "entryLocationCompactionInterval": "3600"}
    service = await start_bookie(tmp_path, uri=uri, **flags)
    current = tmp_path / "b1" / "ledgers" / "current"
    try:
        assert service.storage is not None
        for part in range(3):  # every log holds some of each ledger: deleting 1 and 3 leaves ~half live
            await in_thread(_write_part, service, [1, 2, 3, 4], part)
            await service.storage.checkpoint()
        await in_thread(layout_call, uri, "delete", [1, 3])
        assert (await gc_run(service))["ledgers_deleted"] == [1, 3]
        suspend = {"suspendMajor": True, "suspendMinor": True}
        await in_thread(http, service, "PUT", "/api/v1/bookie/gc/suspend_compaction", suspend)
        held = await gc_run(service, force_major=True)
        assert held["compaction"] is None and held["entry_logs_compacted"] == [], held
        resume = {"resumeMajor": True, "resumeMinor": True}
        await in_thread(http, service, "PUT", "/api/v1/bookie/gc/resume_compaction", resume)
        report = await in_thread(http, service, "PUT", "/api/v1/bookie/gc?wait=true", {"forceMajor": True})
        assert report["compaction"] == "major" and report["entry_logs_compacted"], report
        assert report["errors"] == [] and report["entries_moved"] > 0, report
        compacted = set(report["entry_logs_compacted"])
        assert not {f"{i:x}.log" for i in compacted} & {p.name for p in entry_logs(service)}
        assert not list(current.glob("*.compacting"))
        [details] = await in_thread(http, service, "GET", "/api/v1/bookie/gc_details")
        assert details["majorCompactionCounter"] == 1 and details["totals"]["entries_moved"] > 0
        metrics = await in_thread(_metrics, service)
        assert "bookie_gc_MAJOR_COMPACTION_COUNT 1" in metrics
        assert "bkctl_bookie_gc_entry_location_compactions 0" in metrics  # not due within the hour
        assert isinstance(service.gc, GarbageCollector)
        service.gc.last_entry_location -= 7200  # the interval and its random part (< 1 h) have passed
        await gc_run(service)
        [details] = await in_thread(http, service, "GET", "/api/v1/bookie/gc_details")
        assert details["entryLocationCompactionCounter"] == 1, details
        assert "bkctl_bookie_gc_entry_location_compactions 1" in await in_thread(_metrics, service)
        for ledger_id in (2, 4):
            await in_thread(_read_parts, service, ledger_id)
    finally:
        await service.stop()
    # RocksDB 7.8 (Java's generation) reads the locations after compaction; none names a removed log.
    named, count = ldb_logs_named(current)
    assert named <= {int(p.stem, 16) for p in current.glob("*.log")}
    assert not named & compacted and count == 2 * 3 * PART
    await restart_and_read(tmp_path, uri, flags, [2, 4])
