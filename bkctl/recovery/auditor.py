"""The auditor: watches bookies and the autorecovery flags, and marks the ledgers of lost bookies.

Runs on the reactor while this daemon holds the election; every store call runs in the thread pool
and every watch callback is handed back with `callFromThread`. Audits run one at a time: a change
during an audit asks for one more audit after it, never a second one beside it. While autorecovery
is disabled audits wait (the flag's watch starts the one that waited).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet import task, threads
from twisted.internet.defer import Deferred, inlineCallbacks

from bkctl.metadata.autorecovery import UR_DISABLE, UR_LOST_BOOKIE_RECOVERY_DELAY
from bkctl.metadata.layout import Layout
from bkctl.metadata.nodes import AVAILABLE, COOKIES, READONLY
from bkctl.metadata.store import Subscription
from bkctl.recovery.audit import AuditReport, AuditScheduler, audit_bookies, back_empty
from bkctl.recovery.placement_check import PLACEMENT_CHECK, PlacementCheckReport, mark_for_moves

log = logging.getLogger("bkctl.recovery.auditor")


@dataclass(frozen=True)
class AuditorConfig:
    """Java's keys: lostBookieRecoveryDelay (s), auditorPeriodicBookieCheckInterval,
    auditorPeriodicCheckInterval and auditorPeriodicPlacementPolicyCheckInterval (s, 0 = off),
    repairedPlacementPolicyNotAdheringBookieEnable."""

    lost_bookie_recovery_delay_s: int = 0
    periodic_bookie_check_interval_s: int = 86_400
    periodic_check_interval_s: int = 604_800
    placement_check_interval_s: int = 0
    repair_placement: bool = False


@dataclass
class AuditorStats:
    audits: int = 0
    ledgers_marked: int = 0
    failures: int = 0
    sweeps: int = 0  # periodic checks of every ledger done
    last_audit_ms: int | None = None
    last_report: AuditReport | None = None
    lost_bookies: list[str] = field(default_factory=list)
    placement_checks: int = 0
    # the last placement check's counts (Java's gauges) and time
    ledgers_not_adhering: int = 0
    ledgers_softly_adhering: int = 0
    placement_check_ms: float = 0.0


class Auditor:
    def __init__(
        self,
        layout: Layout,
        reactor: Any,
        config: AuditorConfig = AuditorConfig(),
        sweep: Callable[[], Deferred[dict[int, list[str]]]] | None = None,
        placement: Callable[[], Deferred[PlacementCheckReport]] | None = None,
    ) -> None:
        self._layout, self._reactor, self._config = layout, reactor, config
        self._sweep = sweep  # checks every ledger: ledger -> bad bookies (recovery.ledger_sweep)
        self._placement = placement  # judges every closed ledger (recovery.placement_check)
        self._calls: dict[str, Any] = {}  # the periodic checks' next calls
        self.scheduler = AuditScheduler(reactor, self.request_audit)
        self.stats = AuditorStats()
        self._subs: list[Subscription] = []
        self._periodic: task.LoopingCall | None = None
        self._running = False
        self._audit_in_progress = False
        self._audit_wanted = False
        self._audit_failed_last = False
        self._enabled = True
        self._delay_s: int | None = None
        self.ready = False  # watching (tests wait for it)
        self._sets_asked = 0  # bookie-set reads started (see _bookies_changed)

    # --- life ---------------------------------------------------------------------------------------

    @inlineCallbacks
    def start(self) -> Any:
        self._running = True
        yield self._in_thread(self._init_delay_node)
        yield self._in_thread(self._watch_all)
        interval = self._config.periodic_bookie_check_interval_s
        if interval > 0:
            self._periodic = task.LoopingCall(self._periodic_check)
            self._periodic.clock = self._reactor
            self._periodic.start(interval, now=False)
        for name, (interval, check, _) in self._checks().items():
            if check is not None and interval > 0:
                last = yield self._in_thread(self._layout.check_ctime, name)
                self._schedule(name, last)
        self.ready = True
        log.info("auditor started")

    def stop(self) -> None:
        self._running = False
        for sub in self._subs:
            sub.cancel()
        self._subs.clear()
        if self._periodic is not None and self._periodic.running:
            self._periodic.stop()
        for call in self._calls.values():
            if call.active():
                call.cancel()
        self.scheduler.stop()
        log.info("auditor stopped")

    @property
    def enabled(self) -> bool:
        """False while the disable flag (as last seen by its watch) holds audits back."""
        return self._enabled

    def _in_thread(self, function: Callable[..., Any], *args: Any) -> Deferred[Any]:
        return threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(), function, *args)

    def _init_delay_node(self) -> None:
        """Java's auditor writes lostBookieRecoveryDelay from its configuration when the node is absent."""
        if self._layout.lost_bookie_recovery_delay() is None:
            self._layout.set_lost_bookie_recovery_delay(self._config.lost_bookie_recovery_delay_s)

    def _watch_all(self) -> None:
        """The flags first: their first calls reach the reactor before any bookie change is decided."""
        store = self._layout.store
        self._subs.append(
            store.watch_data(self._layout.ur_path(UR_DISABLE), self._from_thread(self._disable_node))
        )
        self._subs.append(
            store.watch_data(
                self._layout.ur_path(UR_LOST_BOOKIE_RECOVERY_DELAY), self._from_thread(self._delay_node)
            )
        )
        parents = (
            self._layout.path(AVAILABLE),
            self._layout.path(AVAILABLE, READONLY),
            self._layout.path(COOKIES),
        )
        for parent in parents:
            store.ensure_path(parent)
            self._subs.append(store.watch_children(parent, self._from_thread(self._bookies_changed)))

    def _from_thread(self, handler: Callable[..., None]) -> Callable[..., None]:
        def hand_over(*args: Any) -> None:
            self._reactor.callFromThread(handler, *args)

        return hand_over

    # --- events (reactor thread) --------------------------------------------------------------------

    def _bookies_changed(self, _children: object) -> None:
        if self._running:
            # The reads run in pool threads and may end out of order: only the latest one decides
            # (an older one would say a bookie that just went is still there).
            self._sets_asked += 1
            asked = self._sets_asked
            sets = self._in_thread(self._bookie_sets)
            sets.addCallbacks(lambda found: self._decide(found) if asked == self._sets_asked else None)
            sets.addErrback(self._log_failure)

    def _bookie_sets(self) -> tuple[list[str], list[str], int, list[str]]:
        known = self._layout.cookie_bookies()
        available = self._layout.bookies() + self._layout.bookies(readonly=True)
        delay = self._layout.lost_bookie_recovery_delay()
        empty = back_empty(self._layout, available)
        return known, available, self._config.lost_bookie_recovery_delay_s if delay is None else delay, empty

    def _decide(self, sets: tuple[list[str], list[str], int, list[str]]) -> None:
        known, available, delay_s, empty = sets
        self.stats.lost_bookies = sorted(set(known) - set(available))
        if self._running:
            self.scheduler.bookies_changed(known, available, delay_s)
        if empty and self._running:  # back with a new cookie: its data is gone, at once (no delay)
            log.info("bookies back empty under their own id (a new cookie): %s", ", ".join(empty))
            self.request_audit()

    def _delay_node(self, data: bytes | None, _stat: object) -> None:
        if data is None or not self._running:
            return
        try:
            delay_s = int(data.decode().strip())
        except ValueError:
            log.warning("lostBookieRecoveryDelay %r is not a number: ignored", data[:40])
            return
        first, self._delay_s = self._delay_s is None, delay_s
        if not first:  # the watch's first call is the value at start, not a change
            self.scheduler.delay_changed(delay_s)

    def _disable_node(self, data: bytes | None, _stat: object) -> None:
        self._enabled = data is None
        log.info("autorecovery %s", "enabled" if self._enabled else "disabled: audits wait")
        if self._enabled and self._audit_wanted and not self._audit_in_progress:
            self._run_audit()

    def _periodic_check(self) -> None:
        if not self.scheduler.pending:  # Java: the periodic bookie check defers to a pending delayed audit
            self.request_audit()

    # --- the periodic checks: every ledger's replicas, every closed ledger's placement -------------

    def _checks(self) -> dict[str, tuple[int, Callable[[], Deferred[Any]] | None, Callable[[Any], None]]]:
        """ctime node -> (interval, the check, what to do with its result in a thread)."""
        return {
            CHECK_ALL: (self._config.periodic_check_interval_s, self._sweep, self._mark_swept),
            PLACEMENT_CHECK: (self._config.placement_check_interval_s, self._placement, self._placement_done),
        }

    def _schedule(self, name: str, last_ms: int | None) -> None:
        """Next check `interval` after the last one (its ctime node survives auditor changes)."""
        interval = self._checks()[name][0]
        due = 0.0 if last_ms is None else last_ms / 1000 + interval - time.time()
        self._calls[name] = self._reactor.callLater(max(SWEEP_MIN_DELAY_S, due), self._run_check, name)

    def _run_check(self, name: str) -> None:
        _, check, done = self._checks()[name]
        if not self._running or check is None:
            return
        if not self._enabled:  # Java: nothing is checked or marked while disabled; try again later
            self._schedule(name, int(time.time() * 1000))
            return
        running = check().addCallback(lambda result: self._in_thread(done, result))
        running.addErrback(self._log_failure)
        running.addBoth(lambda _: self._schedule(name, int(time.time() * 1000)) if self._running else None)

    def _mark_swept(self, bad: dict[int, list[str]]) -> None:
        for ledger_id, bookies in bad.items():
            self._layout.mark_underreplicated(ledger_id, bookies)
        self._layout.set_check_ctime(CHECK_ALL, int(time.time() * 1000))
        self.stats.ledgers_marked += len(bad)
        self.stats.sweeps += 1
        if bad:
            log.info("periodic check: %d ledger(s) marked under-replicated: %s", len(bad), sorted(bad))

    def _placement_done(self, report: PlacementCheckReport) -> None:
        if self._config.repair_placement:
            self.stats.ledgers_marked += mark_for_moves(self._layout, report)
        self._layout.set_check_ctime(PLACEMENT_CHECK, int(time.time() * 1000))
        self.stats.placement_checks += 1
        self.stats.ledgers_not_adhering = len(report.not_adhering)
        self.stats.ledgers_softly_adhering = report.softly_adhering
        self.stats.placement_check_ms = report.seconds * 1000
        if report.not_adhering:
            log.warning(
                "placement check: %d of %d closed ledger(s) break the placement policy: %s",
                len(report.not_adhering),
                report.closed_audited,
                sorted(report.not_adhering)[:20],
            )

    # --- audits -------------------------------------------------------------------------------------

    def request_audit(self) -> None:
        """Audit now, or right after the running audit, or when autorecovery is enabled again."""
        self._audit_wanted = True
        if self._running and self._enabled and not self._audit_in_progress:
            self._run_audit()

    def _run_audit(self) -> None:
        self._audit_wanted, self._audit_in_progress, self._audit_failed_last = False, True, False
        available = self._in_thread(lambda: self._layout.bookies() + self._layout.bookies(readonly=True))
        available.addCallback(lambda up: self._in_thread(audit_bookies, self._layout, up))
        available.addCallbacks(self._audited, self._audit_failed)
        available.addBoth(self._audit_done)

    def _audited(self, report: AuditReport) -> None:
        self.stats.audits += 1
        self.stats.ledgers_marked += len(report.ledgers_marked)
        self.stats.last_audit_ms = int(time.time() * 1000)
        self.stats.last_report = report
        if report.ledgers_marked:
            log.info(
                "audit: %d of %d ledgers marked under-replicated (lost %s)",
                len(report.ledgers_marked),
                report.ledgers_checked,
                ", ".join(report.lost_bookies),
            )

    def _audit_failed(self, failure: Any) -> None:
        self.stats.failures += 1
        self._audit_wanted = self._audit_failed_last = (
            True  # try again: a mark not written is a ledger nobody repairs
        )
        log.warning("audit failed: %s; retrying in %.0f s", failure.getErrorMessage(), AUDIT_RETRY_S)
        self._reactor.callLater(AUDIT_RETRY_S, self._retry_audit)

    def _retry_audit(self) -> None:
        if self._audit_wanted:
            self.request_audit()

    def _audit_done(self, _result: object) -> None:
        self._audit_in_progress = False
        if self._audit_wanted and self._running and self._enabled and not self._audit_failed_last:
            self._run_audit()

    def _log_failure(self, failure: Any) -> None:
        log.warning("auditor: %s", failure.getErrorMessage())


AUDIT_RETRY_S = 2.0  # local bound
CHECK_ALL = "checkallledgersctime"
SWEEP_MIN_DELAY_S = 1.0  # local bound
