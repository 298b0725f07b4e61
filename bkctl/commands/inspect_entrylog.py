"""`bkctl entrylog inspect` and `bkctl entrylog metadata`: records and per-ledger sizes of an entry log."""

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
    fill_records,
    render_records,
    summary_of,
)
from bkctl.commands.output import (
    Column,
    OutputFormat,
    OutputOption,
    message,
    resolve,
    write_json,
    write_mapping,
    write_rows,
    write_title,
)
from bkctl.errors import UsageError
from bkctl.files.digests import DigestChecker
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol.entrylog_format import RecordKind

FileArgument = Annotated[Path, typer.Argument(help="An entry log file (<hex>.log).")]
COLUMNS = (*KEY_COLUMNS, Column("entry_offset", "INDEX POS", numeric=True), *ENTRY_COLUMNS)
LEDGER_COLUMNS = (Column("ledger_id", "LEDGER", numeric=True), Column("size", "SIZE", numeric=True))


Options = ScanOptions


def entrylog_inspect(
    path: FileArgument,
    ledger: LedgerOption = None,
    entry: Annotated[
        int | None, typer.Option("--entry", "-e", help="Only this entry (needs --ledger).")
    ] = None,
    show_data: ShowDataOption = False,
    summary: Annotated[
        bool, typer.Option("--summary", help="Only counts (types, ledgers, bytes, digests).")
    ] = False,
    digest: DigestOption = None,
    password: PasswordOption = None,
    output: OutputOption = None,
) -> None:
    """Decode every record of an entry log (entries, ledgers map batches, padding runs)."""
    if entry is not None and ledger is None:
        raise UsageError("--entry needs --ledger")
    fmt = resolve(output)
    chosen, secret = digest_choice(digest, password)
    options = Options(ledger, show_data, summary, chosen, secret, fmt is OutputFormat.json, entry)
    failures = Failures()
    doc = _document(path, options, failures)
    if options.json_output:
        write_json(doc)
    else:
        _render(doc, options, fmt)
    failures.raise_if_any()


def _document(path: Path, options: Options, failures: Failures) -> dict[str, Any]:
    from bkctl.files.entrylog import entry_log_records, open_entry_log

    log = open_entry_log(path)
    header = log.header
    doc: dict[str, Any] = {
        "file": str(path),
        "log_id": log.log_id,
        "header_version": header.version if header else None,
        "ledgers_map_offset": header.ledgers_map_offset if header else None,
    }
    if log.empty:
        message(f"bkctl: {path}: empty entry log (preallocated, no header yet)")
        return doc | {"records": [], "summary": summary_of(RecordKind).as_dict(), "stopped": None}
    if log.header_error:
        failures.add(path, None, f"{log.header_error}; scanning records anyway")
    scan = entry_log_records(log)
    fill_records(doc, scan, RecordKind, partial(describe, options=options), _wanted(options), options)
    doc["stopped"] = lambda: _stopped(path, log.header_error, scan.stop, failures)
    return doc


def _stopped(path: Path, header_error: str | None, stop: Any, failures: Failures) -> dict[str, Any] | None:
    stopped = failures.add_stop(path, stop)
    if stopped is None and header_error:
        stopped = {"offset": 0, "reason": header_error}
    return stopped


def _wanted(options: Options) -> Callable[[dict[str, Any]], bool]:
    def wanted(record: dict[str, Any]) -> bool:
        ledger_ok = options.ledger is None or record["ledger_id"] == options.ledger
        return ledger_ok and (options.entry is None or record["entry_id"] == options.entry)

    return wanted


def describe(
    offset: int, kind: RecordKind, body: memoryview, checker: DigestChecker, options: Options
) -> dict[str, Any]:
    """One record as a JSON-ready dict; `entry_offset` is what the index stores for the entry."""
    record: dict[str, Any] = {"offset": offset, "ledger_id": None, "entry_id": None, "type": kind.value}
    record["size"] = len(body)
    if kind is RecordKind.PADDING:
        record["info"] = "size word <= 0: skipped byte by byte"
        return record
    record["ledger_id"], record["entry_id"] = ef.record_key(body)
    record["entry_offset"] = offset + 4
    if kind is RecordKind.LEDGERS_MAP:
        record["ledgers"] = max(0, (len(body) - ef.LEDGERS_MAP_HEADER_SIZE) // ef.LEDGERS_MAP_ITEM_SIZE)
        record["info"] = f"ledgers map batch of {record['ledgers']} ledgers"
    elif kind is RecordKind.DATA:
        record.update(
            entry_fields(record["ledger_id"], body, checker, options.show_data, options.json_output)
        )
    else:
        record["info"] = "unknown negative entry id"
    return record


def _render(doc: dict[str, Any], options: Options, fmt: OutputFormat) -> None:
    columns = (*COLUMNS, DATA_COLUMN) if options.show_data else COLUMNS
    title = (
        f"Entry log {doc['file']} (id {doc['log_id']}, header version {doc['header_version']}, "
        f"ledgers map at {doc['ledgers_map_offset']})"
    )
    render_records(title, doc, columns, options.summary, fmt)


def entrylog_metadata(path: FileArgument, output: OutputOption = None) -> None:
    """Bytes per ledger in an entry log: from its ledgers map when it has one, else by a scan."""
    from bkctl.files.entrylog import ledger_sizes, open_entry_log

    fmt = resolve(output)
    failures = Failures()
    log = open_entry_log(path)
    if log.header_error:
        failures.add(path, None, f"{log.header_error}; scanning records anyway")
    sizes = ledger_sizes(log)
    stopped = failures.add_stop(path, sizes.stop)
    total = sum(sizes.sizes.values())
    ledgers = [{"ledger_id": lid, "size": size} for lid, size in sorted(sizes.sizes.items())]
    doc: dict[str, Any] = {
        "file": str(path),
        "log_id": log.log_id,
        "source": sizes.source,
        "total_size": total,
        # Offline we cannot tell deleted ledgers: every byte counts as remaining, usage 1.0.
        "remaining_size": total,
        "usage": 1.0 if total else 0.0,
        "ledgers": ledgers,
        "stopped": stopped,
    }
    if fmt is OutputFormat.json:
        write_json(doc)
    else:
        write_mapping({k: v for k, v in doc.items() if k not in ("ledgers", "stopped")}, fmt)
        write_title("", fmt)
        write_rows(ledgers, LEDGER_COLUMNS, fmt)
    failures.raise_if_any()
