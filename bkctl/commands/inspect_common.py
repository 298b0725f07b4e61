"""Helpers shared by the inspect commands: failure collection, payload rendering, option types."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from bkctl.commands.output import (
    Column,
    OutputFormat,
    message,
    write_mapping,
    write_rows,
    write_title,
)
from bkctl.errors import CorruptDataError, UsageError
from bkctl.files.digests import DigestChecker, split_payload
from bkctl.model import DigestType
from bkctl.protocol import entry as entry_format
from bkctl.protocol.scanning import ScanStop

# Columns of a scanned record, shared by journal and entry-log inspect (each adds its own in between).
KEY_COLUMNS = (
    Column("offset", "OFFSET", numeric=True),
    Column("ledger_id", "LEDGER", numeric=True),
    Column("entry_id", "ENTRY", numeric=True),
    Column("type", "TYPE"),
    Column("size", "SIZE", numeric=True),
)
ENTRY_COLUMNS = (
    Column("last_add_confirmed", "LAC", numeric=True),
    Column("digest", "DIGEST"),
    Column("digest_ok", "DIGEST OK"),
    Column("info", "INFO"),
)
DATA_COLUMN = Column("data", "DATA")


@dataclass(frozen=True)
class ScanOptions:
    """What the journal and entry-log inspect commands were asked for."""

    ledger: int | None
    show_data: bool
    summary: bool
    digest: DigestType | None
    password: bytes | None
    json_output: bool
    entry: int | None = None  # entry log only


LedgerOption = Annotated[int | None, typer.Option("--ledger", "-l", help="Only records of this ledger id.")]
ShowDataOption = Annotated[
    bool, typer.Option("--show-data", "-m", help="Add each entry's payload (text when printable, else hex).")
]
DigestOption = Annotated[
    str | None,
    typer.Option(
        "--digest",
        help="Digest type of the entries (crc32, crc32c, mac, dummy); default: inferred per ledger.",
    ),
]
PasswordOption = Annotated[
    str | None, typer.Option("--password", help="Ledger password, to verify (and infer) MAC digests.")
]


@dataclass
class Failures:
    """Corruption met while inspecting, raised once at the end (exit 7) so the data printed comes first.

    The first problem is the error line; any further ones are listed on stderr just before it.
    """

    items: list[str] = field(default_factory=list)

    def add(self, path: Path, offset: int | None, reason: str) -> None:
        where = f"{path}" if offset is None else f"{path}: offset {offset}"
        self.items.append(f"{where}: {reason}")

    def add_stop(self, path: Path, stop: ScanStop | None) -> dict[str, Any] | None:
        """Record a scan's end; the JSON `stopped` value (None when the file ended cleanly)."""
        if stop is None or not stop.is_error:
            return None
        self.add(path, stop.position, stop.reason or "corrupt data")
        return {"offset": stop.position, "reason": stop.reason}

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            for item in self.items[1:]:
                message(f"bkctl: also corrupt: {item}")
            more = f" (and {len(self.items) - 1} more above)" if len(self.items) > 1 else ""
            raise CorruptDataError(self.items[0] + more)


def digest_choice(digest: str | None, password: str | None) -> tuple[DigestType | None, bytes | None]:
    """Parse --digest/--password; a MAC digest needs the password."""
    chosen = DigestType.parse(digest) if digest is not None else None
    if chosen is DigestType.MAC and password is None:
        raise UsageError("--digest mac needs --password to verify the entries")
    return chosen, password.encode() if password is not None else None


def payload_text(payload: bytes | memoryview) -> str:
    """A payload for a table cell: the text when it is printable UTF-8, else hex."""
    data = bytes(payload)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data.hex()
    return text if text.isprintable() else data.hex()


def payload_field(payload: bytes | memoryview, json_output: bool) -> dict[str, str]:
    if json_output:
        return {"payload_base64": base64.b64encode(payload).decode()}
    return {"data": payload_text(payload)}


def explicit_lac_value(body: bytes) -> dict[str, Any]:
    """An explicit LAC body as JSON: decoded ledger id and LAC when long enough, and the raw hex."""
    from bkctl.protocol.entry import decode_lac_body

    value: dict[str, Any] = {"ledger_id": None, "lac": None, "raw": body.hex()}
    if len(body) >= 16:
        value["ledger_id"], value["lac"] = decode_lac_body(body)
    return value


def summary_of(kinds: type[Enum]) -> Any:
    """An empty RecordSummary (every kind counted 0), fed record by record with `add_record`."""
    from bkctl.files.summary import RecordSummary

    return RecordSummary(types={kind.value: 0 for kind in kinds})


def add_record(summary: Any, record: dict[str, Any]) -> None:
    """Count one rendered record into a RecordSummary (same numbers as the fast `summarize`)."""
    summary.records += 1
    summary.types[record["type"]] = summary.types.get(record["type"], 0) + 1
    ledger_id = record.get("ledger_id")
    if ledger_id is not None and ledger_id >= 0:
        summary.ledgers.add(ledger_id)
    summary.record_bytes += record["size"]
    if summary.first_offset is None:
        summary.first_offset = record["offset"]
    summary.last_offset = record["offset"]
    if record["type"] == "DATA":
        ok = record.get("digest_ok")
        summary.digest_unverified += ok is None
        summary.digest_failures += ok is False


def entry_fields(
    ledger_id: int, body: memoryview, checker: DigestChecker, show_data: bool, json_output: bool
) -> dict[str, Any]:
    """LAC, digest and (with --show-data) payload of a stored entry, as journal and entry log show it."""
    if len(body) < entry_format.HEADER_SIZE:
        return {
            "last_add_confirmed": None,
            "digest": None,
            "digest_ok": False,
            "info": "shorter than an entry header",
        }
    digest, ok = checker.check(ledger_id, body)
    fields: dict[str, Any] = {
        "last_add_confirmed": entry_format.HEADER.unpack_from(body)[2],
        "digest": digest.name if digest is not None else None,
        "digest_ok": ok,
    }
    if show_data:
        fields |= payload_field(split_payload(body, digest), json_output)
    return fields


def render_records(
    title: str, doc: dict[str, Any], columns: tuple[Column, ...], summary_only: bool, fmt: OutputFormat
) -> None:
    """Table/plain rendering of a scanned file: a title, then its summary or its records, then its end."""
    write_title(title, fmt)
    if summary_only:
        summary = doc["summary"]
        # The file first: a summary of several files (a journal dir) must say which is which.
        write_mapping({"file": doc["file"], **(summary() if callable(summary) else summary)}, fmt)
    elif doc.get("records") is not None:
        write_rows(doc["records"], columns, fmt)
    stopped = doc["stopped"]
    if callable(stopped):
        stopped()


def described_records(
    scan: Iterable[tuple[int, Any, memoryview]],
    describe: Callable[[int, Any, memoryview], dict[str, Any]],
    wanted: Callable[[dict[str, Any]], bool],
    json_output: bool,
    totals: Any,
) -> Iterator[dict[str, Any]]:
    """The records of a scan, described, filtered and counted into `totals` as they stream by."""
    for offset, kind, body in scan:
        record = describe(offset, kind, body)
        if not wanted(record):
            continue
        add_record(totals, record)
        if json_output:
            record.pop("info", None)  # a note for people; JSON carries the typed fields
        yield record


def _with_progress(
    scan: Iterable[tuple[int, Any, memoryview]], doc: dict[str, Any], options: Any
) -> Iterable[tuple[int, Any, memoryview]]:
    """A bar over the file's bytes, by each record's offset (only on a terminal; not over table rows
    streaming to the same terminal)."""
    from bkctl.commands.progress import tracked
    from bkctl.files.chunks import file_size

    path = Path(doc["file"])
    busy = not options.summary
    return tracked(
        scan, path.name, file_size(path), lambda record: record[0], unit_bytes=True, stdout_busy=busy
    )


def fill_records(
    doc: dict[str, Any],
    scan: Iterable[tuple[int, Any, memoryview]],
    kinds: type[Enum],
    describe: Callable[..., dict[str, Any]],
    wanted: Callable[[dict[str, Any]], bool],
    options: Any,
) -> None:
    """Put a scan into `doc`: the fast summary alone with --summary, else the streamed records and their
    totals. `options` carries digest, password, ledger, summary and json_output."""
    from bkctl.files.summary import summarize

    checker = DigestChecker(options.digest, options.password)
    scan = _with_progress(scan, doc, options)
    if options.summary:
        doc["summary"] = lambda: summarize(scan, kinds, checker, options.ledger).as_dict()
        return
    totals = summary_of(kinds)
    doc["records"] = described_records(
        scan, partial(describe, checker=checker), wanted, options.json_output, totals
    )
    doc["summary"] = totals.as_dict
