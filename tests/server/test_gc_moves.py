"""Compaction's write side: batches written grouped (one pwrite, slots by runs) or record range by range
across rotations, and index slots moved by runs only where they still hold the old location."""

from __future__ import annotations

import os
import struct
from array import array
from pathlib import Path

import pytest

from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import index_format as ixf
from bkctl.server.db_ledger_index import DbLedgerIndex
from bkctl.server.entrylog import EntryLogWriter
from bkctl.server.index import IndexStore
from bkctl.server.ledger_storage import LedgerIndex
from bkctl.server.moves import Moved, write_moves
from bkctl.server.storage_kind import DB, INTERLEAVED


def be(values: list[int]) -> bytes:
    return struct.pack(f">{len(values)}q", *values)


def store_with(
    tmp_path: Path, ledger_id: int, slots: dict[int, int], engine: str = INTERLEAVED
) -> LedgerIndex:
    """Either engine's index holding one ledger's slots (the db one committed, as by a checkpoint)."""
    store: LedgerIndex = IndexStore((tmp_path,), 16) if engine == INTERLEAVED else DbLedgerIndex(tmp_path)
    store.open()
    store.write(ledger_id, ixf.IndexHeader(ixf.V1, b"key"), slots)
    store.commit()
    return store


def slots_of(store: LedgerIndex, ledger_id: int, entry_ids: range) -> list[int]:
    return [store.location(ledger_id, e)[0] for e in entry_ids]


@pytest.mark.parametrize("engine", [INTERLEAVED, DB])
def test_relocate_moves_runs_and_keeps_rewritten_slots(tmp_path: Path, engine: str) -> None:
    old = {e: (1 << 32) + 1000 + 10 * e for e in range(3000)}  # spans three pages
    rewritten = {1500: (9 << 32) + 4}  # entry 1500 written again since the scan
    store = store_with(tmp_path, 7, {**old, **rewritten}, engine)
    entries = array("q", range(3000))
    news = [(2 << 32) + 2000 + 10 * e for e in range(3000)]
    changed = store.relocate(7, [(entries, be([old[e] for e in range(3000)]), be(news))])
    assert changed == 2999
    got = slots_of(store, 7, range(3000))
    assert got[:1500] == news[:1500] and got[1501:] == news[1501:]
    assert got[1500] == (9 << 32) + 4
    store.forget_pages()  # what is on disk, not only in the page cache
    assert slots_of(store, 7, range(3000))[:3] == news[:3]
    again = [(4 << 32) + e for e in range(1500)]  # a run of consecutive entries, all still in place
    assert store.relocate(7, [(array("q", range(1500)), be(news[:1500]), be(again))]) == 1500
    assert slots_of(store, 7, range(1501)) == [*again, (9 << 32) + 4]
    store.close()


@pytest.mark.parametrize("engine", [INTERLEAVED, DB])
def test_relocate_striped_ids_and_missing_ledger(tmp_path: Path, engine: str) -> None:
    ids = [e for e in range(2000) if e % 3 != 2]  # E=3, Qw=2: two of every three entries
    old = {e: (1 << 32) + 100 + e for e in ids}
    store = store_with(tmp_path, 8, old, engine)
    news = [(3 << 32) + 100 + e for e in ids]
    assert store.relocate(8, [(array("q", ids), be([old[e] for e in ids]), be(news))]) == len(ids)
    assert [store.location(8, e)[0] for e in ids] == news
    assert store.relocate(99, [(array("q", ids), be(news), be(news))]) == 0  # deleted: not re-created
    assert store.find(99) is None
    store.close()


def test_relocated_index_files_are_synced_once_per_call(tmp_path: Path) -> None:
    store = store_with(tmp_path, 5, {0: (1 << 32) + 100})
    store.write(6, ixf.IndexHeader(ixf.V1, b"key"), {0: (1 << 32) + 200})
    for ledger_id, old in ((5, 100), (6, 200), (5, 100)):  # ledger 5's second move changes nothing
        store.relocate(ledger_id, [(array("q", [0]), be([(1 << 32) + old]), be([(2 << 32) + old]))])
    assert store.sync_relocated() == 2
    assert store.sync_relocated() == 0  # nothing relocated since
    store.relocate(6, [(array("q", [0]), be([(2 << 32) + 200]), be([(3 << 32) + 200]))])
    store.delete(6)  # deleted before the sync: nothing to keep
    assert store.sync_relocated() == 0


def batch_of(records: list[tuple[int, int, bytes]], log_id: int = 1, at: int = 1024) -> Moved:
    batch = Moved()
    for ledger_id, entry_id, payload in records:
        body = struct.pack(">qq", ledger_id, entry_id) + payload
        batch.starts.append(len(batch.records))
        batch.ledgers.append(ledger_id)
        batch.entries.append(entry_id)
        batch.old.append(ef.entry_location(log_id, at + len(batch.records) + 4))
        batch.records += ef.encode_record_size(len(body)) + body
    return batch


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("limit", [64 * 1024 * 1024, 4096])  # the small limit rotates inside the batch
def test_write_moves_new_locations_name_the_records(tmp_path: Path, grouped: bool, limit: int) -> None:
    (tmp_path / "current").mkdir()
    writer = EntryLogWriter((tmp_path,), limit)
    writer.open_next(9)
    records = [(1 + n % 3, n // 3, bytes([n % 251]) * (50 + n)) for n in range(60)]
    batch = batch_of(records)
    relocated = write_moves(writer, [batch.grouped() if grouped else batch])
    writer.flush()
    found = {}
    for ledger_id, moves in relocated.items():
        for entries, _olds, news in moves:
            locations = struct.unpack(f">{len(entries)}q", news)
            found.update({(ledger_id, e): loc for e, loc in zip(entries, locations, strict=True)})
    assert len(found) == 60
    for ledger_id, entry_id, payload in records:
        log_id, offset = ef.split_location(found[(ledger_id, entry_id)])
        fd = os.open(tmp_path / "current" / ef.log_file_name(log_id), os.O_RDONLY)
        try:
            size = int.from_bytes(os.pread(fd, 4, offset - 4), "big")
            assert os.pread(fd, size, offset) == struct.pack(">qq", ledger_id, entry_id) + payload
        finally:
            os.close(fd)
    assert (writer.rotations > 0) == (limit == 4096)
    writer.close()
