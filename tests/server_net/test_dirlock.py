"""One bookie per directory, and bookie start's bad environments answered in one line.

A second bookie on a directory in use is refused before it reads or writes anything there (exit 13,
naming the holder's pid); a port in use is exit 6; a read-only directory exit 12; a journal "directory"
that is a file exit 2. The lock dies with its process: a kill -9'd bookie's directories start again.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from bkctl.errors import DirectoryLockedError, ExitCode, UnavailableError
from bkctl.server.dirlock import LOCK_FILE, lock_directories
from tests.server_net.live import BookieProcess, metadata_uri, start_bookie, twisted_test
from tests.server_net.test_commands import bkctl, dirs

pytestmark = pytest.mark.slow


def bookie_start(*args: str) -> subprocess.CompletedProcess[str]:
    return bkctl("bookie", "start", *args)


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("bkctl: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_second_bookie_on_the_same_directories_is_refused(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b4"
    first = BookieProcess([*dirs(base), "--metadata", uri, "-p", "0", "--bookie-id", "127.0.0.1:4501"])
    try:
        first.wait_serving()
        journal_files = sorted((base / "journal" / "current").iterdir())
        # Same bookie id, another port, and again with only the ledger directory shared.
        for args in (
            [*dirs(base), "-p", "0", "--bookie-id", "127.0.0.1:4501"],
            ["-j", str(tmp_path / "other-journal"), "-l", str(base / "ledgers"), "-p", "0"],
        ):
            second = bookie_start(*args, "--metadata", uri)
            assert second.returncode == ExitCode.LOCKED, second.stderr
            line = one_line(second.stderr)
            assert f"is in use by another process (pid {first.proc.pid}, bkctl bookie start" in line
        # It touched nothing: no journal of its own, no lastMark.
        assert sorted((base / "journal" / "current").iterdir()) == journal_files
        assert not (base / "ledgers" / "current" / "lastMark").exists() or first.proc.poll() is None
        assert first.terminate() == 0
    finally:
        first.kill()


def test_the_lock_dies_with_a_killed_bookie(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b1"
    first = BookieProcess([*dirs(base), "--metadata", uri, "-p", "0", "--bookie-id", "127.0.0.1:4502"])
    first.wait_serving()
    first.kill()
    assert (base / "journal" / LOCK_FILE).exists()  # the file stays; the flock went with the process
    again = BookieProcess([*dirs(base), "--metadata", uri, "-p", "0", "--bookie-id", "127.0.0.1:4502"])
    try:
        again.wait_serving(60)  # it may wait for the killed one's registration to expire
        assert again.terminate() == 0
    finally:
        again.kill()


@twisted_test
async def test_in_process_second_service_is_refused_and_the_first_keeps_serving(tmp_path: Path) -> None:
    same = {"bookieId": "127.0.0.1:4503"}
    first = await start_bookie(tmp_path, "b1", **same)
    try:
        with pytest.raises(DirectoryLockedError, match=f"pid {os.getpid()}"):
            await start_bookie(tmp_path, "b1", **same)
        assert first.state == "read-write"
    finally:
        await first.stop()
    second = await start_bookie(tmp_path, "b1", **same)  # released at stop
    await second.stop()


def test_port_in_use_is_unavailable(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = bookie_start(*dirs(tmp_path / "b1"), "-p", str(port), "--metadata", metadata_uri(tmp_path))
    assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
    assert f"cannot listen on port 127.0.0.1:{port}: Address already in use" in one_line(result.stderr)


def test_read_only_ledger_directory(tmp_path: Path) -> None:
    """Mode bits stop a normal user; root ignores them, and sysfs refuses it the same way."""
    ledgers = tmp_path / "ledgers" if os.geteuid() else Path("/sys/bkctl-test-ledgers")
    if os.geteuid():
        ledgers.mkdir()
        ledgers.chmod(0o555)
    try:
        result = bookie_start(
            "-j", str(tmp_path / "j"), "-l", str(ledgers), "--metadata", metadata_uri(tmp_path)
        )
    finally:
        if os.geteuid():
            ledgers.chmod(0o755)
    assert result.returncode == ExitCode.READ_ONLY, result.stderr
    assert f"ledger directory {ledgers} is not writable" in one_line(result.stderr)
    assert not (tmp_path / "j" / "current").exists()  # refused before anything was written


def test_unusable_directory_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UnavailableError, match="cannot be used: No such file or directory"):
        lock_directories([("ledger directory", Path("/proc/self/bkctl-ledgers"))], "test")


def test_journal_directory_that_is_a_file(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.write_text("not a directory\n")
    result = bookie_start("-j", str(journal), "-l", str(tmp_path / "l"), "--metadata", metadata_uri(tmp_path))
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert one_line(result.stderr) == f"bkctl: error: journal directory {journal} is not a directory"
