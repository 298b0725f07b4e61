"""`bkctl ledger create|write|read|fence|delete`: ledgers through the client, on the reactor.

A ledger has one writer for life, so `write` creates the ledger it writes, in the same process. `read`
opens without recovery by default (a live writer is never fenced by a look); `--recovery` or `fence`
fence, recover and close it. See docs/commands/ledger.md.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bkctl import limits
from bkctl.commands.ledger import app
from bkctl.commands.ledger_options import (
    AckQuorumOption,
    AdminPasswordOption,
    DigestName,
    DigestOption,
    EnsembleOption,
    PasswordOption,
    ProtocolOption,
    TimeoutOption,
    WriteQuorumOption,
    admin_password,
    password_bytes,
)
from bkctl.commands.options import (
    MetadataOption,
    PlacementConfOption,
    PlacementKeysOption,
    confirm,
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
)
from bkctl.commands.running import run_client
from bkctl.errors import LedgerClosedError, ProblemsFound, UsageError

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from bkctl.client.client import Client
    from bkctl.client.ledger import LedgerHandle
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
    conf: PlacementConfOption = None,
    placement: PlacementKeysOption = None,
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

    document = run_client(metadata, work, conf=conf, placement=placement)
    write_mapping(document, fmt)


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
    password: AdminPasswordOption = None,
    timeout_ms: TimeoutOption = None,
    protocol: ProtocolOption = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Print entries --first..--last of a ledger (JSON: one {entry_id, payload_base64} per entry).

    Opened as an administrator: with the password and digest its metadata stores unless --password is
    given. Exit 4 if the ledger or an entry does not exist, 9 on a wrong password. With --bookie, entries that
    bookie should hold but cannot give are reported on stderr and the command exits 3.
    """
    if bookie is not None and recovery:
        raise UsageError("--bookie reads one bookie's copies and never recovers: drop --recovery")
    if last is not None and first > last:
        raise UsageError(f"--first {first} is after --last {last}: nothing to read")
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
        from bkctl.recovery.checker import admin_open

        lh = await admin_open(client, ledger_id, recovery=recovery, password=admin_password(password))
        if bookie is not None:
            return await _read_from_bookie(lh, bookie, first, last, emit)
        end = _read_end(lh, first, last)
        await _in_thread(emit, _with_progress(_stream(lh, first, end), ledger_id, first, end))
        return 0

    failed = run_client(metadata, work, request_timeout_ms=timeout_ms, protocol=protocol)
    if failed:
        raise ProblemsFound(f"{failed} entries could not be read from bookie {bookie}")


def _read_end(lh: LedgerHandle, first: int, last: int | None) -> int:
    """The last entry to read: --last clamped to what exists (a closed ledger's last entry, an open
    one's last add confirmed); a range wholly past a closed ledger's end is NotFound."""
    from bkctl.errors import NotFoundError

    lac = lh.last_add_confirmed
    if lh.is_closed:
        if first > lac:
            ends = "is empty" if lac < 0 else f"ends at entry {lac}"
            raise NotFoundError(f"ledger {lh.ledger_id} is closed and {ends}: no entry {first} to read")
        return lac if last is None else min(last, lac)
    if first > lac:
        message(
            f"ledger {lh.ledger_id}: nothing to read from entry {first} (open, last add confirmed {lac}; "
            "entries past it are unconfirmed until the writer adds more or closes: "
            "`ledger fence` or --recovery recovers them)"
        )
    elif last is not None and last > lac:
        message(
            f"ledger {lh.ledger_id}: open, reading up to its last add confirmed {lac} "
            f"(not {last}: later entries are unconfirmed)"
        )
    return lac if last is None else min(last, lac)


def _with_progress(
    entries: Iterator[LedgerEntry], ledger_id: int, first: int, last: int
) -> Iterable[LedgerEntry]:
    """A bar over the entries read, when they go to a file or a pipe (on a terminal they are it)."""
    from bkctl.commands.progress import tracked

    count = max(0, last - first + 1)
    return tracked(
        entries, f"ledger {ledger_id}", count, lambda e: e.entry_id - first + 1, "entries", stdout_busy=True
    )


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
    password: AdminPasswordOption = None,
    timeout_ms: TimeoutOption = None,
    protocol: ProtocolOption = None,
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
        from bkctl.recovery.checker import admin_open

        before = await client.in_thread(client.layout.read_ledger, ledger_id)
        was_closed = before.value.state is LedgerState.CLOSED
        lh = await admin_open(client, ledger_id, recovery=True, password=admin_password(password))
        document = {
            "ledger_id": ledger_id,
            "state": lh.metadata.state.name,
            "last_entry_id": lh.last_add_confirmed,
            "length": lh.length,
        }
        return document, was_closed

    document, was_closed = run_client(metadata, work, request_timeout_ms=timeout_ms, protocol=protocol)
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
        confirm(
            f"Delete ledger {ledger_id}? Its entries will be gone.",
            declined=f"ledger {ledger_id} not deleted",
            needs_yes=f"delete ledger {ledger_id}",
        )
    with open_layout(metadata) as layout:
        layout.read_ledger(ledger_id)  # NotFoundError (4) names the ledger
        layout.delete_ledger(ledger_id)
    message(f"ledger {ledger_id} deleted")
