"""`bkctl sandbox --demo`: what a new user should see work once: a ledger written (E3/Qw2/Qa2, 1000
entries of 1 KiB), fenced by a second client (recovery open), read back and checked; then a bookie of its
ensemble dies and autorecovery heals the ledger with nothing typed (every entry back on every bookie of its
write set); then the ledger's metadata and the cluster's bookies and ledger count."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from bkctl.commands.ledger import SEGMENT_COLUMNS, ledger_document
from bkctl.commands.ledger_options import TEMPLATE_DEFAULT, payload
from bkctl.commands.ledger_write import write_entries
from bkctl.commands.output import OutputFormat, message, write_json, write_mapping, write_rows, write_title
from bkctl.errors import CorruptDataError

ENTRIES = 1000
ENTRY_SIZE = 1024


HEAL_WAIT_S = 120.0  # local bound


async def run_demo(
    reactor: Any, uri: str, fmt: OutputFormat, kill_bookie: Callable[[str], Awaitable[None]] | None = None
) -> None:
    from twisted.internet import threads

    from bkctl.client.client import Client
    from bkctl.metadata.layout import Layout
    from bkctl.metadata.stores import open_store

    store = await threads.deferToThread(open_store, uri)
    writer = Client(Layout(store), reactor)
    fencer = Client(Layout(store), reactor)
    try:
        document = await _demo(writer, fencer)
        if kill_bookie is not None:
            document["autorecovery"] = await _heal(fencer, document, kill_bookie)
            md = (await fencer.in_thread(fencer.layout.read_ledger, document["ledger"]["ledger_id"])).value
            document["ledger"] = ledger_document(document["ledger"]["ledger_id"], md)
            document["cluster"]["bookies_rw"] = await fencer.in_thread(fencer.layout.bookies)
    finally:
        await writer.close()
        await fencer.close()
        await threads.deferToThread(store.close)
    if fmt is OutputFormat.json:
        write_json(document)
        return
    segments = document["ledger"].pop("segments")
    healed = {f"autorecovery_{k}": v for k, v in document.get("autorecovery", {}).items()}
    write_mapping({"demo": "ok", **document["ledger"], **document["cluster"], **healed}, fmt)
    write_title("\nsegments:", fmt)
    write_rows(segments, SEGMENT_COLUMNS, fmt)


async def _demo(writer: Any, fencer: Any) -> dict[str, Any]:
    lh = await writer.create_ledger(3, 2, 2)
    ledger_id = lh.ledger_id
    message(f"demo: ledger {ledger_id} created on {','.join(lh.ensemble)} (E3/Qw2/Qa2, CRC32C)")
    expected = [payload(ledger_id, i, TEMPLATE_DEFAULT, ENTRY_SIZE) for i in range(ENTRIES)]
    await write_entries(lh, iter(expected))
    message(f"demo: {ENTRIES} entries of {ENTRY_SIZE} bytes written and acknowledged, ledger left open")
    recovered = await fencer.open_ledger(ledger_id, b"", recovery=True)
    message(
        f"demo: fenced and recovered by a second client: closed at entry {recovered.last_add_confirmed}, "
        f"{recovered.length} bytes"
    )
    entries = await recovered.read(0, recovered.last_add_confirmed)
    if [e.payload for e in entries] != expected:
        raise CorruptDataError(f"demo: ledger {ledger_id} read back differs from what was written")
    message(f"demo: read back {len(entries)} entries, every byte matches")
    layout = fencer.layout
    md = (await fencer.in_thread(layout.read_ledger, ledger_id)).value
    cluster = {
        "bookies_rw": await fencer.in_thread(layout.bookies),
        "ledger_count": await fencer.in_thread(lambda: sum(1 for _ in layout.ledger_ids(_ignore))),
    }
    return {"ledger": ledger_document(ledger_id, md), "cluster": cluster}


def _ignore(path: str, why: str) -> None:
    message(f"bkctl: warning: {path}: {why} (skipped)")


async def _heal(
    client: Any, document: dict[str, Any], kill_bookie: Callable[[str], Awaitable[None]]
) -> dict[str, Any]:
    """Stop a bookie of the ledger's ensemble, wait for autorecovery to heal the ledger, check it."""
    from twisted.internet import task

    from bkctl.client.single_bookie import read_from_bookie
    from bkctl.errors import TimeoutError_
    from bkctl.recovery.bookie_recovery import admin_open
    from bkctl.recovery.fragments import fragments

    ledger_id = document["ledger"]["ledger_id"]
    victim = document["ledger"]["segments"][0]["ensemble"][0]
    started = time.monotonic()
    await kill_bookie(victim)
    message(f"demo: bookie {victim} killed (as if its machine died); autorecovery repairs, nothing typed")
    layout = client.layout
    while True:
        md = (await client.in_thread(layout.read_ledger, ledger_id)).value
        marks = await client.in_thread(lambda: list(layout.underreplicated_ids()))
        if not marks and all(victim not in s.ensemble for s in md.segments):
            break
        if time.monotonic() - started > HEAL_WAIT_S:
            raise TimeoutError_(f"demo: ledger {ledger_id} not healed within {HEAL_WAIT_S:.0f} s")
        await task.deferLater(client.reactor, 0.25, lambda: None)
    seconds = round(time.monotonic() - started, 2)
    handle = await admin_open(client, ledger_id, recovery=False)
    for fragment in fragments(ledger_id, handle.metadata, handle.metadata.last_entry_id):
        wanted = list(fragment.entries())
        found, failures = await read_from_bookie(handle, fragment.bookie, wanted)
        if failures or [e.entry_id for e in found] != wanted:
            raise CorruptDataError(
                f"demo: {fragment.bookie} misses entries of ledger {ledger_id}: {failures}"
            )
    message(f"demo: healed in {seconds} s: every entry is on every bookie of its write set again")
    return {
        "killed_bookie": victim,
        "healed_seconds": seconds,
        "ensemble": list(handle.metadata.segments[0].ensemble),
    }
