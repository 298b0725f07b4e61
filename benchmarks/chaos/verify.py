"""The end of a chaos run, in its own process: every ledger of the history is recovered (fenced and
closed when still open) and read back whole, then the history is checked (history.check); then, with
every bookie back, the wait for full replication: no under-replication mark left and every bookie of
every write set holding its entries (a full check). Prints one JSON document.

    python -m benchmarks.chaos.verify --metadata URI --dir HISTORY_DIR [--heal-timeout 180]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from twisted.internet import defer, task

from benchmarks.chaos.history import Facts, check, load
from benchmarks.chaos.payloads import payload
from bkctl.client.client import Client
from bkctl.client.ledger import LedgerHandle
from bkctl.errors import BkctlError, NotFoundError
from bkctl.metadata.stores import layout_at
from bkctl.recovery.bookie_recovery import admin_open
from bkctl.recovery.checker import check_fragments
from bkctl.recovery.fragments import fragments

READ_CHUNK = 500


async def facts_of(client: Client, ledger_id: int) -> Facts:
    for attempt in range(5):  # a bookie restarting or a worker's ensemble swap: try again
        try:
            handle = await admin_open(client, ledger_id, recovery=True)
            return Facts(handle.metadata.last_entry_id, await bad_entries(handle))
        except NotFoundError:
            return Facts(None)
        except BkctlError as exc:
            if attempt == 4:
                return Facts(-1, [(0, f"cannot be recovered: {exc}")])
            await task.deferLater(client.reactor, 2.0, lambda: None)
    raise AssertionError("unreachable")


async def bad_entries(handle: LedgerHandle) -> list[tuple[int, str]]:
    """Entries 0..last that cannot be read or do not hold what was written."""
    bad: list[tuple[int, str]] = []
    last = handle.metadata.last_entry_id
    for first in range(0, last + 1, READ_CHUNK):
        end = min(last, first + READ_CHUNK - 1)
        try:
            entries = await handle.read(first, end)
        except BkctlError:
            entries = []
            for entry_id in range(first, end + 1):
                try:
                    entries += await handle.read(entry_id, entry_id)
                except BkctlError as exc:
                    bad.append((entry_id, f"unreadable: {exc}"))
        for entry in entries:
            if entry.payload != payload(handle.ledger_id, entry.entry_id):
                bad.append((entry.entry_id, "bytes differ from what was written"))
    return bad


async def healed(client: Client, ledger_ids: list[int]) -> list[str]:
    """What still keeps the cluster from full replication (empty when healed)."""
    layout = client.layout
    problems = [f"ledger {i}: marked under-replicated" for i in await client.in_thread(_marked, layout)]
    registered = set(await client.in_thread(lambda: [*layout.bookies(), *layout.bookies(readonly=True)]))
    for ledger_id in ledger_ids:
        try:
            handle = await admin_open(client, ledger_id, recovery=False)
            down = {b for s in handle.metadata.segments for b in s.ensemble} - registered
            found = fragments(ledger_id, handle.metadata, handle.metadata.last_entry_id)
            states = await check_fragments(handle, found, full=True, down=down)
        except NotFoundError:
            continue
        except BkctlError as exc:  # bookies still coming back: not healed yet, asked again later
            problems.append(f"ledger {ledger_id}: cannot be checked: {exc}")
            continue
        problems += [f"ledger {ledger_id}: {s.fragment.bookie} {s.state}" for s in states if not s.ok]
    return problems


def _marked(layout: Any) -> list[int]:
    return list(layout.underreplicated_ids())


async def verify(client: Client, directory: Path, heal_timeout_s: float) -> dict[str, Any]:
    ledgers, faults = load(directory)
    facts = {ledger_id: await facts_of(client, ledger_id) for ledger_id in sorted(ledgers)}
    verdict = check(ledgers, facts)
    started = time.monotonic()
    problems = await healed(client, sorted(ledgers))
    while problems and time.monotonic() - started < heal_timeout_s:
        await task.deferLater(client.reactor, 2.0, lambda: None)
        problems = await healed(client, sorted(ledgers))
    return {
        "ledgers": len(ledgers),
        "entries_acknowledged": verdict.entries_acknowledged,
        "entries_lost": verdict.entries_lost,
        "reads_checked": sum(len(ledger.reads) for ledger in ledgers.values()),
        "violations": verdict.violations,
        "heal_s": round(time.monotonic() - started, 1) if not problems else None,
        "not_healed": problems[:20],
        "faults_logged": len(faults),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--heal-timeout", type=float, default=180.0)
    args = parser.parse_args()
    with layout_at(args.metadata) as layout:

        async def run(reactor: Any) -> None:
            client = Client(layout, reactor)
            try:
                print(json.dumps(await verify(client, args.dir, args.heal_timeout)), flush=True)
            finally:
                await client.close()

        task.react(lambda reactor: defer.ensureDeferred(run(reactor)))


if __name__ == "__main__":
    main()
