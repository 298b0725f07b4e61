"""One process per bookie directory: an exclusive lock file in every journal, ledger and index directory.

Two bookies on one directory lose acknowledged entries: the second writes a lastMark that points past
the first one's unflushed journal, and the first skips that journal at its next start. So a bookie, and
every offline command that writes into a bookie's directories (`bookie format`, `cookie update`), holds
`bkctl.lock` in each directory for as long as it runs. The lock is `flock(LOCK_EX | LOCK_NB)` on an open
file: the kernel drops it when the process dies (kill -9 included), so it is never stale; the file stays
and says who held it last. It sits beside `current/`, never in it: Java and the inspect commands read
only `current/`, and inspect never takes or creates a lock (it modifies nothing).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from bkctl.errors import DirectoryLockedError, ReadOnlyError, UnavailableError, UsageError

LOCK_FILE = "bkctl.lock"
HOLDER_SIZE_MAX = 4096  # local bound


class DirectoryLocks:
    """The locks one process holds; `release()` (idempotent) lets the next process in."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}

    @property
    def directories(self) -> list[Path]:
        return list(self._fds)

    def acquire(self, directory: Path, what: str, holder: str) -> None:
        """Lock `directory` (created if absent) or raise a one-line error naming who holds it."""
        path = directory.resolve()
        if path in self._fds:
            return  # the same directory named twice (e.g. journal and ledger dir alike)
        fd = _open_lock_file(path, what)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            held_by = _read_holder(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise DirectoryLockedError(
                f"{what} {directory} is in use by another process ({held_by}): "
                "stop it first (one bookie per directory)"
            ) from None
        _write_holder(fd, holder)
        self._fds[path] = fd

    def release(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the last descriptor drops the flock
        self._fds.clear()


def lock_directories(
    dirs: Iterable[tuple[str, Path]], holder: str, *, existing_only: bool = False
) -> DirectoryLocks:
    """Lock every (kind, directory) or none: on a refusal the ones taken so far are released.

    `existing_only`: skip directories that do not exist (an offline command creates none).
    """
    locks = DirectoryLocks()
    try:
        for what, directory in dirs:
            if not (existing_only and not directory.exists()):
                locks.acquire(directory, what, holder)
    except BaseException:
        locks.release()
        raise
    return locks


@contextlib.contextmanager
def locked(dirs: Iterable[tuple[str, Path]], command: str) -> Iterator[DirectoryLocks]:
    """`with locked(...)`: for the offline commands that write into existing bookie directories."""
    locks = lock_directories(dirs, holder_text(command), existing_only=True)
    try:
        yield locks
    finally:
        locks.release()


def holder_text(command: str) -> str:
    return f"pid {os.getpid()}, {command}, since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"


def _open_lock_file(path: Path, what: str) -> int:
    if path.exists() and not path.is_dir():
        raise UsageError(f"{what} {path} is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        return os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except PermissionError:
        raise ReadOnlyError(f"{what} {path} is not writable (permission denied)") from None
    except OSError as exc:
        if exc.errno == errno.EROFS:
            raise ReadOnlyError(f"{what} {path} is on a read-only file system") from None
        if exc.errno == errno.ENOTDIR:
            raise UsageError(f"{what} {path}: a parent is not a directory") from None
        raise UnavailableError(f"{what} {path} cannot be used: {exc.strerror}") from None


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, HOLDER_SIZE_MAX, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"


def _write_holder(fd: int, holder: str) -> None:
    """Who holds the lock, for the next process's message (best effort: the flock is what counts)."""
    with contextlib.suppress(OSError):
        data = holder.encode()[:HOLDER_SIZE_MAX]
        os.ftruncate(fd, 0)
        os.pwrite(fd, data + b"\n", 0)
