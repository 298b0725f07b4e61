"""`bkctl bookie start` on corrupt files, as a real process: a damaged journal header refuses to start with
one line naming the file and offset (exit 7, CORRUPT); a flipped journal record is skipped alone and
every other acknowledged entry is served."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkctl.errors import ExitCode
from bkctl.protocol import wire
from bkctl.server.journal import list_journals
from tests.server.test_corrupt_files import flip, record_offsets
from tests.server_net.live import BookieProcess, metadata_uri
from tests.server_net.test_process import AddStream, check_all_readable, start
from tests.server_net.wire_client import WireClient

pytestmark = pytest.mark.slow


def written_then_killed(base: Path, uri: str) -> tuple[int, dict[int, bytes]]:
    """A bookie process takes adds on ledger 7, then kill -9: (its port, the acknowledged entries)."""
    bookie = start(base, uri, "-p", "0")
    try:
        _, port = bookie.wait_serving()
        stream = AddStream(port)
        stream.wait_acked(500)
        bookie.kill()
        stream.thread.join(10)
    finally:
        bookie.kill()
    return port, dict(stream.acked)


def only_journal(base: Path) -> Path:
    (_, path), *_ = list_journals(base / "journal" / "current")
    return path


def test_damaged_journal_header_refuses_to_start_exit_7(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b1"
    port, _ = written_then_killed(base, uri)
    path = only_journal(base)
    flip(path, 1)  # "BKLG" -> "B?LG"
    again: BookieProcess = start(base, uri, "-p", str(port))
    assert again.wait_exit() == ExitCode.CORRUPT, again.stderr
    errors = [line for line in again.lines if "corrupt journal header" in line]
    assert len(errors) == 1 and f"{path} offset 0" in errors[0], again.stderr


def test_flipped_journal_record_is_skipped_the_rest_served(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b1"
    port, acked = written_then_killed(base, uri)
    path = only_journal(base)
    offset, size = record_offsets(path)[(7, 100)]
    flip(path, offset + 4 + size - 1)
    again = start(base, uri, "-p", str(port))
    try:
        again.wait_serving()
        del acked[100]
        check_all_readable(port, 7, acked)
        with WireClient("127.0.0.1", port) as client:
            assert client.read(7, 100).rc == wire.ReturnCode.ENOENTRY
        assert again.terminate() == 0
    finally:
        again.kill()
    assert f"record at offset {offset} skipped: ledger 7 entry 100: CRC32C digest mismatch" in again.stderr
