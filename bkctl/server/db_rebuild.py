"""Offline rebuild of DbLedgerStorage's locations db from the entry logs (Java's
`rebuild-db-ledger-locations-index`, LocationsIndexRebuildOp): every entry of a ledger the ledgers db
holds gets the location of its copy in the entry logs, later logs winning.

Unlike Java, which moves the old db aside first and then builds, the new db is built beside it in
`locations.rebuilding` and swapped in only once complete and synced: a kill at any point leaves either
the old db in place (a rerun starts the build over) or the new one.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bkctl.files.entrylog import entry_log_records, open_entry_log
from bkctl.protocol import db_format as dbf
from bkctl.protocol import entrylog_format as ef
from bkctl.server.db_ledger_index import open_ledgers, read_ledgers
from bkctl.server.entrylog import existing_log_ids
from bkctl.server.fileio import fsync_directory
from bkctl.server.rocksdb_store import KeyValueDb

log = logging.getLogger("bkctl.bookie")

REBUILDING: Final = dbf.LOCATIONS_DB + ".rebuilding"
BATCH_KEYS: Final = 100_000  # keys per (unsynced) write batch


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
    ledgers_db = open_ledgers(current, read_only=True)
    try:
        active = set(read_ledgers(ledgers_db))
    finally:
        ledgers_db.close()
    report.ledgers = len(active)
    target = current / REBUILDING
    if target.exists():
        log.info("%s: left by an interrupted rebuild: starting over", target)
        shutil.rmtree(target)
    built = KeyValueDb(target, huge=True)
    try:
        for log_id, path in sorted(existing_log_ids([ledger_dir]).items()):
            _scan_log(path, log_id, active, built, report)
        built.write({})  # sync the WAL
        built.flush()
    finally:
        built.close()
    _swap(current, target, report)
    report.seconds = time.monotonic() - started
    return report


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


def _swap(current: Path, target: Path, report: RebuildReport) -> None:
    old = current / dbf.LOCATIONS_DB
    if old.exists():
        backup = current / f"{dbf.LOCATIONS_DB}.BACKUP-{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime())}"
        os.rename(old, backup)
        report.backup = str(backup)
    os.rename(target, old)
    fsync_directory(current)
