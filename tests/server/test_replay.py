"""Replay on start: kill -9 consistency, torn journal tails, Java journal versions, explicit LAC."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from twisted.internet import reactor

from bkctl.errors import CorruptDataError
from bkctl.model import DigestType
from bkctl.protocol import index_format as ixf
from bkctl.protocol import journal_format as jf
from bkctl.protocol.wire import ReturnCode as RC
from bkctl.server.storage import Storage
from tests.server.crash_writer import assert_served_right, run_until_killed
from tests.server.helpers import (
    KEY,
    Durable,
    abandon,
    config,
    packaged,
    started,
    twisted_test,
    wait_until,
)
from tests.storage_builders import journal_bytes, ledger_journal_bodies, write


@twisted_test
async def test_every_acknowledged_entry_survives_sigkill(tmp_path: Path) -> None:
    acked = run_until_killed(tmp_path)
    storage = Storage(config(tmp_path), Durable(), reactor)
    report = storage.start()
    assert report.start_mark[1] > 512 and report.entries > 0  # from a checkpoint mid-journal
    assert_served_right(storage, acked)
    await storage.stop()


async def _journal_with_entries(tmp_path: Path, count: int) -> Path:
    durable = Durable()
    storage = started(tmp_path, durable)
    for entry_id in range(count):
        assert storage.add(1, entry_id, KEY, packaged(1, entry_id, bytes(100)), False, entry_id) == RC.EOK
    await wait_until(lambda: count - 1 in durable.tokens)
    abandon(storage)
    return storage._journals[0].path


def _record_offsets(path: Path) -> list[int]:
    from bkctl.files.journal import journal_records, open_journal

    return [o for o, kind, _ in journal_records(open_journal(path)) if kind is jf.RecordKind.DATA]


@twisted_test
async def test_torn_tail_mid_record(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = await _journal_with_entries(tmp_path, 50)
    offsets = _record_offsets(path)
    cut = offsets[40] + 30  # inside record 40
    with path.open("r+b") as f:
        f.truncate(cut)
    with caplog.at_level(logging.WARNING, logger="bkctl.bookie"):
        storage = started(tmp_path)
    assert f"{path}" in caplog.text and f"offset {offsets[40]}" in caplog.text
    for entry_id in range(40):
        assert storage.read(1, entry_id) == (RC.EOK, packaged(1, entry_id, bytes(100)))
    assert storage.read(1, 40) == (RC.ENOENTRY, b"")
    assert storage.read(1, -1) == (RC.EOK, packaged(1, 39, bytes(100)))
    await storage.stop()


@twisted_test
async def test_garbage_after_the_last_record(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = await _journal_with_entries(tmp_path, 20)
    offsets = _record_offsets(path)
    end = offsets[-1] + 4 + len(packaged(1, 19, bytes(100)))
    end += -end % 512  # after the padding of the last commit
    with path.open("r+b") as f:
        f.seek(end)
        f.write(b"\xde\xad\xbe\xef" * 50)
    with caplog.at_level(logging.WARNING, logger="bkctl.bookie"):
        storage = started(tmp_path)
    assert f"offset {end}" in caplog.text
    assert all(storage.read(1, e) == (RC.EOK, packaged(1, e, bytes(100))) for e in range(20))
    await storage.stop()


@pytest.mark.parametrize("version", [3, 4, 5, 6])
@twisted_test
async def test_replays_every_journal_version(tmp_path: Path, version: int) -> None:
    bodies = ledger_journal_bodies(12, 30, DigestType.CRC32C, version)
    data = journal_bytes(version, bodies, pad_every=7 if version >= 5 else 0)
    write(tmp_path / "journal" / "current" / jf.journal_file_name(0x1234), data + bytes(4096))
    storage = started(tmp_path)
    assert all(storage.read(12, e)[1] == bodies[1 + e] for e in range(30))
    assert storage.is_fenced(12) == (version >= 4)
    assert (storage.explicit_lac(12) is not None) == (version >= 6)
    assert storage.add(12, 30, KEY, packaged(12, 30), True, None) == RC.EOK
    await storage.stop()
    again = started(tmp_path)  # now from the index: lastMark moved past the old journal
    assert again.is_fenced(12) == (version >= 4)
    assert again.explicit_lac(12) == storage.explicit_lac(12)
    assert again.read(12, -1) == (RC.EOK, packaged(12, 30))
    await again.stop()


@twisted_test
async def test_replay_of_a_big_journal_checkpoints_as_it_goes(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable)
    for entry_id in range(3000):
        storage.add(
            entry_id % 5,
            entry_id // 5,
            KEY,
            packaged(entry_id % 5, entry_id // 5, bytes(500)),
            False,
            entry_id,
        )
    await wait_until(lambda: 2999 in durable.tokens)
    abandon(storage)
    again = started(tmp_path, write_cache_max_bytes=100_000)
    assert again.metrics.checkpoints == 0 and again._writer.position > 1_000_000
    assert all(
        again.read(e % 5, e // 5) == (RC.EOK, packaged(e % 5, e // 5, bytes(500))) for e in range(3000)
    )
    await again.stop()


@twisted_test
async def test_replay_stops_on_an_unreadable_index_never_skips_its_records(tmp_path: Path) -> None:
    """Only a ledger known deleted (no index, no key record) has its records skipped; an index that
    cannot be read stops the start with lastMark where it was, naming `bkctl index rebuild`."""
    durable = Durable()
    storage = started(tmp_path, durable)
    for entry_id in range(20):
        storage.add(1, entry_id, KEY, packaged(1, entry_id), False, entry_id)
    await wait_until(lambda: 19 in durable.tokens)
    await storage.checkpoint()
    for entry_id in range(20, 40):
        storage.add(1, entry_id, KEY, packaged(1, entry_id), False, entry_id)
    await wait_until(lambda: 39 in durable.tokens)
    abandon(storage)
    index = tmp_path / "ledgers" / "current" / ixf.index_path(1)
    index.write_bytes(b"XXXX" + index.read_bytes()[4:])
    mark = tmp_path / "ledgers" / "current" / "lastMark"
    mark_before = mark.read_bytes()
    with pytest.raises(CorruptDataError, match=r"ledger 1: .*lastMark not moved.*bkctl index rebuild"):
        Storage(config(tmp_path), Durable(), reactor).start()
    assert mark.read_bytes() == mark_before
