"""Garbage collection and compaction on in-process bookies over an SQLite metadata store: deleted ledgers
reclaimed (index files and entry logs), live ledgers byte-identical after compaction, nothing deleted
while the metadata store cannot be read, a ledger re-created with the same id, the admin endpoints."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from bkctl.model import DigestType, LedgerMetadata, Segment
from bkctl.protocol import wire
from bkctl.server.service import BookieService
from tests.server_net.live import in_thread, metadata_uri, start_bookie, twisted_test
from tests.server_net.wire_client import WireClient, package

EOK = wire.ReturnCode.EOK
ENTRY = 1024
PER_LEDGER = 1500  # ~1.5 MB per ledger: with 1 MiB entry logs, several logs per run
# Bookies with small entry logs, GC on demand only (a periodic run must not race the test's steps).
GC_FLAGS = {
    "logSizeLimit": str(1024 * 1024),
    "gcWaitTime": "0",
    "httpServerPort": "0",
    "bookieId": "gc-bookie",
}


def metadata(ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata(
        ensemble_size=1,
        write_quorum=1,
        ack_quorum=1,
        segments=(Segment(0, ("127.0.0.1:3181",)),),
        digest=DigestType.CRC32,
        password=b"pw",
    )


def layout_call(uri: str, action: str, ledger_ids: list[int]) -> None:
    with SqliteStore(Path(uri.removeprefix("sqlite://"))) as store:
        layout = Layout(store)
        for ledger_id in ledger_ids:
            if action == "create":
                layout.create_ledger(metadata(ledger_id), ledger_id=ledger_id)
            else:
                layout.delete_ledger(ledger_id)


def payload(ledger_id: int, entry_id: int) -> bytes:
    seed = f"L{ledger_id}E{entry_id}-".encode()
    return (seed * (ENTRY // len(seed) + 1))[:ENTRY]


def write(service: BookieService, ledger_ids: list[int], count: int = PER_LEDGER) -> None:
    with WireClient("127.0.0.1", service.port) as c:
        for ledger_id in ledger_ids:
            got = c.add_many(ledger_id, [payload(ledger_id, e) for e in range(count)])
            assert all(r.rc == EOK for r in got)


def read_all(service: BookieService, ledger_id: int, count: int = PER_LEDGER) -> None:
    with WireClient("127.0.0.1", service.port) as c:
        for entry_id in range(count):
            r = c.read(ledger_id, entry_id)
            assert (r.rc, r.entry) == (EOK, package(ledger_id, entry_id, payload(ledger_id, entry_id))), (
                ledger_id,
                entry_id,
            )


def entry_logs(service: BookieService) -> list[Path]:
    return sorted((service.config.ledger_dirs[0] / "current").glob("*.log"))


def index_files(service: BookieService) -> list[Path]:
    return sorted((service.config.ledger_dirs[0] / "current").glob("*/*/*.idx"))


def http(service: BookieService, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{service.http_port}{path}", data=data, method=method)
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


async def gc_run(service: BookieService, **force: bool) -> dict[str, Any]:
    assert service.gc is not None
    return await service.gc.trigger(**force)


async def checkpoint(service: BookieService) -> None:
    assert service.storage is not None
    await service.storage.checkpoint()


@twisted_test
async def test_deleted_ledgers_are_reclaimed_and_live_ones_stay(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    await in_thread(layout_call, uri, "create", [1, 2, 3])
    service = await start_bookie(tmp_path, uri=uri, **GC_FLAGS)
    try:
        await in_thread(write, service, [1, 2])  # ledgers 1 and 2 fill the first logs together
        await checkpoint(service)
        await in_thread(write, service, [3])
        await checkpoint(service)
        logs_before = entry_logs(service)
        nothing = await gc_run(service)
        assert nothing["ledgers_deleted"] == [] and nothing["entry_logs_removed"] == []
        await in_thread(layout_call, uri, "delete", [1, 2])
        report = await gc_run(service)
        assert report["ledgers_deleted"] == [1, 2]
        assert report["entry_logs_removed"], report
        assert report["bytes_reclaimed"] > 2 * 1024 * 1024
        assert {p.name for p in index_files(service)} == {"3.idx"}
        assert len(entry_logs(service)) < len(logs_before)
        await in_thread(read_all, service, 3)

        def gone() -> None:
            with WireClient("127.0.0.1", service.port) as c:
                assert c.read(1, 0).rc == wire.ReturnCode.ENOLEDGER

        await in_thread(gone)
        details = await in_thread(http, service, "GET", "/api/v1/bookie/gc_details")
        assert details[0]["totals"]["ledgers_deleted"] == 2
        assert await in_thread(http, service, "GET", "/api/v1/bookie/gc") == {"is_in_force_gc": "false"}
        files = await in_thread(http, service, "GET", "/api/v1/bookie/list_disk_file")
        assert set(files) == {"journal files", "entrylog files", "index files"}
        assert files["index files"] == "3.idx\t"
        assert sorted(files["entrylog files"].split()) == sorted(p.name for p in entry_logs(service))
        assert files["journal files"].endswith(".txn\t")
        logs_only = await in_thread(http, service, "GET", "/api/v1/bookie/list_disk_file?file_type=entrylog")
        assert list(logs_only) == ["entrylog files"]
        assert "bkctl_bookie_gc_bytes_reclaimed_total" in await in_thread(_metrics, service)
    finally:
        await service.stop()


def _metrics(service: BookieService) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{service.http_port}/metrics", timeout=30) as answer:
        return str(answer.read().decode())


class ListingMisses(Layout):
    """A listing that misses ledger 8 (as a walk racing a concurrent change could): a direct read finds it."""

    def ledger_ids(self, on_problem: Any = None) -> Any:
        return (ledger_id for ledger_id in super().ledger_ids() if ledger_id != 8)


@twisted_test
async def test_gc_deletes_nothing_on_doubt(tmp_path: Path) -> None:
    """A ledger the listing misses but a direct read finds is kept; a ledger never created in metadata
    (written over the raw protocol) is deleted, as Java does; an unreadable metadata store deletes nothing."""
    uri = metadata_uri(tmp_path)
    await in_thread(layout_call, uri, "create", [8])
    service = await start_bookie(tmp_path, uri=uri, **GC_FLAGS)
    try:
        await in_thread(write, service, [7, 8], 10)
        await checkpoint(service)
        assert service.layout is not None and service.gc is not None
        service.gc.layout = ListingMisses(service.layout.store)
        report = await gc_run(service)
        assert report["ledgers_deleted"] == [7], report
        assert [p.name for p in index_files(service)] == ["8.idx"]
        await in_thread(read_all, service, 8, 10)
        await in_thread(write, service, [9], 10)
        await checkpoint(service)
        service.layout.store.close()  # the bookie's metadata session is gone: the listing fails
        report = await gc_run(service)
        assert report["ledgers_deleted"] == [] and report["errors"], report
        assert [p.name for p in index_files(service)] == ["8.idx", "9.idx"]
    finally:
        await service.stop()


class AddsDuringListing(Layout):
    """While the metadata listing runs, ledger 12 gets its first adds (its metadata is not even there:
    the worst case); the bookie's own list was taken before, so the run must keep it."""

    port = 0

    def ledger_ids(self, on_problem: Any = None) -> Any:
        with WireClient("127.0.0.1", self.port) as c:
            assert all(r.rc == EOK for r in c.add_many(12, [b"late"] * 3))
        return super().ledger_ids()


@twisted_test
async def test_a_ledger_newer_than_the_bookies_list_is_kept(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    service = await start_bookie(tmp_path, uri=uri, **GC_FLAGS)
    try:
        assert service.layout is not None and service.gc is not None
        listing = AddsDuringListing(service.layout.store)
        listing.port = service.port
        service.gc.layout = listing
        report = await gc_run(service)
        assert report["ledgers_deleted"] == [] and not report["errors"], report

        def still_there() -> None:
            with WireClient("127.0.0.1", service.port) as c:
                assert c.read(12, 2).entry == package(12, 2, b"late")

        await in_thread(still_there)
        service.gc.layout = service.layout
        assert (await gc_run(service))["ledgers_deleted"] == [12]  # the next run: never in metadata
    finally:
        await service.stop()


@twisted_test
async def test_compaction_copies_live_entries_and_removes_old_logs(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    await in_thread(layout_call, uri, "create", [1, 2, 3, 4])
    service = await start_bookie(tmp_path, uri=uri, **GC_FLAGS)
    try:
        # Interleaved ledgers: every log holds some of each, so deleting 1 and 3 leaves ~half live.
        for part in range(3):
            with_part = [1, 2, 3, 4]
            await in_thread(_write_part, service, with_part, part)
            await checkpoint(service)
        await in_thread(layout_call, uri, "delete", [1, 3])
        gc_only = await gc_run(service)
        assert gc_only["ledgers_deleted"] == [1, 3] and gc_only["entry_logs_compacted"] == []
        before = {p.name for p in entry_logs(service)}
        report = await in_thread(http, service, "PUT", "/api/v1/bookie/gc?wait=true", {"forceMajor": True})
        assert report["compaction"] == "major" and report["entry_logs_compacted"], report
        assert report["entries_moved"] > 0
        after = {p.name for p in entry_logs(service)}
        assert not {f"{i:x}.log" for i in report["entry_logs_compacted"]} & after
        assert not list((service.config.ledger_dirs[0] / "current").glob("*.compacting"))
        assert before != after
        for ledger_id in (2, 4):
            await in_thread(_read_parts, service, ledger_id)
    finally:
        await service.stop()
    # Restart: replay and the moved index slots still serve every live entry.
    await restart_and_read(tmp_path, uri, GC_FLAGS, [2, 4])


async def restart_and_read(tmp_path: Path, uri: str, flags: dict[str, str], ledger_ids: list[int]) -> None:
    """A bookie started again on the same directories serves every entry of these ledgers' parts."""
    service = await start_bookie(tmp_path, uri=uri, **flags)
    try:
        for ledger_id in ledger_ids:
            await in_thread(_read_parts, service, ledger_id)
    finally:
        await service.stop()


PART = 500


def _write_part(service: BookieService, ledger_ids: list[int], part: int) -> None:
    with WireClient("127.0.0.1", service.port) as c:
        for ledger_id in ledger_ids:
            first = part * PART
            payloads = [payload(ledger_id, e) for e in range(first, first + PART)]
            assert all(r.rc == EOK for r in c.add_many(ledger_id, payloads, first=first))


def _read_parts(service: BookieService, ledger_id: int) -> None:
    read_all(service, ledger_id, 3 * PART)


@twisted_test
async def test_ledger_recreated_with_the_same_id_after_gc(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    await in_thread(layout_call, uri, "create", [5])
    service = await start_bookie(tmp_path, uri=uri, **GC_FLAGS)
    try:
        await in_thread(write, service, [5], 20)
        await checkpoint(service)
        await in_thread(layout_call, uri, "delete", [5])
        assert (await gc_run(service))["ledgers_deleted"] == [5]
        await in_thread(layout_call, uri, "create", [5])

        def rewrite() -> None:
            with WireClient("127.0.0.1", service.port) as c:
                assert c.read(5, 0).rc == wire.ReturnCode.ENOLEDGER
                other = [b"new-" + bytes([i]) * 100 for i in range(5)]
                assert all(r.rc == EOK for r in c.add_many(5, other))
                for i in range(5):
                    assert c.read(5, i).entry == package(5, i, other[i])
                assert c.read(5, 5).rc == wire.ReturnCode.ENOENTRY  # the old entries 5..19 are gone

        await in_thread(rewrite)
        await checkpoint(service)
        assert (await gc_run(service))["ledgers_deleted"] == []
        await in_thread(rewrite_check, service)
    finally:
        await service.stop()


def rewrite_check(service: BookieService) -> None:
    with WireClient("127.0.0.1", service.port) as c:
        assert c.read(5, 4).rc == EOK
        assert c.read(5, 5).rc == wire.ReturnCode.ENOENTRY


def test_gc_wait_time_zero_means_on_demand_only() -> None:
    from bkctl.server.config import load_config

    assert load_config({"gcWaitTime": "0"}).gc_wait_ms == 0
    assert load_config({}).gc_wait_ms == 600_000
    # compactionRateByEntries wins over the older compactionRate, in any order (as Java's getter).
    both = {"compactionRateByEntries": "5", "compactionRate": "7"}
    assert load_config(both).compaction_rate_by_entries == 5
    assert load_config({"compactionRate": "7"}).compaction_rate_by_entries == 7
    assert load_config({}).compaction_rate_by_entries == 100_000
    assert os.environ.get("BKCTL_FAULT_POINT") is None


@twisted_test
async def test_bkctl_bookie_gc_command(tmp_path: Path) -> None:
    """`bkctl bookie gc`: by --http or by the bookie id's registration; --wait shows the report."""
    from tests.server_net.test_commands import bkctl

    uri = metadata_uri(tmp_path)
    service = await start_bookie(tmp_path, uri=uri, **GC_FLAGS)
    try:
        await in_thread(write, service, [6], 10)
        await checkpoint(service)
        endpoint = f"127.0.0.1:{service.http_port}"
        waited = await in_thread(bkctl, "bookie", "gc", "--http", endpoint, "--major", "--wait", "-o", "json")
        assert waited.returncode == 0, waited.stderr
        assert json.loads(waited.stdout)["ledgers_deleted"] == [6]  # never created in metadata
        by_id = await in_thread(
            bkctl, "bookie", "gc", "gc-bookie", "--metadata", uri, "--wait", "-o", "plain"
        )
        assert by_id.returncode == 0, by_id.stderr
        assert "ledgers_deleted\t-" in by_id.stdout
        trigger = await in_thread(bkctl, "bookie", "gc", "--http", endpoint)
        assert trigger.returncode == 0 and "Triggered GC" in trigger.stderr
        both = await in_thread(bkctl, "bookie", "gc", "--http", endpoint, "--major", "--minor")
        assert both.returncode == 2 and "at most one" in both.stderr
        unknown = await in_thread(bkctl, "bookie", "gc", "nobody", "--metadata", uri)
        assert unknown.returncode == 4 and "not registered" in unknown.stderr
        down = await in_thread(bkctl, "bookie", "gc", "--http", "127.0.0.1:1")
        assert down.returncode == 6, down.stderr
    finally:
        await service.stop()


@twisted_test
async def test_gc_and_compaction_on_a_java_bookies_directories(tmp_path: Path) -> None:
    """Java 4.14.8 bookie1's entry log (no ledgers map: scanned) holds ledgers 0-3; with only ledger 3 in
    the metadata store, a forced minor compaction deletes 0-2, copies ledger 3 (15% live) out of 0.log
    and removes it; ledger 3 is served byte for byte before and after, also after a restart, and the
    files stay readable by the inspect readers."""
    from tests.server_net.test_java_bookie import BOOKIE1, JAVA_INSTANCE_ID, copy_bookie1, update_cookies

    uri = metadata_uri(tmp_path, instance_id=JAVA_INSTANCE_ID)
    base = copy_bookie1(tmp_path)
    await in_thread(update_cookies, base, uri)
    await in_thread(layout_call, uri, "create", [3])
    flags = {**GC_FLAGS, "bookieId": BOOKIE1}
    service = await start_bookie(tmp_path, uri=uri, **flags)
    try:
        before = await in_thread(_java_ledger_3, service)
        assert sum(1 for rc, _ in before if rc == EOK) == 134
        report = await gc_run(service, force_minor=True)
        assert report["ledgers_deleted"] == [0, 1, 2], report
        assert 0 in report["entry_logs_compacted"] and not report["errors"], report
        assert not (base / "ledgers" / "current" / "0.log").exists()
        assert await in_thread(_java_ledger_3, service) == before
    finally:
        await service.stop()
    _assert_logs_and_index_readable(base / "ledgers" / "current", 3)
    service = await start_bookie(tmp_path, uri=uri, **flags)
    try:
        assert await in_thread(_java_ledger_3, service) == before
    finally:
        await service.stop()


def _java_ledger_3(service: BookieService) -> list[tuple[int, bytes]]:
    with WireClient("127.0.0.1", service.port) as c:
        c.send_payloads([wire.encode_read_request(3, e) for e in range(200)])
        return [(r.rc, r.entry) for r in c.receive(200) if isinstance(r, wire.ReadResponse)]


def _assert_logs_and_index_readable(current: Path, ledger_id: int) -> None:
    """Every entry log scans to its end with the inspect readers, and the ledger's index names only
    records of logs that exist, holding that ledger's entries."""
    from bkctl.files.entrylog import entry_log_records, open_entry_log
    from bkctl.files.index import index_entries, open_index
    from bkctl.protocol import entrylog_format as ef

    records = {}
    for path in current.glob("*.log"):
        scan = entry_log_records(open_entry_log(path))
        log_id = ef.parse_log_file_name(path.name)
        assert log_id is not None
        for offset, kind, body in scan:
            if kind is ef.RecordKind.DATA:
                records[ef.entry_location(log_id, offset + 4)] = ef.record_key(body)
        assert scan.stop is not None and not scan.stop.is_error, (path, scan.stop)
    index = next(current.glob(f"*/*/{ledger_id:x}.idx"))
    entries = list(index_entries(open_index(index)))
    assert len(entries) == 134
    for entry_id, log_id, offset in entries:
        assert records[ef.entry_location(log_id, offset)] == (ledger_id, entry_id)
