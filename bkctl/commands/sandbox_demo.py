"""`bkctl sandbox --demo`: what a new user should see work once: a ledger written (E3/Qw2/Qa2, 1000
entries of 1 KiB), fenced by a second client (recovery open), read back and checked, then the ledger's
metadata and the cluster's bookies and ledger count."""

from __future__ import annotations

from typing import Any

from bkctl.commands.ledger import SEGMENT_COLUMNS, ledger_document
from bkctl.commands.ledger_options import TEMPLATE_DEFAULT, payload
from bkctl.commands.ledger_write import write_entries
from bkctl.commands.output import OutputFormat, message, write_json, write_mapping, write_rows, write_title
from bkctl.errors import CorruptDataError

ENTRIES = 1000
ENTRY_SIZE = 1024


async def run_demo(reactor: Any, uri: str, fmt: OutputFormat) -> None:
    from twisted.internet import threads

    from bkctl.client.ledger import Client
    from bkctl.metadata.layout import Layout
    from bkctl.metadata.store import open_store

    store = await threads.deferToThread(open_store, uri)
    writer = Client(Layout(store), reactor)
    fencer = Client(Layout(store), reactor)
    try:
        document = await _demo(writer, fencer)
    finally:
        await writer.close()
        await fencer.close()
        await threads.deferToThread(store.close)
    if fmt is OutputFormat.json:
        write_json(document)
        return
    segments = document["ledger"].pop("segments")
    write_mapping({"demo": "ok", **document["ledger"], **document["cluster"]}, fmt)
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
