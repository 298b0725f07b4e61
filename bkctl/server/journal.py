"""The journal writer: group commit, fdatasync on a dedicated thread, 512-byte alignment, rolling.

Reactor thread: `append` adds a record's length prefix and body to the pending list (no copy, no
Deferred). Once per reactor tick the pending list goes to the file with one `os.pwritev` (chunked by
IOV_MAX). A group is *committed* (padding record so the next write starts aligned, then a sync request
to the sync thread) when the group wait expires, the buffered bytes or entries threshold is reached,
or at the end of the tick when `flush_when_queue_empty` is set, as BookKeeper's journal does. The
sync thread takes every queued request, fdatasyncs each file once, and hands the whole batch back
with one `callFromThread`; only then are the batch's tokens given to `on_durable`, in journal order.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from twisted.internet.defer import Deferred

from bkctl.protocol import journal_format as jf
from bkctl.server.fileio import drop_cached, reserve, write_all
from bkctl.server.metrics import StorageMetrics

log = logging.getLogger("bkctl.bookie")

JOURNAL_VERSION: Final = jf.VERSION_MAX
_INT32: Final = struct.Struct(">i")
_OPEN_FLAGS: Final = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_NO_SPACE: Final = (errno.ENOSPC, errno.EDQUOT)  # failures `reopen` can go on from

Mark = tuple[int, int]  # (journal id, offset): a position in the journal, as lastMark stores it

# Synced journal bytes dropped from the page cache in one call (see SyncThread._drop_synced).
_DROP_BATCH_BYTES: Final = 1024 * 1024  # local bound


@dataclass(frozen=True)
class JournalSettings:
    directory: Path  # the journal dir's `current/`
    group_wait_ms: float = 2.0
    buffered_bytes_threshold: int = 512 * 1024
    buffered_entries_threshold: int = 0
    flush_when_queue_empty: bool = False
    prealloc_size: int = 16 * 1024 * 1024
    max_size: int = 2 * 1024 * 1024 * 1024
    alignment: int = jf.DEFAULT_ALIGNMENT
    max_backups: int = 5
    sync_data: bool = True
    index: int = 0  # which of the bookie's journals (names its sync thread)


@dataclass
class SyncRequest:
    fd: int
    tokens: list[object]
    entries: int
    mark: Mark  # journal position this request makes durable
    directory_fd: int = -1  # a new journal's directory, fsynced once so the file name is durable
    close_after: bool = False  # the last request of a rolled (or stopped) journal closes its file
    first_append: float = 0.0  # perf_counter of its group's first record (the add latency metrics)


@dataclass
class SyncBatch:
    tokens: list[object]
    entries: int
    mark: Mark
    latency_ms: float
    error: OSError | None = None
    requests: int = 1  # the sync requests it answers
    first_append: float = 0.0  # of its oldest request


@dataclass
class _Group:
    """What has been appended since the last commit."""

    tokens: list[object] = field(default_factory=list)
    entries: int = 0
    size: int = 0
    first_append: float = 0.0  # perf_counter when its first record came


class SyncThread:
    """Drains every pending sync request, fdatasyncs once per file, delivers one batch per drain."""

    def __init__(
        self,
        deliver: Callable[[SyncBatch], None],
        call_from_thread: Callable[..., Any],
        sync_data: bool,
        name: str = "bkctl-journal-sync",
    ) -> None:
        self._deliver = deliver
        self._call_from_thread = call_from_thread
        self._sync_data = sync_data
        self._queue: list[SyncRequest | None] = []
        self._dropped_fd = -1  # the file whose pages before _dropped_to are out of the page cache
        self._dropped_to = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: SyncRequest | None) -> None:
        """Queue a request; None asks the thread to finish after the requests queued before it."""
        with self._cond:
            self._queue.append(request)
            self._cond.notify()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                drained, self._queue = self._queue, []
            requests = [r for r in drained if r is not None]
            if requests:
                self._call_from_thread(self._deliver, self._sync(requests))
            if len(requests) != len(drained):
                return

    def _drop_synced(self, requests: list[SyncRequest]) -> None:
        """Synced journal pages leave the page cache (BookKeeper's journalRemovePagesFromCache)."""
        for request in requests:
            if request.fd != self._dropped_fd:
                self._dropped_fd, self._dropped_to = request.fd, 0
            # Once per MiB, not per fsync: the call sits between the fdatasync and the acks.
            if request.close_after or request.mark[1] - self._dropped_to >= _DROP_BATCH_BYTES:
                self._dropped_to = drop_cached(request.fd, self._dropped_to, request.mark[1])
            if request.close_after:
                self._dropped_fd = -1

    def _sync(self, requests: list[SyncRequest]) -> SyncBatch:
        started = time.perf_counter()
        error = None
        try:
            for request in requests:
                if request.directory_fd >= 0:
                    os.fsync(request.directory_fd)
            if self._sync_data:
                for fd in dict.fromkeys(r.fd for r in requests):
                    os.fdatasync(fd)
                self._drop_synced(requests)
        except OSError as exc:
            error = exc
        finally:
            for request in requests:
                if request.directory_fd >= 0:
                    os.close(request.directory_fd)
                if request.close_after:
                    os.close(request.fd)
        latency_ms = (time.perf_counter() - started) * 1000.0
        tokens = requests[0].tokens if len(requests) == 1 else [t for r in requests for t in r.tokens]
        entries = sum(r.entries for r in requests)
        first = min((r.first_append for r in requests if r.entries), default=0.0)
        return SyncBatch(tokens, entries, requests[-1].mark, latency_ms, error, len(requests), first)


class JournalWriter:
    """Appends records to the current journal file; see the module docstring for the flush rules."""

    def __init__(
        self,
        settings: JournalSettings,
        reactor: Any,
        on_durable: Callable[[list[object]], None],
        metrics: StorageMetrics,
        on_failure: Callable[[OSError, list[object]], None],
    ) -> None:
        self.settings = settings
        self._reactor = reactor
        self._on_durable = on_durable
        self._metrics = metrics
        self._on_failure = on_failure
        # Journal 0's thread keeps the plain name; with several journals each has its own thread.
        name = "bkctl-journal-sync" + (f"-{settings.index}" if settings.index else "")
        self._sync = SyncThread(self._delivered, reactor.callFromThread, settings.sync_data, name)
        self._wait_s = settings.group_wait_ms / 1000.0
        # BookKeeper forces flush-when-queue-empty when there is no group wait.
        self._flush_when_empty = settings.flush_when_queue_empty or settings.group_wait_ms <= 0
        self._prealloc = max(
            settings.alignment, settings.prealloc_size // settings.alignment * settings.alignment
        )
        self.journal_id = -1
        self._fd = -1
        self._directory_fd = -1
        self._position = 0  # where the next appended record goes
        self._written = 0  # how far the file has been written
        self._allocated = 0
        self._iov: list[bytes | bytearray] = []
        self._group = _Group()
        self._tick: Any = None
        self._timer: Any = None
        self.durable_mark: Mark = (-1, 0)
        self.failed: OSError | None = None
        self._in_sync = 0  # requests submitted to the sync thread, not delivered yet
        self._stopped: Deferred[None] | None = None
        self._stop_mark: Mark = (-1, 0)

    # --- life -----------------------------------------------------------------------------------

    def start(self, journal_id: int) -> None:
        self._open(journal_id)
        self._sync.start()

    def stop(self) -> Deferred[None]:
        """Commit what is pending, wait for the last fsync to be delivered, close the file."""
        if self._stopped is not None:
            return self._stopped
        self._stopped = Deferred()
        for call in (self._tick, self._timer):
            if call is not None and call.active():
                call.cancel()
        self._tick = self._timer = None
        if self.failed is None:
            self._write_pending()
        self._stop_mark = self.mark  # after the write: a failed one moves the mark back
        self._submit(self._request(close=True))
        self._sync.submit(None)
        return self._stopped

    @property
    def mark(self) -> Mark:
        """The position after the last appended record: a checkpoint covering every add so far."""
        return self.journal_id, self._position

    @property
    def path(self) -> Path:
        return self.settings.directory / jf.journal_file_name(self.journal_id)

    # --- hot path -------------------------------------------------------------------------------

    def append(self, body: bytes | bytearray, token: object | None) -> None:
        """Queue one record; `token` (if any) goes to on_durable once the record is durable.

        The caller (Storage) appends nothing once `stop` was called.
        """
        size = len(body)
        self._iov.append(_INT32.pack(size))
        self._iov.append(body)
        self._position += 4 + size
        group = self._group
        group.size += 4 + size
        if not group.entries:
            group.first_append = time.perf_counter()
        group.entries += 1
        if token is not None:
            group.tokens.append(token)
        self._metrics.journal_queue_depth += 1
        if self._tick is None or self._timer is None:  # both are set for most records: no call then
            self._schedule()

    def append_token(self, token: object) -> None:
        """Deliver `token` after the next fsync (everything journaled before it is then durable)."""
        self._group.tokens.append(token)
        self._schedule()

    def _schedule(self) -> None:
        if self._tick is None:
            self._tick = self._reactor.callLater(0, self._on_tick)
        if self._timer is None and self._wait_s > 0:
            self._timer = self._reactor.callLater(self._wait_s, self._on_group_wait)

    def _on_tick(self) -> None:
        self._tick = None
        if self.failed is not None or self._stopped is not None:
            return
        self._write_pending()
        group = self._group
        entries_max = self.settings.buffered_entries_threshold
        if (
            self._flush_when_empty
            or group.size >= self.settings.buffered_bytes_threshold
            or (entries_max > 0 and group.entries >= entries_max)
        ):
            self._commit()

    def _on_group_wait(self) -> None:
        self._timer = None
        if self.failed is None and self._stopped is None:
            self._write_pending()
            self._commit()

    # --- commit, write, roll --------------------------------------------------------------------

    def _commit(self) -> None:
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
        group = self._group
        if not group.entries and not group.tokens:
            return
        padding = jf.encode_padding(self._position, self.settings.alignment)
        if padding:
            self._iov.append(padding)
            self._position += len(padding)
        if not self._write_pending():
            return
        roll = self._position >= self.settings.max_size
        self._submit(self._request(close=roll))
        if roll:
            try:
                self._open(self.journal_id + 1)
            except OSError as exc:  # no room for the next file: failed as a write would
                self._fd = -1
                self._fail(exc, [])

    def _submit(self, request: SyncRequest) -> None:
        self._in_sync += 1
        self._sync.submit(request)

    def _request(self, close: bool) -> SyncRequest:
        group, self._group = self._group, _Group()
        request = SyncRequest(
            self._fd,
            group.tokens,
            group.entries,
            self.mark,
            self._directory_fd,
            close_after=close,
            first_append=group.first_append,
        )
        self._directory_fd = -1
        return request

    def _write_pending(self) -> bool:
        """Write the pending records with pwritev; False (and the journal failed) on an I/O error."""
        if self.failed is not None:
            # Never write after a failed write: the file ends short of _position, and a later write
            # (say a commit's padding) would land at a stale offset and ack the failed group's adds.
            self._iov = []
            return False
        if not self._iov:
            return True
        buffers, self._iov = self._iov, []
        try:
            self._allocate(self._position)
            write_all(self._fd, buffers, self._written)
        except OSError as exc:
            # The records never reached the file: the mark (what a checkpoint records) stays where the
            # file's whole records end, and their adds are never acknowledged.
            self._position = self._written
            lost, self._group = self._group.tokens, _Group()
            self._fail(exc, lost)
            return False
        self._written = self._position
        return True

    def _allocate(self, end: int) -> None:
        """Reserve disk blocks in prealloc-size steps so fdatasync rarely has to allocate any.

        The file's size is NOT extended (no zero-filled tail, unlike BookKeeper's zero block at the new
        end): a write cut short by a crash must leave the file ending where it stopped, or replay would
        take the cut record, completed by zeros, as whole (see fileio.reserve).
        """
        if end <= self._allocated:
            return
        new_end = -(-end // self._prealloc) * self._prealloc
        reserve(self._fd, self._allocated, new_end - self._allocated)  # best effort
        self._allocated = new_end

    def _open(self, journal_id: int) -> None:
        """Create journal `journal_id` and make it current; on OSError nothing changed (a file that could
        not take its header is removed: replay would refuse a cut one)."""
        directory = self.settings.directory
        path = directory / jf.journal_file_name(journal_id)
        header = jf.encode_header(JOURNAL_VERSION)
        fd = os.open(path, _OPEN_FLAGS, 0o644)
        try:
            reserve(fd, 0, self._prealloc)  # best effort, as _allocate
            write_all(fd, [header], 0)
            directory_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._fd, self.journal_id, self._directory_fd = fd, journal_id, directory_fd
        self._allocated = self._prealloc
        self._position = self._written = len(header)
        log.info("journal %s opened", path)

    def reopen(self) -> bool:
        """After a failure for lack of space (any other error stays: a failing disk), go on in a new
        journal file (the next id), once the sync thread has delivered everything it had. The failed
        file keeps its whole records (replay ends it at its last one); the adds whose records never
        reached it were never acknowledged, and the tokens queued since the failure are given up as
        lost. False while that is not possible yet."""
        failed = self.failed
        if failed is None or failed.errno not in _NO_SPACE or self._stopped is not None or self._in_sync:
            return False
        old_fd, unsynced_directory = self._fd, self._directory_fd
        try:
            self._open(self.journal_id + 1)
        except OSError as exc:
            log.info("journal still cannot take a new file: %s", exc)
            return False
        for fd in (old_fd, unsynced_directory):  # the failed file's: no request of it is left
            if fd >= 0:
                os.close(fd)
        lost, self._group, self._iov = self._group.tokens, _Group(), []
        if lost:
            self._on_failure(failed, lost)
        log.warning("journal %s: adds are journaled again after %s", self.path, failed)
        self.failed = None
        return True

    def _fail(self, exc: OSError, lost: list[object]) -> None:
        """The journal is broken until `reopen` (lack of space) or a restart; `lost` tokens will never be
        delivered."""
        if self.failed is None:
            self.failed = exc
            log.error("journal %s failed: %s; no more adds are acknowledged", self.path, exc)
        self._on_failure(exc, lost)

    # --- sync thread results (reactor thread) ---------------------------------------------------

    def _delivered(self, batch: SyncBatch) -> None:
        self._in_sync -= batch.requests
        if batch.error is not None:
            self._fail(batch.error, batch.tokens)
        else:
            self.durable_mark = batch.mark
            # Each entry of the batch waited at most this long from its append to now, its ack.
            waited_ms = (time.perf_counter() - batch.first_append) * 1000.0 if batch.entries else 0.0
            self._metrics.observe_fsync(batch.latency_ms, batch.entries, waited_ms, len(batch.tokens))
            if batch.tokens:
                self._on_durable(batch.tokens)
        if self._stopped is not None and batch.mark == self._stop_mark and not self._stopped.called:
            self._stopped.callback(None)


def list_journals(directory: Path) -> list[tuple[int, Path]]:
    """(journal id, path) of every `<hex>.txn` in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    found = ((jf.parse_journal_file_name(p.name), p) for p in directory.iterdir() if p.is_file())
    return sorted((jid, p) for jid, p in found if jid is not None)


def remove_old_journals(directory: Path, mark: Mark, max_backups: int) -> list[Path]:
    """Delete journals wholly before the checkpoint `mark`, keeping the newest `max_backups` of them."""
    older = [p for jid, p in list_journals(directory) if jid < mark[0]]
    doomed = older[: max(0, len(older) - max_backups)]
    for path in doomed:
        path.unlink(missing_ok=True)
        log.info("journal %s removed (checkpoint at journal %x offset %d)", path, mark[0], mark[1])
    return doomed
