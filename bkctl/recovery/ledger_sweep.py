"""The auditor's periodic check of every ledger (Java's checkAllLedgers, auditorPeriodicCheckInterval):
each fragment's first and last entry read from its bookie, so a bookie that is alive but lost data (a
wiped or replaced disk, a deleted entry log) is found too, which an audit of lost bookies cannot see.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from twisted.internet import defer

from bkctl.errors import BkctlError
from bkctl.recovery.checker import check_ledger

if TYPE_CHECKING:
    from bkctl.client.client import Client
    from bkctl.metadata.nodes import Versioned
    from bkctl.model import LedgerMetadata

log = logging.getLogger("bkctl.recovery.audit")


SWEEP_PARALLEL = 16  # local bound: ledgers checked at once by the periodic check


async def bad_bookies_of(
    client: Client,
    ledger_id: int,
    *,
    full: bool = False,
    known: Versioned[LedgerMetadata] | None = None,
    registered: set[str] | None = None,
) -> list[str]:
    """Bookies holding a fragment of the ledger that is not `ok` (down, missing or corrupt entries)."""
    check = await check_ledger(client, ledger_id, full=full, known=known, registered=registered)
    return check.bad_bookies()


async def check_all_ledgers(client: Client) -> dict[int, list[str]]:
    """Every ledger with the bookies its check found bad; a ledger that cannot be checked is logged and
    skipped (deleted meanwhile, or no password that opens it). The ledgers' metadata is read in
    batches (multiRead) and the registered bookies once, and SWEEP_PARALLEL ledgers are checked at
    once: each check is a few round trips to its bookies."""
    layout = client.layout
    found: dict[int, list[str]] = {}
    ledgers = await client.in_thread(lambda: list(layout.read_ledgers_versioned(layout.ledger_ids())))
    registered = set(await client.in_thread(lambda: [*layout.bookies(), *layout.bookies(readonly=True)]))
    queue = list(reversed(ledgers))

    async def checker() -> None:
        while queue:
            ledger_id, known = queue.pop()
            try:
                bad = await bad_bookies_of(client, ledger_id, known=known, registered=registered)
            except BkctlError as exc:
                log.info("periodic check: ledger %d skipped: %s", ledger_id, exc)
                continue
            if bad:
                found[ledger_id] = bad

    await defer.gatherResults([defer.ensureDeferred(checker()) for _ in range(SWEEP_PARALLEL)])
    return dict(sorted(found.items()))
