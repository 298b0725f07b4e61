"""Replication workers: take under-replication marks, lock them, repair the ledgers, drop the marks.

Like Java's ReplicationWorker (reference e) with the pain points removed: several ledgers at once
(`parallel`), a ledger that cannot be repaired now backs off exponentially while its lock is held (so no
worker anywhere retries it in a hot loop) and is reported, and a deleted ledger's mark is dropped. An open
ledger whose last segment lost a bookie is left to its writer for `openLedgerRereplicationGracePeriod`,
then fenced and closed by a recovery open, then repaired.

The repair itself is a `Repairer` (recovery's checker + replicator); the worker owns only the marks,
the locks and the timing, so tests can drive it with a fake-free repairer over real bookies.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from twisted.internet import defer, task, threads
from twisted.internet.defer import Deferred, inlineCallbacks

from bkctl import limits
from bkctl.metadata.autorecovery import UR_DISABLE
from bkctl.metadata.layout import Layout
from bkctl.metadata.nodes import Versioned
from bkctl.metadata.store import Subscription
from bkctl.metadata.underreplication import TakenMark, UpperLevels
from bkctl.model import DigestType, LedgerMetadata

log = logging.getLogger("bkctl.recovery.worker")

# pool threads beyond `parallel`: metadata requests are made from pool threads (kazoo sends them from
# every thread over one connection), and the auditor, the status and the copy budget use the pool too
THREADS_SPARE = 8  # local bound


@dataclass(frozen=True)
class RepairOutcome:
    """One repair attempt of one ledger."""

    replicated: bool  # every fragment that can be repaired now has all its replicas
    open_tail_missing: bool = False  # the open last segment names a lost bookie (needs a fence)
    deleted: bool = False  # the ledger no longer exists
    unrecoverable: bool = False  # some entries have no copy left anywhere
    entries_copied: int = 0
    bytes_copied: int = 0
    detail: str = ""


class Repairer(Protocol):
    def repair(
        self, ledger_id: int, missing: tuple[str, ...], known: Versioned[LedgerMetadata] | None = None
    ) -> Deferred[RepairOutcome]:
        """`known`: the ledger's metadata as the take read it (None: the repair reads it)."""
        ...

    def fence(self, ledger_id: int) -> Deferred[Any]: ...


@dataclass(frozen=True)
class WorkerConfig:
    """Java's keys where they exist: openLedgerRereplicationGracePeriod, rwRereplicateBackoffMs,
    lockReleaseOfFailedLedgerGracePeriod (the cap of the per-ledger backoff), bookieRecoveryPasswd and
    bookieRecoveryDigestType (for ledgers whose metadata stores no password), replicationRateByBytes
    (for every daemon of the cluster together, not each one as Java's)."""

    # Ledgers repaired at once: a small ledger's repair is a chain of round trips (ZooKeeper, the
    # bookies' journals) that waits far more than it computes, so many go at once.
    parallel: int = limits.REPLICATION_PARALLEL_DEFAULT
    poll_interval_s: float = 0.25  # an idle walk is one children() call: cheap, and marks start sooner
    # a take waits until this many places are free, then fills them all: one descent of the mark tree
    # (a listing per level, the locks sent together, the marks and the ledgers read in one request each)
    take_batch: int = 4
    open_ledger_grace_s: float = 30.0
    backoff_start_s: float = 5.0
    backoff_max_s: float = 300.0
    recovery_password: bytes = b""
    recovery_digest: DigestType = DigestType.CRC32
    # replicationRateByBytes: the cluster's copy budget (recovery.budget) until `autorecovery set-rate`
    replication_rate_bytes: int | None = None
    newest_first: bool = False  # take the highest ledger ids first (bkctl's replicationNewestFirst)
    # replicationMetadataOpsPerSecond: the daemon's metadata requests a second, auditor and workers
    # together (bkctl.metadata.metered); None: no limit
    metadata_ops_per_s: int | None = limits.REPLICATION_METADATA_OPS_DEFAULT


@dataclass
class Copying:
    ledger_id: int
    started: float
    missing: tuple[str, ...] = ()


@dataclass
class WorkerStats:
    ledgers_replicated: int = 0
    entries_copied: int = 0
    bytes_copied: int = 0
    failures: int = 0
    backlog: int = 0
    marks_dropped: int = 0  # deleted ledgers
    copying: dict[int, Copying] = field(default_factory=dict)
    failing: dict[int, str] = field(default_factory=dict)  # ledger -> last reason, while backing off


class ReplicationWorker:
    def __init__(
        self,
        layout: Layout,
        reactor: Any,
        repairer: Repairer,
        worker_id: str,
        config: WorkerConfig = WorkerConfig(),
    ) -> None:
        self._layout, self._reactor, self._repairer = layout, reactor, repairer
        self.worker_id, self._config = worker_id, config
        self.stats = WorkerStats()
        self._running = False
        self._scan_call: Any = None
        self._scanning = False
        self._backoff: dict[int, float] = {}  # ledger -> current backoff (s), doubled per failure
        self._work: set[Deferred[Any]] = set()
        self._releases: dict[int, Any] = {}  # ledger -> the delayed release of its lock (backoff)
        self._sleeps: set[Deferred[None]] = set()
        self._rng = random.Random()
        self._levels = UpperLevels()  # the mark tree's listings, across takes
        self._finished: dict[int, float] = {}  # ledger -> when its mark was deleted here
        self._enabled: bool | None = None  # the disable flag as last watched; None: not yet
        self._flag_sub: Subscription | None = None
        self.scans = 0  # walks of the marks done: what "nothing happened since" is counted in

    def start(self) -> None:
        self._running = True
        if self._reactor.getThreadPool().max < self._config.parallel + THREADS_SPARE:
            self._reactor.suggestThreadPoolSize(self._config.parallel + THREADS_SPARE)
        self._in_thread(self._watch_flag).addErrback(
            lambda f: log.info("autorecovery flag not watched (%s): read at each take", f.getErrorMessage())
        )
        self._schedule_scan(0)

    def _watch_flag(self) -> None:
        """The disable flag, watched rather than read before every take (one request less per take)."""
        path = self._layout.ur_path(UR_DISABLE)
        sub = self._layout.store.watch_data(path, lambda data, _stat: self._flag_changed(data is None))
        if self._running:
            self._flag_sub = sub
        else:
            sub.cancel()

    def _flag_changed(self, enabled: bool) -> None:  # a store thread
        self._enabled = enabled
        if enabled:
            self._reactor.callFromThread(self._schedule_scan, 0)

    def stop(self) -> Deferred[Any]:
        """Stop taking marks; the copies under way finish (their locks are released)."""
        self._running = False
        if self._flag_sub is not None:
            self._flag_sub.cancel()
        if self._scan_call is not None and self._scan_call.active():
            self._scan_call.cancel()
        for sleep in list(self._sleeps):
            sleep.cancel()
        held = [
            ledger_id for ledger_id, call in self._releases.items() if call.active() and not call.cancel()
        ]
        self._releases.clear()
        releases = [self._in_thread(self._layout.release_lock, ledger_id) for ledger_id in held]
        return defer.DeferredList([*self._work, *releases], consumeErrors=True)

    def _in_thread(self, function: Callable[..., Any], *args: Any) -> Deferred[Any]:
        return threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(), function, *args)

    # --- taking marks -------------------------------------------------------------------------------

    def _schedule_scan(self, delay_s: float) -> None:
        if not self._running or self._scanning:
            return
        if self._scan_call is not None and self._scan_call.active():
            if delay_s > 0:
                return
            self._scan_call.cancel()
        self._scan_call = self._reactor.callLater(delay_s, self._scan)

    def _scan(self) -> None:
        free = self._config.parallel - len(self.stats.copying)
        if not self._running or free <= 0:
            return
        if free < min(self._config.take_batch, self._config.parallel) and self.stats.copying:
            return  # marks are taken a few at a time: the next repair to end asks again
        self._scanning = True
        now = time.monotonic()
        self._finished = {i: t for i, t in self._finished.items() if now - t < self._levels.ttl_s * 2}
        # this worker's own, and the marks it just deleted (still in the listings it keeps)
        busy = set(self.stats.copying) | set(self.stats.failing) | set(self._finished)
        taken = self._in_thread(self._take_marks, free, busy)
        taken.addCallbacks(self._start_all, self._scan_failed)
        taken.addBoth(self._scan_done)

    def _take_marks(
        self, free: int, busy: set[int]
    ) -> list[tuple[TakenMark, Versioned[LedgerMetadata] | None]]:
        """Lock up to `free` marked ledgers (blocking), by a random descent of the mark tree, and read
        their ledgers' metadata in one request (each repair starts from it)."""
        enabled = self._enabled
        if not (self._layout.autorecovery_enabled() if enabled is None else enabled):
            return []
        taken, seen = self._layout.take_underreplicated(
            free, self.worker_id, busy, self._rng, self._levels, newest_first=self._config.newest_first
        )
        self.stats.backlog = seen
        known = dict(self._layout.read_ledgers_versioned([mark.ledger_id for mark in taken]))
        return [(mark, known.get(mark.ledger_id)) for mark in taken]

    def _start_all(self, taken: list[tuple[TakenMark, Versioned[LedgerMetadata] | None]]) -> bool:
        for mark, known in taken:
            self.stats.copying[mark.ledger_id] = Copying(mark.ledger_id, time.monotonic(), mark.replicas)
            work = self._replicate(mark, known)
            self._work.add(work)
            work.addBoth(self._work_done, work, mark.ledger_id)
        return bool(taken)

    def _scan_failed(self, failure: Any) -> None:
        log.warning("replication worker %s: %s", self.worker_id, failure.getErrorMessage())

    def _scan_done(self, took: object) -> None:
        self._scanning = False
        self.scans += 1
        # Marks were there: the repairs that ended during this take ask again now, not a poll later
        # (a fixed wait after every take held a busy worker at a third of its places).
        self._schedule_scan(0 if took is True else self._config.poll_interval_s)

    def _work_done(self, _result: object, work: Deferred[Any], ledger_id: int) -> None:
        self._work.discard(work)
        self.stats.copying.pop(ledger_id, None)
        self._schedule_scan(0)

    # --- one ledger ---------------------------------------------------------------------------------

    @inlineCallbacks
    def _replicate(self, mark: TakenMark, known: Versioned[LedgerMetadata] | None) -> Any:
        ledger_id, missing = mark.ledger_id, mark.replicas
        try:
            outcome = yield self._repairer.repair(ledger_id, missing, known)
            if outcome.open_tail_missing and not outcome.deleted:
                outcome = yield self._fence_after_grace(ledger_id, missing)
        except Exception as exc:  # any failure: back off, keep the daemon alive
            yield self._failed(ledger_id, f"{type(exc).__name__}: {exc}")
            return
        self._count(outcome)
        if outcome.deleted:
            yield self._in_thread(self._layout.mark_replicated, ledger_id, -1)
            self.stats.marks_dropped += 1
            self._finished[ledger_id] = time.monotonic()
            log.info("ledger %d was deleted: under-replication mark dropped", ledger_id)
        elif outcome.replicated:
            prune = not self._others_listed(ledger_id)
            yield self._in_thread(
                lambda: self._layout.mark_replicated(ledger_id, mark.version, mark.session_id, prune=prune)
            )
            self._backoff.pop(ledger_id, None)
            self.stats.failing.pop(ledger_id, None)
            self.stats.ledgers_replicated += 1
            self._finished[ledger_id] = time.monotonic()
            log.info(
                "ledger %d replicated: %d entries, %d bytes copied",
                ledger_id,
                outcome.entries_copied,
                outcome.bytes_copied,
            )
        else:
            yield self._failed(ledger_id, outcome.detail or "not fully replicated")

    def _others_listed(self, ledger_id: int) -> bool:
        """Whether the kept listing of the ledger's last level shows marks other than this worker's
        finished ones: then its level stays, and checking whether it is empty would be a request for
        nothing. A listing that is wrong costs either that request or an empty level left for the next
        take that lists it."""
        level = self._layout.underreplicated_path(ledger_id).rsplit("/", 2)[0]
        done = {f"{i & 0xFFFF:04x}" for i in (*self._finished, ledger_id)}
        return any(name not in done for name in self._levels.get(level) or ())

    @inlineCallbacks
    def _fence_after_grace(self, ledger_id: int, missing: tuple[str, ...]) -> Any:
        grace = self._config.open_ledger_grace_s
        log.info(
            "ledger %d is open and lost a bookie of its last ensemble: fencing in %.0f s", ledger_id, grace
        )
        yield self._sleep(grace)
        outcome = yield self._repairer.repair(ledger_id, missing)
        if outcome.open_tail_missing and not outcome.deleted:
            yield self._repairer.fence(ledger_id)
            outcome = yield self._repairer.repair(ledger_id, missing)
        return outcome

    def _count(self, outcome: RepairOutcome) -> None:
        self.stats.entries_copied += outcome.entries_copied
        self.stats.bytes_copied += outcome.bytes_copied

    def _sleep(self, seconds: float) -> Deferred[None]:
        """A wait that `stop()` cancels (the work then ends with CancelledError and releases its lock)."""
        sleep: Deferred[None] = task.deferLater(self._reactor, seconds, lambda: None)
        self._sleeps.add(sleep)
        return sleep.addBoth(_passing(self._sleeps.discard, sleep))

    def _failed(self, ledger_id: int, reason: str) -> Deferred[None]:
        """Hold the lock through a growing backoff, so no worker retries this ledger in a hot loop."""
        self.stats.failures += 1
        self.stats.failing[ledger_id] = reason
        backoff = self._backoff.get(ledger_id, self._config.backoff_start_s / 2) * 2
        backoff = min(backoff, self._config.backoff_max_s)
        self._backoff[ledger_id] = backoff
        log.warning("ledger %d not replicated (%s); retrying in %.0f s", ledger_id, reason, backoff)
        self._releases[ledger_id] = self._reactor.callLater(backoff, self._release_after_backoff, ledger_id)
        return defer.succeed(None)

    def _release_after_backoff(self, ledger_id: int) -> None:
        self._releases.pop(ledger_id, None)
        self.stats.failing.pop(ledger_id, None)
        released = self._in_thread(self._layout.release_lock, ledger_id)
        released.addErrback(lambda f: log.debug("lock of ledger %d: %s", ledger_id, f.getErrorMessage()))
        released.addBoth(lambda _: self._schedule_scan(0))


def _passing(action: Callable[[Any], object], arg: Any) -> Callable[[Any], Any]:
    def call(result: Any) -> Any:
        action(arg)
        return result

    return call
