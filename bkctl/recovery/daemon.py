"""One autorecovery daemon: an election vote, the auditor while elected, and a replication worker.

BookKeeper's AutoRecoveryMain. It runs alone (`bkctl autorecovery start`), inside a bookie
(`bkctl bookie start --autorecovery`) or in the sandbox. A lost metadata session never stops it: the
election votes again, the auditor restarts if re-elected, and the worker's locks (ephemeral) are simply
taken again on its next scan.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from twisted.internet import task, threads
from twisted.internet.defer import inlineCallbacks

from bkctl.metadata.layout import Layout
from bkctl.metadata.metered import MeteredStore, OpsRate
from bkctl.recovery.auditor import Auditor, AuditorConfig
from bkctl.recovery.budget import CopyBudget
from bkctl.recovery.election import AuditorElection
from bkctl.recovery.worker import Repairer, ReplicationWorker, WorkerConfig
from bkctl.tls import TlsSettings

if TYPE_CHECKING:
    from bkctl.client.placement import Placement

log = logging.getLogger("bkctl.recovery.daemon")


class AutorecoveryDaemon:
    def __init__(
        self,
        layout: Layout,
        reactor: Any,
        daemon_id: str,
        repairer: Repairer,
        auditor_config: AuditorConfig | None = None,
        worker_config: WorkerConfig | None = None,
    ) -> None:
        self._layout, self._reactor, self.daemon_id = layout, reactor, daemon_id
        self._auditor_config = auditor_config or AuditorConfig()
        self.auditor: Auditor | None = None
        self.worker = ReplicationWorker(layout, reactor, repairer, daemon_id, worker_config or WorkerConfig())
        self.election = AuditorElection(layout, daemon_id, reactor, self._elected, self._demoted)
        self._publisher: task.LoopingCall | None = None
        self._published: dict[str, Any] | None = None
        self._rate_mark = (time.monotonic(), 0, 0)  # (when, bytes, ledgers then): for the rates
        self.bytes_per_s = self.ledgers_per_s = 0.0
        self.client: Any = None  # the ledger client of the repairs, closed at stop (see start_daemon)
        self.sweep: Any = None  # the auditor's periodic check of every ledger (autorecovery_daemon)
        self.placement_check: Any = None  # the auditor's periodic placement check (autorecovery_daemon)
        self.budget: CopyBudget | None = None  # this daemon's share of the cluster's copy budget
        self._session_sub: Any = None

    @inlineCallbacks
    def start(self) -> Any:
        self._session_sub = self._layout.store.on_session_lost(self._session_lost_from_thread)
        yield self.election.start()
        if self.budget is not None:
            yield self.budget.start()
        self.worker.start()
        self._publisher = task.LoopingCall(self._publish)
        self._publisher.clock = self._reactor
        self._publisher.start(STATUS_INTERVAL_S, now=True)
        log.info("autorecovery daemon %s started", self.daemon_id)

    @inlineCallbacks
    def stop(self) -> Any:
        if self._publisher is not None and self._publisher.running:
            self._publisher.stop()
        if self._session_sub is not None:
            self._session_sub.cancel()
        yield self.election.stop()  # withdraws the vote first: another daemon audits at once
        if self.budget is not None:
            self.budget.stop()
        yield self.worker.stop()
        if self.client is not None:
            yield self.client.close()
        log.info("autorecovery daemon %s stopped", self.daemon_id)

    def _elected(self) -> None:
        self.auditor = Auditor(
            self._layout, self._reactor, self._auditor_config, self.sweep, self.placement_check
        )
        self.auditor.start().addErrback(self._auditor_failed)

    def _demoted(self) -> None:
        if self.auditor is not None:
            self.auditor.stop()
            self.auditor = None

    def _auditor_failed(self, failure: Any) -> None:
        log.warning("auditor did not start: %s; voting again", failure.getErrorMessage())
        self._demoted()
        self.election.revote(requeue=True)

    def _session_lost_from_thread(self) -> None:
        self._reactor.callFromThread(self._republish)

    def _republish(self) -> None:
        """The status node was ephemeral: it went with the session, so publish it again even unchanged
        (else `autorecovery status` lost a quiet daemon until something it counts moved)."""
        self._published = None
        if self._publisher is not None and self._publisher.running:
            self._publish()

    def status(self) -> dict[str, Any]:
        """What `autorecovery status` and `/metrics` show of this daemon."""
        w = self.worker.stats
        document: dict[str, Any] = {
            "daemon": self.daemon_id,
            "auditor": self.election.is_auditor,
            "backlog": w.backlog,
            "copying": sorted(w.copying),
            "failing": {str(k): v for k, v in sorted(w.failing.items())},
            "ledgers_replicated": w.ledgers_replicated,
            "entries_copied": w.entries_copied,
            "bytes_copied": w.bytes_copied,
            "bytes_per_s": round(self.bytes_per_s),
            "ledgers_per_s": round(self.ledgers_per_s, 1),
            "replication_failures": w.failures,
            "marks_dropped": w.marks_dropped,
            "rate_limit_bytes_per_s": None if self.budget is None else _rounded(self.budget.throttle.rate),
        }
        if self.auditor is not None:
            a = self.auditor.stats
            document.update(
                audits=a.audits,
                checks_of_all_ledgers=a.sweeps,
                ledgers_marked=a.ledgers_marked,
                audit_failures=a.failures,
                last_audit_ms=a.last_audit_ms,
                lost_bookies=a.lost_bookies,
                placement_checks=a.placement_checks,
                # Java's gauges, from the last placement check
                NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY=a.ledgers_not_adhering,
                NUM_LEDGERS_SOFTLY_ADHERING_TO_PLACEMENT_POLICY=a.ledgers_softly_adhering,
                PLACEMENT_POLICY_CHECK_TIME_ms=round(a.placement_check_ms, 1),
            )
        return document

    def _publish(self) -> None:
        """Share status() through the store (for `autorecovery status`) when it changed."""
        now, copied, replicated = (
            time.monotonic(),
            self.worker.stats.bytes_copied,
            self.worker.stats.ledgers_replicated,
        )
        then, copied_then, replicated_then = self._rate_mark
        if now - then >= RATE_WINDOW_S:
            self.bytes_per_s = (copied - copied_then) / (now - then)
            self.ledgers_per_s = (replicated - replicated_then) / (now - then)
            self._rate_mark = (now, copied, replicated)
        document = self.status()
        if document == self._published:
            return
        data = json.dumps(document, sort_keys=True).encode()
        d = threads.deferToThreadPool(
            self._reactor,
            self._reactor.getThreadPool(),
            self._layout.publish_daemon_status,
            self.daemon_id,
            data,
        )
        d.addCallbacks(lambda _: setattr(self, "_published", document), self._publish_failed)

    def _publish_failed(self, failure: Any) -> None:
        log.debug("daemon status not published: %s", failure.getErrorMessage())


def _rounded(rate: float | None) -> int | None:
    return None if rate is None else round(rate)


STATUS_INTERVAL_S = 2.0  # local bound
RATE_WINDOW_S = 5.0  # local bound


def autorecovery_daemon(
    layout: Layout,
    reactor: Any,
    daemon_id: str,
    *,
    local_bookie: str | None = None,
    auditor_config: AuditorConfig | None = None,
    worker_config: WorkerConfig | None = None,
    tls: TlsSettings | None = None,
    placement_policy: Placement | None = None,
) -> AutorecoveryDaemon:
    """A daemon repairing with recovery's checker and replicator through its own ledger client (over
    TLS with `tls`: Java's AutoRecoveryMain uses the TLS keys of its bk_server.conf as a client's)."""
    from twisted.internet import defer

    from bkctl.client.client import Client
    from bkctl.recovery.ledger_sweep import check_all_ledgers
    from bkctl.recovery.placement_check import check_placement
    from bkctl.recovery.repair import LedgerRepairer

    config = worker_config or WorkerConfig()
    if config.metadata_ops_per_s:  # the daemon's requests, auditor and workers, within the budget
        layout = Layout(MeteredStore(layout.store, OpsRate(config.metadata_ops_per_s)), layout.root)
    client = Client(
        layout,
        reactor,
        tls=tls,
        recovery_password=config.recovery_password,
        recovery_digest=config.recovery_digest,
        placement_policy=placement_policy,
    )
    repairer = LedgerRepairer(client, local_bookie, config.parallel)
    daemon = AutorecoveryDaemon(layout, reactor, daemon_id, repairer, auditor_config, worker_config)
    daemon.client = client
    rate = config.replication_rate_bytes
    configured = None if rate is None or rate <= 0 else rate
    daemon.budget = CopyBudget(layout, reactor, repairer.throttle, configured)
    daemon.sweep = lambda: defer.ensureDeferred(check_all_ledgers(client))
    daemon.placement_check = lambda: client.in_thread(check_placement, layout, client.placement)
    return daemon
