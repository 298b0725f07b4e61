"""Replay's fast path: runs of journal DATA records copied to the entry log whole, locations by arithmetic.

A journal DATA record (int32 length + stored entry) is byte for byte an entry log record (int32 size +
stored entry), so a run of consecutive DATA records goes to the entry log as one slice, and an entry's
index location is the run's entry log offset plus the record's offset in the run. Per record the only
Python work is one struct unpack, a few comparisons and one dict store.

The fast path takes only what the journal codec would yield as DATA (length 16..JOURNAL_RECORD_SIZE_MAX,
entry id >= 0, the whole record in the buffer), and only for ledgers the bookie already admitted; it
stops before anything else, which replay then hands to the codec and the storage's record handler.
"""

from __future__ import annotations

import struct
from typing import Final

from bkctl import limits
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import journal_format as jf
from bkctl.server.entrylog import EntryLogWriter

_RECORD_HEAD: Final = struct.Struct(">iqq")  # length, ledger id, entry id
_SIZE_PREFIX: Final = 4
_RECORD_SIZE_MAX: Final = min(limits.JOURNAL_RECORD_SIZE_MAX, limits.ENTRYLOG_RECORD_SIZE_MAX)


class _Ledger:
    """One admitted ledger: its replayed slots since the last index write, and bytes not yet counted."""

    __slots__ = ("slots", "unsized")

    def __init__(self) -> None:
        self.slots: dict[int, int] = {}  # entry id -> index location
        self.unsized = 0  # entry log bytes written but not yet added to the writer's ledgers map


class ReplayRuns:
    """Writes replayed entries to the entry log and keeps their index locations until `drain`."""

    def __init__(self, writer: EntryLogWriter) -> None:
        self._writer = writer
        self._ledgers: dict[int, _Ledger] = {}
        self.count = 0  # entries held in the slot maps

    def add(self, ledger_id: int, entry_id: int, stored_entry: memoryview) -> None:
        """One entry from the codec path; its ledger is admitted to the fast path from now on."""
        if _SIZE_PREFIX + len(stored_entry) > self._writer.room():
            # `append` rotates first: the full log's ledgers map must count the runs written to it.
            self._count_sizes()
        self._admit(ledger_id).slots[entry_id] = self._writer.append(ledger_id, stored_entry)
        self.count += 1

    def take(self, buffer: bytearray, pos: int, end: int) -> tuple[int, int]:
        """Copy whole DATA records of admitted ledgers from buffer[pos:end]; (where it stopped, count)."""
        stop, taken, log_full = self._take_fitting(buffer, pos, end)
        if log_full:
            # The ledgers map of the full log must count every byte written to it. A fresh log has
            # room for any record, so one rotation is enough.
            self._count_sizes()
            self._writer.rotate()
            stop, more, _ = self._take_fitting(buffer, stop, end)
            taken += more
        return stop, taken

    def _take_fitting(self, buffer: bytearray, pos: int, end: int) -> tuple[int, int, bool]:
        """Take the run that fits in the current entry log; (stop, count, stopped only for lack of room)."""
        room_end = pos + self._writer.room()
        stop, count = self._scan_run(buffer, pos, end, room_end)
        if count:
            self._write_run(buffer, pos, stop)
        return stop, count, self._is_over_room(buffer, stop, end, room_end)

    def _scan_run(self, buffer: bytearray, pos: int, end: int, room_end: int) -> tuple[int, int]:
        """Note the locations of the run from `pos`; returns its end and its number of records.

        The locations assume the run goes to the entry log at the writer's current position.
        """
        writer = self._writer
        location_base = (writer.log_id << 32) + writer.position + _SIZE_PREFIX - pos
        unpack = _RECORD_HEAD.unpack_from
        ledger_of = self._ledgers.get
        limit = min(end, room_end)
        last_head = end - _RECORD_HEAD.size
        count = 0
        while pos <= last_head:
            size, ledger_id, entry_id = unpack(buffer, pos)
            after = pos + _SIZE_PREFIX + size
            if entry_id < 0 or size < jf.RECORD_KEY_SIZE or size > _RECORD_SIZE_MAX or after > limit:
                break
            ledger = ledger_of(ledger_id)
            if ledger is None:
                break
            ledger.slots[entry_id] = location_base + pos
            ledger.unsized += after - pos
            pos = after
            count += 1
        self.count += count
        return pos, count

    def _write_run(self, buffer: bytearray, start: int, stop: int) -> None:
        writer = self._writer
        with memoryview(buffer) as view:
            writer.append_records(view[start:stop])
        # The locations above hold 32-bit offsets: the entry log must not have grown past them.
        ef.entry_location(writer.log_id, writer.position)

    def _is_over_room(self, buffer: bytearray, pos: int, end: int, room_end: int) -> bool:
        """Did the run stop only because the record at `pos` does not fit in the current entry log?"""
        if room_end >= end or pos + _RECORD_HEAD.size > end:
            return False
        size, ledger_id, entry_id = _RECORD_HEAD.unpack_from(buffer, pos)
        return (
            entry_id >= 0
            and jf.RECORD_KEY_SIZE <= size <= _RECORD_SIZE_MAX
            and room_end < pos + _SIZE_PREFIX + size <= end
            and ledger_id in self._ledgers
        )

    def drain(self) -> dict[int, dict[int, int]]:
        """The slot maps (ledger id -> entry id -> location) noted so far; the runs start afresh."""
        self._count_sizes()
        slots = {ledger_id: ledger.slots for ledger_id, ledger in self._ledgers.items() if ledger.slots}
        self._ledgers = {}
        self.count = 0
        return slots

    def _admit(self, ledger_id: int) -> _Ledger:
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            ledger = self._ledgers[ledger_id] = _Ledger()
        return ledger

    def _count_sizes(self) -> None:
        sizes = {}
        for ledger_id, ledger in self._ledgers.items():
            if ledger.unsized:
                sizes[ledger_id], ledger.unsized = ledger.unsized, 0
        self._writer.count_ledger_bytes(sizes)
