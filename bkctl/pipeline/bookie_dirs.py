"""A bookie's directories as the audit sees them, and its index files: all the Spark planner needs to
split the work (sources.py), so it stays light to import (no numpy, no bookie server modules: the
planner's Python processes import it, the readers' modules only load in the executors)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bkctl.protocol import index_format as ixf


@dataclass
class BookieDirs:
    """One bookie's directories found on this machine (their `current/` subdirectories)."""

    bookie_id: str
    ledger_dirs: list[Path] = field(default_factory=list)
    journal_dirs: list[Path] = field(default_factory=list)


def index_files(bookie: BookieDirs) -> list[Path]:
    """Every `<x>/<y>/<hex>.idx` under the bookie's ledger dirs (Java's default: index in ledger dirs)."""
    files = []
    for current in bookie.ledger_dirs:
        files += [p for p in current.glob("*/*/*.idx") if ixf.parse_index_file_name(p.name) is not None]
    return sorted(files)


def db_dirs(bookie: BookieDirs) -> list[Path]:
    """The bookie's ledger dirs (`current/`) holding DbLedgerStorage's locations db."""
    return sorted(current for current in bookie.ledger_dirs if (current / "locations" / "CURRENT").is_file())
