"""The in-memory write cache: entries accepted since the last checkpoint swap, readable at once.

Each ledger's entries sit in one append buffer already in entry-log format (4-byte size + stored
entry per record) with an array of the records' offsets, so a checkpoint writes a ledger with one
`pwrite` and computes its index slots for whole pages at once (`shifted_slots`), with no Python work
per entry. How a record is found by entry id depends on the order the ids arrived in:
- dense (first, first+1, ...: a ledger whose whole ensemble is its write quorum): entry id - first id
  is the record's number, no map at all;
- ascending with gaps (a striped ensemble, E > Qw, sends a bookie 2 of every 3 entries): an array of
  the ids, searched by bisection; as cheap per add as the dense case;
- any other order (an entry rewritten, ids going back): an id -> record number dict, newest wins; a
  replaced record stays in the buffer and is written out unreferenced, as entry logs hold garbage anyway.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from typing import Final

_SIZE: Final = struct.Struct(">i")
_SLOT: Final = struct.Struct(">q")
SIZE_PREFIX: Final = _SIZE.size
_UNORDERED: Final = 1 << 63  # last_id once ids came in no order: above every entry id


class LedgerBuffer:
    """One ledger's records in arrival order; mutated on the reactor thread only, until swapped out."""

    __slots__ = ("first_id", "ids", "last_id", "offsets", "records", "where")

    def __init__(self, first_id: int) -> None:
        self.records = bytearray()
        self.offsets = array("q")  # record n's entry starts at records[offsets[n]] (past its size)
        self.first_id = first_id
        self.last_id = first_id - 1  # the id of the last record while ids ascend, then _UNORDERED
        self.ids: array[int] | None = None  # record n's entry id, once ascending with gaps
        self.where: dict[int, int] | None = None  # entry id -> record number once in no order

    def placed(self, entry_id: int) -> None:
        """Index the record just appended (the last offset) under `entry_id`: the slow cases of
        WriteCache.put, which handles the dense and ascending ones inline."""
        number = len(self.offsets) - 1
        if entry_id > self.last_id:  # never once in no order: last_id is then _UNORDERED
            if self.ids is not None:
                self.ids.append(entry_id)
            elif entry_id != self.last_id + 1:  # the first gap: from dense to ascending
                self.ids = array("q", range(self.first_id, self.last_id + 1))
                self.ids.append(entry_id)
            self.last_id = entry_id
            return
        if self.where is None:
            ids = self.ids if self.ids is not None else range(self.first_id, self.last_id + 1)
            self.where = dict(zip(ids, range(number), strict=True))
            self.ids = None
            self.last_id = _UNORDERED
        self.where[entry_id] = number

    def record_number(self, entry_id: int) -> int:
        """The newest record of `entry_id`, or -1."""
        if self.where is not None:
            return self.where.get(entry_id, -1)
        ids = self.ids
        if ids is not None:
            number = bisect_left(ids, entry_id)
            return number if number < len(ids) and ids[number] == entry_id else -1
        number = entry_id - self.first_id
        return number if 0 <= number < len(self.offsets) else -1

    def get(self, entry_id: int) -> bytes | None:
        number = self.record_number(entry_id)
        if number < 0:
            return None
        start = self.offsets[number]
        size = _SIZE.unpack_from(self.records, start - SIZE_PREFIX)[0]
        return bytes(self.records[start : start + size])

    @property
    def dense(self) -> bool:
        return self.where is None and self.ids is None

    def numbered(self) -> Iterator[tuple[int, int]]:
        """(entry id, record number) of every live entry, in arrival order unless ids went back."""
        if self.where is not None:
            return iter(self.where.items())
        ids = self.ids if self.ids is not None else range(self.first_id, self.last_id + 1)
        return zip(ids, range(len(self.offsets)), strict=True)

    def locations(self, slots: bytes) -> dict[int, int]:
        """entry id -> slot, given the slots of every record in record order (8 bytes each, big-endian):
        C-level calls over the whole ledger unless its ids came in no order."""
        values = struct.unpack(f">{len(self.offsets)}q", slots)
        if self.where is not None:
            return {entry_id: values[number] for entry_id, number in self.where.items()}
        ids = self.ids if self.ids is not None else range(self.first_id, self.last_id + 1)
        return dict(zip(ids, values, strict=True))

    def record_end(self, number: int) -> int:
        """Where record `number` ends in `records` (the next one's size prefix starts there)."""
        if number + 1 < len(self.offsets):
            return self.offsets[number + 1] - SIZE_PREFIX
        return len(self.records)


class WriteCache:
    """ledger id -> LedgerBuffer; `size_bytes` counts record bytes (entries plus their size prefixes)."""

    __slots__ = ("ledgers", "size_bytes")

    def __init__(self) -> None:
        self.ledgers: dict[int, LedgerBuffer] = {}
        self.size_bytes = 0

    def put(self, ledger_id: int, entry_id: int, data: bytes | bytearray) -> None:
        ledger = self.ledgers.get(ledger_id)
        if ledger is None:
            ledger = self.ledgers[ledger_id] = LedgerBuffer(entry_id)
        size = len(data)
        self.size_bytes += SIZE_PREFIX + size
        # The hot path (one call per add): the dense and ascending cases inline.
        records = ledger.records
        records += _SIZE.pack(size)
        ledger.offsets.append(len(records))
        records += data
        ids = ledger.ids
        if ids is None:
            if entry_id == ledger.last_id + 1:
                ledger.last_id = entry_id
                return
        elif entry_id > ledger.last_id:
            ids.append(entry_id)
            ledger.last_id = entry_id
            return
        ledger.placed(entry_id)

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        ledger = self.ledgers.get(ledger_id)
        return None if ledger is None else ledger.get(entry_id)

    def __len__(self) -> int:
        """Live entries (a rewritten entry counts once)."""
        return sum(len(b.where) if b.where is not None else len(b.offsets) for b in self.ledgers.values())

    def __bool__(self) -> bool:
        return bool(self.ledgers)

    def items(self) -> Iterator[tuple[int, int, bytes]]:
        """(ledger id, entry id, entry) of every live entry, ledger by ledger (tests and failure paths)."""
        for ledger_id, ledger in self.ledgers.items():
            for entry_id, _ in ledger.numbered():
                data = ledger.get(entry_id)
                assert data is not None
                yield ledger_id, entry_id, data

    def merge_under(self, newer: WriteCache) -> None:
        """Put `newer`'s entries over ours (a failed checkpoint gives its entries back)."""
        for ledger_id, entry_id, data in newer.items():
            self.put(ledger_id, entry_id, data)


def shifted_slots(offsets: array[int], start: int, stop: int, delta: int) -> bytes:
    """Big-endian int64 slots `offsets[n] + delta` for n in [start, stop), with no Python loop per slot.

    The offsets become one big integer (8 bytes per slot) and the delta repeated in every 8-byte lane
    is added (or subtracted) in one C-level operation. No lane carries or borrows into its neighbour
    because every result is a valid location in [0, 2**63), so the lanes come out exactly.
    """
    count = stop - start
    if count <= 0:
        return b""
    part = offsets[start:stop]
    if sys.byteorder == "little":
        part.byteswap()
    value = int.from_bytes(part.tobytes(), "big")
    lanes = int.from_bytes(_SLOT.pack(abs(delta)) * count, "big")
    value = value + lanes if delta >= 0 else value - lanes
    return value.to_bytes(8 * count, "big")
