"""A replay's entry locations, held in memory until the first checkpoint after the start writes them.

Putting a replayed location into the db engine's RocksDB costs ~0.5 µs through rocksdict (a call, a
memtable insertion, a WAL record): half a second of a restart on 1 GiB of journal, while the bookie
does not listen yet. Held here instead, they answer reads at once; the checkpoint the bookie starts as
it listens writes them before its own locations (db_ledger_index.DbLedgerIndex.commit), and lastMark
stays behind them until then: a kill -9 meanwhile replays the same journal again.

Each `add` is one ledger's locations of one replay round, kept as two arrays (16 bytes an entry); a
later round's location of an entry wins, as a later put does in RocksDB.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator


class _Chunk:
    """One round's locations of a ledger: entry ids and locations at the same index."""

    __slots__ = ("by_id", "entry_ids", "high", "locations", "low")

    def __init__(self, entry_ids: array[int], locations: array[int]) -> None:
        self.entry_ids = entry_ids
        self.locations = locations
        self.low = min(entry_ids)
        self.high = max(entry_ids)
        self.by_id: dict[int, int] | None = None  # built on the first lookup the offset cannot answer

    def find(self, entry_id: int) -> int:
        """The entry's location, or 0 (not in this chunk, or a hole)."""
        if entry_id < self.low or entry_id > self.high:
            return 0
        ids = self.entry_ids
        at = entry_id - ids[0]
        if 0 <= at < len(ids) and ids[at] == entry_id:  # journal order is usually entry order: no search
            return self.locations[at]
        by_id = self.by_id
        if by_id is None:
            by_id = self.by_id = dict(zip(ids, self.locations, strict=True))
        return by_id.get(entry_id, 0)


class ReplayedLocations:
    """Ledger id -> its replayed locations, in the order they were replayed."""

    def __init__(self) -> None:
        self._ledgers: dict[int, list[_Chunk]] = {}
        self.count = 0  # locations held

    def add(self, ledger_id: int, entry_ids: array[int], locations: array[int]) -> None:
        if entry_ids:
            self._ledgers.setdefault(ledger_id, []).append(_Chunk(entry_ids, locations))
            self.count += len(entry_ids)

    def location(self, ledger_id: int, entry_id: int) -> int:
        """The entry's latest replayed location, or 0 when none is held."""
        for chunk in reversed(self._ledgers.get(ledger_id, ())):
            location = chunk.find(entry_id)
            if location:
                return location
        return 0

    def last_entry_id(self, ledger_id: int) -> int:
        """The ledger's largest entry id held, or -1."""
        return max((chunk.high for chunk in self._ledgers.get(ledger_id, ())), default=-1)

    def entry_ids(self, ledger_id: int) -> set[int]:
        """The ledger's entry ids held (holes, location 0, left out)."""
        held: set[int] = set()
        for chunk in self._ledgers.get(ledger_id, ()):
            held.update(e for e, location in zip(chunk.entry_ids, chunk.locations, strict=True) if location)
        return held

    def drop(self, ledger_id: int) -> None:
        """Forget a ledger's locations (it was deleted)."""
        for chunk in self._ledgers.pop(ledger_id, ()):
            self.count -= len(chunk.entry_ids)

    def chunks(self) -> Iterator[tuple[int, array[int], array[int]]]:
        """(ledger id, entry ids, locations) in replay order within each ledger."""
        for ledger_id, chunks in self._ledgers.items():
            for chunk in chunks:
                yield ledger_id, chunk.entry_ids, chunk.locations
