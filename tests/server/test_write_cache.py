"""The write cache (per-ledger append buffers), its slot arithmetic, and checkpoints built on them."""

from __future__ import annotations

import struct
import threading
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import reactor

from bkctl.files.index import index_entries, ledger_index_path, open_index
from bkctl.protocol.wire import ReturnCode as RC
from bkctl.server.storage import Storage
from bkctl.server.write_cache import SIZE_PREFIX, WriteCache, shifted_slots
from tests.server.helpers import (
    KEY,
    WAIT_S,
    Durable,
    abandon,
    config,
    packaged,
    started,
    twisted_test,
    wait_until,
)

LOCATION_MAX = (1 << 63) - 1


@given(
    st.lists(st.integers(0, LOCATION_MAX), max_size=300),
    st.integers(-LOCATION_MAX, LOCATION_MAX),
    st.data(),
)
def test_shifted_slots_equals_per_slot_arithmetic(values: list[int], delta: int, data: Any) -> None:
    # Offsets such that every offset + delta is a valid location, as the checkpoint guarantees.
    offsets = array("q", [min(max(v, -delta, 0), LOCATION_MAX - max(delta, 0)) for v in values])
    start = data.draw(st.integers(0, len(offsets)))
    stop = data.draw(st.integers(start, len(offsets)))
    expected = b"".join(struct.pack(">q", o + delta) for o in offsets[start:stop])
    assert shifted_slots(offsets, start, stop, delta) == expected


def test_dense_ledger_is_arithmetic_then_sparse_on_gap_and_rewrite() -> None:
    cache = WriteCache()
    for entry_id in range(5, 10):
        cache.put(1, entry_id, b"e%d" % entry_id)
    ledger = cache.ledgers[1]
    assert ledger.dense and ledger.first_id == 5 and len(cache) == 5
    assert [cache.get(1, e) for e in (4, 5, 9, 10)] == [None, b"e5", b"e9", None]
    cache.put(1, 12, b"e12")  # a gap, as striping gives: ascending ids, searched by bisection
    assert not ledger.dense and ledger.ids is not None and ledger.where is None
    assert [cache.get(1, e) for e in (9, 10, 11, 12, 13)] == [b"e9", None, None, b"e12", None]
    cache.put(1, 6, b"new6")  # a rewrite: the newest wins, in an id -> record map
    assert ledger.ids is None and ledger.where is not None and len(cache) == 6
    assert [cache.get(1, e) for e in (5, 6, 11, 12)] == [b"e5", b"new6", None, b"e12"]
    assert cache.size_bytes == 5 * (SIZE_PREFIX + 2) + (SIZE_PREFIX + 3) + (
        SIZE_PREFIX + 4
    )  # e5-e9, e12, new6
    assert sorted(cache.items()) == sorted(
        [(1, e, b"e%d" % e) for e in (5, 7, 8, 9)] + [(1, 6, b"new6"), (1, 12, b"e12")]
    )


def test_records_are_entry_log_records_at_their_offsets() -> None:
    cache = WriteCache()
    for entry_id, data in enumerate([b"a" * 3, b"", b"b" * 70]):
        cache.put(9, entry_id, data)
    ledger = cache.ledgers[9]
    view = bytes(ledger.records)
    for n, data in enumerate([b"a" * 3, b"", b"b" * 70]):
        start = ledger.offsets[n]
        assert struct.unpack_from(">i", view, start - SIZE_PREFIX)[0] == len(data)
        assert view[start : start + len(data)] == data
        assert ledger.record_end(n) == start + len(data)


@given(st.lists(st.integers(0, 60), max_size=80), st.integers(1, 4))
def test_every_arrival_order_reads_back_and_locates_the_newest(entry_ids: list[int], stride: int) -> None:
    # Striding ids (as an ensemble wider than its write quorum sends) then any order after them.
    cache, model = WriteCache(), {}
    for n, entry_id in enumerate([*range(0, 30, stride), *entry_ids]):
        cache.put(2, entry_id, b"%d/%d" % (entry_id, n))
        model[entry_id] = b"%d/%d" % (entry_id, n)
    ledger = cache.ledgers[2]
    assert all(cache.get(2, e) == model.get(e) for e in range(-1, 62))
    assert len(cache) == len(model) and {e for e, _ in ledger.numbered()} == set(model)
    slots = b"".join(struct.pack(">q", 1000 + n) for n in range(len(ledger.offsets)))
    assert ledger.locations(slots) == {e: 1000 + n for e, n in ledger.numbered()}
    for entry_id, location in ledger.locations(slots).items():
        start = ledger.offsets[location - 1000]
        assert bytes(ledger.records[start : start + len(model[entry_id])]) == model[entry_id]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.binary(max_size=20)), max_size=80))
def test_merge_under_keeps_newest(puts: list[tuple[int, int, bytes]]) -> None:
    older, newer, model = WriteCache(), WriteCache(), {}
    half = len(puts) // 2
    for n, (ledger_id, entry_id, data) in enumerate(puts):
        (older if n < half else newer).put(ledger_id, entry_id, data)
        model[ledger_id, entry_id] = data
    older.merge_under(newer)
    assert {(lid, e): d for lid, e, d in older.items()} == model
    assert all(older.get(lid, e) == d for (lid, e), d in model.items())


def _blocked_checkpoints(storage: Storage) -> tuple[threading.Event, threading.Event]:
    """Make the checkpoint thread wait for `release` before it writes anything; `entered` when it waits."""
    entered, release = threading.Event(), threading.Event()
    write_out = storage._write_out

    def blocked(*args: Any) -> None:
        entered.set()
        release.wait(WAIT_S)
        write_out(*args)

    storage._write_out = blocked  # type: ignore[method-assign, assignment]
    return entered, release


def _add(storage: Storage, ledger_id: int, entry_ids: range | list[int]) -> None:
    for entry_id in entry_ids:
        data = packaged(ledger_id, entry_id)
        assert storage.add(ledger_id, entry_id, KEY, data, False, (ledger_id, entry_id)) == RC.EOK


def _assert_reads(storage: Storage, ledger_id: int, entry_ids: range | list[int]) -> None:
    for entry_id in entry_ids:
        assert storage.read(ledger_id, entry_id) == (RC.EOK, packaged(ledger_id, entry_id)), entry_id


@twisted_test
async def test_reads_during_a_checkpoint_come_from_both_caches(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable)
    entered, release = _blocked_checkpoints(storage)
    _add(storage, 1, range(100))
    _add(storage, 2, [0, 3, 6, 9, 1])  # a sparse ledger
    await wait_until(lambda: (2, 1) in durable.tokens)
    done = storage.checkpoint()
    await wait_until(entered.is_set)
    _add(storage, 1, range(100, 150))  # into the fresh cache while the old one is being written
    await wait_until(lambda: (1, 149) in durable.tokens)
    _assert_reads(storage, 1, range(150))
    _assert_reads(storage, 2, [0, 1, 3, 6, 9])
    assert storage.read(1, -1) == (RC.EOK, packaged(1, 149))
    assert storage.read(2, 2) == (RC.ENOENTRY, b"")
    release.set()
    await done
    assert storage._flushing is None
    _assert_reads(storage, 1, range(150))  # 0-99 from the entry log now
    _assert_reads(storage, 2, [0, 1, 3, 6, 9])
    await storage.stop()
    again = started(tmp_path)
    _assert_reads(again, 1, range(150))
    _assert_reads(again, 2, [0, 1, 3, 6, 9])
    await again.stop()


@twisted_test
async def test_ledger_buffers_split_across_entry_log_rotations(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable, log_size_limit=4096)
    big = 3  # one entry bigger than a whole log
    for entry_id in range(300):
        payload = b"x" * (9000 if entry_id == big else entry_id % 50)
        data = packaged(7, entry_id, payload)
        assert storage.add(7, entry_id, KEY, data, False, (7, entry_id)) == RC.EOK
    await wait_until(lambda: (7, 299) in durable.tokens)
    await storage.checkpoint()
    assert storage._writer.rotations >= 5
    await storage.stop()
    again = started(tmp_path)
    for entry_id in range(300):
        payload = b"x" * (9000 if entry_id == big else entry_id % 50)
        assert again.read(7, entry_id) == (RC.EOK, packaged(7, entry_id, payload))
    await again.stop()


@twisted_test
async def test_restart_after_a_checkpoint_cut_short_like_kill_9(tmp_path: Path) -> None:
    """The entry log is written and one ledger's index too, then the bookie dies: no lastMark moved."""
    durable = Durable()
    storage = started(tmp_path, durable)
    _add(storage, 1, range(200))
    _add(storage, 2, range(0, 400, 2))
    await wait_until(lambda: (2, 398) in durable.tokens)
    index = storage._index
    write_file = index._write_file

    def die_after_first(*args: Any) -> None:
        index._write_file = die  # type: ignore[method-assign, assignment]
        write_file(*args)

    def die(*args: Any) -> None:
        raise OSError("killed")

    index._write_file = die_after_first  # type: ignore[method-assign, assignment]
    mark_before = storage.last_mark_written
    with pytest.raises(OSError):
        await storage.checkpoint()
    assert storage.last_mark_written == mark_before
    _assert_reads(storage, 1, range(200))  # the failed checkpoint gave its entries back
    _assert_reads(storage, 2, range(0, 400, 2))
    abandon(storage)
    storage._writer.close()
    again = Storage(config(tmp_path), Durable(), reactor)
    report = again.start()
    assert report.entries == 400
    _assert_reads(again, 1, range(200))
    _assert_reads(again, 2, range(0, 400, 2))
    assert again.read(2, 1) == (RC.ENOENTRY, b"")
    await again.stop()


@twisted_test
async def test_dense_runs_merge_into_partly_written_index_pages(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable)
    for first, stop in ((0, 1500), (1500, 2100), (2100, 2101)):  # page 1 written three times
        _add(storage, 4, range(first, stop))
        await wait_until(lambda stop=stop: (4, stop - 1) in durable.tokens)  # type: ignore[misc]
        await storage.checkpoint()
    await storage.stop()
    index = open_index(ledger_index_path(4, tmp_path / "ledgers"))
    assert [e for e, _, _ in index_entries(index)] == list(range(2101))
    again = started(tmp_path)
    _assert_reads(again, 4, range(2101))
    await again.stop()
