"""The seam between the bookie's storage (journal, write cache, entry logs, checkpoints: storage.py) and
where entry locations and ledger state are kept, which is what tells BookKeeper's two storages apart:

- "interleaved" (InterleavedLedgerStorage / SortedLedgerStorage): one `.idx` file per ledger
  (index.IndexStore);
- "db" (DbLedgerStorage): two RocksDB databases per ledger directory (db_ledger_index.DbLedgerIndex).

A bookie refuses to start one engine on the other's directories: each would see none of the other's
ledgers and answer "no such ledger" for data it holds.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final, Protocol

from bkctl.protocol import db_format as dbf
from bkctl.protocol import index_format as ixf
from bkctl.server.index import LoadedIndex
from bkctl.server.storage_kind import DB, INTERLEAVED

ENGINES: Final = (INTERLEAVED, DB)
ENGINE_CLASSES: Final = {
    INTERLEAVED: "org.apache.bookkeeper.bookie.SortedLedgerStorage",
    DB: dbf.STORAGE_CLASS,
}


class LedgerIndex(Protocol):
    """Ledger state (the index header) and entry locations; reads on the reactor thread, writes on the
    checkpoint thread (`commit` writes a checkpoint's index, or with `replayed` a replay's; `persist`
    makes what was committed durable before lastMark moves past it, at once for the interleaved engine's
    files)."""

    page_misses: int

    def open(self) -> None: ...
    def find(self, ledger_id: int) -> Path | None: ...
    def load(self, ledger_id: int) -> LoadedIndex | None: ...
    def location(self, ledger_id: int, entry_id: int) -> tuple[int, Path | None, int]: ...
    def entry_ids(self, ledger_id: int) -> Iterator[int]: ...
    def ledger_ids(self) -> set[int]: ...
    def write(self, ledger_id: int, header: ixf.IndexHeader | None, locations: Mapping[int, int]) -> None: ...
    def write_run(
        self, ledger_id: int, header: ixf.IndexHeader | None, first_entry_id: int, slots: bytes
    ) -> None: ...
    def commit(self, replayed: bool = False) -> None: ...
    @property
    def unpersisted(self) -> bool: ...
    def persist(self) -> None: ...
    def relocate(self, ledger_id: int, moves: list[tuple[array[int], bytes, bytes]]) -> int: ...
    def sync_relocated(self) -> int: ...
    def delete(self, ledger_id: int) -> Path | None: ...
    def forget_pages(self) -> None: ...
    def close(self) -> None: ...
