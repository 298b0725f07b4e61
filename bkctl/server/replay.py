"""Journal replay on start: every record from lastMark on, through the bkctl.files journal reader.

Replay is tolerant of a torn tail: a record cut short, or garbage after the last whole record, ends
that journal's replay at the last whole record; the file and offset are logged (logger bkctl.bookie).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bkctl.errors import BkctlError
from bkctl.files.chunks import FileScan
from bkctl.files.journal import open_journal
from bkctl.protocol import journal_format as jf
from bkctl.protocol.journal_format import RecordKind
from bkctl.server.journal import Mark, list_journals

log = logging.getLogger("bkctl.bookie")

# (record kind, record body) -> None; the body is a memoryview valid during the call only.
ApplyRecord = Callable[[RecordKind, memoryview], None]


@dataclass
class ReplayReport:
    start_mark: Mark
    end_mark: Mark = (-1, 0)
    journals: list[str] = field(default_factory=list)
    records: int = 0
    entries: int = 0
    bytes: int = 0  # journal bytes scanned
    skipped: int = 0  # records of ledgers this bookie does not know (deleted), or unknown kinds
    seconds: float = 0.0
    stops: list[str] = field(default_factory=list)  # where a journal ended early, and why

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def replay(journal_dir: Path, mark: Mark, apply: ApplyRecord) -> ReplayReport:
    """Scan the journals from `mark` (oldest first) and apply every record; returns what was done."""
    report = ReplayReport(mark)
    started = time.perf_counter()
    for journal_id, path in list_journals(journal_dir):
        if journal_id < mark[0]:
            continue
        report.journals.append(path.name)
        _replay_one(path, mark[1] if journal_id == mark[0] else 0, apply, report)
        report.end_mark = (journal_id, report.end_mark[1])
    report.seconds = time.perf_counter() - started
    return report


def _replay_one(path: Path, offset: int, apply: ApplyRecord, report: ReplayReport) -> None:
    try:
        journal = open_journal(path)
    except BkctlError as exc:
        report.stops.append(f"{path} offset 0: {exc}")
        log.error("journal %s: not replayed: %s", path, exc)
        return
    start = max(offset, journal.data_start)
    version = journal.version

    def scan(buf: bytes, begin: int, base: int, at_eof: bool) -> Any:
        return jf.scan_records(buf, begin, base, version, at_eof)

    records = FileScan(path, start, scan)
    count = entries = 0
    for _, kind, body in records:
        count += 1
        if kind is RecordKind.DATA:
            entries += 1
        apply(kind, body)
    stop = records.stop
    end = stop.position if stop is not None else start
    report.records += count
    report.entries += entries
    report.bytes += max(0, end - start)
    report.end_mark = (-1, end)
    if stop is not None and stop.is_error:
        what = "torn tail" if stop.truncated else "corrupt record"
        report.stops.append(f"{path} offset {stop.position}: {stop.reason}")
        log.warning(
            "journal %s: replay stopped at offset %d (%s: %s); %d records before it were replayed",
            path,
            stop.position,
            what,
            stop.reason,
            count,
        )
