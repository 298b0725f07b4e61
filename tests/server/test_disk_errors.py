"""ENOSPC inside the storage engine, on real size-limited tmpfs mounts (root, as in CI; a refused mount
fails the test): a failed journal write never acknowledges its adds (and the journal goes on in a new
file once there is room), a failed checkpoint never moves
lastMark and keeps its entries readable, a short index write is an error, not a silent half page."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from twisted.internet import reactor

from bkctl.files.marks import LAST_MARK_NAME
from bkctl.protocol.wire import ReturnCode
from bkctl.server.storage import Storage
from tests.server.helpers import KEY, Durable, abandon, config, packaged, twisted_test, wait_until

EOK = int(ReturnCode.EOK)
NO_AUTO = 1 << 30  # a write cache no test fills: checkpoints only when the test asks


@contextlib.contextmanager
def tmpfs(directory: Path, size: str) -> Iterator[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)]
    mounted = subprocess.run(mount, capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.fail(
            f"cannot mount a tmpfs on {directory} (needs root): {mounted.stderr.strip()}", pytrace=False
        )
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)


def fill(directory: Path, leave_pages: int = 0) -> Path:
    """Fill the file system to the last page, then free `leave_pages` pages."""
    filler = directory / "filler"
    chunk = b"\xff" * (256 * 1024)
    with filler.open("wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk[:4096])
    if leave_pages:
        os.truncate(filler, max(0, filler.stat().st_size - leave_pages * os.sysconf("SC_PAGE_SIZE")))
    return filler


class Lost(Durable):
    """Collects on_lost batches (adds a failed journal will never make durable)."""


def storage_on(tmp_path: Path, durable: Durable, lost: Lost | None = None, **overrides: Any) -> Storage:
    storage = Storage(config(tmp_path, **overrides), durable, reactor, lost)
    storage.start()
    return storage


def add(storage: Storage, ledger_id: int, entry_id: int, payload: bytes | None = None) -> int:
    return storage.add(
        ledger_id, entry_id, KEY, packaged(ledger_id, entry_id, payload), False, (ledger_id, entry_id)
    )


async def add_durably(
    storage: Storage, durable: Durable, ledger_id: int, count: int, payload: bytes | None = None
) -> None:
    """Entries 0..count-1 added, then every one journaled (`durable` saw nothing before)."""
    for entry_id in range(count):
        assert add(storage, ledger_id, entry_id, payload) == EOK
    await wait_until(lambda: len(durable.tokens) == count)


def assert_readable(storage: Storage, ledger_id: int, entry_ids: range) -> None:
    for entry_id in entry_ids:
        assert storage.read(ledger_id, entry_id) == (EOK, packaged(ledger_id, entry_id)), entry_id


@twisted_test
async def test_failed_journal_write_never_acks_its_adds(tmp_path: Path) -> None:
    durable, lost = Durable(), Lost()
    with tmpfs(tmp_path / "jdisk", "4m") as jdisk:
        storage = storage_on(tmp_path, durable, lost, journal_dirs=(jdisk / "journal",))
        await add_durably(storage, durable, 1, 10)
        fill(jdisk)
        # 2 MiB: past the journal's 1 MiB preallocation, on a full file system.
        assert add(storage, 1, 10, b"x" * (2 << 20)) == EOK
        await wait_until(lambda: bool(lost.tokens))
        await wait_until(lambda: storage.read_only)
        assert lost.tokens == [(1, 10)]
        assert (1, 10) not in durable.tokens  # before the fix: acked after a padding write at a stale offset
        assert add(storage, 1, 11) == int(ReturnCode.EIO)
        assert_readable(storage, 1, range(10))
        abandon(storage)  # kill -9
        os.unlink(jdisk / "filler")
        again = storage_on(tmp_path, Durable(), journal_dirs=(jdisk / "journal",))
        assert_readable(again, 1, range(10))
        await again.stop()


@twisted_test
async def test_a_journal_full_for_lack_of_space_goes_on_in_a_new_file_once_there_is_room(
    tmp_path: Path,
) -> None:
    """Java's bookie shuts down when its journal cannot write; bkctl's stays read-only, serving reads,
    and takes adds again by itself once space is freed (a new journal file, the next id); a kill -9
    then replays both files: nothing acknowledged before or after is lost."""
    durable, lost = Durable(), Lost()
    with tmpfs(tmp_path / "jdisk", "4m") as jdisk:
        journal_dir = jdisk / "journal"
        storage = storage_on(tmp_path, durable, lost, journal_dirs=(journal_dir,))
        await add_durably(storage, durable, 1, 10)
        filler = fill(jdisk)
        assert add(storage, 1, 10, b"x" * (2 << 20)) == EOK  # past the preallocation: ENOSPC
        await wait_until(lambda: storage.read_only)
        storage.check_disk_usage()  # still full: stays read-only
        assert storage.read_only and add(storage, 1, 11) != EOK
        filler.unlink()
        storage.check_disk_usage()
        assert not storage.read_only
        assert len(list((journal_dir / "current").glob("*.txn"))) == 2
        for entry_id in range(11, 21):
            assert add(storage, 1, entry_id) == EOK
        await wait_until(lambda: all((1, e) in durable.tokens for e in range(11, 21)))
        assert lost.tokens == [(1, 10)]
        # The disk check that found room also started a checkpoint of the write cache: let it end, or the
        # abandoned storage's thread would write lastMark beside the next one's (a kill -9 ends it too).
        await storage.when_idle()
        abandon(storage)  # kill -9: replay covers what no checkpoint did, from both journals
        again = storage_on(tmp_path, Durable(), journal_dirs=(journal_dir,))
        assert_readable(again, 1, range(10))
        assert_readable(again, 1, range(11, 21))
        await again.stop()


@twisted_test
async def test_failed_checkpoint_keeps_mark_and_entries_then_recovers(tmp_path: Path) -> None:
    durable = Durable()
    with tmpfs(tmp_path / "ldisk", "4m") as ldisk:
        ledgers = (ldisk / "ledgers",)
        storage = storage_on(
            tmp_path, durable, ledger_dirs=ledgers, disk_usage_threshold=1.0, write_cache_max_bytes=NO_AUTO
        )
        mark_path = ledgers[0] / "current" / LAST_MARK_NAME
        await add_durably(storage, durable, 1, 100, b"y" * 20_000)
        mark_before = mark_path.read_bytes()
        filler = fill(ldisk)
        with pytest.raises(OSError):
            await storage.checkpoint()
        assert mark_path.read_bytes() == mark_before  # lastMark never passes what did not reach the log
        assert storage.read_only
        assert add(storage, 2, 0) == int(ReturnCode.EREADONLY)
        for entry_id in range(100):  # still in the write cache
            assert storage.read(1, entry_id) == (EOK, packaged(1, entry_id, b"y" * 20_000))
        # The failed writes were cut off the entry log: no garbage in its middle, space given back.
        log_path = storage._writer.path
        assert log_path.stat().st_size == storage._writer.position

        filler.unlink()
        storage.check_disk_usage()
        assert not storage.read_only
        await wait_until(lambda: storage._running is None and not storage._active)
        assert mark_path.read_bytes() != mark_before
        assert add(storage, 2, 0) == EOK
        await wait_until(lambda: len(durable.tokens) == 101)
        abandon(storage)  # kill -9
        again = storage_on(tmp_path, Durable(), ledger_dirs=ledgers)
        for entry_id in range(100):
            assert again.read(1, entry_id) == (EOK, packaged(1, entry_id, b"y" * 20_000))
        assert again.read(2, 0) == (EOK, packaged(2, 0))
        await again.stop()


@twisted_test
async def test_failed_checkpoint_then_kill_replays_everything(tmp_path: Path) -> None:
    durable = Durable()
    with tmpfs(tmp_path / "ldisk", "4m") as ldisk:
        ledgers = (ldisk / "ledgers",)
        storage = storage_on(
            tmp_path, durable, ledger_dirs=ledgers, disk_usage_threshold=1.0, write_cache_max_bytes=NO_AUTO
        )
        await add_durably(storage, durable, 1, 200)
        fill(ldisk)
        with pytest.raises(OSError):
            await storage.checkpoint()
        abandon(storage)
        os.unlink(ldisk / "filler")
        again = storage_on(tmp_path, Durable(), ledger_dirs=ledgers)
        assert_readable(again, 1, range(200))
        await again.stop()


@twisted_test
async def test_short_index_write_fails_the_checkpoint(tmp_path: Path) -> None:
    """One free page: the index page write is cut short. Before the fix the short pwrite went unseen,
    lastMark moved past entries whose slots never reached the file, and a restart lost them."""
    durable = Durable()
    with tmpfs(tmp_path / "idisk", "2m") as idisk:
        index_dirs = (idisk / "index",)
        storage = storage_on(
            tmp_path, durable, index_dirs=index_dirs, disk_usage_threshold=1.0, write_cache_max_bytes=NO_AUTO
        )
        await add_durably(storage, durable, 1, 1000)
        fill(idisk, leave_pages=1)
        with pytest.raises(OSError):
            await storage.checkpoint()
        assert storage.read_only
        assert_readable(storage, 1, range(1000))
        abandon(storage)  # kill -9
        os.unlink(idisk / "filler")
        again = storage_on(tmp_path, Durable(), index_dirs=index_dirs)
        assert_readable(again, 1, range(1000))
        await again.stop()
