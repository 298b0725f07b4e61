"""Ledger index files: headers (master key, fenced bit, explicit LAC) and entry slots.

One file per ledger at `<index dir>/current/<xx>/<yy>/<hex id>.idx`; a new ledger's file goes to index
dir `ledger_id % len(index_dirs)`, an existing one is found in whichever dir holds it. Slots are read
and written in whole 8 KiB pages (1024 entries) through a bounded LRU of pages shared by all ledgers
(the "ledger cache"). The checkpoint thread writes pages straight through to the file and then
refreshes the cached copy under the same lock, so a reader on the reactor thread never caches a stale
page; no page is ever dirty in memory, which is what keeps the cache bounded.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bkctl.errors import CorruptDataError, ProtocolError
from bkctl.files.index import index_entries, open_index
from bkctl.protocol import index_format as ixf
from bkctl.server.fileio import fsync_directory, write_all

log = logging.getLogger("bkctl.bookie")

_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_ZERO_PAGE: Final = bytes(ixf.PAGE_SIZE)
_PAGE: Final = struct.Struct(f">{ixf.SLOTS_PER_PAGE}q")  # a whole page of slots in one call


@dataclass(frozen=True)
class LoadedIndex:
    path: Path
    header: ixf.IndexHeader
    last_entry_id: int  # -1 when no slot is set


class IndexStore:
    def __init__(self, index_dirs: tuple[Path, ...], pages_max: int) -> None:
        self._dirs = [d / "current" for d in index_dirs]
        self.pages_max = max(1, pages_max)
        self._pages: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._paths: dict[int, Path] = {}
        self._lock = threading.Lock()
        self._unsynced: set[int] = set()  # ledgers whose relocated slots are not fsynced yet
        self.page_misses = 0

    # --- locating files -------------------------------------------------------------------------

    def find(self, ledger_id: int) -> Path | None:
        """The existing index file of `ledger_id`, or None."""
        path = self._paths.get(ledger_id)
        if path is not None:
            return path
        relative = ixf.index_path(ledger_id)
        for directory in self._dirs:
            candidate = directory / relative
            if candidate.is_file():
                self._paths[ledger_id] = candidate
                return candidate
        return None

    def _new_path(self, ledger_id: int) -> Path:
        return self._dirs[ledger_id % len(self._dirs)] / ixf.index_path(ledger_id)

    # --- reactor thread: load a ledger, look up an entry ----------------------------------------

    def load(self, ledger_id: int) -> LoadedIndex | None:
        """Header and last stored entry of an existing index; CorruptDataError when unreadable."""
        path = self.find(ledger_id)
        if path is None:
            return None
        fd = os.open(path, os.O_RDONLY | _CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                # Created by a checkpoint that died before writing the header: nothing of the ledger was
                # made durable here; its key record is still in the journal, and replay rebuilds it.
                log.info("%s is empty (a checkpoint stopped before its header): ledger not loaded", path)
                return None
            try:
                header = ixf.decode_header(os.pread(fd, ixf.HEADER_SIZE, 0))
            except ProtocolError as exc:
                raise CorruptDataError(f"{path} offset 0: corrupt index header: {exc}") from None
            return LoadedIndex(path, header, _last_entry_id(fd, size))
        finally:
            os.close(fd)

    def location(self, ledger_id: int, entry_id: int) -> tuple[int, Path | None, int]:
        """(location or 0, index file, slot offset) of an entry; the path and offset are for error logs."""
        path = self.find(ledger_id)
        if path is None:
            return 0, None, 0
        page_no, slot = divmod(entry_id, ixf.SLOTS_PER_PAGE)
        with self._lock:
            page = self._page(ledger_id, page_no, path)
        first = page_no * ixf.SLOTS_PER_PAGE + slot
        found = next(ixf.decode_slots(page[slot * ixf.SLOT_SIZE : (slot + 1) * ixf.SLOT_SIZE], first), None)
        return (found[1] if found else 0), path, ixf.slot_offset(entry_id)

    def _page(self, ledger_id: int, page_no: int, path: Path, fd: int = -1) -> bytes:
        """A page through the LRU; the caller holds the lock."""
        key = (ledger_id, page_no)
        page = self._pages.get(key)
        if page is not None:
            self._pages.move_to_end(key)
            return page
        self.page_misses += 1
        offset = ixf.HEADER_SIZE + page_no * ixf.PAGE_SIZE
        if fd >= 0:
            page = os.pread(fd, ixf.PAGE_SIZE, offset)
        else:
            own = os.open(path, os.O_RDONLY | _CLOEXEC)
            try:
                page = os.pread(own, ixf.PAGE_SIZE, offset)
            finally:
                os.close(own)
        page = page.ljust(ixf.PAGE_SIZE, b"\0")
        self._remember(key, page)
        return page

    def _remember(self, key: tuple[int, int], page: bytes) -> None:
        self._pages[key] = page
        self._pages.move_to_end(key)
        while len(self._pages) > self.pages_max:
            self._pages.popitem(last=False)

    # --- checkpoint thread: write headers and slots ---------------------------------------------

    def write(self, ledger_id: int, header: ixf.IndexHeader | None, locations: Mapping[int, int]) -> None:
        """Write a ledger's header (when given) and the slots of `locations`, then fsync the file."""
        self._write_file(
            ledger_id, header, lambda fd, path: self._write_slots(fd, ledger_id, path, locations)
        )

    def write_run(
        self, ledger_id: int, header: ixf.IndexHeader | None, first_entry_id: int, slots: bytes
    ) -> None:
        """Write a header (when given) and the slots of entries first_entry_id, first_entry_id + 1, ...

        `slots` holds their big-endian locations back to back. Whole pages are written as they are;
        only the (at most two) partly covered pages are merged with the slots already on disk.
        """
        if first_entry_id < 0:
            raise CorruptDataError("negative entry id in index slots")
        self._write_file(
            ledger_id, header, lambda fd, path: self._write_run(fd, ledger_id, path, first_entry_id, slots)
        )

    def _write_file(
        self, ledger_id: int, header: ixf.IndexHeader | None, write_slots: Callable[[int, Path], None]
    ) -> None:
        path = self.find(ledger_id)
        created = path is None
        if path is None:
            if header is None:
                raise CorruptDataError(f"ledger {ledger_id} has entries but no index header to create")
            path = self._new_path(ledger_id)
            path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _CLOEXEC, 0o644)
        try:
            if header is not None:
                write_all(fd, [ixf.encode_header(header)], 0)
            write_slots(fd, path)
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_directory(path.parent)
            self._paths[ledger_id] = path

    def _write_run(self, fd: int, ledger_id: int, path: Path, first_entry_id: int, slots: bytes) -> None:
        count = len(slots) // ixf.SLOT_SIZE
        done = 0
        while done < count:
            page_no, slot = divmod(first_entry_id + done, ixf.SLOTS_PER_PAGE)
            take = min(count - done, ixf.SLOTS_PER_PAGE - slot)
            part = slots[done * ixf.SLOT_SIZE : (done + take) * ixf.SLOT_SIZE]
            with self._lock:
                if take < ixf.SLOTS_PER_PAGE:
                    old = self._page(ledger_id, page_no, path, fd)
                    part = old[: slot * ixf.SLOT_SIZE] + part + old[(slot + take) * ixf.SLOT_SIZE :]
                write_all(fd, [part], ixf.HEADER_SIZE + page_no * ixf.PAGE_SIZE)
                self._remember((ledger_id, page_no), part)
            done += take

    def _write_slots(self, fd: int, ledger_id: int, path: Path, locations: Mapping[int, int]) -> None:
        for page_no in _pages_of(locations):
            with self._lock:
                old = self._page(ledger_id, page_no, path, fd)
                page = _encode_page(locations, page_no, old)
                write_all(fd, [page], ixf.HEADER_SIZE + page_no * ixf.PAGE_SIZE)
                self._remember((ledger_id, page_no), page)

    def relocate(self, ledger_id: int, moves: list[tuple[array[int], bytes, bytes]]) -> int:
        """Compaction: each entry's slot that still holds its old location takes the new one; not
        fsynced here (see `sync_relocated`).

        `moves` holds (entry ids, old locations, new locations), locations as big-endian slots. A run of
        consecutive entry ids on one page is compared and replaced as one slice (no Python per entry);
        an entry rewritten since the scan keeps its newer slot. A ledger deleted meanwhile (no file) is
        skipped, never re-created. Returns the slots changed.
        """
        path = self.find(ledger_id)
        if path is None or not moves:
            return 0
        try:
            fd = os.open(path, os.O_RDWR | _CLOEXEC)
        except FileNotFoundError:
            return 0
        try:
            changed = sum(self._relocate(fd, ledger_id, path, *move) for move in moves)
        finally:
            os.close(fd)
        if changed:
            with self._lock:
                self._unsynced.add(ledger_id)
        return changed

    def sync_relocated(self) -> int:
        """Fsync every index file `relocate` changed since the last call; how many.

        Compaction calls it once per old entry log, before that log goes: until then a slot lost by a
        crash still names the old log, which is still there (the new copy was fsynced before the slot
        was written, so a slot that did reach the disk is valid too). One fsync per ledger and log,
        not one per ledger and batch: each is a disk cache flush the journal's fdatasync waits behind.
        """
        with self._lock:
            ledgers, self._unsynced = self._unsynced, set()
        paths = [self.find(ledger_id) for ledger_id in sorted(ledgers)]
        return sum(_fsync_file(path) for path in paths if path is not None)

    def _relocate(
        self, fd: int, ledger_id: int, path: Path, entries: array[int], olds: bytes, news: bytes
    ) -> int:
        changed = 0
        page_no, page, dirty = -1, bytearray(), False
        at, count, singles = 0, len(entries), 0  # singles: entries left to take one by one
        while at < count:
            first = entries[at]
            number, slot = divmod(first, ixf.SLOTS_PER_PAGE)
            if number != page_no:
                if dirty:
                    self._put_page(fd, ledger_id, page_no, bytes(page))
                with self._lock:
                    page = bytearray(self._page(ledger_id, number, path, fd))
                page_no, dirty = number, False
            run = 1 if singles else min(count - at, ixf.SLOTS_PER_PAGE - slot)
            if run > 1 and entries[at + run - 1] - first != run - 1:
                run = 1  # not consecutive ids: entry by entry
            here, there, size = slot * ixf.SLOT_SIZE, at * ixf.SLOT_SIZE, run * ixf.SLOT_SIZE
            if page[here : here + size] == olds[there : there + size]:
                page[here : here + size] = news[there : there + size]
                changed, dirty = changed + run, True
            elif run > 1:
                singles = run  # a slot of the run moved on since the scan: this run entry by entry
                continue
            at += run
            singles = max(0, singles - 1)
        if dirty:
            self._put_page(fd, ledger_id, page_no, bytes(page))
        return changed

    def _put_page(self, fd: int, ledger_id: int, page_no: int, page: bytes) -> None:
        with self._lock:
            write_all(fd, [page], ixf.HEADER_SIZE + page_no * ixf.PAGE_SIZE)
            self._remember((ledger_id, page_no), page)

    def delete(self, ledger_id: int) -> Path | None:
        """Remove a ledger's index file and forget its pages (garbage collection); the removed path."""
        path = self.find(ledger_id)
        with self._lock:  # a page read under the lock either finds the file gone or is dropped here
            self._paths.pop(ledger_id, None)
            try:
                if path is not None:
                    path.unlink()
            except FileNotFoundError:
                path = None
            for key in [k for k in self._pages if k[0] == ledger_id]:
                del self._pages[key]
        return path

    def ledger_ids(self) -> set[int]:
        """Every ledger with an index file in the index dirs (a directory walk: call off the reactor)."""
        found: set[int] = set()
        for directory in self._dirs:
            if not directory.is_dir():
                continue
            for path in directory.glob(f"*/*/*{ixf.INDEX_SUFFIX}"):
                try:
                    found.add(int(path.name[: -len(ixf.INDEX_SUFFIX)], 16))
                except ValueError:
                    continue
        return found

    def forget_pages(self) -> None:
        with self._lock:
            self._pages.clear()

    def entry_ids(self, ledger_id: int) -> Iterator[int]:
        """The ledger's indexed entry ids, ascending (reads the file: call off the reactor)."""
        path = self.find(ledger_id)
        # An empty file is a checkpoint killed before its header: nothing indexed (see `load`).
        if path is not None and path.stat().st_size > 0:
            yield from (e for e, _, _ in index_entries(open_index(path)))

    def open(self) -> None:
        """Nothing to open ahead: index files are opened as pages are read."""

    def commit(self, replayed: bool = False) -> None:
        """Nothing to do: `write` fsyncs each file."""

    unpersisted: bool = False  # every write is durable when it returns

    def persist(self) -> None:
        """Nothing to do (see `commit`)."""

    def close(self) -> None:
        self.forget_pages()


def _pages_of(locations: Mapping[int, int]) -> list[int]:
    """The page numbers holding `locations`' entries, ascending."""
    if not locations:
        return []
    if min(locations) < 0:
        raise CorruptDataError("negative entry id in index slots")
    entry_ids = sorted(locations)  # replay and checkpoints hand them in (nearly) ascending order: cheap
    pages = []
    at = 0
    # One bisect per page rather than a division per entry: a page holds up to 1024 entries.
    while at < len(entry_ids):
        page_no = entry_ids[at] // ixf.SLOTS_PER_PAGE
        pages.append(page_no)
        at = bisect.bisect_left(entry_ids, (page_no + 1) * ixf.SLOTS_PER_PAGE, at)
    return pages


def _encode_page(locations: Mapping[int, int], page_no: int, old: bytes) -> bytes:
    """Page `page_no` with `locations`' slots over the `old` page's (a location is never 0: 0 = unset)."""
    first = page_no * ixf.SLOTS_PER_PAGE
    get = locations.get
    values = [get(entry_id, 0) for entry_id in range(first, first + ixf.SLOTS_PER_PAGE)]
    if old != _ZERO_PAGE:  # a new page (the common case) needs no merge
        values = [new or kept for new, kept in zip(values, _PAGE.unpack(old), strict=True)]
    return _PAGE.pack(*values)


def _last_entry_id(fd: int, size: int) -> int:
    """The highest set slot, scanning pages from the end of the file."""
    pages = max(0, size - ixf.HEADER_SIZE) // ixf.PAGE_SIZE + (
        1 if (size - ixf.HEADER_SIZE) % ixf.PAGE_SIZE else 0
    )
    for page_no in range(pages - 1, -1, -1):
        data = os.pread(fd, ixf.PAGE_SIZE, ixf.HEADER_SIZE + page_no * ixf.PAGE_SIZE)
        last = None
        for entry_id, _ in ixf.decode_slots(data, page_no * ixf.SLOTS_PER_PAGE):
            last = entry_id
        if last is not None:
            return last
    return -1


def _fsync_file(path: Path) -> bool:
    """Fsync a file; False when it is gone (a ledger deleted since: nothing left to keep)."""
    try:
        fd = os.open(path, os.O_RDONLY | _CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True
