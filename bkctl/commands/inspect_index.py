"""`bkctl index inspect`: header (master key, fenced, explicit LAC) and entry locations of a ledger index."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from bkctl.commands.inspect_common import Failures, explicit_lac_value
from bkctl.commands.output import (
    Column,
    OutputFormat,
    OutputOption,
    resolve,
    write_json,
    write_mapping,
    write_rows,
    write_title,
)
from bkctl.errors import CorruptDataError, NotFoundError, ProtocolError, UsageError

ENTRY_COLUMNS = (
    Column("entry_id", "ENTRY", numeric=True),
    Column("log_id", "LOG", numeric=True),
    Column("offset", "OFFSET", numeric=True),
)


def index_inspect(
    path: Annotated[Path | None, typer.Argument(help="An index file (<hex>.idx).")] = None,
    ledger: Annotated[
        int | None, typer.Option("--ledger", "-l", help="Ledger id (with --ledger-dir).")
    ] = None,
    ledger_dir: Annotated[
        Path | None,
        typer.Option(
            "--ledger-dir", "--index-dir", help="Index (ledger) dir holding current/<..>/<..>/<id>.idx."
        ),
    ] = None,
    output: OutputOption = None,
) -> None:
    """Show an index file: version, master key, fenced, explicit LAC, entry locations and holes."""
    from bkctl.files.index import HoleTracker, index_entries, ledger_index_path, open_index

    if (path is None) == (ledger is None or ledger_dir is None):
        raise UsageError("give an index file, or --ledger with --ledger-dir (not both)")
    fmt = resolve(output)
    if path is None:
        assert ledger is not None and ledger_dir is not None
        current = db_current(ledger_dir)
        if current is not None:
            _db_ledger_inspect(current, ledger, fmt)
            return
        path = ledger_index_path(ledger, ledger_dir)
    try:
        index = open_index(path)
    except ProtocolError as exc:
        raise CorruptDataError(f"{path}: offset 0: {exc}") from None
    failures = Failures()
    holes = HoleTracker()
    header = index.header
    doc: dict[str, Any] = {
        "file": str(path),
        "ledger_id": index.ledger_id,
        "version": header.version,
        "master_key": header.master_key.hex(),
        "fenced": header.fenced,
        "state_bits": header.state_bits,
        "explicit_lac": explicit_lac_value(header.explicit_lac) if header.explicit_lac else None,
        "slot_count": index.slot_bytes // 8,
        "entries": _entries(_with_progress(index_entries(index), path, index.slot_bytes // 8), holes),
        "holes": lambda: [list(hole) for hole in holes.holes],
        "missing": lambda: holes.missing,
        "last_entry_id": lambda: holes.last_entry_id,
        "stopped": lambda: _stopped(index.size, index.slot_bytes, path, failures),
    }
    if fmt is OutputFormat.json:
        write_json(doc)
    else:
        _render(doc, fmt)
    failures.raise_if_any()


def db_current(ledger_dir: Path) -> Path | None:
    """The `current/` of a DbLedgerStorage ledger dir (RocksDB databases in it), else None."""
    from bkctl.server.storage_kind import DB, found_engine

    for directory in (ledger_dir, ledger_dir.parent):
        if found_engine(directory) == DB:
            return directory / "current"
    return None


def _db_ledger_inspect(current: Path, ledger: int, fmt: OutputFormat) -> None:
    """A ledger of a DbLedgerStorage dir: its LedgerData and its keys in the locations db (read-only)."""
    from bkctl.files.index import HoleTracker
    from bkctl.protocol import db_format as dbf
    from bkctl.server.db_ledger_index import open_ledgers, open_locations

    ledgers = open_ledgers(current, read_only=True)
    try:
        value = ledgers.get(dbf.ledger_key(ledger))
    finally:
        ledgers.close()
    if value is None:
        raise NotFoundError(
            f"{current / dbf.LEDGERS_DB}: no ledger {ledger} (a bookie of n ledger dirs keeps ledger L in "
            "dir number L mod n of its ledgerDirectories)"
        )
    try:
        data = dbf.decode_ledger_data(value)
    except ProtocolError as exc:
        raise CorruptDataError(f"{current / dbf.LEDGERS_DB}: ledger {ledger}: {exc}") from None
    locations = open_locations(current, read_only=True)
    holes = HoleTracker()
    doc: dict[str, Any] = {
        "file": str(current / dbf.LOCATIONS_DB),
        "storage": "db",
        "ledger_id": ledger,
        "version": None,
        "master_key": data.master_key.hex(),
        "fenced": data.fenced,
        "limbo": data.limbo,
        "explicit_lac": explicit_lac_value(data.explicit_lac) if data.explicit_lac else None,
        "slot_count": None,
        "entries": _entries(_db_entries(locations, ledger), holes),
        "holes": lambda: [list(hole) for hole in holes.holes],
        "missing": lambda: holes.missing,
        "last_entry_id": lambda: holes.last_entry_id,
        "stopped": lambda: None,
    }
    try:
        if fmt is OutputFormat.json:
            write_json(doc)
        else:
            _render(doc, fmt)
    finally:
        locations.close()


def _db_entries(locations: Any, ledger: int) -> Iterator[tuple[int, int, int]]:
    from bkctl.protocol import db_format as dbf

    first, end = dbf.location_key(ledger, 0), dbf.location_key(ledger + 1, 0)
    for key, value in locations.items(first, end):
        try:
            location = dbf.decode_location(value)
        except ProtocolError as exc:
            raise CorruptDataError(f"{locations.path}: key {key.hex()}: {exc}") from None
        yield dbf.decode_location_key(key)[1], location >> 32, location & 0xFFFFFFFF


LEDGER_COLUMNS = (
    Column("ledger_id", "LEDGER", numeric=True),
    Column("exists", "EXISTS"),
    Column("fenced", "FENCED"),
    Column("limbo", "LIMBO"),
    Column("master_key", "MASTER KEY"),
    Column("explicit_lac", "EXPLICIT LAC"),
)


def index_ledgers(
    ledger_dir: Annotated[Path, typer.Argument(help="A DbLedgerStorage ledger dir (or its current/).")],
    output: OutputOption = None,
) -> None:
    """List the ledgers index of a DbLedgerStorage dir (current/ledgers): every ledger's state."""
    from bkctl.protocol import db_format as dbf
    from bkctl.server.db_ledger_index import open_ledgers

    current = db_current(ledger_dir)
    if current is None:
        raise UsageError(f"{ledger_dir}: no DbLedgerStorage databases (current/ledgers, current/locations)")
    fmt = resolve(output)
    ledgers = open_ledgers(current, read_only=True)
    try:
        rows = [_ledger_row(key, value, ledgers.path) for key, value in ledgers.items()]
    finally:
        ledgers.close()
    if fmt is OutputFormat.json:
        write_json({"file": str(current / dbf.LEDGERS_DB), "ledgers": rows})
    else:
        write_rows(rows, LEDGER_COLUMNS, fmt)


def _ledger_row(key: bytes, value: bytes, path: Path) -> dict[str, Any]:
    from bkctl.protocol import db_format as dbf

    try:
        ledger_id, data = dbf.decode_ledger_key(key), dbf.decode_ledger_data(value)
    except ProtocolError as exc:
        raise CorruptDataError(f"{path}: key {key.hex()}: {exc}") from None
    lac = explicit_lac_value(data.explicit_lac) if data.explicit_lac else None
    return {
        "ledger_id": ledger_id,
        "exists": data.exists,
        "fenced": data.fenced,
        "limbo": data.limbo,
        "master_key": data.master_key.hex(),
        "explicit_lac": lac["lac"] if lac else None,
    }


def _with_progress(
    entries: Iterator[tuple[int, int, int]], path: Path, slots: int
) -> Iterable[tuple[int, int, int]]:
    """A bar over the slots, when the entries stream to a file or a pipe (on a terminal they are it)."""
    from bkctl.commands.progress import tracked

    return tracked(entries, path.name, slots, lambda entry: entry[0], "slots", stdout_busy=True)


def _entries(entries: Iterable[tuple[int, int, int]], holes: Any) -> Iterator[dict[str, int]]:
    for entry_id, log_id, offset in entries:
        holes.see(entry_id)
        yield {"entry_id": entry_id, "log_id": log_id, "offset": offset}


def _stopped(size: int, slot_bytes: int, path: Path, failures: Failures) -> dict[str, Any] | None:
    partial = slot_bytes % 8
    if not partial:
        return None
    reason = f"partial slot of {partial} bytes at the end (corrupt, or being flushed)"
    failures.add(path, size - partial, reason)
    return {"offset": size - partial, "reason": reason}


def _render(doc: dict[str, Any], fmt: OutputFormat) -> None:
    header_keys = ("file", "ledger_id", "version", "master_key", "fenced", "explicit_lac", "slot_count")
    header = {key: doc[key] for key in header_keys}
    if header["explicit_lac"] is not None:
        header["explicit_lac"] = header["explicit_lac"]["lac"]
    write_mapping(header, fmt)
    write_title("", fmt)
    write_rows(doc["entries"], ENTRY_COLUMNS, fmt)
    write_title("", fmt)
    holes = ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in doc["holes"]())
    tail = {"holes": holes or "none", "missing": doc["missing"](), "last_entry_id": doc["last_entry_id"]()}
    write_mapping(tail, fmt)
    doc["stopped"]()
