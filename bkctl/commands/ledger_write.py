"""`bkctl ledger write`: create a ledger and write entries; always say how far it got.

Every way a write can end prints the same document: `ledger_id`, `entries_written` (acknowledged),
`last_entry_id`, `closed`, and on a failure or Ctrl-C an `error`; then the exit code of what happened
(130 for Ctrl-C). A script always learns the ledger id and the acknowledged range, and whether
`bkctl ledger fence <id>` must close the ledger. Input is checked before the ledger is created, so a
missing file or a bad option leaves nothing behind; a ledger in which nothing was acknowledged is
deleted again rather than left open and empty.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterator
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
    ProtocolOption,
    TimeoutOption,
    WriteQuorumOption,
    check_template,
    password_bytes,
    payload,
)
from bkctl.commands.options import MetadataOption, PlacementConfOption, PlacementKeysOption
from bkctl.commands.output import OutputOption, message, resolve, write_mapping
from bkctl.commands.progress import Bar, bar
from bkctl.commands.running import interruptible, run_client
from bkctl.errors import BkctlError, Interrupted, NotFoundError, UsageError

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from bkctl.client.client import Client
    from bkctl.client.ledger import LedgerHandle


def register(root: typer.Typer) -> None:
    """The command is added to the `ledger` group (bkctl.commands.ledger) at import."""


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
    protocol: ProtocolOption = None,
    conf: PlacementConfOption = None,
    placement: PlacementKeysOption = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Create a ledger and write entries to it: --entries N [--size S | --template T], or --from-file.

    Closes it at the end unless --no-close. Whatever happens, prints ledger_id, entries_written,
    last_entry_id and closed (plus error on a failure); acknowledged entries are durable on Qa bookies.
    A failed or interrupted write is closed at its last acknowledged entry when the metadata store
    allows; if it stays open the message says so (`bkctl ledger fence <id>` closes it).
    """
    fmt = resolve(output)
    source = entry_source(entries, size, template, from_file)

    async def work(client: Client) -> tuple[dict[str, Any], BkctlError | None]:
        with interruptible(client.reactor) as stop:
            lh = await client.create_ledger(
                ensemble_size,
                write_quorum,
                ack_quorum,
                digest=digest.to_type(),
                password=password_bytes(password),
            )
            message(f"ledger {lh.ledger_id} created on {','.join(lh.ensemble)}")
            try:
                with bar(f"ledger {lh.ledger_id}", entries, "entries") as shown:
                    await write_entries(lh, source(lh.ledger_id), stop, shown)
            except BkctlError as exc:
                return await ended_early(client, lh, exc)
        if no_close:
            # Left open, yet not short of a copy: every bookie of the write set answers first.
            await lh.wait_answered()
        else:
            try:
                await lh.close()
            except BkctlError as exc:  # the metadata store stayed away past the deadline, or a fence
                return await ended_early(client, lh, exc, close=False)
        return write_document(lh, closed=not no_close), None

    document, error = run_client(
        metadata,
        work,
        request_timeout_ms=timeout_ms,
        protocol=protocol,
        conf=conf,
        placement=placement,
    )
    write_mapping(document, fmt)
    if error is not None:
        raise error


def write_document(lh: LedgerHandle, *, closed: bool) -> dict[str, Any]:
    return {
        "ledger_id": lh.ledger_id,
        "entries_written": lh.last_add_confirmed + 1,
        "last_entry_id": lh.last_add_confirmed,
        "closed": closed,
    }


async def ended_early(
    client: Client, lh: LedgerHandle, error: BkctlError, *, close: bool = True
) -> tuple[dict[str, Any], BkctlError]:
    """After a failure or Ctrl-C: close the ledger at its last acknowledged entry (delete it if none
    was), and the document saying so; the error keeps its exit code, its message says what to do.
    `close=False` after a failed close: it already waited for the store up to the deadline."""
    document = write_document(lh, closed=False)
    if close:
        await _close_or_delete(client, lh, document)
    if not document["closed"]:
        # After a failed close nobody knows: its request may reach the store once it is back.
        state = "is still open" if close else "may still be open (its close did not complete)"
        message(
            f"ledger {lh.ledger_id} {state}: `bkctl ledger fence {lh.ledger_id}` closes it "
            "(it keeps every acknowledged entry)"
        )
    document["error"] = str(error)
    return document, type(error)(f"ledger {lh.ledger_id}: {_acknowledged(lh)}, then: {error}")


async def _close_or_delete(client: Client, lh: LedgerHandle, document: dict[str, Any]) -> None:
    """Close the ledger at its last acknowledged entry, or delete it if none was; `document` says so."""
    if lh.last_add_confirmed < 0:
        if await _succeeded(client.delete_ledger(lh.ledger_id)):
            document.update(closed=True, deleted=True)
            message(f"ledger {lh.ledger_id}: no entry was acknowledged; the ledger was deleted")
        return
    # close() writes CLOSED at the last acknowledged entry, then re-raises the write's own error.
    await _succeeded(lh.close())
    if lh.is_closed:
        document["closed"] = True
        message(f"ledger {lh.ledger_id}: closed at entry {lh.last_add_confirmed}, the last acknowledged")


def _acknowledged(lh: LedgerHandle) -> str:
    done = lh.last_add_confirmed
    return "no entry acknowledged" if done < 0 else f"entries 0..{done} acknowledged"


async def _succeeded(operation: Deferred[Any]) -> bool:
    """Whether `operation` succeeded; its failure is not the story (the original error is)."""
    try:
        await operation
    except BkctlError:
        return False
    return True


def entry_source(entries: int | None, size: int | None, template: str | None, from_file: str | None) -> Any:
    """A function ledger id -> iterator of payloads, after checking the options (and opening the file)
    so that bad input is refused before any ledger exists."""
    if (entries is None) == (from_file is None):
        raise UsageError("give exactly one of --entries N and --from-file F")
    if from_file is not None:
        if size is not None or template is not None:
            raise UsageError("--size and --template go with --entries, not --from-file")
        stream = sys.stdin.buffer if from_file == "-" else _open(from_file)
        return lambda _: lines_of(from_file, stream)
    if size is not None and template is not None:
        raise UsageError("give at most one of --size and --template")
    text = check_template(template or TEMPLATE_DEFAULT)
    count = entries or 0
    return lambda ledger_id: (payload(ledger_id, i, text, size) for i in range(count))


def lines_of(name: str, stream: IO[bytes]) -> Iterator[bytes]:
    """Each line without its line end, checked against the entry size limit (UsageError naming the line:
    the entries before it are written and the ledger closed there)."""
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
    path = Path(name)
    if path.is_dir():
        raise UsageError(f"{name} is a directory, not a file of entries")
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise NotFoundError(f"{name}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{name}: {exc.strerror}") from None


async def write_entries(
    lh: LedgerHandle,
    payloads: Iterator[bytes],
    stop: Callable[[], bool] = lambda: False,
    shown: Bar | None = None,
) -> int:
    """Add every payload, a few chunks in flight; the count written. Raises the first add failure,
    a bad input line (after the chunks before it are acknowledged), or Interrupted when `stop()`.
    `shown` is told the entries acknowledged after each chunk."""
    shown = shown or Bar()
    in_flight: deque[Deferred[list[int]]] = deque()
    written = 0
    try:
        while not stop():
            chunk, bad_input = _next_chunk(payloads)
            if chunk:
                in_flight.append(lh.add_many(chunk))
                written += len(chunk)
            if bad_input is not None:  # the lines before it are sent; they count
                while in_flight:
                    await in_flight.popleft()
                raise bad_input
            if not chunk:
                break
            while len(in_flight) >= limits.CLI_WRITE_CHUNKS_IN_FLIGHT:
                await in_flight.popleft()
                shown.update(lh.last_add_confirmed + 1)
        while in_flight:
            await in_flight.popleft()
            shown.update(lh.last_add_confirmed + 1)
    except BkctlError:
        for pending in in_flight:
            pending.addErrback(lambda _: None)
        raise
    if stop():
        raise Interrupted("interrupted by Ctrl-C")
    return written


def _next_chunk(payloads: Iterator[bytes]) -> tuple[list[bytes], UsageError | None]:
    chunk: list[bytes] = []
    try:
        for item in payloads:
            chunk.append(item)
            if len(chunk) >= limits.CLI_WRITE_CHUNK_ENTRIES:
                break
    except UsageError as exc:
        return chunk, exc
    return chunk, None
