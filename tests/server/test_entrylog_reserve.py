"""The entry log writer reserves disk blocks ahead of its writes (file size unchanged) and gives them back
when a log is finished: on real files of this machine's file system."""

from __future__ import annotations

import os
from pathlib import Path

from bkctl.protocol import entrylog_format as ef
from bkctl.server.entrylog import RESERVE_AHEAD, EntryLogWriter


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def stored(ledger_id: int, entry_id: int, size: int) -> bytes:
    return ledger_id.to_bytes(8, "big") + entry_id.to_bytes(8, "big") + bytes(size - 16)


def test_blocks_are_reserved_ahead_and_given_back_at_rotation_and_close(tmp_path: Path) -> None:
    (tmp_path / "current").mkdir()
    writer = EntryLogWriter((tmp_path,), 64 * 1024 * 1024)
    writer.open_next(0)
    first = writer.path
    for entry_id in range(1000):
        writer.append(1, stored(1, entry_id, 1024))
    writer.flush()
    size = os.stat(first).st_size
    assert size == writer.position  # the reservation never shows in the file's size
    assert allocated(first) >= size + RESERVE_AHEAD // 2

    writer.rotate()
    assert allocated(first) < os.stat(first).st_size + 64 * 1024  # given back: only the data's blocks
    header = ef.decode_header(first.read_bytes()[: ef.HEADER_SIZE])
    assert header.ledgers_count == 1  # a whole, readable log

    second = writer.path
    writer.append(2, stored(2, 0, 100))
    writer.close()
    assert allocated(second) < os.stat(second).st_size + 64 * 1024


def test_a_log_larger_than_the_reservation_keeps_every_byte(tmp_path: Path) -> None:
    (tmp_path / "current").mkdir()
    writer = EntryLogWriter((tmp_path,), 1024 * 1024 * 1024)
    writer.open_next(0)
    path = writer.path
    payload = stored(3, 0, 64 * 1024)
    count = (RESERVE_AHEAD * 3) // len(payload)
    locations = [writer.append(3, stored(3, entry_id, len(payload))) for entry_id in range(count)]
    writer.close()
    data = path.read_bytes()
    for entry_id in (0, count // 2, count - 1):
        _log_id, offset = ef.split_location(locations[entry_id])
        assert data[offset : offset + 16] == stored(3, entry_id, 16)
