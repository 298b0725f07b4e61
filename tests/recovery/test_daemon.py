"""The daemon's auditor and worker on both backends: marks appear for lost bookies, workers take them.

The repairs here are a plain `Repairer` that records its calls (the real checker and replicator are
tested against real bookies in test_autorecovery.py); these tests are about marks, locks and timing.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from twisted.internet import defer, reactor

from bkctl.metadata.layout import Layout
from bkctl.recovery.auditor import AuditorConfig
from bkctl.recovery.daemon import AutorecoveryDaemon
from bkctl.recovery.worker import RepairOutcome, ReplicationWorker, WorkerConfig
from tests.client.cluster import bounded, sleep
from tests.conftest import StoreTarget
from tests.recovery.test_audit import A, B, C, D, _ledger
from tests.server_net.live import in_thread, twisted_test

WAIT_S = 15.0
FAST = WorkerConfig(
    parallel=2, poll_interval_s=0.1, open_ledger_grace_s=0.3, backoff_start_s=0.4, backoff_max_s=1
)


async def until(predicate: Callable[[], Any], what: str = "condition", timeout_s: float = WAIT_S) -> None:
    """Poll a blocking `predicate` (off the reactor) every 50 ms until it holds; bounded."""
    for _ in range(int(timeout_s / 0.05)):
        if await in_thread(predicate):
            return
        await sleep(0.05)
    raise AssertionError(f"not reached within {timeout_s} s: {what}")


class Recorder:
    """Answers each repair from a script: ledger -> list of outcomes (the last one repeats)."""

    def __init__(self, script: dict[int, list[RepairOutcome]] | None = None) -> None:
        self.script = script or {}
        self.repairs: list[int] = []
        self.times: dict[int, list[float]] = {}  # ledger -> when each repair began (monotonic)
        self.fenced: list[int] = []

    def repair(
        self, ledger_id: int, missing: tuple[str, ...], known: object = None
    ) -> defer.Deferred[RepairOutcome]:
        self.repairs.append(ledger_id)
        self.times.setdefault(ledger_id, []).append(time.monotonic())
        outcomes = self.script.get(ledger_id, [RepairOutcome(replicated=True, entries_copied=10)])
        outcome = outcomes.pop(0) if len(outcomes) > 1 else outcomes[0]
        return defer.succeed(outcome)

    def fence(self, ledger_id: int) -> defer.Deferred[None]:
        self.fenced.append(ledger_id)
        self.script[ledger_id] = [RepairOutcome(replicated=True)]
        return defer.succeed(None)


def cluster(target: StoreTarget) -> Layout:
    layout = Layout(target.open())
    layout.init_cluster()
    for bookie in (A, B, C, D):
        layout.store.create(layout.cookie_path(bookie), b"cookie", make_parents=True)
        layout.register_bookie(bookie)
    return layout


@twisted_test
async def test_lost_bookie_is_marked_and_repaired(store_target: StoreTarget) -> None:
    layout = await in_thread(cluster, store_target)
    on_c = await in_thread(_ledger, layout, (A, B, C))
    clean = await in_thread(_ledger, layout, (A, B, D))
    repairer = Recorder()
    daemon = AutorecoveryDaemon(
        Layout(store_target.open()), reactor, "daemon-1", repairer, worker_config=FAST
    )
    await bounded(daemon.start())
    try:
        await until(lambda: daemon.auditor is not None and daemon.auditor.ready)
        await in_thread(layout.unregister_bookie, C)
        await until(lambda: repairer.repairs == [on_c])
        await until(lambda: daemon.worker.stats.ledgers_replicated == 1)
        assert await in_thread(lambda: list(layout.underreplicated_ids())) == []
        assert clean not in repairer.repairs
        status = daemon.status()
        assert status["auditor"] and status["ledgers_replicated"] == 1 and status["entries_copied"] == 10
        assert status["lost_bookies"] == [C]
    finally:
        await bounded(daemon.stop())


@twisted_test
async def test_disabled_autorecovery_defers_marking_and_repair(store_target: StoreTarget) -> None:
    layout = await in_thread(cluster, store_target)
    on_c = await in_thread(_ledger, layout, (A, B, C))
    await in_thread(layout.set_autorecovery_enabled, False)
    repairer = Recorder()
    daemon = AutorecoveryDaemon(Layout(store_target.open()), reactor, "d", repairer, worker_config=FAST)
    await bounded(daemon.start())
    try:
        await until(lambda: daemon.auditor is not None and daemon.auditor.ready)
        await in_thread(layout.unregister_bookie, C)
        # The auditor saw C lost and asked for its audit in the same reactor call: held back, not run.
        await until(lambda: daemon.auditor is not None and daemon.auditor.stats.lost_bookies == [C])
        assert daemon.auditor is not None and daemon.auditor.stats.audits == 0
        assert await in_thread(lambda: list(layout.underreplicated_ids())) == []
        await in_thread(layout.set_autorecovery_enabled, True)
        await until(lambda: repairer.repairs == [on_c])
    finally:
        await bounded(daemon.stop())


@twisted_test
async def test_delayed_audit_and_bookie_back_in_time(store_target: StoreTarget) -> None:
    layout = await in_thread(cluster, store_target)
    await in_thread(_ledger, layout, (A, B, C))
    config = AuditorConfig(lost_bookie_recovery_delay_s=2)
    daemon = AutorecoveryDaemon(
        Layout(store_target.open()), reactor, "d", Recorder(), auditor_config=config, worker_config=FAST
    )
    await bounded(daemon.start())
    try:
        await until(lambda: daemon.auditor is not None and daemon.auditor.ready)
        assert await in_thread(layout.lost_bookie_recovery_delay) == 2  # written from the config
        await in_thread(layout.unregister_bookie, C)
        await until(lambda: daemon.auditor is not None and daemon.auditor.scheduler.pending)
        await in_thread(layout.register_bookie, C)
        # C back before the delay: the pending audit is cancelled (its timer with it), never run.
        await until(lambda: daemon.auditor is not None and daemon.auditor.scheduler.delayed_audits_cancelled)
        assert daemon.auditor is not None and not daemon.auditor.scheduler.pending
        assert await in_thread(lambda: list(layout.underreplicated_ids())) == []
        assert daemon.auditor is not None and daemon.auditor.stats.audits == 0
    finally:
        await bounded(daemon.stop())


@twisted_test
async def test_worker_backs_off_holding_the_lock_and_drops_deleted_ledgers(store_target: StoreTarget) -> None:
    layout = await in_thread(cluster, store_target)
    stuck, gone, open_tail = 101, 102, 103
    repairer = Recorder(
        {
            stuck: [RepairOutcome(replicated=False, unrecoverable=True, detail="entries 0-9 have no copy")],
            gone: [RepairOutcome(replicated=False, deleted=True)],
            open_tail: [RepairOutcome(replicated=False, open_tail_missing=True)],
        }
    )
    for ledger_id in (stuck, gone, open_tail):
        await in_thread(layout.mark_underreplicated, ledger_id, [C])
    worker_layout = Layout(store_target.open())
    daemon = AutorecoveryDaemon(worker_layout, reactor, "w1", repairer, worker_config=FAST)
    await bounded(daemon.start())
    try:
        await until(lambda: list(layout.underreplicated_ids()) == [stuck])
        assert repairer.fenced == [open_tail]  # fenced after the grace period, then repaired
        # Counted once the mark's removal has returned to the worker: a moment after the test sees it gone.
        await until(lambda: daemon.worker.stats.marks_dropped == 1, "the deleted ledger's mark dropped")
        # Backing off holds the lock (the worker holds it while it copies too: wait for the failure).
        failing = {str(stuck): "entries 0-9 have no copy"}
        await until(
            lambda: daemon.status()["failing"] == failing and layout.lock_holder(stuck) == "w1",
            "the stuck ledger failing, its lock held",
        )
        # Retried with a growing backoff (FAST: 0.4 s, 0.8 s, then 1 s), never in a hot loop: each try
        # comes at least its backoff after the one before (a slow machine only makes the gaps longer).
        await until(lambda: len(repairer.times.get(stuck, [])) >= 3, "three tries of the stuck ledger")
        tries = repairer.times[stuck]
        gaps = [later - earlier for earlier, later in itertools.pairwise(tries)]
        assert gaps[0] >= 0.35 and gaps[1] >= 0.75, gaps
    finally:
        await bounded(daemon.stop())
    assert await in_thread(layout.lock_holder, stuck) is None  # stop released the lock it held


@twisted_test
async def test_daemon_rides_through_a_session_expiry(store_target: StoreTarget) -> None:
    layout = await in_thread(cluster, store_target)
    on_d = await in_thread(_ledger, layout, (A, B, D))
    repairer = Recorder()
    daemon_layout = Layout(store_target.open())
    daemon = AutorecoveryDaemon(daemon_layout, reactor, "d", repairer, worker_config=FAST)
    await bounded(daemon.start())
    try:
        await until(lambda: daemon.auditor is not None and daemon.auditor.ready)
        first = daemon.auditor
        store_target.expire(daemon_layout.store)
        # Voted again, elected again (it is alone), a new auditor that audits what happens next.
        await until(
            lambda: daemon.auditor is not None and daemon.auditor is not first and daemon.auditor.ready
        )
        await in_thread(layout.unregister_bookie, D)
        await until(lambda: repairer.repairs == [on_d])
        await until(lambda: daemon.worker.stats.ledgers_replicated == 1)
    finally:
        await bounded(daemon.stop())


class Holding:
    """Repairs that end only when released: the places a worker fills stay filled."""

    def __init__(self) -> None:
        self.waiting: list[tuple[int, object, defer.Deferred[RepairOutcome]]] = []

    def repair(
        self, ledger_id: int, missing: tuple[str, ...], known: object = None
    ) -> defer.Deferred[RepairOutcome]:
        done: defer.Deferred[RepairOutcome] = defer.Deferred()
        self.waiting.append((ledger_id, known, done))
        return done

    def fence(self, ledger_id: int) -> defer.Deferred[None]:
        return defer.succeed(None)

    def release(self) -> None:
        waiting, self.waiting = self.waiting, []
        for _, _, done in waiting:
            done.callback(RepairOutcome(replicated=True))


@twisted_test
async def test_a_take_fills_every_free_place_and_hands_each_repair_its_ledger(
    store_target: StoreTarget,
) -> None:
    layout = await in_thread(cluster, store_target)
    ids = [await in_thread(_ledger, layout, (A, B, C)) for _ in range(12)]
    await in_thread(lambda: layout.mark_many_underreplicated([(i, [C]) for i in ids]))
    holding = Holding()
    config = WorkerConfig(parallel=8, poll_interval_s=0.1)
    worker = ReplicationWorker(Layout(store_target.open()), reactor, holding, "w", config)
    worker.start()
    try:
        await until(lambda: worker.scans >= 1 and len(holding.waiting) == 8, "8 places filled")
        assert worker.scans == 1 and len(worker.stats.copying) == 8  # by one take
        assert all(known is not None and known.value.segments[0].ensemble == (A, B, C)  # type: ignore[attr-defined]
                   for _, known, _ in holding.waiting)  # fmt: skip
        holding.release()
        await until(lambda: len(holding.waiting) == 4, "the other 4 taken")
        holding.release()
        await until(lambda: worker.stats.ledgers_replicated == 12)
        assert await in_thread(lambda: list(layout.underreplicated_ids())) == []
    finally:
        await bounded(worker.stop())
