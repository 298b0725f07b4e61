"""Offline conversion of a stopped bookie's ledger directory between the two index engines (Java's
`convert-to-db-storage` and `convert-to-interleaved-storage`). The entry logs, journal and lastMark stay
as they are: only where locations and ledger state live changes.

Both ways the new index is written in full, then read back and compared with the old one entry by
entry (every location, every ledger's master key, fenced bit and explicit LAC); only then is the old
index removed. A kill at any point leaves the old index whole, and a rerun does the work again:
- to db: the databases are built as `ledgers.converting` / `locations.converting` and renamed into place
  once verified; with the databases in place and `.idx` files left (a kill during their removal), a
  rerun verifies again and removes them;
- to interleaved: each `.idx` file is written (or rewritten) whole from the databases, then the
  databases are verified against the files and removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bkctl.errors import CorruptDataError, ProtocolError
from bkctl.files.index import index_entries, open_index
from bkctl.protocol import db_format as dbf
from bkctl.protocol import index_format as ixf
from bkctl.server.db_ledger_index import data_of, header_of, read_ledgers
from bkctl.server.fileio import fsync_directory
from bkctl.server.index import IndexStore
from bkctl.server.rocksdb_store import KeyValueDb

log = logging.getLogger("bkctl.bookie")

CONVERTING: Final = ".converting"
BATCH_KEYS: Final = 100_000


@dataclass
class ConvertReport:
    to: str
    ledgers: int = 0
    entries: int = 0  # locations written and verified
    removed: list[str] = field(default_factory=list)  # what of the old index was removed
    seconds: float = 0.0


def _index_files(current: Path) -> dict[int, Path]:
    found = {}
    for path in current.glob(f"*/*/*{ixf.INDEX_SUFFIX}"):
        ledger_id = ixf.parse_index_file_name(path.name)
        if ledger_id is not None:
            found[ledger_id] = path
    return found


def has_index_files(current: Path) -> bool:
    return bool(_index_files(current))


def _read_index(path: Path) -> tuple[ixf.IndexHeader, dict[int, int]]:
    try:
        index = open_index(path)
        return index.header, {e: (log_id << 32) | offset for e, log_id, offset in index_entries(index)}
    except ProtocolError as exc:
        raise CorruptDataError(f"{path}: {exc}") from None


def to_db(ledger_dir: Path) -> ConvertReport:
    """Convert `ledger_dir` (its `.idx` files in its `current/`) to DbLedgerStorage's databases."""
    started = time.monotonic()
    current = ledger_dir / "current"
    report = ConvertReport("db")
    files = _index_files(current)
    ledgers_db, locations_db = current / dbf.LEDGERS_DB, current / dbf.LOCATIONS_DB
    if not (ledgers_db.is_dir() and locations_db.is_dir()):
        for name in (dbf.LEDGERS_DB, dbf.LOCATIONS_DB):
            staging = current / (name + CONVERTING)
            if staging.exists():
                shutil.rmtree(staging)  # an interrupted conversion: start over
        _build_db(current, files, report)
        _verify_db(current, files, CONVERTING)
        for name in (dbf.LEDGERS_DB, dbf.LOCATIONS_DB):
            os.rename(current / (name + CONVERTING), current / name)
        fsync_directory(current)
    else:
        _verify_db(current, files, "")
    report.ledgers = len(files)
    report.entries = 0
    for ledger_id, path in sorted(files.items()):
        report.entries += len(_read_index(path)[1])
        path.unlink()
        report.removed.append(str(path))
        log.debug("ledger %d: %s removed", ledger_id, path)
    emptied = {p.parent for p in files.values()} | {p.parent.parent for p in files.values()}
    for directory in sorted(emptied, key=lambda d: -len(d.parts)):  # <yy> dirs before their <xx>
        _remove_if_empty(directory)
    fsync_directory(current)
    report.seconds = time.monotonic() - started
    return report


def _build_db(current: Path, files: dict[int, Path], report: ConvertReport) -> None:
    ledgers = KeyValueDb(current / (dbf.LEDGERS_DB + CONVERTING), huge=False)
    locations = KeyValueDb(current / (dbf.LOCATIONS_DB + CONVERTING), huge=True)
    try:
        batch: dict[bytes, bytes] = {}
        for ledger_id, path in sorted(files.items()):
            header, slots = _read_index(path)
            ledgers.write({dbf.ledger_key(ledger_id): dbf.encode_ledger_data(data_of(header))}, sync=False)
            for entry_id, location in slots.items():
                batch[dbf.location_key(ledger_id, entry_id)] = dbf.encode_location(location)
            if len(batch) >= BATCH_KEYS:
                locations.write(batch, sync=False)
                batch = {}
        locations.write(batch)
        ledgers.write({})
        locations.flush()
        ledgers.flush()
    finally:
        locations.close()
        ledgers.close()


def _verify_db(current: Path, files: dict[int, Path], suffix: str) -> None:
    """Every `.idx` ledger and location equal in the databases, and nothing more there."""
    ledgers = KeyValueDb(current / (dbf.LEDGERS_DB + suffix), huge=False, read_only=True)
    locations = KeyValueDb(current / (dbf.LOCATIONS_DB + suffix), huge=True, read_only=True)
    try:
        stored = read_ledgers(ledgers)
        if set(stored) != set(files):
            raise CorruptDataError(f"{ledgers.path}: ledgers {sorted(set(stored) ^ set(files))} differ")
        for ledger_id, path in sorted(files.items()):
            header, slots = _read_index(path)
            if stored[ledger_id] != data_of(header):
                raise CorruptDataError(f"{ledgers.path}: ledger {ledger_id} state differs from {path}")
            if _db_slots(locations, ledger_id) != slots:
                raise CorruptDataError(f"{locations.path}: ledger {ledger_id} locations differ from {path}")
    finally:
        locations.close()
        ledgers.close()


def to_interleaved(ledger_dir: Path) -> ConvertReport:
    """Convert `ledger_dir`'s DbLedgerStorage databases to `.idx` files in its `current/`."""
    started = time.monotonic()
    current = ledger_dir / "current"
    report = ConvertReport("interleaved")
    ledgers = KeyValueDb(current / dbf.LEDGERS_DB, huge=False, read_only=True)
    locations = KeyValueDb(current / dbf.LOCATIONS_DB, huge=True, read_only=True)
    store = IndexStore((ledger_dir,), 64)
    try:
        stored = read_ledgers(ledgers)
        for ledger_id, data in sorted(stored.items()):
            slots = _db_slots(locations, ledger_id)
            path = store.find(ledger_id)
            if path is not None:
                path.unlink()  # a file of an interrupted run: written again whole
                store.delete(ledger_id)
            store.write(ledger_id, header_of(data), slots)
            report.entries += len(slots)
        files = _index_files(current)
        if set(files) != set(stored):
            raise CorruptDataError(f"{current}: index files {sorted(set(files) ^ set(stored))} differ")
        for ledger_id, path in sorted(files.items()):
            header, slots = _read_index(path)
            if data_of(header) != stored[ledger_id] or slots != _db_slots(locations, ledger_id):
                raise CorruptDataError(f"{path}: differs from the databases after writing")
    finally:
        locations.close()
        ledgers.close()
    report.ledgers = len(stored)
    for name in (dbf.LEDGERS_DB, dbf.LOCATIONS_DB):
        shutil.rmtree(current / name)
        report.removed.append(str(current / name))
    fsync_directory(current)
    report.seconds = time.monotonic() - started
    return report


def _db_slots(locations: KeyValueDb, ledger_id: int) -> dict[int, int]:
    first, end = dbf.location_key(ledger_id, 0), dbf.location_key(ledger_id + 1, 0)
    return {dbf.decode_location_key(k)[1]: dbf.decode_location(v) for k, v in locations.items(first, end)}


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not empty (other ledgers), or gone
        directory.rmdir()
