"""Journal replay on start: every record from lastMark on, read in big chunks into one reused buffer.

Two paths share each chunk. The fast path (`take_data`, when the caller gives one) consumes runs of
whole DATA records straight from the buffer, with no object per record: that is nearly all of a
journal. Every other record (master key, fence, explicit LAC, padding, a DATA record the fast path
declines, a record cut by the chunk end, anything malformed) goes through the codec's
`journal_format.scan_records` one record at a time, so what is accepted, and where a journal stops,
is exactly what the codec says.

Replay is tolerant of a torn tail: a record cut short, or garbage after the last whole record, ends
that journal's replay at the last whole record; the file and offset are logged (logger bkctl.bookie).
Damage in the middle of a journal is told from a torn tail by what follows it: replay looks for the
next group commit (groups start at 512-byte boundaries in version 5+ journals) whose records parse and
hold a DATA record with a matching CRC digest; if there is one, the records in between are skipped
(logged with the offsets) and replay goes on there, so acknowledged entries after a flipped length
field are not lost. A record the storage rejects (its digest fails, see replay_runs) is skipped alone.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bkctl import limits
from bkctl.errors import BkctlError, CorruptDataError
from bkctl.files.chunks import open_read_only
from bkctl.files.journal import open_journal
from bkctl.protocol import entry as entry_codec
from bkctl.protocol import journal_format as jf
from bkctl.protocol.journal_format import RecordKind
from bkctl.protocol.scanning import ScanStop, StopStatus
from bkctl.server.fileio import read_into
from bkctl.server.journal import Mark, list_journals

log = logging.getLogger("bkctl.bookie")

# (record kind, record body) -> None, or why the record was rejected (skipped: replay logs it with its
# file and offset); the body is a memoryview valid during the call only.
ApplyRecord = Callable[[RecordKind, memoryview], str | None]
# (buffer, start, end) -> (where it stopped, DATA records taken): consume whole DATA records from
# buffer[start:end] and stop before the first one it will not take; the buffer is valid during the call.
TakeData = Callable[[bytearray, int, int], tuple[int, int]]

# (journal bytes replayed, journal bytes found to replay), each since the last call: told once per
# journal dir with what it holds past its mark, then after every chunk (a terminal's progress bar).
ReplayProgress = Callable[[int, int], None]

# Bytes read at a time. Bigger than the biggest record, so a record that straddles a chunk's end is
# always whole after one re-read from its start.
READ_CHUNK_SIZE: Final = max(8 * 1024 * 1024, 2 * (limits.JOURNAL_RECORD_SIZE_MAX + jf.PADDING_HEADER_SIZE))
# Where a group commit may start after damage (every journal alignment is a multiple of it).
RESYNC_ALIGNMENT: Final = jf.DEFAULT_ALIGNMENT
# Records parsed at a candidate group start before it is given up without a CRC-verified DATA record.
RESYNC_RECORDS_MAX: Final = 16  # local bound


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
    rejected: list[str] = field(default_factory=list)  # records skipped (digest mismatch): file offset why
    resyncs: list[str] = field(default_factory=list)  # damaged stretches skipped mid-journal

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def replay(
    journal_dir: Path,
    mark: Mark,
    apply: ApplyRecord,
    take_data: TakeData | None = None,
    mark_written_ns: int | None = None,
    progress: ReplayProgress | None = None,
) -> ReplayReport:
    """Scan the journals from `mark` (oldest first) and apply every record; returns what was done.

    Without `take_data` every record goes to `apply`; with it, the DATA records it takes do not.
    `mark_written_ns` (the lastMark file's mtime) lets replay notice a mark this journal dir's writer
    did not make (see `start_offset`).
    """
    report = ReplayReport(mark)
    started = time.perf_counter()
    buffer = bytearray(READ_CHUNK_SIZE)
    journals = list_journals(journal_dir)
    if journals and mark[0] > journals[-1][0]:
        # A bookie's mark names a journal it still has (journals are removed only below the mark):
        # this one is damaged or not this directory's. Skipping every journal would lose entries.
        log.warning(
            "lastMark names journal %x, newer than every journal in %s: not this bookie's mark; "
            "replaying every journal whole",
            mark[0],
            journal_dir,
        )
        mark = (-1, 0)
    offsets = [(path, start_offset(journal_id, path, mark, mark_written_ns)) for journal_id, path in journals]
    told = progress or (lambda replayed, found: None)
    told(0, sum(max(0, path.stat().st_size - offset) for path, offset in offsets if offset is not None))
    for (journal_id, _), (path, offset) in zip(journals, offsets, strict=True):
        if offset is None:
            continue
        report.journals.append(path.name)
        scan = _JournalScan(path, buffer, apply, take_data, told)
        scan.run(offset, report)
        report.end_mark = (journal_id, report.end_mark[1])
    report.seconds = time.perf_counter() - started
    return report


def start_offset(journal_id: int, path: Path, mark: Mark, mark_written_ns: int | None) -> int | None:
    """Where replay of one journal starts; None when the checkpoint of `mark` covers all of it.

    A journal older than the mark is covered only if nothing was written to it after the mark was:
    the bookie stops writing a journal before it starts the next one, and a checkpoint writes lastMark
    after that. A journal written later means the mark came from another process (two bookies on one
    directory, a directory copied from another bookie): skipping it would lose acknowledged entries,
    so it is replayed whole. The same for a mark past the end of its own journal.
    """
    if journal_id > mark[0]:
        return 0
    stat = path.stat()
    if journal_id == mark[0]:
        if mark[1] <= stat.st_size:
            return mark[1]
        log.warning(
            "lastMark points at offset %d of %s, past its end (%d bytes): not this journal's mark; "
            "replaying the journal whole",
            mark[1],
            path,
            stat.st_size,
        )
        return 0
    if mark_written_ns is not None and stat.st_mtime_ns > mark_written_ns:
        log.warning(
            "%s was written after lastMark (journal %x) was: that mark is not this bookie's; "
            "replaying the journal whole",
            path,
            mark[0],
        )
        return 0
    return None


def merge_reports(reports: list[ReplayReport]) -> ReplayReport:
    """One report for the replay of several journals: counts summed, marks those of the first journal.

    With several, each journal name is prefixed by its journal's index (each dir has its own journal ids).
    """
    if len(reports) == 1:
        return reports[0]
    merged = ReplayReport(reports[0].start_mark, reports[0].end_mark)
    for index, report in enumerate(reports):
        merged.journals += [f"journal {index}: {name}" for name in report.journals]
        merged.records += report.records
        merged.entries += report.entries
        merged.bytes += report.bytes
        merged.skipped += report.skipped
        merged.seconds += report.seconds
        merged.stops += report.stops
        merged.rejected += report.rejected
        merged.resyncs += report.resyncs
    return merged


class _JournalScan:
    """Replays one journal file through the reused chunk buffer."""

    def __init__(
        self,
        path: Path,
        buffer: bytearray,
        apply: ApplyRecord,
        take_data: TakeData | None,
        progress: ReplayProgress,
    ) -> None:
        self.path = path
        self.buffer = buffer
        self.apply = apply
        self.take_data = take_data
        self.progress = progress
        self.records = 0
        self.entries = 0
        self.report = ReplayReport((-1, 0))

    def run(self, offset: int, report: ReplayReport) -> None:
        try:
            version = open_journal(self.path).version
        except BkctlError as exc:
            if self.path.stat().st_size > jf.data_start(jf.VERSION_MAX):
                # Records follow a damaged header: replaying nothing would drop acknowledged entries.
                raise CorruptDataError(
                    f"{self.path} offset 0: corrupt journal header ({exc}); move the file away to start "
                    "without its records (the other replicas hold its entries)"
                ) from None
            report.stops.append(f"{self.path} offset 0: {exc}")
            log.error("journal %s: not replayed: %s", self.path, exc)
            return
        if version < jf.V_HEADER:
            _refuse_damaged_magic(self.path)
        start = max(offset, jf.data_start(version))
        self.report = report
        fd = open_read_only(self.path)
        try:
            stop = self._scan_file(fd, start, version)
        finally:
            os.close(fd)
        report.records += self.records
        report.entries += self.entries
        report.bytes += max(0, stop.position - start)
        report.end_mark = (-1, stop.position)
        if stop.is_error:
            self._log_stop(stop, report)

    def _scan_file(self, fd: int, start: int, version: int) -> ScanStop:
        size = os.fstat(fd).st_size
        base = start  # file offset of buffer[0]
        # Every pass but the last moves `base` forward by at least one record (the chunk holds one whole).
        for _ in range(size // jf.PADDING_HEADER_SIZE + 2):
            end = read_into(fd, self.buffer, base)
            at_eof = base + end >= size or end < len(self.buffer)
            stop = self._scan_chunk(base, end, version, at_eof)
            self.progress(max(0, min(stop.position, size) - base), 0)
            if stop.status is StopStatus.NEED_MORE and not at_eof and stop.position != base:
                base = stop.position
                continue
            if stop.status is StopStatus.NEED_MORE or stop.position >= size:
                return stop
            resume = self._resync(fd, stop, size, version)
            if resume is None:
                return stop
            base = resume
        raise AssertionError("unreachable: the journal scan made no progress")

    def _resync(self, fd: int, stop: ScanStop, size: int, version: int) -> int | None:
        """After damage at `stop` (not the end of the file): the next group start with verified records,
        or None (a torn tail: nothing good follows)."""
        if version < jf.V_PADDING:
            return None  # no group alignment to find again
        candidate = -(-(stop.position + 1) // RESYNC_ALIGNMENT) * RESYNC_ALIGNMENT
        while candidate < size:
            end = read_into(fd, self.buffer, candidate)
            at_eof = candidate + end >= size
            # Candidates in the first half only (unless at the end): a group there is whole in the chunk.
            last = end if at_eof else end // 2
            view = memoryview(self.buffer)[:end]
            try:
                for offset in range(0, last, RESYNC_ALIGNMENT):
                    if _verified_group_at(view, offset, candidate, version, at_eof):
                        self._skipped_stretch(stop, candidate + offset)
                        return candidate + offset
            finally:
                view.release()
            candidate += last
        return None

    def _skipped_stretch(self, stop: ScanStop, resume: int) -> None:
        self.report.resyncs.append(
            f"{self.path} offsets {stop.position}-{resume}: {stop.reason or 'end mark'}"
        )
        log.warning(
            "journal %s: damaged records at offsets %d-%d skipped (%s); good records follow, replay goes on "
            "at %d (the other replicas hold the skipped entries)",
            self.path,
            stop.position,
            resume,
            stop.reason or "an end mark before the end of the file",
            resume,
        )

    def _scan_chunk(self, base: int, end: int, version: int, at_eof: bool) -> ScanStop:
        """Alternate the fast path and one codec-scanned record until the chunk is used up."""
        buffer, take_data, apply = self.buffer, self.take_data, self.apply
        view = memoryview(buffer)[:end]
        pos = 0
        while True:
            if take_data is not None:
                pos, taken = take_data(buffer, pos, end)
                self.records += taken
                self.entries += taken
            try:
                offset, kind, body = next(jf.scan_records(view, pos, base, version, at_eof))
            except StopIteration as done:
                stop: ScanStop = done.value
                return stop
            rejected = apply(kind, body)
            self.records += 1
            if rejected is not None:
                self._rejected(offset, rejected)
            elif kind is RecordKind.DATA:
                self.entries += 1
            # The record ends after its body; padding records have an 8-byte header, the others 4.
            header = jf.PADDING_HEADER_SIZE if kind is RecordKind.PADDING else 4
            pos = offset - base + header + len(body)

    def _rejected(self, offset: int, reason: str) -> None:
        self.report.rejected.append(f"{self.path} offset {offset}: {reason}")
        log.warning(
            "journal %s: record at offset %d skipped: %s (the other replicas hold it)",
            self.path,
            offset,
            reason,
        )

    def _log_stop(self, stop: ScanStop, report: ReplayReport) -> None:
        what = "torn tail" if stop.truncated else "corrupt record"
        report.stops.append(f"{self.path} offset {stop.position}: {stop.reason}")
        log.warning(
            "journal %s: replay stopped at offset %d (%s: %s); %d records before it were replayed",
            self.path,
            stop.position,
            what,
            stop.reason,
            self.records,
        )


def _refuse_damaged_magic(path: Path) -> None:
    """A journal read as version 1 (no "BKLG" magic) whose next 4 bytes are a version with a header:
    the magic was damaged; replaying it as headerless would stop at its first padding record."""
    with path.open("rb") as f:
        head = f.read(8)
    if len(head) == 8 and jf.V_HEADER <= int.from_bytes(head[4:], "big") <= jf.VERSION_MAX:
        raise CorruptDataError(
            f"{path} offset 0: corrupt journal header (magic {head[:4]!r}); move the file away to start "
            "without its records (the other replicas hold its entries)"
        )


def _verified_group_at(view: memoryview, offset: int, base: int, version: int, at_eof: bool) -> bool:
    """Do whole records start at view[offset], with a DATA record whose CRC digest matches among the
    first few (before any malformed one)?"""
    records = jf.scan_records(view, offset, base, version, at_eof)
    for _, (_, kind, body) in zip(range(RESYNC_RECORDS_MAX), records, strict=False):
        if kind is RecordKind.DATA and entry_codec.infer_digest(body) is not None:
            return True
    return False
