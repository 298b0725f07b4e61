"""Compaction's live records of one old entry log, found from the index (the scan process's work,
gc_scan.py; never imported by the bookie process, so numpy stays out of it).

A record is live when its ledger's index slot still names it: an `.idx` file's slot (`IndexFileSlots`)
or the db engine's location (db_slots.py). The slots naming this log are read first
(index files whole, a chunk at a time): they give every live record's start, ledger and entry, so the log
is read only where live records are (a log 20% live costs 20% of its reads), and in log order. Each
read's records are checked as a whole with numpy, with no Python work per record: the size prefix in
range, the ledger and entry id in the record those the slot names, no record running into the next one
or past the end of the log. The first record that fails (a damaged index, corrupt data) hands the rest of
the log to the generic scanner (bkctl.files), which walks every record from there, copies those whose
slot names them and stops at corrupt data; a record the index names that was never found keeps the log
(`error`).

A batch names its records by where they are in the old log (`Moved.spans`), not by their bytes: the
bookie reads them itself, straight into the buffer it writes from (gc_scan.py). No record crosses the
pipe, and this process copies each byte once (its read, into one reused buffer).

Index files are read directly, never through the storage's page cache (which a stale page from here
could poison): a slot only ever moves away from an old log, so a slot read as naming this record does,
and one read as naming another place does too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from bkctl import limits
from bkctl.files.chunks import FileScan
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import index_format as ixf
from bkctl.protocol.entrylog_format import RecordKind
from bkctl.server.fileio import CLOEXEC
from bkctl.server.moves import Moved

Column = npt.NDArray[np.int64]

_SIZE_PREFIX: Final = 4
# A record's size prefix, ledger id and entry id, as they start every entry log record.
_HEAD: Final = np.dtype([("size", ">i4"), ("ledger", ">i8"), ("entry", ">i8")])
_HEAD_BYTES: Final = np.arange(_HEAD.itemsize)
_SLOT: Final = np.dtype(">i8")
_OFFSET_MASK: Final = 0xFFFFFFFF
READ_CHUNK: Final = 256 * 1024
# Live records whose starts are this close are read as one run (the dead ones between cost less than
# another request); past a run's last record start, this much is read with it (a bigger record, one more).
RUN_GAP: Final = 64 * 1024
RUN_TAIL: Final = 16 * 1024
_INDEX_READ: Final = 128 * ixf.PAGE_SIZE
_PAGES_CACHED_MAX: Final = 1024  # local bound: index pages the generic scanner keeps


class LiveRecords:
    """The records of one entry log whose index slot still names them, in batches grouped by ledger."""

    def __init__(self, log_id: int, path: Path, index: dict[int, Path] | Slots) -> None:
        self.log_id = log_id
        self.path = path
        self._slots = IndexFileSlots(index) if isinstance(index, dict) else index
        self._fd = os.open(path, os.O_RDONLY | CLOEXEC)
        self._size = os.fstat(self._fd).st_size
        # No read-ahead: each READ_CHUNK read is one request on the disk, never a queue of them ahead
        # of the journal's fdatasync (the writers' latency on a shared disk).
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)
        self._buffer = bytearray(READ_CHUNK)
        self._table: tuple[Column, Column, Column] | None = None  # starts, ledgers, entries in log order
        self._run_last: Column | None = None  # per live record: the start of its run's last record
        self._next = 0  # the next live record of the table
        self._walked_to = ef.HEADER_SIZE  # the end of the last record taken from the table
        self._generic: Iterator[Any] | None = None
        self._generic_scan: FileScan[Any] | None = None
        self._done = False
        self._live = 0  # records the index files name in this log
        self.scanned = 0
        self.copied = 0
        self.error: str | None = None

    def next_batch(self, batch_bytes: int) -> Moved | None:
        """Up to about `batch_bytes` of live records; None once the log is done (see `error`)."""
        if self._table is None:
            self._read_index()
        pieces: list[_Piece] = []
        size = 0
        while size < batch_bytes and not self._done:
            piece = self._table_chunk() if self._generic is None else self._generic_chunk(batch_bytes - size)
            if piece is not None:
                pieces.append(piece)
                size += piece.size
        batch = _grouped(self.log_id, pieces)
        self.copied += len(batch)
        if self._done:
            self._check_complete()
            self.close()
        return batch if len(batch) or not self._done else None

    # --- the live records the index names -------------------------------------------------------

    def _read_index(self) -> None:
        found: list[tuple[Column, Column, Column]] = []
        for ledger_id, starts, entries in self._slots.naming(self.log_id):
            found.append((starts, np.full(len(starts), ledger_id, np.int64), entries))
        starts, ledgers, entries = (
            np.concatenate([part[k] for part in found]) if found else np.empty(0, np.int64) for k in range(3)
        )
        self._live = len(starts)
        order = np.argsort(starts, kind="stable")
        starts, ledgers, entries = starts[order], ledgers[order], entries[order]
        # A start outside the log is a damaged slot: left out here, so the log is kept (_check_complete).
        inside = (starts >= ef.HEADER_SIZE) & (starts <= self._size - _HEAD.itemsize)
        self._table = (starts[inside], ledgers[inside], entries[inside])
        self._run_last = _run_lasts(self._table[0])

    def _table_chunk(self) -> _Piece | None:
        """The checked records of one read from the next live record on; None when there were none (the
        end, or the generic scanner took over)."""
        assert self._table is not None and self._run_last is not None
        starts, ledgers, entries = self._table
        first = self._next
        if first >= len(starts):
            self._done = True
            return None
        position = int(starts[first])
        want = min(READ_CHUNK, int(self._run_last[first]) - position + RUN_TAIL)
        with memoryview(self._buffer) as view:
            got = os.preadv(self._fd, [view[:want]], position)
        stop = int(np.searchsorted(starts, position + got - _HEAD.itemsize, side="right"))
        rel = starts[first:stop] - position
        heads = _heads(np.frombuffer(self._buffer, np.uint8, got), rel)
        sizes = heads["size"].astype(np.int64)
        ends = rel + _SIZE_PREFIX + sizes
        good = (
            (sizes >= ef.RECORD_KEY_SIZE)
            & (sizes <= limits.ENTRYLOG_RECORD_SIZE_MAX)
            & (heads["ledger"] == ledgers[first:stop])
            & (heads["entry"] == entries[first:stop])
            & (position + ends <= self._size)
        )
        good[:-1] &= ends[:-1] <= rel[1:]  # a record running into the next live one: a damaged slot
        # A record that ends past the read is checked again with the next one, unless it comes first:
        # its head is all this process needs of it.
        whole = good & (ends <= got)
        whole[:1] = good[:1]
        taken = len(whole) if whole.all() else int(np.argmin(whole))
        if taken == 0:
            self._to_generic(self._walked_to)
            return None
        stop = first + taken
        self._next = stop
        self.scanned += taken
        self._walked_to = position + int(ends[taken - 1])
        found = starts[first:stop]
        return _Piece(found, found + (ends[:taken] - rel[:taken]), ledgers[first:stop], entries[first:stop])

    # --- the generic scanner, once the table cannot be trusted ------------------------------------

    def _to_generic(self, position: int) -> None:
        self._generic_scan = FileScan(self.path, position, _scan)
        self._generic = iter(self._generic_scan)

    def _generic_chunk(self, batch_bytes: int) -> _Piece:
        """Every record from here whose slot names it, up to `batch_bytes` of them."""
        assert self._generic is not None and self._generic_scan is not None
        found: tuple[list[int], ...] = ([], [], [], [])  # record starts, ends, ledgers, entries
        size = 0
        for offset, kind, body in self._generic:
            if kind is not RecordKind.DATA:
                continue
            self.scanned += 1
            ledger_id, entry_id = ef.record_key(body)
            if ledger_id in self._slots and self._slots.slot(ledger_id, entry_id) == ef.entry_location(
                self.log_id, offset + _SIZE_PREFIX
            ):
                end = offset + _SIZE_PREFIX + len(body)
                for column, value in zip(found, (offset, end, ledger_id, entry_id), strict=True):
                    column.append(value)
                size += end - offset
                if size >= batch_bytes:
                    break
        else:
            stop = self._generic_scan.stop
            if stop is not None and not stop.read_all_valid:
                self.error = f"{self.path} offset {stop.position}: {stop.reason}"
            self._done = True
        starts, ends, ledgers, entries = (np.array(column, np.int64) for column in found)
        return _Piece(starts, ends, ledgers, entries)

    def _check_complete(self) -> None:
        """Every record a slot names was found where it names it: else (a slot naming no record start,
        a walk thrown off by one) the log must not go, whatever was copied."""
        if self.error is None and self.copied != self._live:
            self.error = (
                f"{self.path}: {self._live - self.copied} of the {self._live} records the index names "
                "were not found there; the log is kept"
            )

    def close(self) -> None:
        self._slots.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Slots(Protocol):
    """Where the index says each entry of the given ledgers is: index files (`IndexFileSlots`) or the
    db engine's locations db (db_slots.DbSlots)."""

    def __contains__(self, ledger_id: int) -> bool: ...
    def naming(self, log_id: int) -> Iterator[tuple[int, Column, Column]]: ...
    def slot(self, ledger_id: int, entry_id: int) -> int: ...
    def close(self) -> None: ...


class IndexFileSlots:
    """The slots of the interleaved engine's index files, one per ledger."""

    def __init__(self, index_paths: dict[int, Path]) -> None:
        self._paths = index_paths
        self._pages: dict[tuple[int, int], Column] = {}

    def __contains__(self, ledger_id: int) -> bool:
        return ledger_id in self._paths

    def naming(self, log_id: int) -> Iterator[tuple[int, Column, Column]]:
        """(ledger id, record starts, entry ids) of the slots naming `log_id`, a chunk at a time."""
        for ledger_id, path in self._paths.items():
            for starts, entries in _slots_naming(path, log_id):
                yield ledger_id, starts, entries

    def slot(self, ledger_id: int, entry_id: int) -> int:
        if entry_id < 0:
            return 0
        page_no, slot = divmod(entry_id, ixf.SLOTS_PER_PAGE)
        page = self._pages.get((ledger_id, page_no))
        if page is None:
            page = _index_page(self._paths[ledger_id], page_no)
            if len(self._pages) >= _PAGES_CACHED_MAX:
                self._pages.clear()
            self._pages[(ledger_id, page_no)] = page
        return int(page[slot])

    def close(self) -> None:
        self._pages.clear()


@dataclass(slots=True)
class _Piece:
    """Checked records in log order: where each starts and ends in the old log, and its key."""

    starts: Column
    ends: Column
    ledgers: Column
    entries: Column

    @property
    def size(self) -> int:
        return int((self.ends - self.starts).sum())


def _grouped(log_id: int, pieces: list[_Piece]) -> Moved:
    """One batch: the records' spans in log order (adjacent records one span), the columns grouped by
    ledger (Moved.runs), each record's start in the spans read back to back."""
    starts, ends, ledgers, entries = (
        np.concatenate([getattr(p, name) for p in pieces]) if pieces else np.empty(0, np.int64)
        for name in ("starts", "ends", "ledgers", "entries")
    )
    batch = Moved(spans=_spans(starts, ends))
    if not len(starts):
        return batch
    lengths = ends - starts
    order = np.argsort(ledgers, kind="stable")  # log order within a ledger
    at = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    for column, values in (
        (batch.starts, at),
        (batch.ledgers, ledgers),
        (batch.entries, entries),
        (batch.old, (log_id << 32) + starts + _SIZE_PREFIX),
    ):
        column.frombytes(values[order].astype(np.int64).tobytes())
    ids, firsts, counts = np.unique(ledgers[order], return_index=True, return_counts=True)
    sizes = np.add.reduceat(lengths[order], firsts)
    # np.unique sorts the ids, and the columns are sorted by id: the runs come in column order.
    batch.runs = list(zip(ids.tolist(), firsts.tolist(), counts.tolist(), sizes.tolist(), strict=True))
    return batch


def _spans(starts: Column, ends: Column) -> list[tuple[int, int]]:
    """(offset, length) of the runs of adjacent records among those from starts[k] to ends[k]."""
    if not len(starts):
        return []
    breaks = np.flatnonzero(starts[1:] != ends[:-1]) + 1
    firsts = np.concatenate(([0], breaks))
    lasts = np.concatenate((breaks, [len(starts)])) - 1
    return list(zip(starts[firsts].tolist(), (ends[lasts] - starts[firsts]).tolist(), strict=True))


def _slots_naming(path: Path, log_id: int) -> Iterator[tuple[Column, Column]]:
    """(record starts, entry ids) of one index file's slots naming `log_id`, a chunk at a time."""
    try:
        fd = os.open(path, os.O_RDONLY | CLOEXEC)
    except FileNotFoundError:  # deleted since: its records are garbage
        return
    try:
        offset, first_entry = ixf.HEADER_SIZE, 0
        while count := len(data := os.pread(fd, _INDEX_READ, offset)) // ixf.SLOT_SIZE:
            slots = np.frombuffer(data, _SLOT, count).astype(np.int64)
            hits = np.flatnonzero((slots >> 32 == log_id) & (slots != 0))
            if len(hits):
                yield (slots[hits] & _OFFSET_MASK) - _SIZE_PREFIX, hits + first_entry
            offset += count * ixf.SLOT_SIZE
            first_entry += count
    finally:
        os.close(fd)


def _index_page(path: Path, page_no: int) -> Column:
    try:
        fd = os.open(path, os.O_RDONLY | CLOEXEC)
    except FileNotFoundError:  # deleted since: its records are garbage
        return np.zeros(ixf.SLOTS_PER_PAGE, np.int64)
    try:
        data = os.pread(fd, ixf.PAGE_SIZE, ixf.HEADER_SIZE + page_no * ixf.PAGE_SIZE)
    finally:
        os.close(fd)
    return np.frombuffer(data.ljust(ixf.PAGE_SIZE, b"\0"), _SLOT).astype(np.int64)


def _run_lasts(starts: Column) -> Column:
    """For each start: the last start of its run (starts under RUN_GAP apart)."""
    if not len(starts):
        return starts
    apart = np.diff(starts) > RUN_GAP
    lasts = np.concatenate((np.flatnonzero(apart), [len(starts) - 1]))
    run_of = np.concatenate(([0], np.cumsum(apart)))
    result: Column = starts[lasts][run_of]
    return result


def _heads(data: npt.NDArray[np.uint8], rel: Column) -> Any:
    """The size, ledger and entry id at each offset of `rel` in `data` (each a whole head before its
    end)."""
    raw = data[rel[:, None] + _HEAD_BYTES]
    return np.ascontiguousarray(raw).view(_HEAD).reshape(-1)


def _scan(buf: bytes, start: int, base: int, at_eof: bool) -> Any:
    return ef.scan_records(buf, start, base, at_eof)
