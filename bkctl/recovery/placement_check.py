"""Judging placement: which segments of a ledger break the policy, which replica to move, and the
auditor's periodic placement check over every closed ledger (Java's placementPolicyCheck, with its
gauges NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY and NUM_LEDGERS_SOFTLY_ADHERING_TO_PLACEMENT_POLICY).

Moving a replica is the replication worker's (recovery/repair.py): with
`repairedPlacementPolicyNotAdheringBookieEnable` the check marks each such ledger under-replicated,
naming the bookie to move; the worker copies its fragment to a bookie placement chooses and only then
swaps it in, so the copy count never drops.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bkctl.client.placement import Placement, Violation
from bkctl.metadata.layout import Layout
from bkctl.model import LedgerMetadata, LedgerState

log = logging.getLogger("bkctl.recovery.placement")

PLACEMENT_CHECK = "placementpolicycheckctime"


@dataclass(frozen=True)
class SegmentPlacement:
    segment: int
    ensemble: tuple[str, ...]
    violations: tuple[Violation, ...]
    move: str  # the replica to move so the write sets can span more racks

    def as_dict(self) -> dict[str, Any]:
        return {
            "segment": self.segment,
            "ensemble": list(self.ensemble),
            "move": self.move,
            "violations": [v.as_dict() for v in self.violations],
        }


def ledger_placement(policy: Placement, md: LedgerMetadata) -> list[SegmentPlacement]:
    """The segments breaking the policy (blocking: asks the rack source)."""
    found = []
    for number, segment in enumerate(md.segments):
        broken = policy.violations(segment.ensemble, md.write_quorum)
        if broken:
            found.append(SegmentPlacement(number, segment.ensemble, tuple(broken), _to_move(policy, broken)))
    return found


def _to_move(policy: Placement, broken: list[Violation]) -> str:
    """A bookie sharing its rack with another of a failing write set (the one in most of them); a
    bookie of the default rack when the sets fail on that alone."""
    votes: Counter[str] = Counter()
    for violation in broken:
        where = policy.locations(violation.bookies)
        seen: dict[str, str] = {}
        for bookie in violation.bookies:
            domain = policy.domain(where[bookie])
            if domain in seen or domain == policy.domain(policy.settings.default_location):
                votes[bookie] += 1
            seen.setdefault(domain, bookie)
    return votes.most_common(1)[0][0] if votes else broken[0].bookies[-1]


@dataclass
class PlacementCheckReport:
    closed_audited: int = 0
    not_adhering: dict[int, list[str]] = field(default_factory=dict)  # ledger -> bookies to move
    softly_adhering: int = 0
    seconds: float = 0.0


def check_placement(layout: Layout, policy: Placement) -> PlacementCheckReport:
    """Every closed ledger judged (blocking; run in a thread). Java audits closed ledgers only: an
    open one's writer is still choosing."""
    report = PlacementCheckReport()
    started = time.monotonic()
    for ledger_id, md in layout.read_ledgers(layout.ledger_ids()):
        if md.state is not LedgerState.CLOSED:
            continue
        report.closed_audited += 1
        segments = ledger_placement(policy, md)
        if segments:
            report.not_adhering[ledger_id] = sorted({s.move for s in segments})
    report.seconds = time.monotonic() - started
    return report


def mark_for_moves(layout: Layout, report: PlacementCheckReport) -> int:
    """Mark each ledger not adhering, naming the bookies to move; the workers move one replica."""
    for ledger_id, bookies in report.not_adhering.items():
        layout.mark_underreplicated(ledger_id, bookies)
    if report.not_adhering:
        log.info(
            "placement check: %d ledger(s) marked to move a replica: %s",
            len(report.not_adhering),
            sorted(report.not_adhering),
        )
    return len(report.not_adhering)
