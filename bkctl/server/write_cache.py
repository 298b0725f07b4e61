"""The in-memory write cache: entries accepted since the last checkpoint swap, readable at once."""

from __future__ import annotations

from collections.abc import Iterator


class WriteCache:
    """ledger id -> entry id -> stored entry; the checkpoint writes it out sorted by ledger and entry."""

    __slots__ = ("entries", "size_bytes")

    def __init__(self) -> None:
        self.entries: dict[int, dict[int, bytes]] = {}
        self.size_bytes = 0

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        ledger = self.entries.get(ledger_id)
        if ledger is None:
            ledger = self.entries[ledger_id] = {}
        old = ledger.get(entry_id)
        if old is not None:
            self.size_bytes -= len(old)
        ledger[entry_id] = data
        self.size_bytes += len(data)

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        ledger = self.entries.get(ledger_id)
        return None if ledger is None else ledger.get(entry_id)

    def __len__(self) -> int:
        return sum(len(e) for e in self.entries.values())

    def __bool__(self) -> bool:
        return bool(self.entries)

    def sorted_items(self) -> Iterator[tuple[int, int, bytes]]:
        """(ledger id, entry id, entry) in ledger then entry order, as SortedLedgerStorage flushes."""
        for ledger_id in sorted(self.entries):
            ledger = self.entries[ledger_id]
            for entry_id in sorted(ledger):
                yield ledger_id, entry_id, ledger[entry_id]

    def merge_under(self, newer: WriteCache) -> None:
        """Put `newer`'s entries over ours (a failed checkpoint gives its entries back)."""
        for ledger_id, entries in newer.entries.items():
            for entry_id, data in entries.items():
                self.put(ledger_id, entry_id, data)
