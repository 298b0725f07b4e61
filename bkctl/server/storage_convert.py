"""Offline conversion of a stopped bookie's ledger directories between the two index engines (Java's
`convert-to-db-storage` and `convert-to-interleaved-storage`), for one ledger directory or several.

The two storages lay several ledger directories out differently. The interleaved engine keeps one
sequence of entry log ids over all its directories (a log may sit in any of them, its readers search
them all) and each `.idx` file in any directory. DbLedgerStorage is one storage per directory: ledger L
lives in directory `L mod n` (the bookie's order of ledgerDirectories), with its index in that
directory's RocksDB and its entries in that directory's own entry logs, whose ids are counted per
directory (two directories both hold a `0.log`). So:
- to db, an entry already in its ledger's directory is indexed in place; an entry in another directory
  is copied to a new entry log in its ledger's directory (ids after every id of every directory). The
  old log keeps the copied records, which no index of its directory names: garbage that directory's
  compaction reclaims as Java's does (a record of a ledger living elsewhere is not live there);
- to interleaved, no entry moves (the interleaved engine reads any log in any directory), but log ids
  that two directories share are renamed apart: the later directory's log gets a fresh id (a hard link
  under the new name, then the old name removed) and the locations into it are rewritten.
With one directory neither happens: only where locations and ledger state live changes.

Both ways the new index (and copied or linked logs) is built beside the old one where no bookie looks
(`ledgers.converting` / `locations.converting`, `<ledger dir>/convert-staging/`, or `.idx` files a db
bookie refuses to start beside), then compared with the old one entry by entry: every ledger's master
key, fenced bit and explicit LAC, every entry's location, the bytes of every copied entry against the
original record, and a renamed log against the file it links. Only then is `convert.json` written in
the first directory (the conversion is decided), and the new files are moved into place and the old
index removed, each step idempotent. A kill before `convert.json` leaves the old storage whole and a
rerun starts over; a kill after it leaves a bookie that refuses to start (storage_kind.py) until a
rerun finishes. No entry log is rewritten or removed (a renamed one keeps its bytes under its new
name); journals and lastMark stay as they are.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bkctl.errors import ConflictError, CorruptDataError, ProtocolError
from bkctl.files.index import index_entries, open_index
from bkctl.protocol import db_format as dbf
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import index_format as ixf
from bkctl.server.db_ledger_index import data_of, header_of, read_ledgers
from bkctl.server.entrylog import LAST_ID_NAME, EntryLogReader, EntryLogWriter, existing_log_ids, last_log_id
from bkctl.server.faults import fault_point
from bkctl.server.fileio import fsync_directory, write_durably
from bkctl.server.index import IndexStore
from bkctl.server.ledger_dirs import dir_of
from bkctl.server.rocksdb_store import KeyValueDb
from bkctl.server.storage_kind import CONVERT_STATE_NAME, DB, INTERLEAVED

log = logging.getLogger("bkctl.bookie")

CONVERTING: Final = ".converting"
STAGING: Final = "convert-staging"  # <ledger dir>/convert-staging/current/<hex>.log: copied or linked logs
STATE_NAME: Final = CONVERT_STATE_NAME  # in the first ledger dir's current/: the conversion is decided
BATCH_KEYS: Final = 100_000
COPY_LOG_SIZE: Final = 1 << 30  # entry logs the copies go to: Java's default logSizeLimit
ID_WRAP: Final = 1 << 31  # format fact: location words hold 31-bit log ids
_COMPACTING: Final = ".compacting"  # gc.MARKER_SUFFIX: a compaction marker beside a log follows a rename


@dataclass
class ConvertReport:
    to: str
    ledgers: int = 0
    entries: int = 0  # locations written and verified
    copied: int = 0  # entries copied to their ledger's directory (db, several dirs)
    renamed_logs: int = 0  # entry logs given a fresh id (interleaved, several dirs)
    removed: list[str] = field(default_factory=list)  # what of the old index was removed
    seconds: float = 0.0


def state_path(ledger_dirs: Sequence[Path]) -> Path:
    return ledger_dirs[0] / "current" / STATE_NAME


def decided(ledger_dirs: Sequence[Path]) -> str | None:
    """The engine a conversion was decided to (verified) and not finished, None if there is none."""
    path = state_path(ledger_dirs)
    if not path.is_file():
        return None
    try:
        to = json.loads(path.read_bytes())["to"]
    except (ValueError, KeyError, TypeError):
        raise CorruptDataError(f"{path}: not a conversion state; nothing was changed") from None
    if to not in (DB, INTERLEAVED):
        raise CorruptDataError(f"{path}: conversion to {to!r}?; nothing was changed")
    return str(to)


def _index_files(ledger_dirs: Sequence[Path]) -> dict[int, Path]:
    found: dict[int, Path] = {}
    for directory in ledger_dirs:
        for path in (directory / "current").glob(f"*/*/*{ixf.INDEX_SUFFIX}"):
            ledger_id = ixf.parse_index_file_name(path.name)
            if ledger_id is not None:
                if ledger_id in found:
                    raise CorruptDataError(
                        f"ledger {ledger_id} has two index files: {found[ledger_id]}, {path}"
                    )
                found[ledger_id] = path
    return found


def _read_index(path: Path) -> tuple[ixf.IndexHeader, dict[int, int]]:
    try:
        index = open_index(path)
        return index.header, {e: (log_id << 32) | offset for e, log_id, offset in index_entries(index)}
    except ProtocolError as exc:
        raise CorruptDataError(f"{path}: {exc}") from None


def _staging(directory: Path) -> Path:
    return directory / STAGING


def _discard_staging(ledger_dirs: Sequence[Path]) -> None:
    """What an undecided earlier run built: it is built again from the old index."""
    for directory in ledger_dirs:
        for name in (dbf.LEDGERS_DB, dbf.LOCATIONS_DB):
            staged = directory / "current" / (name + CONVERTING)
            if staged.exists():
                shutil.rmtree(staged)
        if _staging(directory).exists():
            shutil.rmtree(_staging(directory))


def _decide(ledger_dirs: Sequence[Path], to: str, report: ConvertReport, renames: list[list[int]]) -> None:
    doc = {
        "to": to,
        "ledgers": report.ledgers,
        "entries": report.entries,
        "copied": report.copied,
        "renames": renames,
    }
    write_durably(state_path(ledger_dirs), json.dumps(doc).encode())


def _decision(ledger_dirs: Sequence[Path], report: ConvertReport) -> list[tuple[int, int, int]]:
    """The renames the decision made; the report counts what the decided run converted."""
    doc = json.loads(state_path(ledger_dirs).read_bytes())
    report.ledgers, report.entries = int(doc.get("ledgers", 0)), int(doc.get("entries", 0))
    report.copied = int(doc.get("copied", 0))
    renames = [(int(d), int(old), int(new)) for d, old, new in doc.get("renames", [])]
    report.renamed_logs = len(renames)
    return renames


def _finish(ledger_dirs: Sequence[Path], report: ConvertReport) -> None:
    """After the decision: staged logs into place, lastId past them, staging gone, state removed."""
    for directory in ledger_dirs:
        current, staged = directory / "current", _staging(directory) / "current"
        if staged.is_dir():
            for path in sorted(staged.glob("*.log")):
                os.rename(path, current / path.name)
            fsync_directory(current)
        highest = last_log_id((directory,))
        if highest >= 0:
            write_durably(current / LAST_ID_NAME, ef.encode_last_id(highest))
        if _staging(directory).exists():
            shutil.rmtree(_staging(directory))
    state_path(ledger_dirs).unlink()
    fsync_directory(ledger_dirs[0] / "current")


# --- to db ---------------------------------------------------------------------------------------


def to_db(ledger_dirs: Sequence[Path]) -> ConvertReport:
    """Convert the `.idx` files of the bookie's ledger dirs (in its order) to DbLedgerStorage."""
    started = time.monotonic()
    dirs = tuple(ledger_dirs)
    report = ConvertReport(DB)
    files = _index_files(dirs)
    if decided(dirs) is None:
        _discard_staging(dirs)
        _build_db(dirs, files, report)
        fault_point("convert-built")
        _verify_db(dirs, files)
        _decide(dirs, DB, report, [])
        fault_point("convert-decided")
    _decision(dirs, report)
    for directory in dirs:
        current = directory / "current"
        for name in (dbf.LEDGERS_DB, dbf.LOCATIONS_DB):
            if (current / (name + CONVERTING)).exists():
                os.rename(current / (name + CONVERTING), current / name)
        fsync_directory(current)
        fault_point("convert-moving")
    for ledger_id, path in sorted(files.items()):
        path.unlink()
        report.removed.append(str(path))
        log.debug("ledger %d: %s removed", ledger_id, path)
    emptied = {p.parent for p in files.values()} | {p.parent.parent for p in files.values()}
    for directory in sorted(emptied, key=lambda d: -len(d.parts)):  # <yy> dirs before their <xx>
        _remove_if_empty(directory)
    _finish(dirs, report)
    report.seconds = time.monotonic() - started
    return report


def _unique_logs(ledger_dirs: Sequence[Path]) -> dict[int, Path]:
    """The interleaved engine's entry logs over all its dirs; CorruptDataError for an id held twice."""
    logs: dict[int, Path] = {}
    for directory in ledger_dirs:
        for log_id, path in existing_log_ids((directory,)).items():
            if log_id in logs:
                raise CorruptDataError(f"entry log {log_id:x} is in two directories: {logs[log_id]}, {path}")
            logs[log_id] = path
    return logs


def _build_db(dirs: tuple[Path, ...], files: dict[int, Path], report: ConvertReport) -> None:
    """The staging databases, and copies of the entries held in another dir than their ledger's."""
    logs = _unique_logs(dirs)
    report.ledgers = len(files)
    first_copy = _last_id(dirs)  # copies take ids after every id of every dir
    writers: dict[int, EntryLogWriter] = {}
    reader = EntryLogReader(dirs)
    new_slots: dict[int, dict[int, int]] = {}
    try:
        for ledger_id, path in sorted(files.items()):
            target = dir_of(ledger_id, len(dirs))
            home = dirs[target] / "current"
            slots = _read_index(path)[1]
            report.entries += len(slots)
            for entry_id, location in slots.items():
                held = logs.get(location >> 32)
                if held is None or held.parent == home:
                    continue  # in place (a missing log is the verify's to report)
                writer = writers.get(target)
                if writer is None:
                    writer = writers[target] = _copy_writer(dirs[target], first_copy)
                slots[entry_id] = writer.append(ledger_id, reader.read(location, ledger_id, entry_id))
                report.copied += 1
            new_slots[ledger_id] = slots
    finally:
        reader.close()
        for writer in writers.values():
            writer.close()  # flushed and fsynced before the databases name its records
    for target in writers:  # the copies' names durable before a decision names them
        fsync_directory(_staging(dirs[target]) / "current")
    for index, directory in enumerate(dirs):
        mine = {i: p for i, p in files.items() if dir_of(i, len(dirs)) == index}
        _write_db(directory / "current", mine, new_slots)


def _last_id(dirs: tuple[Path, ...]) -> int:
    """The highest log id of every dir; new ids follow it (CorruptDataError when they would wrap)."""
    highest = last_log_id(dirs)
    if highest >= ID_WRAP - (1 << 16):
        raise CorruptDataError(f"entry log ids reach {highest:x}: no fresh ids to convert into")
    return highest


def _copy_writer(directory: Path, after_id: int) -> EntryLogWriter:
    staged = _staging(directory)
    (staged / "current").mkdir(parents=True, exist_ok=True)
    writer = EntryLogWriter((staged,), COPY_LOG_SIZE)
    writer.open_next(after_id)
    return writer


def _write_db(current: Path, files: dict[int, Path], slots_of: dict[int, dict[int, int]]) -> None:
    ledgers = KeyValueDb(current / (dbf.LEDGERS_DB + CONVERTING), huge=False)
    locations = KeyValueDb(current / (dbf.LOCATIONS_DB + CONVERTING), huge=True)
    try:
        batch: dict[bytes, bytes] = {}
        for ledger_id, path in sorted(files.items()):
            header = _read_index(path)[0]
            ledgers.write({dbf.ledger_key(ledger_id): dbf.encode_ledger_data(data_of(header))}, sync=False)
            for entry_id, location in slots_of[ledger_id].items():
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


def _verify_db(dirs: tuple[Path, ...], files: dict[int, Path]) -> None:
    """Each dir's staging databases hold exactly its ledgers as the `.idx` files say, an entry left in
    place is in its ledger's dir, and a copied entry reads back the original record's bytes."""
    logs = _unique_logs(dirs)
    source = EntryLogReader(dirs)
    try:
        for index, directory in enumerate(dirs):
            mine = {i: p for i, p in files.items() if dir_of(i, len(dirs)) == index}
            with _opened_db(directory / "current", CONVERTING) as (ledgers, locations):
                _verify_dir(directory, mine, logs, source, ledgers, locations)
    finally:
        source.close()


def _verify_dir(
    directory: Path,
    files: dict[int, Path],
    logs: dict[int, Path],
    source: EntryLogReader,
    ledgers: KeyValueDb,
    locations: KeyValueDb,
) -> None:
    home = directory / "current"
    target = EntryLogReader((directory, _staging(directory)))
    try:
        stored = read_ledgers(ledgers)
        if set(stored) != set(files):
            raise CorruptDataError(f"{ledgers.path}: ledgers {sorted(set(stored) ^ set(files))} differ")
        for ledger_id, path in sorted(files.items()):
            header, slots = _read_index(path)
            if stored[ledger_id] != data_of(header):
                raise CorruptDataError(f"{ledgers.path}: ledger {ledger_id} state differs from {path}")
            new = _db_slots(locations, ledger_id)
            if set(new) != set(slots):
                raise CorruptDataError(f"{locations.path}: ledger {ledger_id} entries differ from {path}")
            for entry_id, location in slots.items():
                moved = new[entry_id]
                held = logs.get(location >> 32)
                if moved == location and held is not None and held.parent == home:
                    continue
                if moved == location or held is None:
                    raise CorruptDataError(
                        f"{path}: ledger {ledger_id} entry {entry_id}: its entry log {location >> 32:x} is "
                        f"{'missing' if held is None else 'in ' + str(held.parent)}"
                    )
                if target.read(moved, ledger_id, entry_id) != source.read(location, ledger_id, entry_id):
                    raise CorruptDataError(f"{home}: ledger {ledger_id} entry {entry_id}: its copy differs")
    finally:
        target.close()


@contextlib.contextmanager
def _opened_db(current: Path, suffix: str) -> Iterator[tuple[KeyValueDb, KeyValueDb]]:
    ledgers = KeyValueDb(current / (dbf.LEDGERS_DB + suffix), huge=False, read_only=True)
    try:
        locations = KeyValueDb(current / (dbf.LOCATIONS_DB + suffix), huge=True, read_only=True)
        try:
            yield ledgers, locations
        finally:
            locations.close()
    finally:
        ledgers.close()


# --- to interleaved ------------------------------------------------------------------------------


def to_interleaved(ledger_dirs: Sequence[Path]) -> ConvertReport:
    """Convert the DbLedgerStorage databases of the bookie's ledger dirs (in its order) to `.idx` files."""
    started = time.monotonic()
    dirs = tuple(ledger_dirs)
    report = ConvertReport(INTERLEAVED)
    if decided(dirs) is None:
        _discard_staging(dirs)
        renames = _link_apart(dirs)
        fault_point("convert-built")
        report.ledgers, report.entries = _write_index_files(dirs, renames)
        _decide(dirs, INTERLEAVED, report, [[d, old, new] for (d, old), new in sorted(renames.items())])
        fault_point("convert-decided")
    for index, old, new in _decision(dirs, report):
        _rename_log(dirs[index], old, new)
        fault_point("convert-moving")
    for directory in dirs:
        current = directory / "current"
        for name in (dbf.LEDGERS_DB, dbf.LOCATIONS_DB):
            if (current / name).exists():
                shutil.rmtree(current / name)
                report.removed.append(str(current / name))
        fsync_directory(current)
    _finish(dirs, report)
    report.seconds = time.monotonic() - started
    return report


def _link_apart(dirs: tuple[Path, ...]) -> dict[tuple[int, int], int]:
    """Fresh ids for the logs of a later dir whose id an earlier dir holds: (dir, old id) -> new id, each
    a hard link in the dir's staging (the old name stays until the conversion is decided)."""
    renames: dict[tuple[int, int], int] = {}
    taken: set[int] = set()
    fresh = _last_id(dirs) + 1
    for index, directory in enumerate(dirs):
        for log_id, path in sorted(existing_log_ids((directory,)).items()):
            if log_id not in taken:
                taken.add(log_id)
                continue
            staged = _staging(directory) / "current"
            staged.mkdir(parents=True, exist_ok=True)
            os.link(path, staged / ef.log_file_name(fresh))
            renames[(index, log_id)] = fresh
            taken.add(fresh)
            fresh += 1
    for directory in dirs:
        if (_staging(directory) / "current").is_dir():
            fsync_directory(_staging(directory) / "current")
    return renames


def _write_index_files(dirs: tuple[Path, ...], renames: dict[tuple[int, int], int]) -> tuple[int, int]:
    """Every ledger's `.idx` file from its dir's databases, locations into renamed logs rewritten; then
    every file read back and compared with the databases. (ledgers, entries)."""
    store = IndexStore(dirs, 64)
    every: set[int] = set()
    entries = 0
    for index, directory in enumerate(dirs):
        if not (directory / "current" / dbf.LEDGERS_DB).is_dir():
            continue  # a dir that never held a ledger
        with _opened_db(directory / "current", "") as (ledgers, locations):
            stored = read_ledgers(ledgers)
            _check_home(directory, index, len(dirs), stored)
            every |= set(stored)
            for ledger_id, data in sorted(stored.items()):
                slots = _moved(_db_slots(locations, ledger_id), index, renames)
                path = store.find(ledger_id)
                if path is not None:
                    path.unlink()  # a file of an interrupted run: written again whole
                    store.delete(ledger_id)
                store.write(ledger_id, header_of(data), slots)
                entries += len(slots)
    files = _index_files(dirs)
    if set(files) != every:
        raise CorruptDataError(
            f"index files of ledgers {sorted(set(files) ^ every)} differ from the databases"
        )
    final = _final_logs(dirs, renames)
    for index, directory in enumerate(dirs):
        if not (directory / "current" / dbf.LEDGERS_DB).is_dir():
            continue
        with _opened_db(directory / "current", "") as (ledgers, locations):
            for ledger_id, data in sorted(read_ledgers(ledgers).items()):
                header, slots = _read_index(files[ledger_id])
                if data_of(header) != data or slots != _moved(
                    _db_slots(locations, ledger_id), index, renames
                ):
                    raise CorruptDataError(f"{files[ledger_id]}: differs from the databases after writing")
                for log_id in {location >> 32 for location in slots.values()}:
                    if final.get(log_id) != index:
                        raise CorruptDataError(f"ledger {ledger_id}: entry log {log_id:x} not in {directory}")
    for (index, old), new in renames.items():  # each link the very file of the log it renames
        link = _staging(dirs[index]) / "current" / ef.log_file_name(new)
        if not os.path.samefile(link, dirs[index] / "current" / ef.log_file_name(old)):
            raise CorruptDataError(f"{link}: not the entry log {old:x} it renames")
    return len(every), entries


def _check_home(directory: Path, index: int, count: int, stored: dict[int, dbf.LedgerData]) -> None:
    strays = sorted(i for i in stored if dir_of(i, count) != index)
    if strays:
        raise ConflictError(
            f"{directory}: its databases hold ledgers {strays[:5]} that DbLedgerStorage keeps in another "
            "directory: give the --ledger-dir in the bookie's order (ledgerDirectories); nothing was changed"
        )


def _moved(slots: dict[int, int], index: int, renames: dict[tuple[int, int], int]) -> dict[int, int]:
    if not renames:
        return slots
    moved = {}
    for entry_id, location in slots.items():
        new = renames.get((index, location >> 32))
        moved[entry_id] = location if new is None else (new << 32) | (location & 0xFFFFFFFF)
    return moved


def _final_logs(dirs: tuple[Path, ...], renames: dict[tuple[int, int], int]) -> dict[int, int]:
    """Log id -> its dir as the interleaved engine will see them once the renames are done."""
    final: dict[int, int] = {}
    for index, directory in enumerate(dirs):
        for log_id in existing_log_ids((directory,)):
            key = renames.get((index, log_id), log_id)
            if key in final:
                raise CorruptDataError(f"entry log {key:x} would be in two directories")
            final[key] = index
    return final


def _rename_log(directory: Path, old: int, new: int) -> None:
    """The linked log into place under its new id, then its old name gone (each step idempotent)."""
    current = directory / "current"
    staged = _staging(directory) / "current" / ef.log_file_name(new)
    target, source = current / ef.log_file_name(new), current / ef.log_file_name(old)
    if staged.exists():
        os.rename(staged, target)
    if source.exists() and target.exists() and os.path.samefile(source, target):
        marker = source.with_name(source.name + _COMPACTING)
        if marker.exists():
            os.rename(marker, target.with_name(target.name + _COMPACTING))
        source.unlink()
    fsync_directory(current)


def _db_slots(locations: KeyValueDb, ledger_id: int) -> dict[int, int]:
    first, end = dbf.location_key(ledger_id, 0), dbf.location_key(ledger_id + 1, 0)
    return {dbf.decode_location_key(k)[1]: dbf.decode_location(v) for k, v in locations.items(first, end)}


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not empty (other ledgers), or gone
        directory.rmdir()
