"""The replication worker's repair of one marked ledger, on the manual recovery's code.

A mark names the bookies the auditor found lost. Those that are registered again are not lost any more
(BookKeeper re-replicated ledgers whose bookies had come back, and kept their marks: here the mark just
goes). For the others the ledger's fragments are copied and swapped as `bkctl recover` does, to this
daemon's bookie when it runs beside one (as Java's worker does) or wherever placement says. An open
ledger whose last ensemble lost a bookie is left to its writer: the worker fences it after its grace
period and asks again. A bookie of the mark that is alive is checked (first and last entry of each
fragment); where it lacks entries they are repaired (`live`: sealed fragments move, an open tail is
copied back in place) and the writer is never fenced for it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.defer import Deferred

from bkctl import limits
from bkctl.errors import NotFoundError
from bkctl.metadata.nodes import Versioned
from bkctl.model import LedgerMetadata, LedgerState
from bkctl.recovery.bookie_recovery import BookieRecovery, RecoveryOptions, RegisteredBookies, admin_open
from bkctl.recovery.checker import check_ledger
from bkctl.recovery.placement_check import ledger_placement
from bkctl.recovery.replicator import Throttle, format_ranges, window_for
from bkctl.recovery.worker import RepairOutcome

if TYPE_CHECKING:
    from bkctl.client.client import Client

OPEN_SKIP = "--skip-open-ledgers"


class LedgerRepairer:
    def __init__(
        self,
        client: Client,
        local_bookie: str | None = None,
        parallel: int = limits.REPLICATION_PARALLEL_DEFAULT,
    ) -> None:
        self.client, self.local_bookie = client, local_bookie
        self.bookies = RegisteredBookies(client)  # shared by this worker's repairs
        # every copy of this worker, together: its share of the cluster's replicationRateByBytes, and
        # the entries in flight of its `parallel` repairs
        self.throttle = Throttle(client.reactor, None, window_for(parallel))

    def repair(
        self, ledger_id: int, missing: tuple[str, ...], known: Versioned[LedgerMetadata] | None = None
    ) -> Deferred[RepairOutcome]:
        return defer.ensureDeferred(self._repair(ledger_id, missing, known))

    def fence(self, ledger_id: int) -> Deferred[Any]:
        return defer.ensureDeferred(admin_open(self.client, ledger_id, recovery=True))

    async def _repair(
        self, ledger_id: int, missing: tuple[str, ...], known: Versioned[LedgerMetadata] | None
    ) -> RepairOutcome:
        layout = self.client.layout
        # the take's read, else read now; a stale one fails the swap's CAS, which reads again
        metadata: Versioned[LedgerMetadata]
        try:
            metadata = (
                known if known is not None else await self.client.in_thread(layout.read_ledger, ledger_id)
            )
        except NotFoundError:
            return RepairOutcome(replicated=False, deleted=True)
        writable, readonly = await self.bookies.lists()
        lost = [b for b in missing if b not in writable and b not in readonly]
        alive = [b for b in missing if b not in lost]
        live: frozenset[tuple[str, int]] = frozenset()
        if alive:
            # Marked by a check (a wiped disk), by a writer (copies acknowledged adds missed: the tail
            # of a fragment, the entries after the bookie failed), or back since the audit: ask them,
            # first and last entry of each fragment read and the entries they list (reading every entry
            # would read whole ledgers again after each bookie restart that the auditor marked).
            check = await check_ledger(self.client, ledger_id)
            bad = [s.fragment for s in check.states if not s.ok and s.fragment.bookie in alive]
            lost += sorted({f.bookie for f in bad})
            live = frozenset((f.bookie, f.segment) for f in bad)  # repaired where they lack entries
        move = False
        if not lost:
            # Marked by the placement check: move one replica of each segment breaking the policy.
            placed = await self._placement_moves(ledger_id, alive)
            if not placed:
                return RepairOutcome(replicated=True, detail="every bookie of the mark is back with its data")
            lost, live, move = sorted({b for b, _ in placed}), frozenset(placed), True
        # Copies go to our own bookie when it can take them (as Java's worker does), else placement
        # chooses: a daemon beside a read-only or stopped bookie, or alone, still repairs.
        # With a placement policy, placement chooses (as Java's worker does since 4.12): our own bookie
        # may be in the wrong rack.
        local = self.local_bookie if not self.client.placement.aware else None
        target = local if local in writable else None
        options = RecoveryOptions(
            tuple(lost), target, ledger=ledger_id, parallel=1, skip_open=True, live=live, placement_move=move
        )
        known_now = {ledger_id: metadata}
        recovery = BookieRecovery(
            self.client, options, known=known_now, bookies=self.bookies, throttle=self.throttle
        )
        report = await recovery.run()
        outcome = RepairOutcome(
            replicated=True, entries_copied=report.copied.entries, bytes_copied=report.copied.bytes
        )
        if any(OPEN_SKIP in s["reason"] for s in report.ledgers_skipped):
            return replace(outcome, replicated=False, open_tail_missing=True)
        if report.ledgers_unrecoverable:
            runs = report.ledgers_unrecoverable[0]["entries"]
            entries = [e for first, last in runs for e in range(first, last + 1)]
            detail = f"no surviving copy of entries {format_ranges(entries)}"
            return replace(outcome, replicated=False, unrecoverable=True, detail=detail)
        if report.ledgers_skipped:
            return replace(outcome, replicated=False, detail=str(report.ledgers_skipped[0]["reason"]))
        return outcome

    async def _placement_moves(self, ledger_id: int, alive: list[str]) -> list[tuple[str, int]]:
        """(bookie, segment): the replicas of the mark's bookies to move so the closed ledger's write
        sets span the racks the policy asks for."""
        policy = self.client.placement
        if not policy.aware or not alive:
            return []
        md = (await self.client.in_thread(self.client.layout.read_ledger, ledger_id)).value
        if md.state is not LedgerState.CLOSED:
            return []
        segments = await self.client.in_thread(ledger_placement, policy, md)
        return [(s.move, s.segment) for s in segments if s.move in alive]
