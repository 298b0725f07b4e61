"""`bkctl ledger simpletest` and `bkctl bookie sanity`: BookKeeper's end-to-end smoke tests.

simpletest: a ledger on E bookies (CRC32C, empty password, custom metadata Bookie=simpletest), N
100-byte A-Z entries, read back and compared, then deleted. sanity: per bookie, a 1/1/1 MAC ledger on
that bookie alone, entries `entry-<i>`, close, reopen, LAC check, read and compare, delete.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bkctl.commands.bookie import app as bookie_app
from bkctl.commands.ledger import app as ledger_app
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
from bkctl.errors import BkctlError, CorruptDataError, UnavailableError

if TYPE_CHECKING:
    from bkctl.client.client import Client

ENTRY_SIZE = 100
ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def register(root: typer.Typer) -> None:
    """The commands are added to the `ledger` and `bookie` groups at import."""


def simpletest_entry(entry_id: int) -> bytes:
    """100 bytes of A-Z, starting at a letter that moves with the entry id."""
    start = entry_id % len(ALPHABET)
    return ((ALPHABET[start:] + ALPHABET[:start]) * 4)[:ENTRY_SIZE]


@ledger_app.command("simpletest")
def simpletest(
    ensemble_size: Annotated[int, typer.Option("--ensemble-size", "-e", min=1, help="Ensemble size.")] = 3,
    write_quorum: Annotated[int, typer.Option("--write-quorum", "-w", min=1, help="Write quorum.")] = 2,
    ack_quorum: Annotated[int, typer.Option("--ack-quorum", "-a", min=1, help="Ack quorum.")] = 2,
    num_entries: Annotated[
        int, typer.Option("--num-entries", "-n", min=1, max=1_000_000, help="Entries to write.")
    ] = 100,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Write N 100-byte entries to a new ledger, read them back and compare, delete the ledger.

    Exit 0 when every entry came back intact; otherwise the failing step's exit code (7 on a mismatch).
    """
    from bkctl.model import DigestType

    fmt = resolve(output)

    async def work(client: Client) -> dict[str, Any]:
        lh = await client.create_ledger(
            ensemble_size,
            write_quorum,
            ack_quorum,
            digest=DigestType.CRC32C,
            custom_metadata=[("Bookie", b"simpletest")],
        )
        message(f"Ledger ID: {lh.ledger_id}")
        await lh.add_many([simpletest_entry(i) for i in range(num_entries)])
        message(
            f"{num_entries} entries written to ledger {lh.ledger_id}. Last entry Id {lh.last_add_confirmed}"
        )
        entries = await lh.read(0, lh.last_add_confirmed)
        bad = [e.entry_id for e in entries if e.payload != simpletest_entry(e.entry_id)]
        if bad or len(entries) != num_entries:
            raise CorruptDataError(f"ledger {lh.ledger_id}: entries {bad[:10]} came back different")
        await lh.close()
        await client.delete_ledger(lh.ledger_id)
        message(f"{len(entries)} entries read back and compared; ledger {lh.ledger_id} deleted")
        return {
            "ledger_id": lh.ledger_id,
            "entries_written": num_entries,
            "last_entry_id": lh.last_add_confirmed,
            "entries_read": len(entries),
            "ensemble": lh.ensemble,
        }

    write_mapping(run_client(metadata, work), fmt)


SANITY_COLUMNS = (
    Column("bookie_id", "BOOKIE"),
    Column("ok", "OK"),
    Column("entries", "ENTRIES", numeric=True),
    Column("elapsed_ms", "MS", numeric=True),
    Column("error", "ERROR"),
)


@bookie_app.command("sanity")
def sanity(
    bookie: Annotated[
        list[str] | None,
        typer.Option("--bookie", "-b", help="Bookie to test (repeat; default: every read-write bookie)."),
    ] = None,
    entries: Annotated[
        int, typer.Option("--entries", "-e", min=1, max=100_000, help="Entries to write.")
    ] = 10,
    timeout_s: Annotated[
        float, typer.Option("--timeout", "-t", min=0.05, help="Per-request timeout, seconds.")
    ] = 1.0,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Write, close, reopen, read back and delete a ledger on each bookie alone (ensemble 1).

    One row per bookie; exit 6 if any bookie failed (its error is in the row and on stderr).
    """
    fmt = resolve(output)

    async def work(client: Client) -> list[dict[str, Any]]:
        targets = bookie or sorted(await client.in_thread(client.layout.bookies))
        if not targets:
            raise UnavailableError("no read-write bookie is registered")
        return [await sanity_one(client, b, entries) for b in targets]

    rows = run_client(metadata, work, request_timeout_ms=max(1, int(timeout_s * 1000)))
    if fmt is OutputFormat.json:
        write_json(rows)
    else:
        write_rows(rows, SANITY_COLUMNS, fmt)
    failed = [row for row in rows if not row["ok"]]
    if failed:
        raise UnavailableError(f"bookie sanity failed on {len(failed)} of {len(rows)} bookie(s)")
    message("Bookie sanity test succeeded")


async def sanity_one(client: Client, bookie: str, count: int) -> dict[str, Any]:
    from bkctl.model import DigestType

    started = time.monotonic()
    row: dict[str, Any] = {"bookie_id": bookie, "ok": False, "entries": 0, "elapsed_ms": None, "error": None}
    expected = [f"entry-{i}".encode() for i in range(count)]
    ledger_id = None
    try:
        lh = await client.create_ledger(1, 1, 1, digest=DigestType.MAC, ensemble=[bookie])
        ledger_id = lh.ledger_id
        await lh.add_many(expected)
        if lh.ensemble != [bookie]:
            # The client replaced the bookie after failed adds: the writes did not test it.
            raise UnavailableError(f"adds to {bookie} failed (the client moved them to {lh.ensemble[0]})")
        await lh.close()
        reader = await client.open_ledger(ledger_id, b"", recovery=False)
        if reader.last_add_confirmed != count - 1:
            raise CorruptDataError(f"last add confirmed {reader.last_add_confirmed}, expected {count - 1}")
        got = [e.payload for e in await reader.read(0, count - 1)]
        if got != expected:
            raise CorruptDataError("entries came back different")
        row.update(ok=True, entries=len(got))
        message(f"Read {len(got)} entries from ledger {ledger_id} on {bookie}")
    except BkctlError as exc:
        row["error"] = str(exc)
        message(f"bkctl: bookie {bookie}: {exc}")
    finally:
        if ledger_id is not None:
            try:
                await client.delete_ledger(ledger_id)
            except BkctlError as exc:
                message(f"bkctl: warning: ledger {ledger_id} not deleted: {exc}")
    row["elapsed_ms"] = round((time.monotonic() - started) * 1000, 1)
    return row
