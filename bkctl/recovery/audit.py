"""The auditor's decisions: when to audit lost bookies, and which ledgers an audit marks.

`AuditScheduler` follows Java's Auditor rules (reference e): lost = known - (read-write + read-only);
one lost bookie waits `lostBookieRecoveryDelay` seconds, more than one (or a delay of 0) audits at once,
a bookie that comes back before the delay ends cancels the pending audit; a change of the delay to 0 or
to the same value audits at once (that is how `trigger-audit` works), another value reschedules.
It only decides; the audit itself is a callable given to it, so tests drive it with `task.Clock`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bkctl.metadata.layout import Layout
from bkctl.model import LedgerMetadata

MARK_BATCH = 256  # local bound: marks an audit sends together

log = logging.getLogger("bkctl.recovery.audit")


class AuditScheduler:
    """Turns bookie-set and delay changes into audits, now or after the lost-bookie delay."""

    def __init__(self, clock: Any, audit: Callable[[], object]) -> None:
        self._clock, self._audit = clock, audit
        self._to_audit: set[str] = set()
        self._pending: Any = None
        self._delay_s = 0
        self.delayed_audits_cancelled = 0

    @property
    def pending(self) -> bool:
        return self._pending is not None and self._pending.active()

    @property
    def bookies_to_audit(self) -> frozenset[str]:
        return frozenset(self._to_audit)

    def bookies_changed(self, known: Iterable[str], available: Iterable[str], delay_s: int) -> None:
        """The registrations or cookies changed: decide whether an audit runs now, later, or not."""
        self._delay_s = delay_s
        up = set(available)
        if self._to_audit and self._to_audit <= up:
            log.info("lost bookie(s) %s came back: pending audit cancelled", sorted(self._to_audit))
            self._cancel_pending(counted=True)
            self._to_audit.clear()
        self._to_audit |= set(known) - up
        if not self._to_audit:
            return
        if delay_s == 0 or len(self._to_audit) > 1:
            self._cancel_pending(counted=True)
            self._audit_now()
        elif not self.pending:
            log.info("bookie %s lost: audit in %d s", next(iter(self._to_audit)), delay_s)
            self._pending = self._clock.callLater(delay_s, self._audit_now)

    def delay_changed(self, delay_s: int) -> None:
        """`lostBookieRecoveryDelay` was written: 0 or the same value audits now, else reschedule."""
        same, self._delay_s = delay_s == self._delay_s, delay_s
        if delay_s == 0 or same:
            self._cancel_pending(counted=False)
            self._audit_now()
        elif self.pending:
            self._cancel_pending(counted=False)
            self._pending = self._clock.callLater(delay_s, self._audit_now)

    def stop(self) -> None:
        self._cancel_pending(counted=False)

    def _cancel_pending(self, *, counted: bool) -> None:
        if self.pending:
            assert self._pending is not None
            self._pending.cancel()
            self.delayed_audits_cancelled += counted
        self._pending = None

    def _audit_now(self) -> None:
        self._pending = None
        self._to_audit.clear()
        self._audit()


@dataclass
class AuditReport:
    """What one audit of lost bookies did."""

    lost_bookies: list[str]
    ledgers_checked: int = 0
    ledgers_marked: list[int] = field(default_factory=list)


def missing_members(metadata: LedgerMetadata, available: frozenset[str]) -> list[str]:
    """Bookies named by any of the ledger's ensembles that are not available (Java: membership)."""
    members = dict.fromkeys(b for segment in metadata.segments for b in segment.ensemble)
    return [b for b in members if b not in available]


def ledgers_missing_bookies(
    ledgers: Iterable[tuple[int, LedgerMetadata]], available: frozenset[str]
) -> Iterator[tuple[int, list[str]]]:
    for ledger_id, metadata in ledgers:
        missing = missing_members(metadata, available)
        if missing:
            yield ledger_id, missing


def audit_bookies(layout: Layout, available: Iterable[str]) -> AuditReport:
    """Mark every ledger whose ensembles name a bookie that is not available (blocking).

    Like Java's auditBookies, a bookie named in metadata but never seen (no cookie) counts as lost too:
    its replicas are gone either way. A bookie back empty under its own id (its cookie made again since
    the last audit, see `back_empty`) counts as lost for this audit: its ledgers are marked, and the
    worker checks each (it is registered) and refills what it lacks, in place if no other bookie can
    take the copy. Then its cookie's generation is recorded, so the next audit does not mark them again.
    """
    listed = list(available)
    empty = back_empty(layout, listed)
    up = frozenset(listed) - frozenset(empty)
    report = AuditReport(lost_bookies=[])
    lost: dict[str, None] = {}
    ledgers = layout.read_ledgers(layout.ledger_ids())
    found = ledgers_missing_bookies(_counted(ledgers, report), up)
    while chunk := list(itertools.islice(found, MARK_BATCH)):
        layout.mark_many_underreplicated(chunk)  # the workers start on a chunk while the next is found
        for ledger_id, missing in chunk:
            report.ledgers_marked.append(ledger_id)
            lost.update(dict.fromkeys(missing))
    report.lost_bookies = sorted(lost)
    for bookie, (czxid, seen) in layout.cookie_generations(listed).items():
        if seen != czxid:
            layout.record_cookie_generation(bookie, czxid)
    return report


def back_empty(layout: Layout, bookies: list[str]) -> list[str]:
    """Registered bookies whose cookie was made again since the last audit recorded it (a wiped disk
    started under the same id: `bookie format`, then a first start). A bookie seen for the first time
    is recorded now, not suspected: a wipe is seen from the second cookie an auditor sees on."""
    generations = layout.cookie_generations(bookies)
    for bookie, (now, seen) in generations.items():
        if seen is None:
            layout.record_cookie_generation(bookie, now)
    return [b for b, (now, seen) in generations.items() if seen is not None and seen != now]


def _counted(
    ledgers: Iterable[tuple[int, LedgerMetadata]], report: AuditReport
) -> Iterator[tuple[int, LedgerMetadata]]:
    for item in ledgers:
        report.ledgers_checked += 1
        yield item
