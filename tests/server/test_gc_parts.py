"""The pure parts of garbage collection: candidates, compaction order, the rate limit, file removal; which
over-replicated ledgers a check may delete (on an SQLite store)."""

from __future__ import annotations

import os
import time
from array import array
from pathlib import Path
from typing import Any

import pytest

from bkctl.errors import UnavailableError
from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from bkctl.model import LedgerMetadata, LedgerState, Segment
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import index_format as ixf
from bkctl.server import fileio
from bkctl.server.db_ledger_index import DbLedgerIndex
from bkctl.server.gc import LogUsage, Throttle, collectable, compaction_order, log_usage, marker_path
from bkctl.server.gc_overreplicated import OverReplication
from bkctl.server.storage_kind import DB, INTERLEAVED


def test_collectable_is_what_the_listing_lacks() -> None:
    assert collectable([5, 1, 3, 3], {3, 4}) == [1, 5]
    assert collectable([], {1}) == []


def test_usage_counts_only_held_ledgers() -> None:
    usage = log_usage(7, Path("7.log"), {1: 100, 2: 300}, lambda ledger_id: ledger_id == 1)
    assert (usage.total, usage.live, usage.fraction) == (400, 100, 0.25)
    assert LogUsage(1, Path("1.log"), 0, 0).fraction == 0.0


def test_compaction_order_least_live_first_under_threshold() -> None:
    usages = [
        LogUsage(1, Path("1.log"), 100, 50),
        LogUsage(2, Path("2.log"), 100, 10),
        LogUsage(3, Path("3.log"), 100, 0),  # removed without copying, never compacted
        LogUsage(4, Path("4.log"), 100, 90),
    ]
    assert [u.log_id for u in compaction_order(usages, 0.8)] == [2, 1]
    assert [u.log_id for u in compaction_order(usages, 0.2)] == [2]
    assert compaction_order(usages, 0.0) == []


def test_throttle_waits_for_the_rate() -> None:
    now = [0.0]
    limit = Throttle(1000, clock=lambda: now[0])
    assert limit.delay(500) == 0.5
    now[0] = 2.0
    assert limit.delay(500) == 0.0
    assert Throttle(0).delay(10**9) == 0.0


def test_marker_is_beside_the_log() -> None:
    assert marker_path(Path("/d/current/1a.log")) == Path("/d/current/1a.log.compacting")


def _log_and_index(
    tmp_path: Path, gap: int, engine: str = INTERLEAVED
) -> tuple[Path, dict[int, Path], list[tuple[int, int, bytes]]]:
    """Entry log 5: ledger 1 entries 0-5 and ledger 2 entries 0-5 alternating, then `gap` zero bytes (a
    preallocated tail); index files (or the db engine's locations db) naming every ledger 1 entry and
    only ledger 2's even ones."""
    data = bytearray(ef.encode_header(ef.EntryLogHeader(ef.HEADER_V1)))
    records: list[tuple[int, int, bytes]] = []
    slots: dict[int, dict[int, int]] = {1: {}, 2: {}}
    for n in range(12):
        ledger_id, entry_id = 1 + n % 2, n // 2
        body = packaged_body(ledger_id, entry_id, n)
        slots[ledger_id][entry_id] = ef.entry_location(5, len(data) + 4)
        data += ef.encode_record_size(len(body)) + body
        records.append((ledger_id, entry_id, body))
    data += bytes(gap)
    log = tmp_path / "5.log"
    log.write_bytes(bytes(data))
    live = {1: slots[1], 2: {e: loc for e, loc in slots[2].items() if e % 2 == 0}}
    kept = [(lid, eid, body) for lid, eid, body in records if lid == 1 or eid % 2 == 0]
    if engine == DB:
        index = DbLedgerIndex(tmp_path / "current")
        index.open()
        for ledger_id, locations in live.items():
            index.write(ledger_id, ixf.IndexHeader(ixf.V1, b"key"), locations)
        index.commit()
        index.close()
        return log, {ledger_id: index.find(ledger_id) or Path() for ledger_id in live}, kept
    paths = {}
    for ledger_id, locations in live.items():
        paths[ledger_id] = tmp_path / f"{ledger_id}.idx"
        header = ixf.encode_header(ixf.IndexHeader(ixf.V1, b"key"))
        paths[ledger_id].write_bytes(header + ixf.encode_slots(locations))
    return log, paths, kept


def packaged_body(ledger_id: int, entry_id: int, n: int) -> bytes:
    import struct

    return struct.pack(">qq", ledger_id, entry_id) + bytes([n]) * (100 + 37 * n)


def _moved(batches: list[Any], log: Path | None = None) -> list[tuple[int, int, bytes]]:
    """(ledger, entry, body) of each record in log order; the scan's batches name their records by
    spans of `log`, the bookie side's hold them."""
    out = []
    for batch in batches:
        if batch.spans is not None:
            assert log is not None
            data = log.read_bytes()
            batch.records = bytearray(b"".join(data[at : at + length] for at, length in batch.spans))
        ordered = batch.in_log_order()
        for k in range(len(ordered)):
            end = ordered.starts[k + 1] if k + 1 < len(ordered) else len(ordered.records)
            body = bytes(ordered.records[ordered.starts[k] + 4 : end])
            out.append((ordered.ledgers[k], ordered.entries[k], body))
    return out


@pytest.mark.parametrize(("gap", "chunk"), [(0, 4 << 20), (0, 300), (7, 4 << 20), (4096, 250)])
def test_live_records_are_those_the_index_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gap: int, chunk: int
) -> None:
    """Small read chunks (records across chunks, one bigger than a chunk) and a zero tail find the same
    records, and only the live ones are looked at."""
    from bkctl.server import live_records

    monkeypatch.setattr(live_records, "READ_CHUNK", chunk)
    log, paths, kept = _log_and_index(tmp_path, gap)
    records = live_records.LiveRecords(5, log, paths)
    batches = []
    while (batch := records.next_batch(batch_bytes=500)) is not None:
        batches.append(batch)
    assert records.error is None
    assert _moved(batches, log) == kept
    assert records.scanned == records.copied == len(kept) == 9


def test_live_records_stop_at_corrupt_data(tmp_path: Path) -> None:
    from bkctl.server.live_records import LiveRecords

    log, paths, _ = _log_and_index(tmp_path, 0)
    data = bytearray(log.read_bytes())
    data[1024 + 4 + 16 + 100 : 1024 + 4 + 16 + 104] = (7).to_bytes(4, "big")  # second record: size 7
    data[1024 + 4 + 116 : 1024 + 8 + 116] = (7).to_bytes(4, "big")
    log.write_bytes(bytes(data))
    records = LiveRecords(5, log, paths)
    while records.next_batch(4096) is not None:
        pass
    assert records.error is not None and "shorter" in records.error


@pytest.mark.parametrize("engine", [INTERLEAVED, DB])
def test_scan_child_process_answers_as_the_in_process_scan(tmp_path: Path, engine: str) -> None:
    """The child process (`python -m bkctl.server.gc_scan`) gives the same records, then the error of a
    corrupt log, and serves several logs in turn. On the db engine it reads the locations db while the
    bookie (here: a DbLedgerIndex) holds it open for writing."""
    from bkctl.server.gc_scan import ScanChild

    log, paths, kept = _log_and_index(tmp_path, 4096, engine)
    primary = DbLedgerIndex(tmp_path / "current")
    if engine == DB:
        primary.open()
        # Ledger 2's entry 2 moved to log 6 by the bookie since: only in the WAL, and the scan sees it.
        old, new = (primary.location(2, 2)[0], ef.entry_location(6, 1024))
        moved = (array("q", [2]), old.to_bytes(8, "big"), new.to_bytes(8, "big"))
        assert primary.relocate(2, [moved]) == 1
        kept = [record for record in kept if record[:2] != (2, 2)]
    child = ScanChild()
    try:
        child.start(5, log, paths, 500, engine)
        batches = []
        while (batch := child.next_batch()) is not None:
            batches.append(batch)
        assert child.error is None and child.scanned == len(kept)  # the live records only
        assert sorted(_moved(batches)) == sorted(kept)  # grouped by ledger in each batch
        data = bytearray(log.read_bytes())
        data[1024 + 4 + 116 : 1024 + 8 + 116] = (7).to_bytes(4, "big")
        log.write_bytes(bytes(data))
        child.start(5, log, paths, 500, engine)
        while child.next_batch() is not None:
            pass
        assert child.error is not None and "shorter" in child.error
    finally:
        child.close()
        primary.close()


class UnreadableLedger(Layout):
    """Ledger 2's metadata cannot be read (a store that times out on it)."""

    def read_ledger(self, ledger_id: int) -> Any:
        if ledger_id == 2:
            raise UnavailableError("metadata store timed out")
        return super().read_ledger(ledger_id)


def test_over_replicated_candidates_are_kept_on_doubt(tmp_path: Path) -> None:
    def closed_on(*bookies: str) -> LedgerMetadata:
        return LedgerMetadata(1, 1, 1, (Segment(0, bookies),), state=LedgerState.CLOSED, last_entry_id=5)

    index = tmp_path / "old.idx"
    index.write_bytes(b"")
    os.utime(index, (time.time() - 3600, time.time() - 3600))
    with SqliteStore(tmp_path / "metadata.db") as store:
        layout = UnreadableLedger(store)
        layout.init_cluster()
        for ledger_id, bookie in (
            (1, "other:1"),
            (2, "other:1"),
            (3, "me:1"),
            (4, "other:1"),
            (5, "other:1"),
        ):
            layout.create_ledger(closed_on(bookie), ledger_id=ledger_id)
        assert layout.acquire_replication_lock(4, "a-worker")  # being replicated
        over = OverReplication(layout, "me:1", wait_ms=60_000)
        assert not over.due()  # one wait after the start
        held = [(1, index), (2, index), (3, index), (4, index), (5, tmp_path / "fresh.idx"), (6, index)]
        # 2: unreadable; 3: names this bookie; 4: locked; 5: no index file (entries only in memory); 6: gone
        assert over.locked_candidates(held) == [1]
        assert layout.lock_holder(1) == "me:1"  # held while the caller deletes
        over.release([1])
        assert layout.lock_holder(1) is None and layout.lock_holder(4) == "a-worker"


def test_remove_gradually_frees_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "7.log"
    size = 3 * fileio.REMOVE_STEP + 12_345  # cut in steps, then a remainder
    path.write_bytes(b"x" * size)
    assert fileio.remove_gradually(path) == size
    assert not path.exists()
    with pytest.raises(FileNotFoundError):
        fileio.remove_gradually(path)


def test_write_out_leaves_the_bytes_as_written(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    data = bytes(range(256)) * (fileio.WRITE_OUT_STEP // 128 + 3)  # more than two steps
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, data)
        fileio.write_out(fd, 100, len(data))  # from a mid-page offset, as after a flush
        fileio.write_out(fd, len(data), len(data))  # nothing to do
        assert os.pread(fd, len(data) + 1, 0) == data
    finally:
        os.close(fd)


def _drain(records: Any) -> list[Any]:
    batches = []
    while (batch := records.next_batch(batch_bytes=500)) is not None:
        batches.append(batch)
    return batches


def test_only_the_live_runs_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of live records far apart: the dead records between them are never looked at (a log 20%
    live costs 20% of its reads), and what is copied is the same."""
    from bkctl.server import live_records

    monkeypatch.setattr(live_records, "RUN_GAP", 0)  # every live record its own run: each dead one is skipped
    log, paths, kept = _log_and_index(tmp_path, 0)
    records = live_records.LiveRecords(5, log, paths)
    assert _moved(_drain(records), log) == kept
    assert records.error is None and records.scanned == len(kept) == records.copied == 9


def test_a_slot_naming_no_record_keeps_the_log(tmp_path: Path) -> None:
    """An index slot pointing into the middle of a record (a damaged index file): the walk goes back to
    every record from before it, and since that record is never found the log must not be removed."""
    from bkctl.protocol import entrylog_format as ef
    from bkctl.protocol import index_format as ixf
    from bkctl.server.live_records import LiveRecords

    log, paths, kept = _log_and_index(tmp_path, 0)
    index = bytearray(paths[2].read_bytes())
    slot = ixf.slot_offset(4)  # ledger 2 entry 4, live: now names an offset inside another record
    index[slot : slot + 8] = ef.entry_location(5, 2000).to_bytes(8, "big")
    paths[2].write_bytes(bytes(index))
    records = LiveRecords(5, log, paths)
    moved = _moved(_drain(records), log)
    assert records.error is not None and "1 of the 9 records" in records.error
    assert moved == [k for k in kept if k[:2] != (2, 4)]


def test_a_slot_naming_past_the_end_of_the_log_keeps_it(tmp_path: Path) -> None:
    """A slot naming an offset past the log's end (a damaged index file): the records that are there are
    copied, and the one that cannot be keeps the log."""
    from bkctl.protocol import entrylog_format as ef
    from bkctl.protocol import index_format as ixf
    from bkctl.server.live_records import LiveRecords

    log, paths, kept = _log_and_index(tmp_path, 0)
    index = bytearray(paths[1].read_bytes())
    slot = ixf.slot_offset(5)  # ledger 1's last entry, live: now past the end of the log
    index[slot : slot + 8] = ef.entry_location(5, log.stat().st_size + 100).to_bytes(8, "big")
    paths[1].write_bytes(bytes(index))
    records = LiveRecords(5, log, paths)
    moved = _moved(_drain(records), log)
    assert records.error is not None and "1 of the 9 records" in records.error
    assert moved == [k for k in kept if k[:2] != (1, 5)]


def test_scan_child_reports_a_locations_db_it_cannot_open_and_serves_on(tmp_path: Path) -> None:
    """A db request whose locations db is missing gets an error (the log is then kept), and the same
    child serves the next request."""
    from bkctl.server.gc_scan import ScanChild

    log, paths, kept = _log_and_index(tmp_path, 0)
    child = ScanChild()
    try:
        child.start(5, log, {1: tmp_path / "elsewhere" / "current" / "ledgers"}, 500, DB)
        assert child.next_batch() is None
        assert child.error is not None and "no RocksDB database" in child.error
        child.start(5, log, paths, 500)
        batches = []
        while (batch := child.next_batch()) is not None:
            batches.append(batch)
        assert child.error is None and sorted(_moved(batches)) == sorted(kept)
    finally:
        child.close()
