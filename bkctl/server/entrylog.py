"""Entry logs: the writer (checkpoint thread) with rotation at logSizeLimit, and the pread reader.

The writer appends stored entries to `<ledger dir>/current/<hex id>.log` (header version 1) in
buffered writes. When the next record would pass `log_size_limit`, the log is rotated: the ledgers map
(bytes per ledger) is appended, its offset and count are patched into the header, the file is
fsynced and closed, and the next id is opened (and written to `lastId`). Logs are spread over the
ledger dirs round-robin by id. The log being written at shutdown keeps no map, as Java's does; readers
then scan it. We never append to a log we did not create: on start a new id follows every existing one.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Final

from bkctl import limits
from bkctl.errors import CorruptDataError, ProtocolError
from bkctl.protocol import entrylog_format as ef
from bkctl.server.fileio import drop_cached, write_all, write_durably, write_out

log = logging.getLogger("bkctl.bookie")

LAST_ID_NAME: Final = "lastId"
# Buffered bytes before a write: big writes, bounded memory.
WRITE_BUFFER_SIZE: Final = 4 * 1024 * 1024
# Entry log files kept open for reads.
READ_FDS_MAX: Final = 64  # local bound
_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_SIZE_PREFIX: Final = 4
_FRESH_HEADER: Final = ef.encode_header(ef.EntryLogHeader(ef.HEADER_V1))


def current_dirs(ledger_dirs: Iterable[Path]) -> list[Path]:
    return [d / "current" for d in ledger_dirs]


def existing_log_ids(ledger_dirs: Iterable[Path]) -> dict[int, Path]:
    """Every `<hex>.log` in the ledger dirs' `current/`."""
    found: dict[int, Path] = {}
    for directory in current_dirs(ledger_dirs):
        if directory.is_dir():
            for path in directory.iterdir():
                log_id = ef.parse_log_file_name(path.name)
                if log_id is not None:
                    found[log_id] = path
    return found


def last_log_id(ledger_dirs: Iterable[Path]) -> int:
    """The highest log id named by a `lastId` file or an existing log; -1 when there is none."""
    dirs = list(ledger_dirs)
    highest = max(existing_log_ids(dirs), default=-1)
    for directory in current_dirs(dirs):
        path = directory / LAST_ID_NAME
        if path.is_file():
            try:
                highest = max(highest, ef.decode_last_id(path.read_bytes()[: ef.LAST_ID_SIZE_MAX + 1]))
            except ProtocolError as exc:
                log.warning("%s: ignoring unreadable lastId: %s", path, exc)
    return highest


class EntryLogWriter:
    """Appends stored entries; used by one thread at a time (the checkpoint, or replay in start)."""

    def __init__(self, ledger_dirs: tuple[Path, ...], log_size_limit: int) -> None:
        self._dirs = current_dirs(ledger_dirs)
        self.log_size_limit = max(log_size_limit, ef.HEADER_SIZE + 64)
        self.log_id = -1
        self._fd = -1
        self.position = 0  # file offset after the buffered bytes
        # Two buffers: one fills while a worker thread pwrites the other, so the kernel's page-cache work
        # (slow on first touch in VMs) overlaps our Python work. (pwritev straight from the entries'
        # buffers was measured slower: a thousand small iovecs per call cost more than one copy.)
        self._buffer = bytearray(WRITE_BUFFER_SIZE)
        self._spare = bytearray(WRITE_BUFFER_SIZE)
        self._filled = 0
        self._pending: Future[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._buffer_offset = 0
        self._sizes: dict[int, int] = {}
        self._dropped_to = 0  # the current log's bytes before this are out of the page cache
        self.rotations = 0
        # Where the current log's fsynced bytes end, and its ledgers map then (see discard_unflushed).
        self._flushed: tuple[int, dict[int, int]] = (0, {})
        # (log id, end of its fsynced bytes), replaced whole so another thread reads a consistent pair:
        # past that end a record may be half written (the read-ahead stops there).
        self.durable: tuple[int, int] = (-1, 0)

    @property
    def path(self) -> Path:
        return self._dirs[self.log_id % len(self._dirs)] / ef.log_file_name(self.log_id)

    def open_next(self, after_id: int) -> None:
        log_id = after_id + 1
        if log_id >= 1 << 31:  # location words hold 31-bit log ids; Java wraps to 0 as well
            log_id = 0
        self.log_id = log_id
        path = self.path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | _CLOEXEC, 0o644)
        self.position = self._buffer_offset = ef.HEADER_SIZE
        self._sizes = {}
        self._dropped_to = 0
        self._flushed = (self.position, {})
        self.durable = (log_id, self.position)
        write_all(self._fd, [_FRESH_HEADER], 0)
        _write_last_id(path.parent, log_id)
        log.info("entry log %s opened", path)

    def append(self, ledger_id: int, stored_entry: bytes | memoryview) -> int:
        """Buffer one entry (copied); returns its index location (log id << 32 | offset after the size)."""
        size = len(stored_entry)
        record_size = _SIZE_PREFIX + size
        if self.position + record_size > self.log_size_limit and self.position > ef.HEADER_SIZE:
            self.rotate()
        prefix = ef.encode_record_size(size)
        buffer, filled = self._buffer, self._filled
        if filled + record_size > WRITE_BUFFER_SIZE:
            self._write_buffer(wait=False)
            buffer, filled = self._buffer, 0
        if record_size > WRITE_BUFFER_SIZE:
            write_all(self._fd, [prefix, stored_entry], self.position)
            self._buffer_offset = self.position + record_size
        else:
            buffer[filled : filled + _SIZE_PREFIX] = prefix
            buffer[filled + _SIZE_PREFIX : filled + record_size] = stored_entry
            self._filled = filled + record_size
        offset = self.position + _SIZE_PREFIX
        self.position += record_size
        self._sizes[ledger_id] = self._sizes.get(ledger_id, 0) + record_size
        return ef.entry_location(self.log_id, offset)

    @property
    def fresh(self) -> bool:
        """Nothing written to the current log yet."""
        return self.position <= ef.HEADER_SIZE

    def room(self) -> int:
        """Record bytes that still fit before rotation; a fresh log takes any record, however big."""
        if self.position <= ef.HEADER_SIZE:
            return 1 << 62
        return max(0, self.log_size_limit - self.position)

    def append_records(self, records: memoryview) -> None:
        """Buffer whole entry log records (size prefix + stored entry each) with one copy per buffer.

        The caller made sure they fit (`room`), knows their locations (they start at `position`) and
        reports their bytes per ledger with `count_ledger_bytes`.
        """
        copied = 0
        total = len(records)
        while copied < total:  # each pass copies at least one byte: the buffer is emptied when full
            if self._filled == WRITE_BUFFER_SIZE:
                self._write_buffer(wait=False)
            filled = self._filled
            part = min(total - copied, WRITE_BUFFER_SIZE - filled)
            self._buffer[filled : filled + part] = records[copied : copied + part]
            self._filled = filled + part
            self.position += part
            copied += part

    def append_spans(self, records: memoryview, spans: list[int]) -> None:
        """`append_records` of several slices of `records` (flat start, stop pairs), in order: each
        copied straight into the buffer (replay over several ledger dirs: a dir's records interleave
        with the others' in the journal)."""
        for i in range(0, len(spans), 2):
            start, stop = spans[i], spans[i + 1]
            size, filled = stop - start, self._filled
            if filled + size <= WRITE_BUFFER_SIZE:
                self._buffer[filled : filled + size] = records[start:stop]
                self._filled = filled + size
                self.position += size
            else:
                self.append_records(records[start:stop])

    def write_records(self, ledger_id: int, records: memoryview) -> int:
        """Write one ledger's whole entry log records at `position` with one pwrite; returns that offset.

        Pending buffered bytes go first. The caller made sure they fit (`room`). The big write runs
        without the GIL, so the reactor thread keeps serving while the checkpoint copies megabytes.
        """
        return self.write_block(records, {ledger_id: len(records)})

    def write_block(self, records: memoryview, sizes: dict[int, int]) -> int:
        """`write_records` for records of several ledgers (`sizes`: their bytes per ledger)."""
        self._write_buffer()
        position = self.position
        write_all(self._fd, [records], position)
        self.position = self._buffer_offset = position + len(records)
        self.count_ledger_bytes(sizes)
        return position

    def count_ledger_bytes(self, sizes: dict[int, int]) -> None:
        """Add bytes written per ledger (by `append_records`) to this log's ledgers map."""
        for ledger_id, size in sizes.items():
            self._sizes[ledger_id] = self._sizes.get(ledger_id, 0) + size

    def flush(self) -> None:
        """Write the buffer and fsync the current log (rotated logs were fsynced when rotated)."""
        self._write_buffer()
        if self._fd >= 0:
            write_out(self._fd, self._flushed[0], self.position)
            os.fsync(self._fd)
            self._flushed = (self.position, dict(self._sizes))
            self.durable = (self.log_id, self.position)
            self._dropped_to = drop_cached(self._fd, self._dropped_to, self.position)

    def discard_unflushed(self) -> None:
        """After a failed write (ENOSPC): forget everything since the last fsync and cut the file there.

        No index slot points past that fsync (slots are written after it), so the next checkpoint
        rewrites its entries where the failed ones were: no hole of garbage in the middle of the log for
        sequential scanners to stop at, and the cut frees the space the failed writes took.
        """
        with contextlib.suppress(OSError):  # the failure being handled
            self._wait()
        self._filled = 0
        position, sizes = self._flushed
        self.position = self._buffer_offset = position
        self._sizes = dict(sizes)
        if self._fd >= 0:
            os.ftruncate(self._fd, position)
            if position <= ef.HEADER_SIZE:  # the failed write may have been the header of a fresh log
                write_all(self._fd, [_FRESH_HEADER], 0)

    def rotate(self) -> None:
        self._write_buffer()
        map_offset = self.position
        ledgers_map = ef.encode_ledgers_map(sorted(self._sizes.items()))
        write_all(self._fd, [ledgers_map], map_offset)
        header = ef.EntryLogHeader(ef.HEADER_V1, map_offset, len(self._sizes))
        write_all(self._fd, [ef.encode_header(header)], 0)
        write_out(self._fd, self._flushed[0], map_offset + len(ledgers_map))
        os.fsync(self._fd)
        drop_cached(self._fd, self._dropped_to, 1 << 62)  # the whole finished log
        os.close(self._fd)
        log.info("entry log %s rotated at %d bytes (%d ledgers)", self.path, map_offset, len(self._sizes))
        self.rotations += 1
        self.open_next(self.log_id)

    def close(self) -> None:
        if self._fd >= 0:
            self.flush()
            os.close(self._fd)
            self._fd = -1
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _write_buffer(self, wait: bool = True) -> None:
        """Hand the filled buffer to the write thread; with `wait`, return once everything is written."""
        if self._filled:
            self._wait()
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="bkctl-entrylog-write")
            view = memoryview(self._buffer)[: self._filled]
            self._pending = self._executor.submit(write_all, self._fd, [view], self._buffer_offset)
            self._pending.add_done_callback(lambda _: view.release())
            self._buffer, self._spare = self._spare, self._buffer
            self._filled = 0
        self._buffer_offset = self.position
        if wait:
            self._wait()

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()  # re-raises the write's OSError here


def _write_last_id(directory: Path, log_id: int) -> None:
    write_durably(directory / LAST_ID_NAME, ef.encode_last_id(log_id))


class EntryLogReader:
    """Reads one stored entry at an index location with two preads; keeps a few files open."""

    def __init__(self, ledger_dirs: tuple[Path, ...]) -> None:
        self._dirs = current_dirs(ledger_dirs)
        self._fds: OrderedDict[int, tuple[int, Path]] = OrderedDict()

    def read(self, location: int, ledger_id: int, entry_id: int) -> bytes:
        """The stored entry; CorruptDataError naming the file and offset when the record is bad."""
        log_id, offset = ef.split_location(location)
        fd, path = self._open(log_id)
        prefix = os.pread(fd, _SIZE_PREFIX, offset - _SIZE_PREFIX)
        if len(prefix) < _SIZE_PREFIX:
            raise CorruptDataError(f"{path} offset {offset - _SIZE_PREFIX}: record size past the end of file")
        size = int.from_bytes(prefix, "big", signed=True)
        if not ef.RECORD_KEY_SIZE <= size <= limits.ENTRYLOG_RECORD_SIZE_MAX:
            raise CorruptDataError(f"{path} offset {offset - _SIZE_PREFIX}: bad record size {size}")
        data = os.pread(fd, size, offset)
        if len(data) < size:
            raise CorruptDataError(f"{path} offset {offset}: record of {size} bytes cut short")
        if ef.record_key(data) != (ledger_id, entry_id):
            found = ef.record_key(data)
            raise CorruptDataError(
                f"{path} offset {offset}: holds ledger {found[0]} entry {found[1]}, "
                f"the index says ledger {ledger_id} entry {entry_id}"
            )
        return data

    def fd_of(self, location: int) -> int:
        """The open file of the entry log a location names (read-ahead reads on from there)."""
        return self._open(ef.split_location(location)[0])[0]

    def _open(self, log_id: int) -> tuple[int, Path]:
        cached = self._fds.get(log_id)
        if cached is not None:
            self._fds.move_to_end(log_id)
            return cached
        for directory in self._dirs:
            path = directory / ef.log_file_name(log_id)
            try:
                fd = os.open(path, os.O_RDONLY | _CLOEXEC)
            except FileNotFoundError:
                continue
            self._fds[log_id] = (fd, path)
            if len(self._fds) > READ_FDS_MAX:
                os.close(self._fds.popitem(last=False)[1][0])
            return fd, path
        raise CorruptDataError(f"entry log {ef.log_file_name(log_id)} not found in {self._dirs}")

    def forget(self, log_id: int) -> None:
        entry = self._fds.pop(log_id, None)
        if entry is not None:
            os.close(entry[0])

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1][0])
