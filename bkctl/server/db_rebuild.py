"""Offline rebuilds of DbLedgerStorage's RocksDB dbs of one ledger directory.

- The locations db from the entry logs (Java's `rebuild-db-ledger-locations-index`,
  LocationsIndexRebuildOp): every entry of a ledger the ledgers db holds gets the location of its copy
  in the entry logs, later logs winning.
- The ledgers db (Java's `rebuild-db-ledgers-index`, LedgersIndexRebuildOp): every ledger found in the
  directory's entry logs and in the journals (those of this directory: ledger id mod the number of
  ledger dirs), fenced, as Java's. Where Java writes an empty master key, bkctl takes the ledger's state
  from the old ledgers db when it still reads, else the key from the journal's master key record, else
  from the ledger's password in the metadata; only a ledger none of them knows keeps Java's empty key.

Unlike Java, which moves the old db aside first and then builds, the new db is built beside it in
`<db>.rebuilding` and swapped in only once complete and synced: a marker `<db>.rebuilt` is written
first, then the old db becomes `<db>.BACKUP-<time>` and the new one takes its name, then the marker
goes. A kill before the marker leaves the old db in place (a rerun starts the build over); after it, a
rerun (and nothing else: the bookie refuses to start on a marker) finishes the swap.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bkctl.errors import ConflictError, ProtocolError, UsageError
from bkctl.files.entrylog import entry_log_records, ledger_sizes, open_entry_log
from bkctl.files.journal import journal_records, open_journal
from bkctl.protocol import db_format as dbf
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import journal_format as jf
from bkctl.server.db_ledger_index import open_ledgers, read_ledgers
from bkctl.server.entrylog import existing_log_ids
from bkctl.server.faults import fault_point
from bkctl.server.fileio import fsync_directory
from bkctl.server.journal import list_journals
from bkctl.server.rocksdb_store import KeyValueDb
from bkctl.server.storage_kind import REBUILT_SUFFIX

log = logging.getLogger("bkctl.bookie")

REBUILDING_SUFFIX: Final = ".rebuilding"
_LEDGER_RECORDS: Final = (jf.RecordKind.DATA, jf.RecordKind.FENCE, jf.RecordKind.EXPLICIT_LAC)
BATCH_KEYS: Final = 100_000  # keys per (unsynced) write batch
BACKUPS_PER_SECOND_MAX: Final = 100  # local bound: backups of one db made within one second


@dataclass
class RebuildReport:
    ledgers: int = 0  # in the ledgers db
    entry_logs: list[int] = field(default_factory=list)
    keys: int = 0  # locations written (an entry in several logs counts once per log)
    skipped: int = 0  # entries of ledgers the ledgers db does not hold
    stops: list[str] = field(default_factory=list)  # logs whose scan stopped early, and why
    backup: str | None = None
    seconds: float = 0.0


def rebuild_locations(ledger_dir: Path) -> RebuildReport:
    """Rebuild `<ledger_dir>/current/locations`; the caller holds the directory's lock."""
    started = time.monotonic()
    current = ledger_dir / "current"
    report = RebuildReport()
    finish_interrupted_swaps(current)
    ledgers_db = open_ledgers(current, read_only=True)
    try:
        active = set(read_ledgers(ledgers_db))
    finally:
        ledgers_db.close()
    report.ledgers = len(active)

    def fill(built: KeyValueDb) -> None:
        for log_id, path in sorted(existing_log_ids([ledger_dir]).items()):
            _scan_log(path, log_id, active, built, report)
            fault_point("db-rebuild-building")  # part of the new db written

    report.backup = _build(current, dbf.LOCATIONS_DB, fill)
    report.seconds = time.monotonic() - started
    return report


def _build(current: Path, name: str, fill: Callable[[KeyValueDb], None]) -> str | None:
    """Build db `name` afresh in `<name>.rebuilding` with `fill`, sync it, swap it in; the backup."""
    target = current / (name + REBUILDING_SUFFIX)
    if target.exists():
        log.info("%s: left by an interrupted rebuild: starting over", target)
        shutil.rmtree(target)
    built = KeyValueDb(target, huge=name == dbf.LOCATIONS_DB)
    try:
        fill(built)
        built.write({})  # sync the WAL
        built.flush()
    finally:
        built.close()
    return _swap(current, name)


def _scan_log(path: Path, log_id: int, active: set[int], built: KeyValueDb, report: RebuildReport) -> None:
    entry_log = open_entry_log(path)
    if entry_log.empty:
        return
    report.entry_logs.append(log_id)
    batch: dict[bytes, bytes] = {}
    scan = entry_log_records(entry_log)
    for offset, kind, body in scan:
        if kind is not ef.RecordKind.DATA:
            continue
        ledger_id, entry_id = ef.record_key(body)
        if ledger_id not in active:
            report.skipped += 1
            continue
        # The location names the entry itself, past its 4-byte size (as the bookie indexes it).
        batch[dbf.location_key(ledger_id, entry_id)] = dbf.encode_location(
            ef.entry_location(log_id, offset + 4)
        )
        if len(batch) >= BATCH_KEYS:
            report.keys += len(batch)
            built.write(batch, sync=False)
            batch = {}
    report.keys += len(batch)
    built.write(batch, sync=False)
    if scan.stop is not None and not scan.stop.read_all_valid:
        report.stops.append(f"{path}: {scan.stop}")


def _swap(current: Path, name: str) -> str | None:
    """Put the complete, synced `<name>.rebuilding` in the place of `<name>`; the old one's backup."""
    fault_point("db-rebuild-built")  # complete and synced, not marked: a rerun builds again
    marker = current / (name + REBUILT_SUFFIX)
    marker.write_bytes(b"")
    fsync_directory(current)
    return _finish_swap(current, name)


def _finish_swap(current: Path, name: str) -> str | None:
    old, target = current / name, current / (name + REBUILDING_SUFFIX)
    backup = None
    if old.exists():
        backup = _backup_name(current, name)
        os.rename(old, backup)
        fault_point("db-rebuild-swapping")  # the old db moved away, the new one not yet in its place
    if target.exists():
        os.rename(target, old)
    fsync_directory(current)
    (current / (name + REBUILT_SUFFIX)).unlink()
    fsync_directory(current)
    return str(backup) if backup is not None else None


def _backup_name(current: Path, name: str) -> Path:
    """`<name>.BACKUP-<time>`, with `.N` added when a backup of that second is there (a rerun after a
    kill within the same second): a rename onto it would fail, or replace a backup."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    backup = current / f"{name}.BACKUP-{stamp}"
    for n in range(1, BACKUPS_PER_SECOND_MAX):
        if not backup.exists():
            return backup
        backup = current / f"{name}.BACKUP-{stamp}.{n}"
    raise ConflictError(f"{current}: {BACKUPS_PER_SECOND_MAX} backups of {name} this second; remove old ones")


def interrupted_swaps(current: Path) -> list[str]:
    """The dbs whose swap a kill interrupted (their marker is there)."""
    return [
        name for name in (dbf.LEDGERS_DB, dbf.LOCATIONS_DB) if (current / (name + REBUILT_SUFFIX)).exists()
    ]


def finish_interrupted_swaps(current: Path) -> None:
    for name in interrupted_swaps(current):
        log.info("%s: finishing the swap of an interrupted rebuild", current / name)
        _finish_swap(current, name)


# --- the ledgers db ----------------------------------------------------------------------------------


@dataclass
class LedgersRebuildReport:
    ledgers: int = 0  # written to the new ledgers db
    from_old_db: int = 0  # state kept from the old ledgers db
    key_from_journal: int = 0
    key_from_metadata: int = 0
    without_key: int = 0  # Java's empty master key: the bookie refuses adds with a key until recovery
    entry_logs: list[int] = field(default_factory=list)
    journals: list[str] = field(default_factory=list)
    old_db: str = "absent"  # "read", "absent" or why it could not be read
    stops: list[str] = field(default_factory=list)
    backup: str | None = None
    seconds: float = 0.0


@dataclass
class _Found:
    ledgers: set[int] = field(default_factory=set)
    keys: dict[int, bytes] = field(default_factory=dict)  # from journal master key records


def rebuild_ledgers(
    ledger_dir: Path,
    dir_index: int = 0,
    dir_count: int = 1,
    journal_dirs: tuple[Path, ...] = (),
    metadata_key: Callable[[int], bytes | None] | None = None,
) -> LedgersRebuildReport:
    """Rebuild `<ledger_dir>/current/ledgers` (the directory `dir_index` of `dir_count`: its ledgers are
    those whose id mod dir_count is dir_index); the caller holds the directories' locks."""
    started = time.monotonic()
    current = ledger_dir / "current"
    report = LedgersRebuildReport()
    finish_interrupted_swaps(current)
    old = _old_ledgers(current, report)
    found = _Found()
    for log_id, path in sorted(existing_log_ids([ledger_dir]).items()):
        entry_log = open_entry_log(path)
        if entry_log.empty:
            continue
        sizes = ledger_sizes(entry_log)
        report.entry_logs.append(log_id)
        _check_placement(ledger_dir, sizes.sizes, dir_index, dir_count)
        found.ledgers.update(sizes.sizes)
        if sizes.stop is not None and sizes.stop.is_error:
            report.stops.append(f"{path}: {sizes.stop}")
    for directory in journal_dirs:
        _scan_journals(directory / "current", found, report)
    ledgers = {i for i in found.ledgers | found.keys.keys() if i >= 0 and i % dir_count == dir_index}
    built = {**{i: _state_of(i, found, metadata_key, report) for i in ledgers - old.keys()}, **old}
    report.from_old_db = len(old)
    report.ledgers = len(built)
    pairs = {dbf.ledger_key(i): dbf.encode_ledger_data(data) for i, data in sorted(built.items())}
    report.backup = _build(current, dbf.LEDGERS_DB, lambda db: db.write(pairs, sync=False))
    report.seconds = time.monotonic() - started
    return report


def _check_placement(ledger_dir: Path, ledger_ids: Iterable[int], dir_index: int, dir_count: int) -> None:
    """UsageError when the directory's entry logs hold another directory's ledgers: the directories
    were given in another order than ledgerDirectories' (or another number of them)."""
    misplaced = sorted(i for i in ledger_ids if i % dir_count != dir_index)
    if misplaced:
        raise UsageError(
            f"{ledger_dir}: its entry logs hold ledger {misplaced[0]}, whose directory is number "
            f"{misplaced[0] % dir_count} of {dir_count} (ledger id mod {dir_count}), not {dir_index}: give "
            "every --ledger-dir, in ledgerDirectories' order; nothing was changed"
        )


def ledgers_db_readable(ledger_dir: Path) -> bool:
    """Does `<ledger_dir>/current/ledgers` open and decode whole? (Reads only.)"""
    report = LedgersRebuildReport()
    _old_ledgers(ledger_dir / "current", report)
    return report.old_db == "read"


def _old_ledgers(current: Path, report: LedgersRebuildReport) -> dict[int, dbf.LedgerData]:
    """The old ledgers db's state where it still reads whole; {} when absent or unreadable."""
    if not (current / dbf.LEDGERS_DB / "CURRENT").is_file():
        return {}
    try:
        db = open_ledgers(current, read_only=True)
    except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status text
        report.old_db = f"unreadable: {exc}"
        return {}
    try:
        old = read_ledgers(db)
    except Exception as exc:  # CorruptDataError, or RocksDB's own while iterating
        report.old_db = f"unreadable: {exc}"
        return {}
    finally:
        db.close()
    report.old_db = "read"
    return old


def _scan_journals(directory: Path, found: _Found, report: LedgersRebuildReport) -> None:
    for _, path in list_journals(directory):
        try:
            journal = open_journal(path)
        except ProtocolError as exc:
            report.stops.append(f"{path}: {exc}")
            continue
        report.journals.append(str(path))
        scan = journal_records(journal)
        for _, kind, body in scan:
            if (
                kind is jf.RecordKind.DATA
                or kind is jf.RecordKind.FENCE
                or kind is jf.RecordKind.EXPLICIT_LAC
            ):
                found.ledgers.add(jf.record_key(body)[0])
            elif kind is jf.RecordKind.MASTER_KEY:
                ledger_id, key = jf.decode_master_key(body)
                found.keys[ledger_id] = key
        if scan.stop is not None and scan.stop.is_error:
            report.stops.append(f"{path}: {scan.stop}")


def _state_of(
    ledger_id: int,
    found: _Found,
    metadata_key: Callable[[int], bytes | None] | None,
    report: LedgersRebuildReport,
) -> dbf.LedgerData:
    """A ledger the old db lacks: fenced (Java's rule: the bookie cannot know it was not), its key
    from the journal, else the metadata, else empty (Java's)."""
    key = found.keys.get(ledger_id)
    if key is not None:
        report.key_from_journal += 1
    elif metadata_key is not None and (key := metadata_key(ledger_id)) is not None:
        report.key_from_metadata += 1
    else:
        key = b""
        report.without_key += 1
    return dbf.LedgerData(key, fenced=True)
