"""`bkctl journal inspect`: every record of one journal file or of a journal dir's files."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from bkctl.commands.inspect_common import (
    DATA_COLUMN,
    ENTRY_COLUMNS,
    KEY_COLUMNS,
    DigestOption,
    Failures,
    LedgerOption,
    PasswordOption,
    ScanOptions,
    ShowDataOption,
    digest_choice,
    entry_fields,
    explicit_lac_value,
    fill_records,
    render_records,
    summary_of,
)
from bkctl.commands.output import (
    OutputFormat,
    OutputOption,
    resolve,
    write_json,
)
from bkctl.errors import ProtocolError
from bkctl.files.chunks import file_size
from bkctl.files.digests import DigestChecker
from bkctl.protocol import journal_format as jf
from bkctl.protocol.journal_format import RecordKind

COLUMNS = (*KEY_COLUMNS, *ENTRY_COLUMNS)
Options = ScanOptions


def journal_inspect(
    path: Annotated[Path, typer.Argument(help="A journal file (<hex>.txn) or a journal dir.")],
    ledger: LedgerOption = None,
    show_data: ShowDataOption = False,
    summary: Annotated[
        bool, typer.Option("--summary", help="Only counts per file (types, ledgers, bytes, digest failures).")
    ] = False,
    digest: DigestOption = None,
    password: PasswordOption = None,
    output: OutputOption = None,
) -> None:
    """Decode every record of a journal: entries, master keys, fences, explicit LACs and padding."""
    from bkctl.files.journal import find_journals

    fmt = resolve(output)
    chosen, secret = digest_choice(digest, password)
    options = Options(ledger, show_data, summary, chosen, secret, fmt is OutputFormat.json)
    failures = Failures()
    paths = find_journals(path)
    if options.json_output:
        write_json({"journals": (_document(p, options, failures) for p in paths)})
    else:
        for journal_path in paths:
            _render(_document(journal_path, options, failures), options, fmt)
    failures.raise_if_any()


def _document(path: Path, options: Options, failures: Failures) -> dict[str, Any]:
    """The JSON object of one journal; records, summary and stop are produced lazily, in that order."""
    from bkctl.files.journal import journal_records, open_journal

    doc: dict[str, Any] = {"file": str(path), "journal_id": jf.parse_journal_file_name(path.name)}
    try:
        journal = open_journal(path)
    except ProtocolError as exc:
        doc["version"] = None
        return _unreadable(doc, path, 0, str(exc), options, failures)
    doc["version"] = journal.version
    size = file_size(path)
    if 0 < size < journal.data_start:  # BookKeeper writes the whole 512-byte header at once
        reason = f"journal header cut short: {size} of {journal.data_start} bytes"
        return _unreadable(doc, path, size, reason, options, failures)
    scan = journal_records(journal)
    fill_records(doc, scan, RecordKind, partial(describe, options=options), _wanted(options), options)
    doc["stopped"] = lambda: failures.add_stop(path, scan.stop)
    return doc


def _unreadable(
    doc: dict[str, Any], path: Path, offset: int, reason: str, options: Options, failures: Failures
) -> dict[str, Any]:
    """A journal whose records cannot be reached: no records, and a stop that makes the command exit 7."""
    failures.add(path, offset, reason)
    if not options.summary:
        doc["records"] = []
    return doc | {
        "summary": summary_of(RecordKind).as_dict(),
        "stopped": {"offset": offset, "reason": reason},
    }


def _wanted(options: Options) -> Callable[[dict[str, Any]], bool]:
    return lambda record: options.ledger is None or record["ledger_id"] == options.ledger


def describe(
    offset: int, kind: RecordKind, body: memoryview, checker: DigestChecker, options: Options
) -> dict[str, Any]:
    """One record as a JSON-ready dict (`info` is the table's summary of special records)."""
    record: dict[str, Any] = {"offset": offset, "ledger_id": None, "entry_id": None, "type": kind.value}
    record["size"] = len(body)
    if kind is RecordKind.PADDING:
        record["info"] = f"{len(body) + jf.PADDING_HEADER_SIZE} bytes to the alignment boundary"
        return record
    record["ledger_id"], record["entry_id"] = jf.record_key(body)
    if kind is RecordKind.DATA:
        record.update(
            entry_fields(record["ledger_id"], body, checker, options.show_data, options.json_output)
        )
    elif kind is RecordKind.MASTER_KEY:
        record["master_key"] = jf.decode_master_key(body)[1].hex()
        record["info"] = f"master key {record['master_key']}"
    elif kind is RecordKind.FENCE:
        record["info"] = "fenced"
    elif kind is RecordKind.EXPLICIT_LAC:
        record["explicit_lac"] = explicit_lac_value(jf.decode_explicit_lac(body)[1])
        record["info"] = f"explicit LAC {record['explicit_lac']['lac']}"
    else:
        record["info"] = "unknown special entry id (skipped by replay)"
    return record


def _render(doc: dict[str, Any], options: Options, fmt: OutputFormat) -> None:
    columns = (*COLUMNS, DATA_COLUMN) if options.show_data else COLUMNS
    journal_id = "not in the file name" if doc["journal_id"] is None else doc["journal_id"]
    title = f"Journal {doc['file']} (id {journal_id}, version {doc['version']})"
    render_records(title, doc, columns, options.summary, fmt)
