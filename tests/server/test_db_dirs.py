"""The db engine over several ledger directories (Java's DbLedgerStorage: ledger L in directory L mod n,
each with its own entry logs and RocksDB dbs), and its read-ahead cache."""

from __future__ import annotations

from pathlib import Path

from twisted.internet import reactor

from bkctl.protocol import db_format as dbf
from bkctl.protocol.wire import ReturnCode as RC
from bkctl.server.db_ledger_index import open_ledgers, open_locations, read_ledgers
from bkctl.server.read_cache import STREAMS_PER_LEDGER, ReadCache
from bkctl.server.storage import Storage
from tests.server.crash_writer import assert_served_right, run_until_killed
from tests.server.helpers import (
    KEY,
    Durable,
    abandon,
    config,
    ledger_dirs,
    packaged,
    started,
    twisted_test,
    wait_until,
)
from tests.server.test_storage import add_all

TWO = 2


def _killed(storage: Storage) -> None:
    abandon(storage)
    for store in range(storage.store_count):
        storage.store(store).index.close()


def _db_contents(ledger_dir: Path) -> tuple[set[int], set[int]]:
    """(ledgers in the ledgers db, ledgers in the locations db) of one ledger dir."""
    current = ledger_dir / "current"
    ledgers = open_ledgers(current, read_only=True)
    locations = open_locations(current, read_only=True)
    try:
        held = set(read_ledgers(ledgers))
        located = {dbf.decode_location_key(key)[0] for key, _ in locations.items()}
    finally:
        ledgers.close()
        locations.close()
    return held, located


@twisted_test
async def test_ledgers_live_in_the_directory_java_puts_them_in(tmp_path: Path) -> None:
    durable = Durable()
    dirs = ledger_dirs(tmp_path, TWO)
    storage = started(tmp_path, durable, engine="db", ledger_dirs=dirs, log_size_limit=16 * 1024)
    for ledger_id in range(5):
        await add_all(storage, durable, ledger_id, 300)
    lac_body = (3).to_bytes(8, "big") + (2).to_bytes(8, "big") + b"digest"
    assert storage.write_lac(3, KEY, lac_body, "lac") == RC.EOK
    assert storage.fence(4, KEY, "fence") == RC.EOK
    await wait_until(lambda: "fence" in durable.tokens and "lac" in durable.tokens)
    await storage.checkpoint()
    assert storage.store_count == TWO
    # Each directory counts its own log ids from 0, as Java's: both hold 0.log.
    assert all((d / "current" / "0.log").is_file() for d in dirs)
    assert all(len(storage.store(i).entry_logs()) > 1 for i in range(TWO))
    await storage.stop()
    assert _db_contents(dirs[0]) == ({0, 2, 4}, {0, 2, 4})
    assert _db_contents(dirs[1]) == ({1, 3}, {1, 3})
    again = started(tmp_path, engine="db", ledger_dirs=dirs)
    assert again.is_fenced(4) and again.explicit_lac(3) == lac_body
    assert again.add(4, 300, KEY, packaged(4, 300), False, None) == RC.EFENCED
    for ledger_id in range(5):
        assert [again.read(ledger_id, e) for e in range(300)] == [
            (RC.EOK, packaged(ledger_id, e)) for e in range(300)
        ]
    assert await again.ledger_ids() == set(range(5))
    assert again.delete_ledger(3) and again.read(3, 0) == (RC.ENOLEDGER, b"")
    assert again.read(1, 299) == (RC.EOK, packaged(1, 299))
    info = again.info()
    assert len(info["entry_log_ids"]) == TWO  # type: ignore[arg-type]
    await again.stop()
    assert _db_contents(dirs[1]) == ({1}, {1})


@twisted_test
async def test_every_acknowledged_entry_survives_sigkill_over_two_dirs(tmp_path: Path) -> None:
    acked = run_until_killed(tmp_path, engine="db", ledger_dir_count=TWO)
    dirs = ledger_dirs(tmp_path, TWO)
    storage = Storage(config(tmp_path, engine="db", ledger_dirs=dirs), Durable(), reactor)
    report = storage.start()
    assert report.entries > 0
    assert_served_right(storage, acked)
    await storage.stop()
    for n, directory in enumerate(dirs):  # the crash writer's ledgers 0..4, each in its own dir
        held, located = _db_contents(directory)
        assert held == located == {ledger for ledger in range(5) if ledger % TWO == n}


@twisted_test
async def test_a_read_following_the_previous_one_reads_the_next_entries_ahead(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable, engine="db", read_ahead_batch=10)
    await add_all(storage, durable, 1, 15)
    await add_all(storage, durable, 2, 5)  # after ledger 1's in the entry log: read-ahead stops there
    await storage.stop()
    again = started(tmp_path, engine="db", read_ahead_batch=10)
    metrics = again.read_cache_metrics
    assert again.read(1, 0) == (RC.EOK, packaged(1, 0))  # a first read tells nothing: no read-ahead
    assert (metrics.misses, metrics.skipped, metrics.batches) == (1, 1, 0)
    assert again.read(1, 1) == (RC.EOK, packaged(1, 1))  # starts where entry 0 ended: in order
    assert (metrics.misses, metrics.hits, metrics.batch_entries) == (2, 0, 10)
    assert [again.read(1, e) for e in range(2, 12)] == [(RC.EOK, packaged(1, e)) for e in range(2, 12)]
    assert (metrics.misses, metrics.hits) == (2, 10)
    assert again.read(1, 12) == (RC.EOK, packaged(1, 12))  # where the batch ended: the next batch
    assert (metrics.misses, metrics.batch_entries, metrics.batches) == (3, 12, 2)
    assert again.read(2, 0) == (RC.EOK, packaged(2, 0))
    assert (metrics.misses, metrics.skipped) == (4, 2)
    again.delete_ledger(1)
    assert again.read(1, 12) == (RC.ENOLEDGER, b"")
    await again.stop()
    off = started(tmp_path, engine="db", read_cache_max_bytes=0)
    assert off.read(2, 1) == (RC.EOK, packaged(2, 1)) and off.read_cache_metrics.misses == 0
    await off.stop()


@twisted_test
async def test_random_reads_read_nothing_ahead_and_keep_nothing(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable, engine="db", read_ahead_batch=10)
    await add_all(storage, durable, 1, 40)
    await storage.stop()
    again = started(tmp_path, engine="db", read_ahead_batch=10)
    picks = [30, 7, 22, 3, 15, 7, 36]
    assert [again.read(1, e) for e in picks] == [(RC.EOK, packaged(1, e)) for e in picks]
    metrics = again.read_cache_metrics
    assert (metrics.misses, metrics.skipped, metrics.batches, metrics.hits) == (7, 7, 0, 0)
    assert len(again.store(0).read_cache or ()) == 0  # entry 7, read twice, was read twice
    await again.stop()


@twisted_test
async def test_a_reader_of_a_striped_ledger_and_two_readers_of_one_ledger_keep_their_read_ahead(
    tmp_path: Path,
) -> None:
    durable = Durable()
    storage = started(tmp_path, durable, engine="db", read_ahead_batch=10)
    # Ensemble 3, write quorum 2: this bookie holds two entries of every three ...
    held = [e for e in range(90) if e % 3 != 2]
    for entry_id in held:
        assert storage.add(1, entry_id, KEY, packaged(1, entry_id), False, entry_id) == RC.EOK
    await wait_until(lambda: held[-1] in durable.tokens)
    await add_all(storage, durable, 2, 60)
    await storage.stop()
    again = started(tmp_path, engine="db", read_ahead_batch=10)
    metrics = again.read_cache_metrics
    # ... and a reader asks it for one of every three (the others go to the other bookies).
    asked = [e for e in held if e % 3 == 0][:12]
    assert [again.read(1, e) for e in asked] == [(RC.EOK, packaged(1, e)) for e in asked]
    assert (metrics.misses, metrics.batches, metrics.hits) == (3, 2, 9)
    # Two readers of ledger 2, one from entry 0 and one from entry 30, in turns.
    before = metrics.misses
    for step in range(20):
        for first in (0, 30):
            assert again.read(2, first + step) == (RC.EOK, packaged(2, first + step))
    assert metrics.misses - before == 2 * 2 + 2  # each: two misses to start, then one per 10 entries
    await again.stop()


def test_follows_tells_readers_in_order_from_random_reads() -> None:
    cache = ReadCache(1 << 20, 10)
    record = 4 + 100  # size prefix + a stored entry of 100 bytes
    at = 1024 + 4  # log 0: the first entry of the log, after its header

    def location(log_id: int, number: int) -> int:
        return log_id << 32 | (at + number * record)

    assert not cache.follows(1, location(0, 0), 100)  # nothing known of ledger 1
    assert cache.follows(1, location(0, 1), 100)  # right after
    assert cache.follows(1, location(0, 4), 100)  # two records skipped: a striped ledger
    assert not cache.follows(1, location(0, 8), 100)  # three skipped: not in order
    assert not cache.follows(1, location(0, 8), 100)  # the same entry again
    assert not cache.follows(1, location(1, 9), 100)  # the next record's offset, in another log
    assert not cache.follows(2, location(0, 9), 100)  # another ledger's position
    for number in range(20, 20 + STREAMS_PER_LEDGER):  # as many other readers as are kept
        cache.follows(1, location(0, number * 10), 100)
    assert not cache.follows(1, location(0, 9), 100)  # the oldest reader was forgotten
    cache.forget_ledger(1)
    assert not cache.follows(1, location(0, 10), 100)


@twisted_test
async def test_read_ahead_stops_where_the_log_being_written_is_fsynced(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable, engine="db")
    await add_all(storage, durable, 1, 10)
    await storage.checkpoint()
    store = storage.store(0)
    log_id, end = store.writer.durable
    location = store.index.location(1, 0)[0]
    assert log_id == location >> 32  # the log being written, fsynced up to `end`
    first = store.reader.read(location, 1, 0)
    cache = ReadCache(1 << 20, 100)
    fd = store.reader.fd_of(location)
    assert cache.read_ahead(fd, 1, location, len(first), end)[0] == 9
    fifth = store.index.location(1, 5)[0]  # as if the log's fsynced bytes ended after entry 4
    cut = ReadCache(1 << 20, 100)
    assert cut.read_ahead(fd, 1, location, len(first), (fifth & 0xFFFF_FFFF) - 4)[0] == 4
    assert cut.get(1, 4) == packaged(1, 4) and cut.get(1, 5) is None
    await storage.stop()


@twisted_test
async def test_read_ahead_reads_entries_of_any_size(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable, engine="db")
    sizes = [100, 2000, 300 * 1024, 100, 5000, 100]  # one bigger than a read-ahead chunk
    for entry_id, size in enumerate(sizes):
        data = packaged(1, entry_id, bytes([entry_id]) * size)
        assert storage.add(1, entry_id, KEY, data, False, entry_id) == RC.EOK
    await wait_until(lambda: len(sizes) - 1 in durable.tokens)
    await storage.checkpoint()
    store = storage.store(0)
    location = store.index.location(1, 0)[0]
    first = store.reader.read(location, 1, 0)
    cache = ReadCache(4 << 20, 100)
    assert cache.read_ahead(store.reader.fd_of(location), 1, location, len(first))[0] == len(sizes) - 1
    assert [cache.get(1, e) for e in range(1, len(sizes))] == [
        packaged(1, e, bytes([e]) * size) for e, size in enumerate(sizes) if e
    ]
    await storage.stop()
