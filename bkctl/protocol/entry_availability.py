"""The entries a bookie holds of one ledger, as BookKeeper's AvailabilityOfEntriesOfLedger bytes: the
body of a v3 GET_LIST_OF_ENTRIES_OF_LEDGER response (what the Java auditor's replicas check reads).

Layout (big-endian): a 64-byte header (int version 0, int number of groups, zeros), then 24 bytes per
sequence group: long first_start, long last_start, int size, int period. A group is runs of `size`
consecutive entries starting every `period` ids from first_start to last_start (period 0: one run).
Striping makes this compact: with E=3, Qw=2 a bookie holds two entries of every three, one group.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from bkctl.errors import ProtocolError

HEADER_SIZE: Final = 64
VERSION: Final = 0
_HEADER: Final = struct.Struct(">ii")
_GROUP: Final = struct.Struct(">qqii")
_INT_MAX: Final = 2**31 - 1  # format fact


@dataclass(frozen=True)
class SequenceGroup:
    first_start: int
    last_start: int
    size: int
    period: int

    @property
    def entries(self) -> int:
        runs = 1 if self.period == 0 else (self.last_start - self.first_start) // self.period + 1
        return runs * self.size

    def ids(self) -> Iterator[int]:
        step = self.period or 1  # period 0: one run (first_start == last_start)
        for start in range(self.first_start, self.last_start + 1, step):
            yield from range(start, start + self.size)


def runs(entry_ids: Iterable[int]) -> Iterator[tuple[int, int]]:
    """(start, size) of each run of consecutive ids in ascending, duplicate-free `entry_ids`."""
    start = size = 0
    for entry_id in entry_ids:
        if size and entry_id == start + size and size < _INT_MAX:
            size += 1
            continue
        if size:
            yield start, size
        start, size = entry_id, 1
    if size:
        yield start, size


def groups(entry_ids: Iterable[int]) -> list[SequenceGroup]:
    """Runs of equal size at a constant distance, merged into groups (ids ascending, no duplicates)."""
    out: list[SequenceGroup] = []
    for start, size in runs(entry_ids):
        last = out[-1] if out else None
        if last is not None and last.size == size:
            period = start - last.last_start
            if (last.period in (0, period)) and period <= _INT_MAX:
                out[-1] = SequenceGroup(last.first_start, start, size, period)
                continue
        out.append(SequenceGroup(start, start, size, 0))
    return out


def encode(entry_ids: Iterable[int]) -> bytes:
    """The availability bytes of ascending, duplicate-free entry ids."""
    found = groups(entry_ids)
    header = _HEADER.pack(VERSION, len(found)).ljust(HEADER_SIZE, b"\0")
    return header + b"".join(_GROUP.pack(g.first_start, g.last_start, g.size, g.period) for g in found)


def decode(data: bytes | memoryview) -> list[SequenceGroup]:
    """The groups of availability bytes; ProtocolError when they are cut, of a newer version or absurd."""
    if len(data) < HEADER_SIZE:
        raise ProtocolError(f"entry availability of {len(data)} bytes: cut in its {HEADER_SIZE}-byte header")
    version, count = _HEADER.unpack_from(data, 0)
    if version > VERSION:
        raise ProtocolError(f"entry availability version {version} is not supported (at most {VERSION})")
    if count < 0 or HEADER_SIZE + count * _GROUP.size > len(data):
        raise ProtocolError(f"entry availability says {count} groups but holds {len(data)} bytes")
    out = []
    for i in range(count):
        group = SequenceGroup(*_GROUP.unpack_from(data, HEADER_SIZE + i * _GROUP.size))
        if group.size <= 0 or group.period < 0 or not 0 <= group.first_start <= group.last_start:
            raise ProtocolError(f"entry availability group {i} is malformed: {group}")
        if group.period == 0 and group.last_start != group.first_start:
            raise ProtocolError(f"entry availability group {i} has several runs and no period: {group}")
        out.append(group)
    return out


def entry_ids(data: bytes | memoryview) -> Iterator[int]:
    """Every entry id the availability bytes say are held, ascending."""
    for group in decode(data):
        yield from group.ids()


class Holdings:
    """Whether an entry id is held, straight from the groups (a bookie may hold millions of a ledger's
    entries: they are never listed). Groups are disjoint and ascending, as both encoders make them."""

    def __init__(self, groups: list[SequenceGroup]) -> None:
        self._groups = sorted(groups, key=lambda g: g.first_start)
        self._starts = [g.first_start for g in self._groups]

    def __contains__(self, entry_id: object) -> bool:
        if not isinstance(entry_id, int):
            return False
        at = bisect.bisect_right(self._starts, entry_id)
        if at == 0:
            return False
        group = self._groups[at - 1]
        offset = entry_id - group.first_start
        if group.period == 0:
            return offset < group.size
        run, within = divmod(offset, group.period)
        return within < group.size and group.first_start + run * group.period <= group.last_start
