"""The auditor's rules (Java's AuditorLedgerCheckerTest scenarios): when an audit runs, what it marks."""

from __future__ import annotations

from twisted.internet.task import Clock

from bkctl.metadata.layout import Layout
from bkctl.metadata.store import MetadataStore
from bkctl.model import LedgerMetadata, LedgerState, Segment
from bkctl.recovery.audit import AuditScheduler, audit_bookies

A, B, C, D = "10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181", "10.0.0.4:3181"
KNOWN = [A, B, C, D]


def scheduler() -> tuple[AuditScheduler, Clock, list[float]]:
    clock = Clock()
    audits: list[float] = []
    return AuditScheduler(clock, lambda: audits.append(clock.seconds())), clock, audits


def test_no_lost_bookie_no_audit() -> None:
    s, _, audits = scheduler()
    s.bookies_changed(KNOWN, KNOWN, 0)
    assert audits == []


def test_delay_zero_audits_at_once() -> None:
    s, _, audits = scheduler()
    s.bookies_changed(KNOWN, [A, B, C], 0)
    assert audits == [0]


def test_one_lost_bookie_waits_the_delay() -> None:
    s, clock, audits = scheduler()
    s.bookies_changed(KNOWN, [A, B, C], 10)
    assert s.pending and audits == []
    clock.advance(9)
    s.bookies_changed(KNOWN, [A, B, C], 10)  # another change (no new loss) does not restart the wait
    clock.advance(1)
    assert audits == [10] and not s.pending


def test_bookie_back_within_the_delay_cancels_the_audit() -> None:
    s, clock, audits = scheduler()
    s.bookies_changed(KNOWN, [A, B, C], 10)
    clock.advance(5)
    s.bookies_changed(KNOWN, KNOWN, 10)
    clock.advance(60)
    assert audits == [] and s.delayed_audits_cancelled == 1


def test_second_lost_bookie_audits_at_once() -> None:
    s, clock, audits = scheduler()
    s.bookies_changed(KNOWN, [A, B, C], 10)
    clock.advance(3)
    s.bookies_changed(KNOWN, [A, B], 10)
    assert audits == [3] and not s.pending


def test_delay_change_reschedules_and_same_value_triggers() -> None:
    s, clock, audits = scheduler()
    s.bookies_changed(KNOWN, [A, B, C], 10)
    clock.advance(5)
    s.delay_changed(30)  # another value: the pending audit now runs 30 s from here
    clock.advance(25)
    assert audits == []
    clock.advance(5)
    assert audits == [35]
    s.delay_changed(30)  # the same value: trigger-audit
    assert audits == [35, 35]


def test_delay_change_to_zero_audits_at_once() -> None:
    s, clock, audits = scheduler()
    s.bookies_changed(KNOWN, [A, B, C], 100)
    clock.advance(1)
    s.delay_changed(0)
    assert audits == [1] and not s.pending


def _ledger(layout: Layout, *ensembles: tuple[str, ...], closed: bool = True) -> int:
    segments = tuple(Segment(i * 10, e) for i, e in enumerate(ensembles))
    last = len(ensembles) * 10 - 1 if closed else -1
    md = LedgerMetadata(
        ensemble_size=len(ensembles[0]),
        write_quorum=2,
        ack_quorum=2,
        segments=segments,
        state=LedgerState.CLOSED if closed else LedgerState.OPEN,
        last_entry_id=last,
    )
    ledger_id, _ = layout.create_ledger(md)
    return ledger_id


def test_audit_marks_every_ledger_naming_a_lost_bookie(store: MetadataStore) -> None:
    layout = Layout(store)
    layout.init_cluster()
    on_c = _ledger(layout, (A, B, C))
    clean = _ledger(layout, (A, B, D))
    earlier_segment = _ledger(layout, (C, A, B), (D, A, B), closed=False)
    never_seen = _ledger(layout, ("192.0.2.1:1000", A, B))  # AuditorPeriodicBookieCheckTest
    report = audit_bookies(layout, [A, B, D])
    assert sorted(report.ledgers_marked) == sorted([on_c, earlier_segment, never_seen])
    assert report.ledgers_checked == 4
    assert report.lost_bookies == ["10.0.0.3:3181", "192.0.2.1:1000"]
    marks = {e.ledger_id: e.mark.replicas for e in layout.underreplicated_ledgers()}
    assert marks == {on_c: (C,), earlier_segment: (C,), never_seen: ("192.0.2.1:1000",)}
    assert clean not in marks
    # A second audit with another lost bookie merges it into the marks, as Java's re-marking does.
    audit_bookies(layout, [B, D])
    assert layout.read_underreplicated(on_c).value.replicas == (C, A)  # type: ignore[union-attr]
