"""Which ledger storage a bookie's configuration and directories hold, decided before any file is written.

bkctl serves the interleaved storage: entry logs plus one `.idx` file per ledger (Java's
InterleavedLedgerStorage, and SortedLedgerStorage, Java's default, whose files are the same). A conf
naming another storage, or a ledger directory holding another storage's files, refuses the start:
served as an empty interleaved bookie, a DbLedgerStorage directory's entry logs would be deleted by
the first GC, every entry of that bookie lost. This module is the one place that decides, so serving
another storage later changes `SERVED` and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Final

from bkctl.errors import ConflictError, UsageError


class StorageKind(Enum):
    INTERLEAVED = "interleaved"  # entry logs + current/<xx>/<yy>/<id>.idx
    DB = "DbLedgerStorage"  # entry logs + RocksDB indexes in current/ledgers and current/locations


STORAGE_CLASS_KEY: Final = "ledgerStorageClass"
_PACKAGE: Final = "org.apache.bookkeeper.bookie."
CLASSES: Final = {
    _PACKAGE + "InterleavedLedgerStorage": StorageKind.INTERLEAVED,
    _PACKAGE + "SortedLedgerStorage": StorageKind.INTERLEAVED,
    _PACKAGE + "storage.ldb.DbLedgerStorage": StorageKind.DB,
}
SERVED: Final = frozenset({StorageKind.INTERLEAVED})
# DbLedgerStorage's RocksDB databases under current/ (ledger metadata, entry locations).
DB_DIRECTORIES: Final = ("ledgers", "locations")


def configured_kind(storage_class: str | None) -> StorageKind:
    """The kind a `ledgerStorageClass` value names (absent: Java's default, SortedLedgerStorage);
    UsageError for a class bkctl does not serve."""
    if not storage_class:
        return StorageKind.INTERLEAVED
    kind = CLASSES.get(storage_class.strip())
    if kind is None:
        raise UsageError(
            f"config key {STORAGE_CLASS_KEY}={storage_class}: a storage bkctl does not know; "
            "nothing was changed (bkctl serves InterleavedLedgerStorage and SortedLedgerStorage)"
        )
    if kind not in SERVED:
        raise UsageError(
            f"config key {STORAGE_CLASS_KEY}={storage_class}: bkctl does not serve {kind.value} yet; "
            "nothing was changed (run this bookie with Java BookKeeper)"
        )
    return kind


def found_kinds(ledger_dir: Path) -> set[StorageKind]:
    """The storages whose files `ledger_dir/current` holds (an empty or new directory: none)."""
    current = ledger_dir / "current"
    kinds: set[StorageKind] = set()
    if any((current / name).is_dir() for name in DB_DIRECTORIES):
        kinds.add(StorageKind.DB)
    if next(current.glob("*/*/*.idx"), None) is not None:
        kinds.add(StorageKind.INTERLEAVED)
    return kinds


def check_storage(storage_class: str | None, ledger_dirs: Iterable[Path]) -> StorageKind:
    """The storage to serve, or a refusal: the conf names a storage bkctl does not serve (UsageError),
    or a ledger directory holds another storage's files (ConflictError). Reads only."""
    kind = configured_kind(storage_class)
    for directory in ledger_dirs:
        foreign = found_kinds(directory) - {kind}
        if foreign:
            other = foreign.pop()
            raise ConflictError(
                f"{directory / 'current'} holds {other.value} files but {kind.value} storage is "
                f"configured ({STORAGE_CLASS_KEY}): refusing to start, nothing was changed; "
                "point the bookie at its own directories or its own configuration"
            )
    return kind
