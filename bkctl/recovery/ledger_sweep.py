"""The auditor's periodic check of every ledger (Java's checkAllLedgers, auditorPeriodicCheckInterval):
each fragment's first and last entry read from its bookie, so a bookie that is alive but lost data (a
wiped or replaced disk, a deleted entry log) is found too, which an audit of lost bookies cannot see.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from bkctl.errors import BkctlError
from bkctl.recovery.checker import check_ledger

if TYPE_CHECKING:
    from bkctl.client.client import Client

log = logging.getLogger("bkctl.recovery.audit")


async def bad_bookies_of(client: Client, ledger_id: int, *, full: bool = False) -> list[str]:
    """Bookies holding a fragment of the ledger that is not `ok` (down, missing or corrupt entries)."""
    return (await check_ledger(client, ledger_id, full=full)).bad_bookies()


async def check_all_ledgers(client: Client) -> dict[int, list[str]]:
    """Every ledger with the bookies its check found bad; a ledger that cannot be checked is logged and
    skipped (deleted meanwhile, or no password that opens it)."""
    layout = client.layout
    found: dict[int, list[str]] = {}
    for ledger_id in await client.in_thread(lambda: list(layout.ledger_ids())):
        try:
            bad = await bad_bookies_of(client, ledger_id)
        except BkctlError as exc:
            log.info("periodic check: ledger %d skipped: %s", ledger_id, exc)
            continue
        if bad:
            found[ledger_id] = bad
    return found
