"""The in-memory write cache: entries accepted since the last checkpoint swap, readable at once.

Each ledger's entries are kept as they arrived, not copied: a list of entry-log records as parts
(4-byte size, stored entry, 4-byte size, ...), the entry being the very bytes object the request
carried, with an array of where each record's entry starts in those records laid end to end. A
checkpoint writes a ledger with `pwritev` straight from the parts (the kernel does the one copy) and
computes its index slots for whole pages at once (`shifted_slots`), with no Python work per entry.
Copying each entry into one growing buffer, as this cache did first, cost a memcpy and a fresh page
fault per 4 KiB on the reactor thread: at 1 KiB entries about 15% of a busy bookie's reactor time.

A ledger whose entry ids keep arriving as first, first+1, ... ("dense", the usual case, striped
ensembles aside) needs no map at all: entry id - first id is the record's number. Any other order
(gaps, a rewrite of an entry) switches that ledger to an id -> record number dict, newest wins; a
replaced record stays in the parts and is written out unreferenced, as entry logs hold garbage anyway.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator
from typing import Final

_SIZE: Final = struct.Struct(">i")
_SLOT: Final = struct.Struct(">q")
SIZE_PREFIX: Final = _SIZE.size


class LedgerBuffer:
    """One ledger's records in arrival order; mutated on the reactor thread only, until swapped out."""

    __slots__ = ("first_id", "offsets", "parts", "size", "where")

    def __init__(self, first_id: int) -> None:
        self.parts: list[bytes] = []  # record n = parts[2n] (its size) + parts[2n + 1] (the entry)
        self.offsets = array("q")  # record n's entry starts offsets[n] bytes into the records
        self.size = 0  # bytes of all records
        self.first_id = first_id
        self.where: dict[int, int] | None = None  # entry id -> record number once not dense

    def put(self, entry_id: int, data: bytes) -> None:
        number = len(self.offsets)
        _append(self, data)
        where = self.where
        if where is None:
            if entry_id == self.first_id + number:
                return
            where = self.where = {self.first_id + n: n for n in range(number)}
        where[entry_id] = number

    def record_number(self, entry_id: int) -> int:
        """The newest record of `entry_id`, or -1."""
        if self.where is not None:
            return self.where.get(entry_id, -1)
        number = entry_id - self.first_id
        return number if 0 <= number < len(self.offsets) else -1

    def get(self, entry_id: int) -> bytes | None:
        number = self.record_number(entry_id)
        return None if number < 0 else self.parts[2 * number + 1]

    @property
    def dense(self) -> bool:
        return self.where is None

    def numbered(self) -> Iterator[tuple[int, int]]:
        """(entry id, record number) of every live entry, in arrival order for a dense ledger."""
        if self.where is None:
            first = self.first_id
            return ((first + n, n) for n in range(len(self.offsets)))
        return iter(self.where.items())

    def record_end(self, number: int) -> int:
        """Where record `number` ends in the records (the next one's size prefix starts there)."""
        return self.offsets[number] + len(self.parts[2 * number + 1])

    def records(self, start: int, stop: int) -> list[bytes]:
        """The parts of records [start, stop): written back to back, they are entry log records."""
        return self.parts[2 * start : 2 * stop]


def _append(ledger: LedgerBuffer, data: bytes) -> None:
    if type(data) is not bytes:  # a view of a buffer that will be reused: keep a copy
        data = bytes(data)
    size = len(data)
    ledger.parts += (_SIZE.pack(size), data)
    ledger.offsets.append(ledger.size + SIZE_PREFIX)
    ledger.size += SIZE_PREFIX + size


class WriteCache:
    """ledger id -> LedgerBuffer; `size_bytes` counts record bytes (entries plus their size prefixes)."""

    __slots__ = ("ledgers", "size_bytes")

    def __init__(self) -> None:
        self.ledgers: dict[int, LedgerBuffer] = {}
        self.size_bytes = 0

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        ledger = self.ledgers.get(ledger_id)
        if ledger is None:
            ledger = self.ledgers[ledger_id] = LedgerBuffer(entry_id)
        self.size_bytes += SIZE_PREFIX + len(data)
        if ledger.where is None and entry_id == ledger.first_id + len(ledger.offsets):
            _append(ledger, data)  # the hot path (one call per add): dense, no map to keep
        else:
            ledger.put(entry_id, data)

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
