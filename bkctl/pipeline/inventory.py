"""What the audit reads, as plain Python: the bookies' directories (who they are, from their cookies),
what each bookie's files hold (index files, and the journal after lastMark), and ledger metadata by
segment. No pyspark here: `sources.py` wraps these generators as Spark data sources, and tests call
them directly. Every reader opens files read-only (bkctl.files); nothing is ever written.

A bookie "holds" an entry when its index has a slot for it (what a bookie serves reads from) or when the
journal after its lastMark has it (acknowledged, not yet checkpointed into the index).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bkctl import limits
from bkctl.errors import BkctlError, UsageError
from bkctl.files.chunks import open_read_only
from bkctl.files.index import IndexFile, index_entries, open_index
from bkctl.files.marks import read_last_mark
from bkctl.metadata.stores import layout_at
from bkctl.model import INVALID_ENTRY_ID, DigestType, LedgerState
from bkctl.pipeline import bitmaps
from bkctl.pipeline.bookie_dirs import BookieDirs
from bkctl.protocol import db_format as dbf
from bkctl.protocol import entry as entry_codec
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import index_format as ixf
from bkctl.protocol import journal_format as jf
from bkctl.protocol.journal_format import RecordKind
from bkctl.server.cookies import read_local_cookie
from bkctl.server.entrylog import EntryLogReader
from bkctl.server.journal import list_journals
from bkctl.server.replay import replay

CURRENT = "current"
LAST_MARK = "lastMark"

# One row of a bookie's contents: what it holds of one ledger from `first_entry_id` on, as packed
# bitmaps (bitmaps.py): `held` (every copy), `ok` and `bad` (copies whose digest was checked: it verified,
# or it did not or the record could not be read; empty unless digests are checked) and `crcs` (CRC-32 of
# the payload of each `ok` copy, little-endian uint32 in entry order). A problem row (a file that cannot
# be read) has ledger_id -1 and names the file in `problem`.
HoldingRow = tuple[str, int, int, bytes, bytes, bytes, bytes, str | None]


def problem_row(bookie: str, problem: str) -> HoldingRow:
    return (bookie, -1, -1, b"", b"", b"", b"", problem)


@dataclass(frozen=True)
class Checks:
    """Digest checks of held entries, aligned with their ids: verified, failed, payload CRC (when ok)."""

    ok: bitmaps.Mask
    bad: bitmaps.Mask
    crcs: npt.NDArray[np.uint32]

    @classmethod
    def of(cls, results: list[tuple[bool | None, int | None]]) -> Checks:
        ok = np.fromiter((r[0] is True for r in results), dtype=np.bool_, count=len(results))
        bad = np.fromiter((r[0] is False for r in results), dtype=np.bool_, count=len(results))
        crcs = np.fromiter((r[1] or 0 for r in results), dtype=np.uint32, count=len(results))
        return cls(ok, bad, crcs)


def holding_rows(
    bookie: str, ledger_id: int, ids: bitmaps.Ids, checks: Checks | None
) -> Iterator[HoldingRow]:
    """Rows of the sorted, distinct entry `ids` a bookie holds of a ledger (and their checks)."""
    for start, stop in bitmaps.pieces(ids):
        part = ids[start:stop]
        first, size = int(part[0]), int(part[-1] - part[0]) + 1
        held = bitmaps.pack(bitmaps.mask_of(part, first, size))
        if checks is None:
            yield (bookie, ledger_id, first, held, b"", b"", b"", None)
            continue
        ok, bad = checks.ok[start:stop], checks.bad[start:stop]
        yield (
            bookie,
            ledger_id,
            first,
            held,
            bitmaps.pack(bitmaps.mask_of(part[ok], first, size)),
            bitmaps.pack(bitmaps.mask_of(part[bad], first, size)),
            checks.crcs[start:stop][ok].astype("<u4").tobytes(),
            None,
        )


def resolve_bookie_dirs(specs: Iterable[str]) -> list[BookieDirs]:
    """`[ID=]DIR` arguments -> bookies. DIR is a journal or ledger directory, or a bookie's root holding
    several; the bookie id comes from each directory's cookie unless ID= gives it. UsageError for a
    directory that is neither, or has no cookie and no ID."""
    found: dict[str, BookieDirs] = {}
    for spec in specs:
        given, _, text = spec.rpartition("=") if "=" in spec else ("", "", spec)
        for directory in _data_dirs(Path(text)):
            bookie = given or _cookie_bookie(directory)
            dirs = found.setdefault(bookie, BookieDirs(bookie))
            target = dirs.journal_dirs if _is_journal_dir(directory) else dirs.ledger_dirs
            if directory not in target:
                target.append(directory)
    return sorted(found.values(), key=lambda b: b.bookie_id)


def _data_dirs(path: Path) -> list[Path]:
    """`path/current` when `path` is a bookie directory, else those of its subdirectories (a root)."""
    if not path.is_dir():
        raise UsageError(f"--bookie-dir {path}: no such directory")
    if (path / CURRENT).is_dir():
        return [path / CURRENT]
    found = sorted(p / CURRENT for p in path.iterdir() if (p / CURRENT).is_dir())
    if not found:
        raise UsageError(f"--bookie-dir {path}: not a bookie directory (no current/ in it or below it)")
    return found


def _cookie_bookie(current: Path) -> str:
    stored = read_local_cookie(current.parent)
    if stored.cookie is None:
        why = stored.problem or "no cookie"
        raise UsageError(f"--bookie-dir {current.parent}: {why} ({stored.location}); give it as ID=DIR")
    return stored.cookie.bookie_id


def foreign_cookies(bookies: Iterable[BookieDirs], instance_id: str | None) -> list[str]:
    """The directories whose cookie names another cluster's instance id than `instance_id`, each as
    `DIR (instance id X)`: another cluster's bookie, whose every copy would be an `extra` here."""
    if instance_id is None:
        return []
    found = []
    for bookie in bookies:
        for current in [*bookie.journal_dirs, *bookie.ledger_dirs]:
            cookie = read_local_cookie(current.parent).cookie
            if cookie is not None and cookie.instance_id not in (None, instance_id):
                found.append(f"{current.parent} (instance id {cookie.instance_id})")
    return found


def _is_journal_dir(current: Path) -> bool:
    return any(jf.parse_journal_file_name(p.name) is not None for p in current.iterdir())


# --- what a bookie holds -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Verify:
    """Digest checking: the digest type and MAC key of each ledger (None: do not check)."""

    keys: dict[int, tuple[DigestType, bytes | None]]
    sample: float = 1.0

    def sampled(self, ledger_id: int, entry_id: int) -> bool:
        if self.sample >= 1.0:
            return True
        # Deterministic per entry so every copy of one entry is checked, or none (divergence needs both).
        return (zlib.crc32(f"{ledger_id}:{entry_id}".encode()) & 0xFFFF) < self.sample * 0x10000

    def check(self, ledger_id: int, stored: bytes) -> tuple[bool | None, int | None]:
        """(digest ok, CRC-32 of the payload) of one stored entry; (None, None) for unknown ledgers."""
        key = self.keys.get(ledger_id)
        if key is None:
            return None, None
        digest, mac_key = key
        ok = digest is DigestType.DUMMY or entry_codec.digest_matches(stored, digest, mac_key)
        payload = memoryview(stored)[entry_codec.HEADER_SIZE + digest.digest_size :]
        return ok, zlib.crc32(payload)


def index_holdings(
    bookie: BookieDirs, path: Path, verify: Verify | None, logs: set[int] | None = None
) -> Iterator[HoldingRow]:
    """What one index file says the bookie holds (a problem row when it cannot be read). `logs`: the
    bookie's entry log ids (entry_log_ids), when the caller reads several files."""
    try:
        index = open_index(path)
        if index.ledger_id is None:
            return
        # A slot in an entry log that is gone (deleted by hand) is not a copy the bookie can serve.
        known = np.fromiter(entry_log_ids(bookie) if logs is None else logs, dtype=np.int64)
        rows: list[HoldingRow] = []
        for ids, locations in _present_slots(index, known):
            checks = None if verify is None else _check_slots(bookie, index.ledger_id, ids, locations, verify)
            rows += holding_rows(bookie.bookie_id, index.ledger_id, ids, checks)
    except (BkctlError, OSError) as exc:
        rows = [problem_row(bookie.bookie_id, f"{path}: {exc}")]
    yield from rows


DB_KEYS_PER_READ = 65536  # locations db keys turned into numpy arrays at once
# A locations db key (ledger id, entry id) and its value, as KeyValueDb.packed_chunks packs them.
_DB_RECORD = np.dtype([("key", ">i8", (2,)), ("location", ">u8")])


def db_ranges(current: Path, ledgers_per_range: int) -> list[tuple[bytes, bytes | None]]:
    """Key ranges that cover a DbLedgerStorage dir's locations db, about `ledgers_per_range` ledgers of
    its ledgers db each, for several tasks to read one db (the whole db when that cannot be read)."""
    from bkctl.server.db_ledger_index import open_ledgers

    try:
        db = open_ledgers(current, read_only=True)
    except (BkctlError, OSError):
        return [(b"", None)]
    try:
        keys = [key for key, _ in db.items()]
    except (BkctlError, OSError):
        keys = []
    finally:
        db.close()
    starts = keys[ledgers_per_range::ledgers_per_range]
    bounds = [dbf.location_key(dbf.decode_ledger_key(k), 0) for k in starts if len(k) == dbf.LEDGER_KEY_SIZE]
    return list(zip([b"", *bounds], [*bounds, None], strict=True))


def db_holdings(
    bookie: BookieDirs, current: Path, verify: Verify | None, first: bytes = b"", end: bytes | None = None
) -> Iterator[HoldingRow]:
    """What a DbLedgerStorage dir's locations db says the bookie holds, of the keys in [first, end) (a
    problem row when it cannot be read), ledger by ledger; the keys are decoded by numpy a chunk at a
    time, as index slots are."""
    from bkctl.server.db_ledger_index import open_locations

    try:
        db = open_locations(current, read_only=True)
    except (BkctlError, OSError) as exc:
        yield problem_row(bookie.bookie_id, f"{current}: {exc}")
        return
    # Its locations name its own entry logs: each DbLedgerStorage directory counts log ids from 0.
    bookie = BookieDirs(bookie.bookie_id, [current], bookie.journal_dirs)
    known = np.fromiter(entry_log_ids(bookie), dtype=np.int64)
    try:
        pending: tuple[int, list[Any], list[Any]] | None = None  # a ledger running across chunks
        for packed in db.packed_chunks(
            _DB_RECORD["key"].itemsize, ixf.SLOT_SIZE, DB_KEYS_PER_READ, first, end
        ):
            records = np.frombuffer(packed, dtype=_DB_RECORD)
            keys, values = records["key"].astype(np.int64), records["location"]
            for ledger_id, ids, locations in _by_ledger(keys, values, known):
                if pending is not None and pending[0] != ledger_id:
                    yield from _db_ledger_rows(bookie, *pending, verify)
                    pending = None
                pending = pending or (ledger_id, [], [])
                pending[1].append(ids)
                pending[2].append(locations)
        if pending is not None:
            yield from _db_ledger_rows(bookie, *pending, verify)
    except (BkctlError, OSError) as exc:
        yield problem_row(bookie.bookie_id, f"{current}: {exc}")
    finally:
        db.close()


def _by_ledger(
    pairs: npt.NDArray[Any], locations: npt.NDArray[Any], logs: npt.NDArray[np.int64]
) -> Iterator[tuple[int, bitmaps.Ids, Any]]:
    """(ledger id, entry ids, locations) of the keys in one chunk whose location names an existing log."""
    present = (locations != 0) & np.isin((locations >> 32).astype(np.int64), logs)
    pairs, locations = pairs[present], locations[present]
    if not len(pairs):
        return
    starts = np.flatnonzero(np.r_[True, pairs[1:, 0] != pairs[:-1, 0]])
    for start, stop in zip(starts, [*starts[1:], len(pairs)], strict=True):
        yield int(pairs[start, 0]), pairs[start:stop, 1], locations[start:stop]


def _db_ledger_rows(
    bookie: BookieDirs, ledger_id: int, ids: list[Any], locations: list[Any], verify: Verify | None
) -> Iterator[HoldingRow]:
    all_ids, all_locations = np.concatenate(ids), np.concatenate(locations)
    checks = None if verify is None else _check_slots(bookie, ledger_id, all_ids, all_locations, verify)
    yield from holding_rows(bookie.bookie_id, ledger_id, all_ids, checks)


def _present_slots(index: IndexFile, logs: npt.NDArray[np.int64]) -> Iterator[tuple[bitmaps.Ids, Any]]:
    """(entry ids, slot values) of the non-zero slots pointing into an existing entry log, a chunk of
    the file at a time (numpy: a million slots take milliseconds, where a Python loop took a second)."""
    fd = open_read_only(index.path)
    try:
        position = ixf.HEADER_SIZE
        chunk_size = limits.FILE_READ_CHUNK - limits.FILE_READ_CHUNK % ixf.SLOT_SIZE
        while position < index.size:
            chunk = os.pread(fd, chunk_size, position)
            whole = len(chunk) - len(chunk) % ixf.SLOT_SIZE
            if whole == 0:
                break
            slots = np.frombuffer(chunk, dtype=">u8", count=whole // ixf.SLOT_SIZE)
            present = np.flatnonzero((slots != 0) & np.isin((slots >> 32).astype(np.int64), logs))
            if len(present):
                first = (position - ixf.HEADER_SIZE) // ixf.SLOT_SIZE
                yield present.astype(np.int64) + first, slots[present]
            position += len(chunk)
    finally:
        os.close(fd)


def entry_log_ids(bookie: BookieDirs) -> set[int]:
    found = (ef.parse_log_file_name(p.name) for d in bookie.ledger_dirs for p in d.glob("*.log"))
    return {log_id for log_id in found if log_id is not None}


def _check_slots(
    bookie: BookieDirs, ledger_id: int, ids: bitmaps.Ids, locations: Any, verify: Verify
) -> Checks:
    """Each sampled copy read from its entry log and its digest checked (an unreadable one fails)."""
    results: list[tuple[bool | None, int | None]] = []
    reader = EntryLogReader(tuple(d.parent for d in bookie.ledger_dirs))
    try:
        for entry_id, location in zip(ids.tolist(), locations.tolist(), strict=True):
            if not verify.sampled(ledger_id, entry_id):
                results.append((None, None))
                continue
            log_id, offset = location >> 32, location & 0xFFFF_FFFF
            try:
                stored = reader.read(ef.entry_location(log_id, offset), ledger_id, entry_id)
            except (BkctlError, OSError):
                results.append((False, None))  # unreadable copy: corrupt
                continue
            results.append(verify.check(ledger_id, stored))
    finally:
        reader.close()
    return Checks.of(results)


def journal_holdings(bookie: BookieDirs, journal_dir: Path, verify: Verify | None) -> Iterator[HoldingRow]:
    """Entries in one journal directory after the bookie's lastMark: acknowledged, maybe not indexed."""
    found: dict[int, dict[int, tuple[bool | None, int | None]]] = {}

    def apply(kind: RecordKind, body: memoryview) -> None:
        if kind is RecordKind.DATA:
            ledger_id, entry_id = jf.record_key(body)
            checked: tuple[bool | None, int | None] = (None, None)
            if verify is not None and verify.sampled(ledger_id, entry_id):
                checked = verify.check(ledger_id, bytes(body))
            found.setdefault(ledger_id, {})[entry_id] = checked  # a copy journaled twice: the last

    rows: list[HoldingRow] = []
    try:
        if list_journals(journal_dir):
            replay(journal_dir, _last_mark(bookie, journal_dir), apply)
    except (BkctlError, OSError) as exc:
        rows.append(problem_row(bookie.bookie_id, f"{journal_dir}: {exc}"))
    for ledger_id, entries in sorted(found.items()):
        ordered = sorted(entries.items())
        ids = np.fromiter((e for e, _ in ordered), dtype=np.int64, count=len(ordered))
        checks = None if verify is None else Checks.of([c for _, c in ordered])
        rows += holding_rows(bookie.bookie_id, ledger_id, ids, checks)
    return iter(rows)


def _last_mark(bookie: BookieDirs, journal_dir: Path) -> tuple[int, int]:
    """The newest lastMark of this journal over the ledger dirs ((-1, 0): read the journal whole)."""
    index = sorted(bookie.journal_dirs).index(journal_dir)
    names = [LAST_MARK] if len(bookie.journal_dirs) == 1 else [f"{LAST_MARK}.{index}"]
    marks = [(-1, 0)]
    for current in bookie.ledger_dirs:
        for name in names:
            if (current / name).is_file():
                mark = read_last_mark(current / name)
                marks.append((mark.journal_id, mark.offset))
    return max(marks)


def ledger_record_bytes(bookie: BookieDirs, ledger_id: int) -> int:
    """Bytes one ledger takes in the bookie's entry logs (records with their size prefixes)."""
    total = 0
    logs = {p.name: p for d in bookie.ledger_dirs for p in d.glob("*.log")}
    for current in bookie.ledger_dirs:
        path = current / ixf.index_path(ledger_id)
        if not path.is_file():
            continue
        for _, log_id, offset in index_entries(open_index(path)):
            log = logs.get(ef.log_file_name(log_id))
            if log is not None:
                total += _record_size(log, offset)
    return total


def _record_size(log: Path, offset: int) -> int:
    fd = os.open(log, os.O_RDONLY)
    try:
        return 4 + max(0, int.from_bytes(os.pread(fd, 4, offset - 4), "big", signed=True))
    finally:
        os.close(fd)


# --- ledger metadata ---------------------------------------------------------------------------------

# One row per segment: ledger_id, state, last_entry_id (closed: the last entry; open: -1, the end comes
# from what the bookies hold), ensemble_size, write_quorum, ack_quorum, first_entry_id, segment_last
# (-1: to the ledger's end), ensemble, problem (a node that does not decode: the row has its ledger_id).


def segment_rows(uri: str, ledger_ids: list[int]) -> Iterator[tuple[Any, ...]]:
    """The segments of the given ledgers, read from the metadata store (in an executor or the driver)."""
    problems: list[tuple[str, str]] = []
    with layout_at(uri) as layout:
        ids_by_path = {layout.ledger_path(i): i for i in ledger_ids}
        for ledger_id, md in layout.read_ledgers(ledger_ids, lambda p, why: problems.append((p, why))):
            closed = md.state is LedgerState.CLOSED
            last = md.last_entry_id if closed else INVALID_ENTRY_ID
            for i, segment in enumerate(md.segments):
                after = (
                    md.segments[i + 1].first_entry_id - 1 if i + 1 < len(md.segments) else INVALID_ENTRY_ID
                )
                yield (
                    ledger_id,
                    md.state.name,
                    last,
                    md.ensemble_size,
                    md.write_quorum,
                    md.ack_quorum,
                    segment.first_entry_id,
                    after,
                    list(segment.ensemble),
                    None,
                )
    for path, why in problems:
        ledger_id = ids_by_path.get(path, -1)
        yield (ledger_id, "", INVALID_ENTRY_ID, 0, 0, 0, 0, INVALID_ENTRY_ID, [], f"{path}: {why}")
