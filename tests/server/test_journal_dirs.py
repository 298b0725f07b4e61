"""Several journal dirs: each ledger's records in journal (ledger id mod N), lastMark.<i> per journal,
replay of every journal from its own mark, kill -9 safety, fences across restarts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from twisted.internet import reactor
from typer.testing import CliRunner

from bkctl.cli import build_app
from bkctl.errors import UsageError
from bkctl.files.marks import find_last_marks, read_last_mark
from bkctl.protocol import journal_format as jf
from bkctl.protocol.journal_format import RecordKind
from bkctl.protocol.wire import ReturnCode as RC
from bkctl.server.replay import replay
from bkctl.server.storage import Storage
from tests.server.crash_writer import LEDGERS, assert_served_right, run_until_killed
from tests.server.helpers import (
    KEY,
    Durable,
    abandon,
    config,
    journal_dirs,
    packaged,
    started,
    twisted_test,
    wait_until,
)
from tests.server.test_replay_fast_path import counted_takes

LEDGER_IDS = (0, 1, 2, 3, 4, 5, 7, 1 << 40, (1 << 63) - 1)


def ledgers_in_journals(directory: Path, torn_tail_ok: bool = False) -> set[int]:
    """Ledger ids of every master key, data and fence record in a journal dir's `current/`."""
    found: set[int] = set()

    def apply(kind: RecordKind, body: memoryview) -> None:
        if kind in (RecordKind.DATA, RecordKind.MASTER_KEY, RecordKind.FENCE):
            found.add(jf.record_key(body)[0])

    report = replay(directory / "current", (-1, 0), apply)
    # After kill -9 the last write may be cut short: the journal then ends in a truncated record.
    assert all("at end of file" in stop for stop in report.stops) if torn_tail_ok else not report.stops
    return found


async def add_each(storage: Storage, durable: Durable, count: int) -> None:
    for ledger_id in LEDGER_IDS:
        for entry_id in range(count):
            token = (ledger_id, entry_id)
            assert (
                storage.add(ledger_id, entry_id, KEY, packaged(ledger_id, entry_id), False, token) == RC.EOK
            )
    await wait_until(lambda: len(durable.tokens) == count * len(LEDGER_IDS))


@pytest.mark.parametrize("count", [2, 3])
@twisted_test
async def test_records_spread_by_ledger_and_last_marks_per_journal(tmp_path: Path, count: int) -> None:
    durable = Durable()
    dirs = journal_dirs(tmp_path, count)
    storage = started(tmp_path, durable, journal_dirs=dirs)
    await add_each(storage, durable, 20)
    tokens_before = len(durable.tokens)
    for ledger_id in LEDGER_IDS[::2]:
        assert storage.fence(ledger_id, KEY, ("fence", ledger_id)) == RC.EOK
    await wait_until(lambda: len(durable.tokens) == tokens_before + len(LEDGER_IDS[::2]))
    for index, directory in enumerate(dirs):
        assert ledgers_in_journals(directory) == {lid for lid in LEDGER_IDS if lid % count == index}
    await storage.checkpoint()
    for index, journal in enumerate(storage._journals):
        assert (
            read_last_mark(tmp_path / "ledgers" / "current" / f"lastMark.{index}").offset == journal.mark[1]
        )
    assert storage.last_marks_written == tuple(j.mark for j in storage._journals)
    assert not (tmp_path / "ledgers" / "current" / "lastMark").exists()
    assert len(find_last_marks(tmp_path / "ledgers")) == count
    await storage.stop()

    result = CliRunner().invoke(build_app(), ["lastmark", str(tmp_path / "ledgers"), "-o", "json"])
    assert result.exit_code == 0, result.output
    marks = json.loads(result.stdout)["marks"]
    assert sorted(Path(m["file"]).name for m in marks) == [f"lastMark.{i}" for i in range(count)]
    for mark in marks:
        index = int(Path(mark["file"]).name.rsplit(".", 1)[1])
        journal_files = os.listdir(dirs[index] / "current")
        assert mark["journal_file"] in journal_files

    again = started(tmp_path, journal_dirs=dirs)
    for ledger_id in LEDGER_IDS:
        assert again.read(ledger_id, 19) == (RC.EOK, packaged(ledger_id, 19))
        assert again.is_fenced(ledger_id) == (ledger_id in LEDGER_IDS[::2])
    assert again.add(LEDGER_IDS[0], 20, KEY, packaged(LEDGER_IDS[0], 20), False, "x") == RC.EFENCED
    assert again.add(LEDGER_IDS[1], 20, KEY, packaged(LEDGER_IDS[1], 20), False, "y") == RC.EOK
    await again.stop()


@pytest.mark.parametrize("count", [2, 3])
@twisted_test
async def test_replay_of_every_journal_without_checkpoint(
    tmp_path: Path, count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Abandoned before any checkpoint: adds, fences and keys come back from each journal; fast path taken."""
    durable = Durable()
    dirs = journal_dirs(tmp_path, count)
    storage = started(tmp_path, durable, journal_dirs=dirs)
    await add_each(storage, durable, 50)
    tokens_before = len(durable.tokens)
    for ledger_id in LEDGER_IDS[1::2]:
        assert storage.fence(ledger_id, KEY, ("fence", ledger_id)) == RC.EOK
    await wait_until(lambda: len(durable.tokens) == tokens_before + len(LEDGER_IDS[1::2]))
    abandon(storage)

    taken = counted_takes(monkeypatch)
    again = Storage(config(tmp_path, journal_dirs=dirs), Durable(), reactor)
    report = again.start()
    assert report.entries == 50 * len(LEDGER_IDS) and not report.stops
    # Only each ledger's first DATA record goes record by record.
    assert sum(taken) == 49 * len(LEDGER_IDS)
    assert len(report.journals) == count
    for ledger_id in LEDGER_IDS:
        assert again.read(ledger_id, -1) == (RC.EOK, packaged(ledger_id, 49))
        assert again.is_fenced(ledger_id) == (ledger_id in LEDGER_IDS[1::2])
    assert all((tmp_path / "ledgers" / "current" / f"lastMark.{i}").is_file() for i in range(count))
    await again.stop()


@pytest.mark.parametrize("count", [2, 3])
@twisted_test
async def test_every_acknowledged_entry_survives_sigkill(tmp_path: Path, count: int) -> None:
    acked = run_until_killed(tmp_path, count)
    dirs = journal_dirs(tmp_path, count)
    marks = [read_last_mark(tmp_path / "ledgers" / "current" / f"lastMark.{i}") for i in range(count)]
    assert all(mark.offset > 512 for mark in marks)  # checkpoints ran: replay starts mid-journal
    for index, directory in enumerate(dirs):
        expected = {lid for lid in range(LEDGERS) if lid % count == index}
        assert ledgers_in_journals(directory, torn_tail_ok=True) <= expected
    storage = Storage(config(tmp_path, journal_dirs=dirs), Durable(), reactor)
    report = storage.start()
    assert report.entries > 0 and len(report.journals) >= count
    assert_served_right(storage, acked)
    await storage.stop()


def test_journal_dirs_are_checked(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="listed twice"):
        config(tmp_path, journal_dirs=(tmp_path / "j", tmp_path / "j"))
    with pytest.raises(UsageError, match="journal dirs"):
        config(tmp_path, journal_dirs=())
    with pytest.raises(UsageError, match="journal dirs"):
        config(tmp_path, journal_dirs=tuple(tmp_path / f"j{i}" for i in range(65)))


@twisted_test
async def test_single_journal_keeps_plain_last_mark(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable)
    await add_each(storage, durable, 3)
    await storage.checkpoint()
    await storage.stop()
    names = sorted(p.name for p in find_last_marks(tmp_path / "ledgers"))
    assert names == ["lastMark"]
