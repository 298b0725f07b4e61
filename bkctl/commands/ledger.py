"""`bkctl ledger`: ledgers in the metadata store (list, inspect); ledger_data.py adds create, write,
read, fence and delete."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bkctl.commands.options import MetadataOption, Problems, open_layout
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

if TYPE_CHECKING:
    from bkctl.model import LedgerMetadata

LIST_COLUMNS = (Column("ledger_id", "LEDGER ID", numeric=True),)
SEGMENT_COLUMNS = (
    Column("first_entry_id", "FIRST ENTRY", numeric=True),
    Column("last_entry_id", "LAST ENTRY", numeric=True),
    Column("ensemble", "ENSEMBLE"),
)

app = typer.Typer(help="Ledgers in the metadata store.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="ledger")


@app.command("list")
def ledger_list(
    bookie: Annotated[
        str | None,
        typer.Option(
            "--bookie", "-b", help="Only ledgers with entries striped onto this bookie (host:port)."
        ),
    ] = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """List ledger ids, ascending. Malformed or foreign metadata nodes are reported and skipped (exit 3)."""
    fmt = resolve(output)
    problems = Problems()
    with open_layout(metadata) as layout:
        ids: Iterator[int] = layout.ledger_ids(problems)
        if bookie is not None:
            ids = _on_bookie(layout, ids, bookie, problems)
        rows = ({"ledger_id": ledger_id} for ledger_id in ids)
        if fmt is OutputFormat.json:
            write_json(rows)
        else:
            write_rows(rows, LIST_COLUMNS, fmt)
    problems.raise_if_any()


def _on_bookie(layout: Any, ids: Iterator[int], bookie: str, problems: Problems) -> Iterator[int]:
    from bkctl.metadata.layout import stores_entries_on

    for ledger_id, md in layout.read_ledgers(ids, problems):
        if stores_entries_on(md, bookie):
            yield ledger_id


@app.command("inspect")
def ledger_inspect(
    ledger_id: Annotated[int, typer.Argument(help="Ledger id.", min=0)],
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Show a ledger's metadata: state, quorums, digest, last entry, length, ctime, every segment.

    Exit 4 if the ledger does not exist, 7 if its metadata does not decode.
    """
    from bkctl.protocol.metadata_format import ledger_metadata_format_version

    fmt = resolve(output)
    with open_layout(metadata) as layout:
        raw = layout.read_ledger_bytes(ledger_id)
        md = layout.decode_ledger(ledger_id, raw).value
    document = ledger_document(ledger_id, md)
    document["format_version"] = ledger_metadata_format_version(raw.value)
    document["metadata_version"] = raw.version
    if fmt is OutputFormat.json:
        write_json(document)
        return
    segments = document.pop("segments")
    document["custom_metadata"] = {k: _show_bytes(v) for k, v in md.custom_metadata} or None
    if fmt is OutputFormat.plain:
        # Machine-readable: one raw value per field, every line led by its key (segments included).
        write_mapping(document, fmt)
        write_rows(({"key": "segment", **s} for s in segments), (Column("key", "KEY"), *SEGMENT_COLUMNS), fmt)
        return
    document["ctime"] = _show_ms(md.ctime)
    write_mapping(document, fmt)
    write_title("\nsegments:", fmt)
    write_rows(segments, SEGMENT_COLUMNS, fmt)


def ledger_document(ledger_id: int, md: LedgerMetadata) -> dict[str, Any]:
    """The JSON contract of `ledger inspect` (docs/cli.md)."""
    return {
        "ledger_id": ledger_id,
        "state": md.state.name,
        "ensemble_size": md.ensemble_size,
        "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum,
        "digest": None if md.digest is None else md.digest.name,
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "ctime": md.ctime,
        "custom_metadata": {key: base64.b64encode(value).decode() for key, value in md.custom_metadata},
        "segments": [
            {
                "first_entry_id": segment.first_entry_id,
                "last_entry_id": md.segment_last_entry(index),
                "ensemble": list(segment.ensemble),
            }
            for index, segment in enumerate(md.segments)
        ],
    }


def _show_ms(ms: int | None) -> str | None:
    if ms is None:
        return None
    try:
        when = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    except (OverflowError, ValueError, OSError):
        return str(ms)
    return f"{ms} ({when})"


def _show_bytes(value: bytes) -> str:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if text.isprintable():
        return text
    return "base64:" + base64.b64encode(value).decode()
