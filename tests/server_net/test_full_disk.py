"""Full disks with a real `bkctl bookie start` process whose directories sit on a small tmpfs.

Above diskUsageThreshold the bookie turns read-only and registers so, and writable again under
diskUsageLwmThreshold; ENOSPC on a journal write or on an entry log write during a checkpoint fails the
affected adds (never an acknowledgement), turns the bookie read-only, and every entry acknowledged before
stays readable, also after kill -9 and a restart on the same directories once space is freed.

The tests mount tmpfs (root here and in CI); a refused mount fails them, it never skips them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bkctl.protocol import wire
from tests.server_net.live import BookieProcess, metadata_uri, registrations_of
from tests.server_net.test_process import check_all_readable as check_readable
from tests.server_net.wire_client import MASTER_KEY, WireClient, package

pytestmark = pytest.mark.slow

EOK = wire.ReturnCode.EOK
WAIT_S = 30.0
TMPFS_SIZE = "32m"


@contextlib.contextmanager
def tmpfs(directory: Path, size: str = TMPFS_SIZE) -> Iterator[Path]:
    """`directory` on a fresh size-limited tmpfs for the duration of the block."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.fail(
            f"cannot mount a tmpfs on {directory} (these tests need root): {mounted.stderr.strip()}",
            pytrace=False,
        )
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)


def fill(directory: Path, leave_fraction: float = 0.0) -> Path:
    """A filler file that leaves `leave_fraction` of the filesystem free (0: full, ENOSPC for anything)."""
    filler = directory / "filler"
    usage = shutil.disk_usage(directory)
    target = max(0, usage.free - int(usage.total * leave_fraction))
    chunk = b"\xff" * (64 * 1024)
    with filler.open("wb", buffering=0) as f:
        written = 0
        try:
            while written < target:
                written += f.write(chunk[: min(len(chunk), target - written)])
            if leave_fraction == 0.0:
                while True:  # the last pages, whatever statvfs said
                    f.write(chunk[:4096])
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def wait_for(
    what: str, condition: Callable[[], bool], bookie: BookieProcess, timeout_s: float = WAIT_S
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s} s; bookie stderr:\n{bookie.stderr}")
        time.sleep(0.05)


def write_conf(path: Path, **keys: str) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    return path


def start(
    base: Path, uri: str, journal: Path, ledgers: Path, port: int = 0, keys: dict[str, str] | None = None
) -> BookieProcess:
    conf = write_conf(
        base / "bk_server.conf",
        journalPreAllocSizeMB="1",
        journalMaxGroupWaitMSec="1",
        diskCheckInterval="100",
        **(keys or {}),
    )
    args = ["-c", str(conf), "-j", str(journal), "-l", str(ledgers), "-p", str(port), "--metadata", uri]
    return BookieProcess(args)


class Writer:
    """Adds to one ledger on a thread, one at a time, until stopped or the bookie stops acknowledging.

    `acked` holds every entry answered EOK; `refused` the first non-EOK answer or connection error.
    """

    def __init__(self, port: int, ledger_id: int, payload_size: int = 4000, pause_s: float = 0.0) -> None:
        self.port = port
        self.pause_s = pause_s
        self.ledger_id = ledger_id
        self.payload_size = payload_size
        self.acked: dict[int, bytes] = {}
        self.refused: str | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def payload(self, entry_id: int) -> bytes:
        return f"{self.ledger_id}:{entry_id}:".encode().ljust(self.payload_size, b"x")

    def _run(self) -> None:
        entry_id = 0
        try:
            with WireClient("127.0.0.1", self.port, timeout_s=10) as client:
                window = 16
                while not self._stop.is_set() and self.refused is None:
                    batch = list(range(entry_id, entry_id + window))
                    client.send_payloads(
                        wire.encode_add_request(package(self.ledger_id, e, self.payload(e)), MASTER_KEY)
                        for e in batch
                    )
                    for response in client.receive(len(batch)):
                        assert isinstance(response, wire.AddResponse)
                        if response.rc == EOK:
                            self.acked[response.entry_id] = self.payload(response.entry_id)
                        elif self.refused is None:
                            self.refused = f"rc {response.rc}"
                    entry_id += window
                    time.sleep(self.pause_s)
        except (OSError, ConnectionError) as exc:
            self.refused = f"connection: {exc}"

    def stop(self) -> dict[int, bytes]:
        self._stop.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive()
        return dict(self.acked)


def is_read_only(uri: str, bookie_id: str) -> bool:
    rw, ro = registrations_of(uri)
    return bookie_id in ro and bookie_id not in rw


def is_read_write(uri: str, bookie_id: str) -> bool:
    rw, ro = registrations_of(uri)
    return bookie_id in rw and bookie_id not in ro


def add_rc(port: int, ledger_id: int, entry_id: int) -> int | str:
    """One add on a fresh connection: its return code, or the connection error."""
    try:
        with WireClient("127.0.0.1", port, timeout_s=10) as client:
            return int(client.add(ledger_id, entry_id, b"probe").rc)
    except (OSError, ConnectionError) as exc:
        return f"connection: {exc}"


def test_threshold_read_only_and_back_registered_so(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    with tmpfs(tmp_path / "disk") as disk:
        bookie = start(tmp_path, uri, disk / "journal", disk / "ledgers")
        try:
            bookie_id, port = bookie.wait_serving()
            wait_for("registered read-write", lambda: is_read_write(uri, bookie_id), bookie)
            writer = Writer(port, 1, pause_s=0.05)  # slow: the disk check must see the disk first
            wait_for("adds acknowledged", lambda: len(writer.acked) >= 50, bookie)
            filler = fill(disk, leave_fraction=0.03)  # 97% used: above diskUsageThreshold 0.95
            wait_for("registered read-only", lambda: is_read_only(uri, bookie_id), bookie)
            wait_for("the writer refused", lambda: writer.refused is not None, bookie)
            acked = writer.stop()
            assert writer.refused == f"rc {int(wire.ReturnCode.EREADONLY)}", writer.refused
            assert add_rc(port, 2, 0) == wire.ReturnCode.EREADONLY
            check_readable(port, 1, acked)

            filler.unlink()  # far below diskUsageLwmThreshold 0.90
            wait_for("registered read-write again", lambda: is_read_write(uri, bookie_id), bookie)
            assert add_rc(port, 2, 0) == EOK
            check_readable(port, 1, acked)
            assert bookie.terminate() == 0
        finally:
            bookie.kill()
    assert "above the threshold: read-only" in bookie.stderr
    assert "below the low-water mark: writable again" in bookie.stderr


def restart_and_check(
    tmp_path: Path,
    uri: str,
    journal: Path,
    ledgers: Path,
    port: int,
    acked: dict[int, bytes],
    keys: dict[str, str],
) -> None:
    """kill -9 happened and space was freed: a new process on the same dirs serves every acked entry."""
    again = start(tmp_path, uri, journal, ledgers, port, keys)
    try:
        again.wait_serving()
        try:
            check_readable(port, 1, acked)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; restarted bookie's stderr:\n{again.stderr}") from None
        assert add_rc(port, 3, 0) == EOK
        assert again.terminate() == 0
    finally:
        again.kill()


def test_enospc_on_journal_write_fails_adds_and_keeps_acked_entries(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    ledgers = tmp_path / "ledgers"
    keys = {"diskUsageThreshold": "1.0", "diskUsageLwmThreshold": "1.0"}  # only ENOSPC can stop it
    with tmpfs(tmp_path / "jdisk", "8m") as jdisk:
        bookie = start(tmp_path, uri, jdisk / "journal", ledgers, keys=keys)
        try:
            bookie_id, port = bookie.wait_serving()
            writer = Writer(port, 1)
            wait_for("adds acknowledged", lambda: len(writer.acked) >= 50, bookie)
            fill(jdisk)  # 100%: the next journal block cannot be had
            wait_for("the writer refused", lambda: writer.refused is not None, bookie)
            acked = writer.stop()
            wait_for("registered read-only", lambda: is_read_only(uri, bookie_id), bookie)
            assert add_rc(port, 2, 0) == wire.ReturnCode.EIO
            check_readable(port, 1, acked)
        finally:
            bookie.kill()  # kill -9
        assert "no more adds are acknowledged" in bookie.stderr
        os.unlink(jdisk / "filler")
        restart_and_check(tmp_path, uri, jdisk / "journal", ledgers, port, acked, keys)


def test_enospc_on_entry_log_during_checkpoint_read_only_then_back(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    journal = tmp_path / "journal"
    # A 1 MiB write cache: a checkpoint every 32-96 KiB of adds.
    keys = {"diskUsageThreshold": "1.0", "diskUsageLwmThreshold": "0.9", "skipListSizeLimit": str(1 << 20)}
    with tmpfs(tmp_path / "ldisk", "8m") as ldisk:
        bookie = start(tmp_path, uri, journal, ldisk / "ledgers", keys=keys)
        try:
            bookie_id, port = bookie.wait_serving()
            writer = Writer(port, 1)
            wait_for("adds acknowledged", lambda: len(writer.acked) >= 50, bookie)
            filler = fill(ldisk)
            wait_for("the writer refused", lambda: writer.refused is not None, bookie)
            acked = writer.stop()
            assert writer.refused == f"rc {int(wire.ReturnCode.EREADONLY)}", writer.refused
            wait_for("registered read-only", lambda: is_read_only(uri, bookie_id), bookie)
            check_readable(port, 1, acked)  # from the write cache a failed checkpoint kept

            filler.unlink()
            wait_for("registered read-write again", lambda: is_read_write(uri, bookie_id), bookie)
            assert add_rc(port, 2, 0) == EOK
            check_readable(port, 1, acked)
            fill(ldisk)  # full again; nothing checkpoints after the kill
        finally:
            bookie.kill()  # kill -9
        assert "checkpoint could not write" in bookie.stderr
        os.unlink(ldisk / "filler")
        restart_and_check(tmp_path, uri, journal, ldisk / "ledgers", port, acked, keys)
