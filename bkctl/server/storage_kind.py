"""Which ledger storage a bookie's configuration and directories hold, decided before any file is written.

bkctl serves both of BookKeeper's storages: the interleaved one (entry logs plus one `.idx` file per
ledger: Java's InterleavedLedgerStorage, and SortedLedgerStorage, Java's default, whose files are the
same) and DbLedgerStorage (entry logs plus two RocksDB databases per ledger directory). A conf naming a
storage bkctl does not know, or a directory holding the other storage's files, refuses the start: a
DbLedgerStorage directory served as an empty interleaved bookie would have its entry logs deleted by the
first GC, every entry of that bookie lost. This module is the one place that decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Final

from bkctl.errors import ConflictError, UsageError
from bkctl.protocol import db_format as dbf
from bkctl.protocol import index_format as ixf

INTERLEAVED: Final = "interleaved"  # entry logs + current/<xx>/<yy>/<id>.idx
DB: Final = "db"  # entry logs + RocksDB indexes in current/ledgers and current/locations
NAMES: Final = {INTERLEAVED: "interleaved", DB: "DbLedgerStorage"}
STORAGE_CLASS_KEY: Final = "ledgerStorageClass"
_PACKAGE: Final = "org.apache.bookkeeper.bookie."
# ledgerStorageClass values (bk_server.conf) and the engine each selects.
CLASSES: Final = {
    _PACKAGE + "InterleavedLedgerStorage": INTERLEAVED,
    _PACKAGE + "SortedLedgerStorage": INTERLEAVED,
    dbf.STORAGE_CLASS: DB,
}
SERVED: Final = frozenset({INTERLEAVED, DB})
# Beside a RocksDB db whose offline rebuild was killed while swapping the new db in (db_rebuild.py).
REBUILT_SUFFIX: Final = ".rebuilt"
# In the first ledger dir's current/ while a decided conversion is unfinished (storage_convert.py).
CONVERT_STATE_NAME: Final = "convert.json"


def configured_kind(storage_class: str | None) -> str:
    """The engine a `ledgerStorageClass` value names (absent: Java's default, SortedLedgerStorage);
    UsageError for a class bkctl does not serve."""
    if not storage_class:
        return INTERLEAVED
    kind = CLASSES.get(storage_class.strip())
    if kind is None or kind not in SERVED:
        raise UsageError(
            f"config key {STORAGE_CLASS_KEY}={storage_class}: a storage bkctl does not know; "
            f"nothing was changed (bkctl serves {', '.join(CLASSES)})"
        )
    return kind


def found_kinds(ledger_dir: Path) -> set[str]:
    """The storages whose files `ledger_dir/current` holds (an empty or new directory: none)."""
    current = ledger_dir / "current"
    kinds: set[str] = set()
    if any((current / name).is_dir() for name in (dbf.LEDGERS_DB, dbf.LOCATIONS_DB)):
        kinds.add(DB)
    if next(current.glob(f"*/*/*{ixf.INDEX_SUFFIX}"), None) is not None:
        kinds.add(INTERLEAVED)
    return kinds


def found_engine(ledger_dir: Path) -> str | None:
    """The engine whose index a ledger directory holds (DbLedgerStorage first), None if neither."""
    kinds = found_kinds(ledger_dir)
    return DB if DB in kinds else INTERLEAVED if kinds else None


def check_storage(kind: str, directories: Iterable[Path]) -> None:
    """ConflictError when a ledger or index directory holds the other storage's files, or a db whose
    rebuild was killed while swapping it in (a bookie started there would see no db). Reads only."""
    for directory in directories:
        current = directory / "current"
        if (current / CONVERT_STATE_NAME).exists():
            raise ConflictError(
                f"{current}: a conversion of this bookie's storage was killed after it was decided: refusing "
                "to start, nothing was changed; run the same `bkctl bookie convert` again to finish it"
            )
        swapping = [
            n for n in (dbf.LEDGERS_DB, dbf.LOCATIONS_DB) if (current / (n + REBUILT_SUFFIX)).exists()
        ]
        if swapping:
            raise ConflictError(
                f"{current}: the rebuild of {', '.join(swapping)} was killed while swapping it in: refusing "
                "to start, nothing was changed; run `bkctl index rebuild` on this directory again"
            )
        foreign = found_kinds(directory) - {kind}
        if foreign:
            other = foreign.pop()
            raise ConflictError(
                f"{directory / 'current'} holds {NAMES[other]} files but {NAMES[kind]} storage is "
                f"configured ({STORAGE_CLASS_KEY}, --storage): refusing to start, nothing was changed; "
                "point the bookie at its own directories or its own configuration"
            )
