"""The journal writer: group commit rules (task.Clock), fsync before acknowledgement, alignment, rolling."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from twisted.internet import reactor

from bkctl.files.journal import journal_records, open_journal
from bkctl.protocol import journal_format as jf
from bkctl.protocol.journal_format import RecordKind
from bkctl.server.fileio import reserve
from bkctl.server.journal import JournalSettings, JournalWriter, list_journals, remove_old_journals
from bkctl.server.metrics import StorageMetrics
from tests.server.helpers import Durable, ThreadedClock, packaged, twisted_test, wait_until


def writer(tmp_path: Path, clock: Any, durable: Durable, **overrides: Any) -> JournalWriter:
    directory = tmp_path / "journal" / "current"
    directory.mkdir(parents=True, exist_ok=True)
    settings = JournalSettings(directory=directory, prealloc_size=64 * 1024, **overrides)
    journal = JournalWriter(settings, clock, durable, StorageMetrics(), lambda exc: None)
    journal.start(1)
    return journal


def records(path: Path) -> list[tuple[int, RecordKind, bytes]]:
    scan = journal_records(open_journal(path))
    found = [(offset, kind, bytes(body)) for offset, kind, body in scan]
    assert scan.stop is not None and not scan.stop.is_error, scan.stop
    return found


def test_group_wait_timer_commits_after_the_wait(tmp_path: Path) -> None:
    clock, durable = ThreadedClock(), Durable()
    journal = writer(tmp_path, clock, durable, group_wait_ms=2.0)
    journal.append(packaged(1, 0), "t0")
    journal.append(packaged(1, 1), "t1")
    clock.advance(0)  # the tick writes, but below every threshold nothing is committed
    assert clock.from_threads.empty() and not durable.batches
    clock.advance(0.0019)
    assert clock.from_threads.empty()
    clock.advance(0.0002)
    clock.run_from_threads()
    assert durable.batches == [["t0", "t1"]]
    assert journal.durable_mark == journal.mark and journal.mark[1] % 512 == 0


def test_bytes_threshold_commits_without_waiting(tmp_path: Path) -> None:
    clock, durable = ThreadedClock(), Durable()
    journal = writer(tmp_path, clock, durable, group_wait_ms=1000.0, buffered_bytes_threshold=1000)
    journal.append(packaged(1, 0, bytes(500)), "a")
    clock.advance(0)
    assert clock.from_threads.empty()
    journal.append(packaged(1, 1, bytes(500)), "b")
    clock.advance(0)
    clock.run_from_threads()
    assert durable.batches == [["a", "b"]]


def test_entries_threshold_commits(tmp_path: Path) -> None:
    clock, durable = ThreadedClock(), Durable()
    journal = writer(tmp_path, clock, durable, group_wait_ms=1000.0, buffered_entries_threshold=3)
    for i in range(2):
        journal.append(packaged(1, i), i)
    clock.advance(0)
    assert clock.from_threads.empty()
    journal.append(packaged(1, 2), 2)
    clock.advance(0)
    clock.run_from_threads()
    assert durable.tokens == [0, 1, 2]


@pytest.mark.parametrize(("wait_ms", "when_empty"), [(1000.0, True), (0.0, False)])
def test_flush_when_queue_empty(tmp_path: Path, wait_ms: float, when_empty: bool) -> None:
    """journalFlushWhenQueueEmpty, and BookKeeper forcing it on when the group wait is 0."""
    clock, durable = ThreadedClock(), Durable()
    journal = writer(tmp_path, clock, durable, group_wait_ms=wait_ms, flush_when_queue_empty=when_empty)
    journal.append(packaged(1, 0), "x")
    clock.advance(0)
    clock.run_from_threads()
    assert durable.tokens == ["x"]


def test_records_are_aligned_and_readable(tmp_path: Path) -> None:
    clock, durable = ThreadedClock(), Durable()
    journal = writer(tmp_path, clock, durable, flush_when_queue_empty=True)
    bodies: list[bytes] = []
    for batch in range(5):
        for i in range(batch + 1):
            body = packaged(7, len(bodies), bytes(i * 37))
            bodies.append(body)
            journal.append(body, len(bodies))
        clock.advance(0)
        assert journal.mark[1] % 512 == 0
    clock.run_until(lambda: len(durable.tokens) == len(bodies))
    assert durable.tokens == list(range(1, len(bodies) + 1))
    found = records(journal.path)
    assert [b for _, k, b in found if k is RecordKind.DATA] == bodies
    padding_ends = [offset + 8 + len(b) for offset, k, b in found if k is RecordKind.PADDING]
    assert len(padding_ends) >= 4 and all(end % 512 == 0 for end in padding_ends)
    assert open_journal(journal.path).version == jf.VERSION_MAX
    # Blocks reserved in whole preallocation steps, but the file ends where the data does (a write cut
    # short by a crash must not be followed by zeros that complete its record: see test_torn_tail.py).
    status = os.stat(journal.path)
    assert status.st_size == journal.mark[1]
    assert status.st_blocks * 512 >= 64 * 1024 or not reserve(journal._fd, 0, 64 * 1024)


def test_journal_rolls_at_max_size_and_old_journals_are_removed(tmp_path: Path) -> None:
    clock, durable = ThreadedClock(), Durable()
    journal = writer(tmp_path, clock, durable, flush_when_queue_empty=True, max_size=8192)
    for i in range(40):
        journal.append(packaged(3, i, bytes(900)), i)
        clock.advance(0)
    clock.run_until(lambda: len(durable.tokens) == 40)
    assert durable.tokens == list(range(40))
    journals = list_journals(journal.settings.directory)
    assert len(journals) >= 4 and journals[-1][0] == journal.journal_id
    data = [bytes(b) for _, path in journals for _, k, b in records(path) if k is RecordKind.DATA]
    assert data == [packaged(3, i, bytes(900)) for i in range(40)]
    removed = remove_old_journals(journal.settings.directory, journal.mark, max_backups=1)
    assert len(removed) == len(journals) - 2
    assert [j for j, _ in list_journals(journal.settings.directory)] == [j for j, _ in journals[-2:]]


@twisted_test
async def test_acknowledged_only_after_fdatasync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[object] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        real(fd)
        events.append("fsync")

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    durable = Durable()

    def on_durable(tokens: list[object]) -> None:
        events.append(tuple(tokens))
        durable(tokens)

    journal = writer(tmp_path, reactor, on_durable, group_wait_ms=1.0)  # type: ignore[arg-type]
    metrics = journal._metrics
    for i in range(1000):
        journal.append(packaged(1, i), i)
    await wait_until(lambda: len(durable.tokens) == 1000)
    assert events[0] == "fsync" and events[1] == tuple(range(1000))
    assert metrics.fsyncs == 1 and metrics.entries_per_fsync == 1000 and metrics.journal_queue_depth == 0
    await journal.stop()
