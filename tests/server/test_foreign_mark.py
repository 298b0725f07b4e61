"""A lastMark that another process wrote must never make replay skip our journal.

Two bookies on one directory (now refused by the directory locks) used to do exactly this: B wrote a
lastMark pointing at its own, newer journal; A's acknowledged entries in its older, unflushed journal
were then skipped at A's next start and answered ENOLEDGER. Replay now replays a journal older than the
mark in full when it was written after the mark was, and a journal whose mark points past its end.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from twisted.internet import reactor

from bkctl.protocol import journal_format as jf
from bkctl.protocol.wire import ReturnCode as RC
from bkctl.server.storage import Storage
from tests.server.helpers import KEY, Durable, abandon, config, packaged, started, twisted_test, wait_until

LEDGER = 7


async def write_acknowledged(storage: Storage, durable: Durable, count: int) -> dict[int, bytes]:
    written = {e: packaged(LEDGER, e) for e in range(count)}
    for entry_id, data in written.items():
        assert storage.add(LEDGER, entry_id, KEY, data, False, entry_id) == RC.EOK
    await wait_until(lambda: len(durable.tokens) == count)
    return written


def kill(storage: Storage) -> None:
    abandon(storage)
    storage._close_files(None)


@twisted_test
async def test_a_second_bookie_s_mark_does_not_hide_the_first_one_s_journal(tmp_path: Path) -> None:
    durable = Durable()
    first = started(tmp_path, durable)
    # The second process on the same directories: its own, newer journal, and lastMark at its stop.
    time.sleep(0.01)
    second = started(tmp_path)
    await second.stop()
    mark_path = tmp_path / "ledgers" / "current" / "lastMark"
    assert jf.decode_last_mark(mark_path.read_bytes())[0] > first._journals[0].mark[0]
    time.sleep(0.01)  # the first bookie's adds come after that mark, in its older journal
    written = await write_acknowledged(first, durable, 100)
    kill(first)

    again = Storage(config(tmp_path), Durable(), reactor)
    report = again.start()
    for entry_id, data in written.items():
        assert again.read(LEDGER, entry_id) == (RC.EOK, data), entry_id
    assert report.entries >= 100
    await again.stop()


@twisted_test
async def test_a_mark_past_the_end_of_its_journal_replays_it_whole(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable)
    written = await write_acknowledged(storage, durable, 10)
    journal_id = storage._journals[0].mark[0]
    kill(storage)
    mark_path = tmp_path / "ledgers" / "current" / "lastMark"
    mark_path.write_bytes(jf.encode_last_mark(journal_id, 1 << 40))

    again = Storage(config(tmp_path), Durable(), reactor)
    again.start()
    for entry_id, data in written.items():
        assert again.read(LEDGER, entry_id) == (RC.EOK, data), entry_id
    await again.stop()


@twisted_test
async def test_journals_before_a_genuine_mark_are_not_replayed(tmp_path: Path) -> None:
    """The normal case is unchanged: after a checkpoint and a restart, old journals are not read."""
    durable = Durable()
    storage = started(tmp_path, durable)
    await write_acknowledged(storage, durable, 10)
    await storage.checkpoint()
    await storage.stop()
    again = Storage(config(tmp_path), Durable(), reactor)
    report = again.start()
    assert report.entries == 0
    await again.stop()
    # And an old journal's mtime in the future of the mark (a copied directory) only costs a replay.
    journals = sorted((tmp_path / "journal" / "current").glob("*.txn"))
    future = time.time_ns() + 10**9
    os.utime(journals[0], ns=(future, future))
    third = Storage(config(tmp_path), Durable(), reactor)
    third.start()
    assert third.read(LEDGER, 9)[0] == RC.EOK
    await third.stop()
