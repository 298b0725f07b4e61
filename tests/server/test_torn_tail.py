"""A journal write cut short by kill -9 must not come back as a whole record on replay.

Linux copies a buffered write page by page and stops between pages once SIGKILL is pending, so a
killed bookie can leave the first part of a record in its journal and nothing of the rest. If the
journal file was already longer (preallocated and zero-filled), replay read the cut record as whole:
its length intact, the rest of it zeros. With the cut inside the entry id, the record's key became an
*earlier* entry's (ledger 3, entry 0x1028 cut after 7 bytes of the id reads as entry 0x1000), and
replay replaced that acknowledged, checkpointed entry with zeros. These tests cut the journal's write
at a page boundary exactly as the kernel does and restart.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from twisted.internet import reactor

from bkctl.protocol.wire import ReturnCode as RC
from bkctl.server import journal as journal_module
from bkctl.server.fileio import PAGE_SIZE
from bkctl.server.journal import JournalWriter
from bkctl.server.storage import Storage
from tests.server.helpers import (
    KEY,
    Durable,
    ThreadedClock,
    abandon,
    config,
    journal_dirs,
    packaged,
    started,
    twisted_test,
    wait_until,
)

LEDGER = 3
# Entry 0x1028 cut after 7 of its 8 id bytes reads as entry 0x1000, which the bookie acknowledged.
ALIASED, TORN = 0x1000, 0x1028
RECORD_HEAD = 4 + 8  # length prefix + ledger id: what precedes the entry id in a journal record


def cut_writes_at(monkeypatch: pytest.MonkeyPatch, cut: int) -> None:
    """The journal's next write that crosses file offset `cut` stops there, as a killed process's does."""
    real = journal_module.write_all

    def write_all(fd: int, buffers: Sequence[bytes | memoryview], offset: int) -> None:
        data = b"".join(buffers)
        if offset + len(data) <= cut:
            real(fd, buffers, offset)
            return
        os.pwrite(fd, data[: cut - offset], offset)
        raise OSError(errno.EINTR, "killed in the middle of a write")

    monkeypatch.setattr(journal_module, "write_all", write_all)


def filler_for(journal: JournalWriter, record_start: int) -> bytes:
    """An entry of LEDGER whose journal record ends exactly at `record_start` (from the journal's mark)."""
    payload = record_start - journal.mark[1] - 4 - len(packaged(LEDGER, TORN - 1, b""))
    return packaged(LEDGER, TORN - 1, b"f" * payload)


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("id_bytes_written", [0, 7])
@twisted_test
async def test_cut_record_does_not_replace_an_acknowledged_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int, id_bytes_written: int
) -> None:
    dirs = journal_dirs(tmp_path, count)
    durable = Durable()
    storage = started(tmp_path, durable, journal_dirs=dirs)
    acknowledged = {ALIASED: packaged(LEDGER, ALIASED, b"acknowledged " * 20)}
    if id_bytes_written == 0:  # the cut before the entry id: it reads as entry 0
        acknowledged[0] = packaged(LEDGER, 0, b"the first entry " * 20)
    for entry_id, data in sorted(acknowledged.items()):
        assert storage.add(LEDGER, entry_id, KEY, data, False, entry_id) == RC.EOK
    await wait_until(lambda: len(durable.tokens) == len(acknowledged))
    await storage.checkpoint()  # lastMark moves past them: replay will not write them again

    journal = storage._journals[LEDGER % count]
    page = -(-(journal.mark[1] + 600) // PAGE_SIZE) * PAGE_SIZE
    record_start = page - RECORD_HEAD - id_bytes_written
    filler = filler_for(journal, record_start)
    cut_writes_at(monkeypatch, page)
    torn = packaged(LEDGER, TORN, b"never acknowledged " * 20)
    assert storage.add(LEDGER, TORN - 1, KEY, filler, False, "filler") == RC.EOK
    assert storage.add(LEDGER, TORN, KEY, torn, False, "torn") == RC.EOK
    assert journal.mark[1] > page
    await wait_until(lambda: journal.failed is not None)
    assert "torn" not in durable.tokens
    abandon(storage)
    storage._close_files(None)
    monkeypatch.undo()

    again = Storage(config(tmp_path, journal_dirs=dirs), Durable(), reactor)
    report = again.start()
    for entry_id, data in acknowledged.items():
        assert again.read(LEDGER, entry_id) == (RC.EOK, data), entry_id
    assert again.read(LEDGER, TORN) == (RC.ENOENTRY, b"")
    # The whole record before the cut was never acknowledged but is intact: replaying it is right.
    assert again.read(LEDGER, TORN - 1) == (RC.EOK, filler)
    assert any("truncated record" in stop for stop in report.stops), report.stops
    await again.stop()


def test_a_journal_is_never_longer_than_what_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Preallocation reserves blocks but keeps the file size: a cut write ends the file where it stopped."""
    clock = ThreadedClock()
    storage = Storage(config(tmp_path), Durable(), clock)
    storage.start()
    journal = storage._journals[0]
    assert os.path.getsize(journal.path) == journal.mark[1] == 512
    cut_writes_at(monkeypatch, 4096)
    for entry_id in range(40):
        storage.add(LEDGER, entry_id, KEY, packaged(LEDGER, entry_id, bytes(200)), False, entry_id)
    clock.advance(0)
    assert journal.failed is not None
    assert os.path.getsize(journal.path) == 4096
    abandon(storage)
    storage._close_files(None)
