"""`bkctl ledger create|write|read|fence|delete`: ledgers through the client, on the reactor.

A ledger has one writer for life, so `write` creates the ledger it writes, in the same process. `read`
opens without recovery by default (a live writer is never fenced by a look); `--recovery` or `fence`
fence, recover and close it. See docs/commands/ledger.md.
"""

from __future__ import annotations

import base64
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

from bkctl import limits
from bkctl.commands.ledger import app
from bkctl.commands.ledger_options import (
    TEMPLATE_DEFAULT,
    AckQuorumOption,
    DigestName,
    DigestOption,
    EnsembleOption,
    PasswordOption,
    TimeoutOption,
    WriteQuorumOption,
    check_template,
    password_bytes,
    payload,
)
from bkctl.commands.options import MetadataOption
from bkctl.commands.output import (
    Column,
    OutputFormat,
    OutputOption,
    message,
    resolve,
    write_json,
    write_mapping,
    write_rows,
)
from bkctl.commands.running import run_client
from bkctl.errors import BkctlError, LedgerClosedError, ProblemsFound, UsageError

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from bkctl.client.ledger import Client, LedgerHandle
    from bkctl.client.reads import LedgerEntry

LedgerIdArgument = Annotated[int, typer.Argument(help="Ledger id.", min=0)]


def register(root: typer.Typer) -> None:
    """The commands are added to the `ledger` group (bkctl.commands.ledger) at import."""


# --- create -------------------------------------------------------------------------------------------


@app.command("create")
def ledger_create(
    ensemble_size: EnsembleOption = 3,
    write_quorum: WriteQuorumOption = 2,
    ack_quorum: AckQuorumOption = 2,
    digest: DigestOption = DigestName.crc32c,
    password: PasswordOption = "",
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Create an empty OPEN ledger and print its id and ensemble. Nobody can write it afterwards (a
    ledger has one writer for life): use `ledger write` to create and write; `ledger fence` closes it."""
    fmt = resolve(output)

    async def work(client: Client) -> dict[str, Any]:
        lh = await client.create_ledger(
            ensemble_size,
            write_quorum,
            ack_quorum,
            digest=digest.to_type(),
            password=password_bytes(password),
        )
        return {"ledger_id": lh.ledger_id, "ensemble": lh.ensemble}

    document = run_client(metadata, work)
    write_mapping(document, fmt)


# --- write --------------------------------------------------------------------------------------------


@app.command("write")
def ledger_write(
    entries: Annotated[int | None, typer.Option("--entries", "-n", min=0, help="Number of entries.")] = None,
    size: Annotated[
        int | None,
        typer.Option(
            "--size", "-s", min=0, max=limits.ENTRY_SIZE_MAX, help="Bytes per entry (template + A-Z)."
        ),
    ] = None,
    template: Annotated[
        str | None, typer.Option("--template", help=f"Entry text; default {TEMPLATE_DEFAULT!r}.")
    ] = None,
    from_file: Annotated[
        str | None, typer.Option("--from-file", "-f", help="One entry per line of this file ('-': stdin).")
    ] = None,
    no_close: Annotated[
        bool, typer.Option("--no-close", help="Leave the ledger open, as a crashed writer would.")
    ] = False,
    ensemble_size: EnsembleOption = 3,
    write_quorum: WriteQuorumOption = 2,
    ack_quorum: AckQuorumOption = 2,
    digest: DigestOption = DigestName.crc32c,
    password: PasswordOption = "",
    timeout_ms: TimeoutOption = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Create a ledger and write entries to it: --entries N [--size S | --template T], or --from-file.

    Closes it at the end unless --no-close. On a failure the error says which entries were acknowledged
    (those are durable on Qa bookies); the ledger stays open: `ledger fence` closes it.
    """
    fmt = resolve(output)
    source = _entry_source(entries, size, template, from_file)

    async def work(client: Client) -> dict[str, Any]:
        lh = await client.create_ledger(
            ensemble_size,
            write_quorum,
            ack_quorum,
            digest=digest.to_type(),
            password=password_bytes(password),
        )
        message(f"ledger {lh.ledger_id} created on {','.join(lh.ensemble)}")
        written = await write_entries(lh, source(lh.ledger_id))
        if not no_close:
            await lh.close()
        return {"ledger_id": lh.ledger_id, "entries_written": written, "last_entry_id": lh.last_add_confirmed}

    write_mapping(run_client(metadata, work, request_timeout_ms=timeout_ms), fmt)


def _entry_source(entries: int | None, size: int | None, template: str | None, from_file: str | None) -> Any:
    """A function ledger id -> iterator of payloads, after checking the options fit together."""
    if (entries is None) == (from_file is None):
        raise UsageError("give exactly one of --entries N and --from-file F")
    if from_file is not None:
        if size is not None or template is not None:
            raise UsageError("--size and --template go with --entries, not --from-file")
        return lambda _: _lines(from_file)
    if size is not None and template is not None:
        raise UsageError("give at most one of --size and --template")
    text = check_template(template or TEMPLATE_DEFAULT)
    count = entries or 0
    return lambda ledger_id: (payload(ledger_id, i, text, size) for i in range(count))


def _lines(name: str) -> Iterator[bytes]:
    """Each line of the file (or stdin) without its line end, checked against the entry size limit."""
    stream: IO[bytes] = sys.stdin.buffer if name == "-" else _open(name)
    try:
        for number in range(1, sys.maxsize):
            line = stream.readline(limits.ENTRY_SIZE_MAX + 2)
            if not line:
                return
            entry = line.removesuffix(b"\n").removesuffix(b"\r")
            if len(entry) > limits.ENTRY_SIZE_MAX:
                raise UsageError(
                    f"{name}: line {number} is over the {limits.ENTRY_SIZE_MAX}-byte entry limit"
                )
            yield entry
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _open(name: str) -> IO[bytes]:
    try:
        return Path(name).open("rb")
    except OSError as exc:
        from bkctl.errors import NotFoundError

        raise NotFoundError(f"{name}: {exc.strerror}") from None


async def write_entries(lh: LedgerHandle, payloads: Iterator[bytes]) -> int:
    """Add every payload, a few chunks in flight; the count written. On failure the error names the
    acknowledged range (same error class, so the exit code stays)."""

    in_flight: deque[Deferred[list[int]]] = deque()
    written = 0
    try:
        while True:
            chunk = [p for _, p in zip(range(limits.CLI_WRITE_CHUNK_ENTRIES), payloads, strict=False)]
            if not chunk:
                break
            in_flight.append(lh.add_many(chunk))
            written += len(chunk)
            while len(in_flight) >= limits.CLI_WRITE_CHUNKS_IN_FLIGHT:
                await in_flight.popleft()
        while in_flight:
            await in_flight.popleft()
    except BkctlError as exc:
        for pending in in_flight:
            pending.addErrback(lambda _: None)
        done = lh.last_add_confirmed
        acked = "no entry acknowledged" if done < 0 else f"entries 0..{done} acknowledged"
        raise type(exc)(f"ledger {lh.ledger_id}: {acked}, then: {exc}") from exc
    return written


# --- read ---------------------------------------------------------------------------------------------

READ_COLUMNS = (
    Column("entry_id", "ENTRY", numeric=True),
    Column("size", "SIZE", numeric=True),
    Column("payload", "PAYLOAD"),
)


@app.command("read")
def ledger_read(
    ledger_id: LedgerIdArgument,
    first: Annotated[int, typer.Option("--first", min=0, help="First entry.")] = 0,
    last: Annotated[
        int | None, typer.Option("--last", min=0, help="Last entry (default: the last add confirmed).")
    ] = None,
    bookie: Annotated[
        str | None,
        typer.Option("--bookie", "-b", help="Read only this bookie's copies (host:port); never recovers."),
    ] = None,
    recovery: Annotated[
        bool,
        typer.Option(
            "--recovery/--no-recovery",
            help="--recovery fences, recovers and closes an open ledger first (its writer then fails). "
            "Default --no-recovery: read up to the last add confirmed, the writer goes on.",
        ),
    ] = False,
    as_text: Annotated[bool, typer.Option("--as-text", help="Payloads as UTF-8 text, not base64.")] = False,
    password: PasswordOption = "",
    timeout_ms: TimeoutOption = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Print entries --first..--last of a ledger (JSON: one {entry_id, payload_base64} per entry).

    Exit 4 if the ledger or an entry does not exist, 9 on a wrong password. With --bookie, entries that
    bookie should hold but cannot give are reported on stderr and the command exits 3.
    """
    if bookie is not None and recovery:
        raise UsageError("--bookie reads one bookie's copies and never recovers: drop --recovery")
    fmt = resolve(output)
    key = "payload" if as_text else "payload_base64"

    def row(entry: LedgerEntry) -> dict[str, Any]:
        shown = (
            entry.payload.decode("utf-8", "replace") if as_text else base64.b64encode(entry.payload).decode()
        )
        if fmt is OutputFormat.json:
            return {"entry_id": entry.entry_id, key: shown}
        return {"entry_id": entry.entry_id, "size": len(entry.payload), "payload": shown}

    def emit(entries: Iterator[LedgerEntry]) -> None:
        rows = (row(entry) for entry in entries)
        if fmt is OutputFormat.json:
            write_json(rows)
        else:
            write_rows(rows, READ_COLUMNS, fmt)

    async def work(client: Client) -> int:
        lh = await client.open_ledger(ledger_id, password_bytes(password), recovery=recovery)
        if bookie is not None:
            return await _read_from_bookie(lh, bookie, first, last, emit)
        end = lh.last_add_confirmed if last is None else last
        if end < first:
            message(
                f"ledger {ledger_id}: nothing to read (last add confirmed {lh.last_add_confirmed}; "
                "entries past it are unconfirmed until the writer adds more or closes: "
                "`ledger fence` or --recovery recovers them)"
            )
        await _in_thread(emit, _stream(lh, first, end))
        return 0

    failed = run_client(metadata, work, request_timeout_ms=timeout_ms)
    if failed:
        raise ProblemsFound(f"{failed} entries could not be read from bookie {bookie}")


def _stream(lh: LedgerHandle, first: int, last: int) -> Iterator[LedgerEntry]:
    """Entries first..last, read chunk by chunk from the reactor; runs in a worker thread."""
    from twisted.internet.threads import blockingCallFromThread

    reactor = lh.client.reactor
    chunk = limits.CLI_READ_CHUNK_ENTRIES
    for start in range(first, last + 1, chunk):
        end = min(last, start + chunk - 1)
        entries: list[LedgerEntry] = blockingCallFromThread(reactor, _read_range, lh, start, end)
        yield from entries


def _read_range(lh: LedgerHandle, first: int, last: int) -> Deferred[list[LedgerEntry]]:
    return lh.read(first, last)


async def _in_thread(function: Any, *args: Any) -> Any:
    from twisted.internet import threads

    return await threads.deferToThread(function, *args)


async def _read_from_bookie(lh: LedgerHandle, bookie: str, first: int, last: int | None, emit: Any) -> int:
    """Every entry in first..last that `bookie` stores (by the write sets), from that bookie only.

    Without --last, up to the highest of the last add confirmed (open without recovery) and the
    bookie's own last entry, so unconfirmed entries it holds show too (BookKeeper's `readledger -b`
    printed nothing without -fe/-le).
    """
    from bkctl.client.single_bookie import last_entry_on, read_from_bookie

    end = last
    if end is None:
        held = await last_entry_on(lh, bookie)
        end = max(lh.last_add_confirmed, held)
        message(
            f"ledger {lh.ledger_id}: last add confirmed {lh.last_add_confirmed}, "
            f"{bookie} holds up to entry {held}"
        )
    wanted = [e for e in range(first, end + 1) if bookie in _write_set(lh, e)]
    if not wanted:
        message(f"ledger {lh.ledger_id}: bookie {bookie} stores no entry in {first}..{end}")
    found, failures = await read_from_bookie(lh, bookie, wanted)
    for entry_id, why in failures:
        message(f"bkctl: entry {entry_id}: {why}")
    await _in_thread(emit, iter(found))
    return len(failures)


def _write_set(lh: LedgerHandle, entry_id: int) -> set[str]:
    return {lh.replica(entry_id, position) for position in range(lh.quorum.write_quorum)}


# --- fence --------------------------------------------------------------------------------------------


@app.command("fence")
def ledger_fence(
    ledger_id: LedgerIdArgument,
    password: PasswordOption = "",
    timeout_ms: TimeoutOption = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Recovery open: fence the ledger on its bookies (its writer can add no more), recover the
    unconfirmed tail, close it. Prints the last entry and the length.

    Exit 0 when this command closed it; when it was already CLOSED the same data is printed and the
    exit code is 11 (CLOSED).
    """
    fmt = resolve(output)

    async def work(client: Client) -> tuple[dict[str, Any], bool]:
        from bkctl.model import LedgerState

        before = await client.in_thread(client.layout.read_ledger, ledger_id)
        was_closed = before.value.state is LedgerState.CLOSED
        lh = await client.open_ledger(ledger_id, password_bytes(password), recovery=True)
        document = {
            "ledger_id": ledger_id,
            "state": lh.metadata.state.name,
            "last_entry_id": lh.last_add_confirmed,
            "length": lh.length,
        }
        return document, was_closed

    document, was_closed = run_client(metadata, work, request_timeout_ms=timeout_ms)
    write_mapping(document, fmt)
    if was_closed:
        raise LedgerClosedError(f"ledger {ledger_id} was already closed (nothing fenced)")


# --- delete -------------------------------------------------------------------------------------------


@app.command("delete")
def ledger_delete(
    ledger_id: LedgerIdArgument,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    metadata: MetadataOption = None,
) -> None:
    """Delete a ledger's metadata; bookies garbage-collect its entries later. Asks first unless --yes
    (without a terminal and without --yes: exit 2). Exit 4 if it does not exist."""
    from bkctl.commands.options import open_layout

    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"refusing to delete ledger {ledger_id} without --yes (no terminal to ask)")
        if not typer.confirm(f"Delete ledger {ledger_id}? Its entries will be gone.", err=True):
            raise typer.Abort()
    with open_layout(metadata) as layout:
        layout.read_ledger(ledger_id)  # NotFoundError (4) names the ledger
        layout.delete_ledger(ledger_id)
    message(f"ledger {ledger_id} deleted")
