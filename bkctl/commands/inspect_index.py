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
from bkctl.errors import CorruptDataError, ProtocolError, UsageError

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
    if path is None:
        assert ledger is not None and ledger_dir is not None
        path = ledger_index_path(ledger, ledger_dir)
    fmt = resolve(output)
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
