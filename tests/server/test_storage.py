"""Storage: adds, reads (cache, entry log + index), entry -1, errors, fencing, checkpoints, rotation."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from twisted.internet import reactor

from bkctl.files.entrylog import entry_log_records, ledger_sizes, open_entry_log
from bkctl.files.index import index_entries, ledger_index_path, open_index
from bkctl.protocol import entry_availability
from bkctl.protocol.entrylog_format import RecordKind, record_key
from bkctl.protocol.wire import ReturnCode as RC
from bkctl.server.storage import CHECKPOINT_AT_FRACTION, CHECKPOINT_JITTER, Storage
from tests.server.helpers import (
    KEY,
    OTHER_KEY,
    Durable,
    abandon,
    config,
    packaged,
    started,
    twisted_test,
    wait_until,
)


async def add_all(storage: Storage, durable: Durable, ledger_id: int, count: int, first: int = 0) -> None:
    for entry_id in range(first, first + count):
        rc = storage.add(
            ledger_id, entry_id, KEY, packaged(ledger_id, entry_id), False, (ledger_id, entry_id)
        )
        assert rc == RC.EOK
    await wait_until(lambda: (ledger_id, first + count - 1) in durable.tokens)


@twisted_test
async def test_reads_from_cache_then_from_entry_log_and_index(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable)
    await add_all(storage, durable, 5, 20)
    assert storage.read(5, 3) == (RC.EOK, packaged(5, 3))
    assert storage.read(5, -1) == (RC.EOK, packaged(5, 19))
    await storage.checkpoint()
    assert storage._active.size_bytes == 0
    for entry_id in range(20):
        assert storage.read(5, entry_id) == (RC.EOK, packaged(5, entry_id))
    assert storage.read(5, -1) == (RC.EOK, packaged(5, 19))
    assert storage.read(5, 20) == (RC.ENOENTRY, b"")
    assert storage.read(6, 0) == (RC.ENOLEDGER, b"")
    index = open_index(ledger_index_path(5, tmp_path / "ledgers"))
    assert index.header.master_key == KEY and not index.header.fenced
    assert [e for e, _, _ in index_entries(index)] == list(range(20))
    await storage.stop()


@twisted_test
async def test_add_errors(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable)
    await add_all(storage, durable, 1, 1)
    assert storage.add(1, 1, OTHER_KEY, packaged(1, 1), False, None) == RC.EUA
    assert storage.add(1, 2, KEY, packaged(1, 3), False, None) == RC.EBADREQ  # ids disagree
    assert storage.add(1, 2, KEY, b"short", False, None) == RC.EBADREQ
    storage.set_read_only(True)
    assert storage.add(1, 1, KEY, packaged(1, 1), False, None) == RC.EREADONLY
    assert storage.add(1, 5, KEY, packaged(1, 5), True, None) == RC.EOK  # recovery adds still go in
    assert storage.read(1, 0) == (RC.EOK, packaged(1, 0))
    storage.set_read_only(False)
    assert storage.add(1, 1, KEY, packaged(1, 1), False, None) == RC.EOK
    assert storage.metrics.errors_by_rc == {RC.EUA: 1, RC.EBADREQ: 2, RC.EREADONLY: 1}
    await storage.stop()


@twisted_test
async def test_fence_then_adds_refused_recovery_accepted_and_persisted(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable)
    await add_all(storage, durable, 2, 3)
    assert storage.fence(2, OTHER_KEY, "bad") == RC.EUA
    assert storage.fence(2, KEY, "fence") == RC.EOK
    assert storage.fence(2, KEY, "early") == RC.EOK  # the fence record is not durable yet: wait for it
    assert "early" not in durable.tokens
    assert storage.is_fenced(2)
    assert storage.add(2, 3, KEY, packaged(2, 3), False, None) == RC.EFENCED
    await wait_until(lambda: "fence" in durable.tokens and "early" in durable.tokens)
    assert durable.tokens.index("fence") < durable.tokens.index("early")
    assert storage.add(2, 3, KEY, packaged(2, 3), True, "recovery") == RC.EOK
    assert storage.fence(2, KEY, "again") == RC.EOK
    assert "again" in durable.tokens  # fenced durably already: answered at once, no fsync wait
    await wait_until(lambda: "recovery" in durable.tokens)
    # An unknown ledger is created fenced, as Java does, so a late add of the old writer is refused.
    assert storage.fence(9, KEY, "new") == RC.EOK
    assert storage.read(9, 0) == (RC.ENOENTRY, b"")
    assert storage.add(9, 0, KEY, packaged(9, 0), False, None) == RC.EFENCED
    await wait_until(lambda: "new" in durable.tokens)
    # Restart without a checkpoint: the fence comes back from the journal.
    abandon(storage)
    again = started(tmp_path)
    assert again.is_fenced(2) and again.is_fenced(9)
    assert again.read(2, 3) == (RC.EOK, packaged(2, 3))
    assert again.add(2, 4, KEY, packaged(2, 4), False, None) == RC.EFENCED
    await again.stop()
    # And after a checkpoint, from the index header.
    index = open_index(ledger_index_path(2, tmp_path / "ledgers"))
    assert index.header.fenced and index.header.master_key == KEY
    third = started(tmp_path)
    assert third.is_fenced(2) and third.read(2, -1) == (RC.EOK, packaged(2, 3))
    await third.stop()


@twisted_test
async def test_reads_during_checkpoint_and_many_ledgers(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable)
    for ledger_id in range(10):
        await add_all(storage, durable, ledger_id, 30)
    running = storage.checkpoint()
    assert storage.add(3, 30, KEY, packaged(3, 30), False, "late") == RC.EOK
    for ledger_id in range(10):
        assert storage.read(ledger_id, 29) == (RC.EOK, packaged(ledger_id, 29))
    await running
    assert storage.read(3, -1) == (RC.EOK, packaged(3, 30))
    await storage.checkpoint()
    for ledger_id in range(10):
        assert storage.read(ledger_id, 0) == (RC.EOK, packaged(ledger_id, 0))
    assert storage.read(3, 30) == (RC.EOK, packaged(3, 30))
    await storage.stop()


@twisted_test
async def test_entry_log_rotation_writes_ledgers_map(tmp_path: Path) -> None:
    from tests.test_inspect import invoke_json

    durable = Durable()
    storage = started(tmp_path, durable, log_size_limit=4096)
    for ledger_id in (1, 2, 3):
        await add_all(storage, durable, ledger_id, 100)
    await storage.checkpoint()
    for ledger_id in (1, 2, 3):
        for entry_id in range(100):
            assert storage.read(ledger_id, entry_id) == (RC.EOK, packaged(ledger_id, entry_id))
    await storage.stop()
    logs = sorted((tmp_path / "ledgers" / "current").glob("*.log"))
    assert len(logs) >= 3
    seen: dict[tuple[int, int], bytes] = {}
    for path in logs:
        log = open_entry_log(path)
        assert log.header is not None and log.header_error is None
        scan = entry_log_records(log)
        for _, kind, body in scan:
            if kind is RecordKind.DATA:
                seen[record_key(body)] = bytes(body)
        assert scan.stop is not None and not scan.stop.is_error
        sizes = ledger_sizes(log)
        assert sizes.stop is None or not sizes.stop.is_error
        if path != logs[-1]:
            assert sizes.source == "ledgers-map" and log.size <= 4096 + 20 + 3 * 16
            meta = invoke_json("entrylog", "metadata", str(path))
            assert meta["source"] == "ledgers-map"
            assert {x["ledger_id"]: x["size"] for x in meta["ledgers"]} == sizes.sizes
    assert seen == {(lid, e): packaged(lid, e) for lid in (1, 2, 3) for e in range(100)}


@twisted_test
async def test_checkpoint_writes_last_mark_and_removes_old_journals(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable, journal_max_size=1024, journal_max_backups=1)
    for first in range(0, 60, 10):  # journals roll at a commit, so commit several times
        await add_all(storage, durable, 1, 10, first)
    journals = sorted((tmp_path / "journal" / "current").glob("*.txn"))
    assert len(journals) > 3
    await storage.checkpoint()
    assert storage.last_mark_written == storage._journals[0].mark
    left = sorted((tmp_path / "journal" / "current").glob("*.txn"))
    assert len(left) == 2 and left[-1] == storage._journals[0].path
    await storage.stop()
    again = started(tmp_path)
    assert again.read(1, -1) == (RC.EOK, packaged(1, 59))
    await again.stop()


@twisted_test
async def test_corrupt_entry_log_record_and_index_page_give_eio(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    durable = Durable()
    storage = started(tmp_path, durable)
    await add_all(storage, durable, 4, 10)
    await add_all(storage, durable, 8, 10)
    await storage.checkpoint()
    await storage.stop()
    index_path = ledger_index_path(4, tmp_path / "ledgers")
    (_, log_id, offset) = next(x for x in index_entries(open_index(index_path)) if x[0] == 3)
    log_path = tmp_path / "ledgers" / "current" / f"{log_id:x}.log"
    with log_path.open("r+b") as f:  # entry 3's ledger id becomes garbage
        f.seek(offset)
        f.write(b"\xff" * 8)
    with index_path.open("r+b") as f:  # entry 5's slot points far past the end of the log
        f.seek(1024 + 8 * 5)
        f.write(((log_id << 32) | 0x7FFF_0000).to_bytes(8, "big"))
    storage = started(tmp_path)
    with caplog.at_level(logging.ERROR, logger="bkctl.bookie"):
        assert storage.read(4, 3) == (RC.EIO, b"")
        assert storage.read(4, 5) == (RC.EIO, b"")
    assert str(log_path) in caplog.text and f"offset {offset}" in caplog.text
    assert str(index_path) in caplog.text and f"offset {1024 + 8 * 5}" in caplog.text
    assert storage.read(4, 4) == (RC.EOK, packaged(4, 4))
    assert storage.read(8, 3) == (RC.EOK, packaged(8, 3))
    await storage.stop()


def test_checkpoint_thresholds_are_spread(tmp_path: Path) -> None:
    # Bookies fed the same stream must not checkpoint in step: every threshold is drawn afresh.
    storage = Storage(config(tmp_path, write_cache_max_bytes=16 * 1024 * 1024), Durable(), reactor)
    base = 16 * 1024 * 1024 * CHECKPOINT_AT_FRACTION
    low, high = CHECKPOINT_JITTER
    drawn = {storage._next_checkpoint_at() for _ in range(50)}
    assert len(drawn) > 40 and all(base * low <= t <= base * high for t in drawn)


def test_config_defaults_index_dirs_to_ledger_dirs(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert cfg.index_dirs == cfg.ledger_dirs


@twisted_test
async def test_several_ledger_and_index_dirs(tmp_path: Path) -> None:
    durable = Durable()
    dirs = (tmp_path / "l1", tmp_path / "l2")
    storage = started(tmp_path, durable, ledger_dirs=dirs, index_dirs=(tmp_path / "i1", tmp_path / "i2"))
    for ledger_id in range(4):
        await add_all(storage, durable, ledger_id, 5)
    await storage.checkpoint()
    await storage.stop()
    assert (tmp_path / "i1" / "current" / "0" / "0" / "0.idx").is_file()
    assert (tmp_path / "i2" / "current" / "0" / "1" / "1.idx").is_file()
    assert all((d / "current" / "lastMark").is_file() for d in dirs)
    again = Storage(
        config(tmp_path, ledger_dirs=dirs, index_dirs=(tmp_path / "i1", tmp_path / "i2")), Durable(), reactor
    )
    again.start()
    assert all(again.read(lid, 4) == (RC.EOK, packaged(lid, 4)) for lid in range(4))
    await again.stop()


@twisted_test
async def test_empty_index_file_left_by_a_killed_checkpoint_is_rebuilt_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    durable = Durable()
    storage = started(tmp_path, durable)
    await add_all(storage, durable, 5, 10)
    abandon(storage)
    # kill -9 between a checkpoint creating the index file and writing its header
    path = ledger_index_path(5, tmp_path / "ledgers")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    with caplog.at_level(logging.INFO, logger="bkctl.bookie"):
        restarted = started(tmp_path, Durable())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "is empty" in caplog.text
    for entry_id in range(10):
        assert restarted.read(5, entry_id) == (RC.EOK, packaged(5, entry_id))
    await restarted.checkpoint()
    assert open_index(path).header.master_key == KEY
    await restarted.stop()


@twisted_test
async def test_entry_availability_merges_the_index_and_the_write_cache(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable)
    await add_all(storage, durable, 5, 10)
    await storage.checkpoint()  # 0-9 in the index
    await add_all(storage, durable, 5, 5, first=20)  # 20-24 in the write cache
    rc, body = await storage.entry_availability(5)
    assert rc == RC.EOK and list(entry_availability.entry_ids(body)) == [*range(10), *range(20, 25)]
    assert await storage.entry_availability(6) == (RC.ENOLEDGER, b"")
    await storage.stop()
