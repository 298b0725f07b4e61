"""An offline, read-only consistency check of a stopped bookie's ledger storage (Java's
localconsistencycheck, plus the other direction).

1. Every index file decodes (start_checks.index_problem).
2. Every index slot points at a record of the same ledger and entry, in an entry log that exists,
   whose digest verifies (the ledger's digest type inferred from its entries, as the bookie does).
3. Every DATA record in the entry logs is reachable: its ledger has an index and the entry's slot is
   set. A record that is not is a problem unless its entry is in the journal past lastMark (the next
   start replays it; `journal_dirs` given) or its ledger is known deleted (`deleted(ledger)`: the
   metadata lacks it, so GC will collect the record).

On DbLedgerStorage the index is each ledger directory's RocksDB dbs (`current/ledgers` and
`current/locations`), checked against that directory's own entry logs (log ids are per directory
there); `index_files` then counts the ledgers of the ledgers dbs.

Nothing is written and no lock is taken: run it on a stopped bookie, or accept that a running one
changes what it reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bkctl.errors import BkctlError, ProtocolError
from bkctl.files.digests import DigestChecker
from bkctl.files.index import index_entries, open_index
from bkctl.files.marks import LAST_MARK_NAME, read_last_mark
from bkctl.protocol import db_format as dbf
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol.journal_format import RecordKind as JournalRecordKind
from bkctl.server.entrylog import existing_log_ids
from bkctl.server.fileio import CLOEXEC
from bkctl.server.index_rebuild import data_records
from bkctl.server.replay import replay
from bkctl.server.start_checks import index_files, index_problem
from bkctl.server.storage_kind import DB, found_engine

_SIZE_PREFIX = 4
_UNHELD = "a location of a ledger the ledgers db does not hold: the bookie does not serve it"


@dataclass
class CheckReport:
    index_files: int = 0
    entry_logs: int = 0
    slots: int = 0
    records: int = 0
    in_journal: int = 0  # records not indexed yet whose entries the journal replays
    problems: list[dict[str, object]] = field(default_factory=list)

    def add(
        self, problem: str, ledger_id: int, entry_id: int | None, path: Path, offset: int, detail: str
    ) -> None:
        self.problems.append(
            {
                "problem": problem,
                "ledger_id": ledger_id,
                "entry_id": entry_id,
                "file": str(path),
                "offset": offset,
                "detail": detail,
            }
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "index_files": self.index_files,
            "entry_logs": self.entry_logs,
            "slots": self.slots,
            "records": self.records,
            "in_journal": self.in_journal,
            "problems": self.problems,
        }


def check(
    ledger_dirs: tuple[Path, ...],
    index_dirs: tuple[Path, ...],
    journal_dirs: tuple[Path, ...] = (),
    deleted: Callable[[int], bool] = lambda ledger_id: False,
) -> CheckReport:
    report = CheckReport()
    checker = DigestChecker()
    journaled = _journal_entries(journal_dirs, ledger_dirs)
    if any(found_engine(d) == DB for d in ledger_dirs):
        for directory in ledger_dirs:
            logs = existing_log_ids((directory,))
            indexed = _check_db_slots(report, directory / "current", logs, checker)
            _check_records(report, logs, indexed, journaled, deleted)
        return report
    logs = existing_log_ids(ledger_dirs)
    indexed = _check_slots(report, index_dirs, logs, checker)
    _check_records(report, logs, indexed, journaled, deleted)
    return report


def _check_records(
    report: CheckReport,
    logs: dict[int, Path],
    indexed: dict[int, set[int]],
    journaled: set[tuple[int, int]],
    deleted: Callable[[int], bool],
) -> None:
    """Every DATA record of the logs is indexed, or replayed from the journal, or of a deleted ledger."""
    report.entry_logs += len(logs)
    for record in data_records(logs):
        report.records += 1
        ledger_id, entry_id = record.ledger_id, record.entry_id
        slots = indexed.get(ledger_id)
        if slots is not None and entry_id in slots:
            continue
        if (ledger_id, entry_id) in journaled:
            report.in_journal += 1
        elif not deleted(ledger_id):
            why = "no index file for its ledger" if slots is None else "its index slot is not set"
            report.add("unreachable", ledger_id, entry_id, record.log_path, record.offset, why)


def _check_db_slots(
    report: CheckReport, current: Path, logs: dict[int, Path], checker: DigestChecker
) -> dict[int, set[int]]:
    """DbLedgerStorage: every location of the directory's locations db; each ledger's located entries
    (a ledger the ledgers db lacks is served as absent: its locations are a problem)."""
    from bkctl.server.db_ledger_index import open_ledgers, open_locations, read_ledgers

    ledgers_db = open_ledgers(current, read_only=True)
    try:
        ledgers = read_ledgers(ledgers_db)
    finally:
        ledgers_db.close()
    report.index_files += len(ledgers)
    indexed: dict[int, set[int]] = {ledger_id: set() for ledger_id in ledgers}
    locations = open_locations(current, read_only=True)
    fds: dict[int, int] = {}
    try:
        for key, value in locations.items():
            report.slots += 1
            ledger_id, entry_id = dbf.decode_location_key(key)
            log_id, offset = ef.split_location(dbf.decode_location(value))
            if ledger_id not in ledgers:
                report.add("slot", ledger_id, entry_id, locations.path, 0, _UNHELD)
                continue
            indexed[ledger_id].add(entry_id)
            why = _slot_problem(ledger_id, entry_id, log_id, offset, logs, fds, checker)
            if why is not None:
                report.add("slot", ledger_id, entry_id, locations.path, 0, why)
    finally:
        locations.close()
        for fd in fds.values():
            os.close(fd)
    return indexed


def _check_slots(
    report: CheckReport, index_dirs: Iterable[Path], logs: dict[int, Path], checker: DigestChecker
) -> dict[int, set[int]]:
    """Check every slot of every index; each decodable index's set entry ids."""
    indexed: dict[int, set[int]] = {}
    fds: dict[int, int] = {}
    try:
        for ledger_id, path in index_files(index_dirs):
            report.index_files += 1
            problem = index_problem(path)
            if problem is not None:
                report.add("index", ledger_id, None, path, 0, problem)
                continue
            if path.stat().st_size == 0:
                continue
            slots = indexed[ledger_id] = set()
            for entry_id, log_id, offset in index_entries(open_index(path)):
                report.slots += 1
                slots.add(entry_id)
                why = _slot_problem(ledger_id, entry_id, log_id, offset, logs, fds, checker)
                if why is not None:
                    report.add("slot", ledger_id, entry_id, path, 0, why)
    finally:
        for fd in fds.values():
            os.close(fd)
    return indexed


def _slot_problem(
    ledger_id: int,
    entry_id: int,
    log_id: int,
    offset: int,
    logs: dict[int, Path],
    fds: dict[int, int],
    checker: DigestChecker,
) -> str | None:
    path = logs.get(log_id)
    if path is None:
        return f"points at entry log {log_id:x}, which does not exist"
    fd = fds.get(log_id)
    if fd is None:
        fd = fds[log_id] = os.open(path, os.O_RDONLY | CLOEXEC)
    if offset < ef.HEADER_SIZE + _SIZE_PREFIX:
        return f"points at offset {offset} of {path.name}, inside its header"
    size = int.from_bytes(os.pread(fd, _SIZE_PREFIX, offset - _SIZE_PREFIX), "big", signed=True)
    if size < 16:
        return f"points at {path.name} offset {offset}: no record there (size {size})"
    body = os.pread(fd, size, offset)
    if len(body) < size:
        return f"points at {path.name} offset {offset}: the record runs past the end of the file"
    found = ef.record_key(body)
    if found != (ledger_id, entry_id):
        return f"points at {path.name} offset {offset}: a record of ledger {found[0]} entry {found[1]}"
    if checker.check(ledger_id, body)[1] is False:
        return f"points at {path.name} offset {offset}: the record's digest does not verify"
    return None


def _journal_entries(journal_dirs: tuple[Path, ...], ledger_dirs: tuple[Path, ...]) -> set[tuple[int, int]]:
    """(ledger, entry) of every DATA record the next start would replay (each journal from lastMark)."""
    found: set[tuple[int, int]] = set()

    def keep(kind: JournalRecordKind, body: memoryview) -> None:
        if kind is JournalRecordKind.DATA:
            found.add(ef.record_key(body))

    for index, journal_dir in enumerate(journal_dirs):
        name = LAST_MARK_NAME if len(journal_dirs) == 1 else f"{LAST_MARK_NAME}.{index}"
        marks = [(-1, 0)]
        for directory in ledger_dirs:
            try:
                mark = read_last_mark(directory / "current" / name)
            except (BkctlError, ProtocolError, OSError):
                continue
            marks.append((mark.journal_id, mark.offset))
        replay(journal_dir / "current", max(marks), keep)
    return found
