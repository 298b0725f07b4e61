"""GC of over-replicated ledgers on a real ZooKeeper: a bookie that comes back after a recovery copied its
ledgers elsewhere drops its copies once `gcOverreplicatedLedgerWaitTime` has passed, but never a copy of
a ledger whose replication lock is held (a worker may be copying it there)."""

from __future__ import annotations

from pathlib import Path

from bkctl.model import LedgerMetadata, LedgerState, Segment
from bkctl.recovery.bookie_recovery import BookieRecovery, RecoveryOptions
from bkctl.server.gc import GcReport
from bkctl.server.gc_overreplicated import over_replicated
from bkctl.server.service import BookieService
from tests.client.cluster import Cluster, bounded, sleep
from tests.recovery.test_bookie_recovery import assert_fully_replicated, write_ledgers
from tests.server_net.live import in_thread, start_bookie, twisted_test

WAIT_MS = 1000
FLAGS = {"gcWaitTime": "0", "gcOverreplicatedLedgerWaitTime": str(WAIT_MS)}


async def add_bookie(cluster: Cluster, name: str, **extra: str) -> BookieService:
    service = await start_bookie(cluster.tmp_path, name, cluster.uri, **FLAGS, **extra)
    cluster.bookies.append(service)
    return service


async def ensemble_of(cluster: Cluster, ledger_id: int) -> set[str]:
    assert cluster.layout is not None
    metadata = (await in_thread(cluster.layout.read_ledger, ledger_id)).value
    return {bookie for segment in metadata.segments for bookie in segment.ensemble}


async def gc_until_overreplicated_deleted(service: BookieService, timeout_s: float = 30.0) -> GcReport:
    """GC runs every 0.1 s until one deletes over-replicated ledgers (the check is due once per
    gcOverreplicatedLedgerWaitTime); that run's report. Bounded."""
    for _ in range(int(timeout_s / 0.1)):
        report = await gc_run(service)
        if report["overreplicated_deleted"]:
            return report
        await sleep(0.1)
    raise AssertionError(f"no GC run deleted an over-replicated ledger within {timeout_s} s")


async def gc_run(service: BookieService) -> GcReport:
    assert service.gc is not None
    return await bounded(service.gc.trigger())


@twisted_test
async def test_a_recovered_bookies_copies_go_after_the_wait_unless_being_replicated(
    tmp_path: Path, zk_chroot: str
) -> None:
    cluster = await Cluster(tmp_path, zk_chroot).start(0)
    try:
        for k in range(4):
            await add_bookie(cluster, f"b{k + 1}")
        kept_locked, dropped = await write_ledgers(cluster, 2, 30)
        common = (await ensemble_of(cluster, kept_locked)) & (await ensemble_of(cluster, dropped))
        old = next(b for b in cluster.bookies if b.bookie_id in common)
        old_id, old_name = str(old.bookie_id), Path(old.config.ledger_dirs[0]).parent.name
        await bounded(old.stop())
        await bounded(BookieRecovery(cluster.client(seed=3), RecoveryOptions((old_id,))).run())
        for ledger_id in (kept_locked, dropped):
            assert old_id not in await ensemble_of(cluster, ledger_id)

        back = await add_bookie(cluster, old_name, bookiePort=old_id.rpartition(":")[2])
        assert back.bookie_id == old_id and back.storage is not None
        assert back.storage.holds_ledger(dropped) and back.storage.holds_ledger(kept_locked)
        assert cluster.layout is not None
        assert await in_thread(cluster.layout.acquire_replication_lock, kept_locked, "test-worker")

        early = await gc_run(back)  # the check is first due one wait after the start
        assert early["overreplicated_deleted"] == [] and early["ledgers_deleted"] == []
        report = await gc_until_overreplicated_deleted(back)  # due one wait after the first check
        assert report["overreplicated_deleted"] == [dropped], report
        assert not back.storage.holds_ledger(dropped)
        assert back.storage.holds_ledger(kept_locked)  # its lock was held: maybe being copied there
        assert await in_thread(cluster.layout.lock_holder, kept_locked) == "test-worker"
        await assert_fully_replicated(cluster, dropped, {old_id})  # the other copies are untouched

        await in_thread(cluster.layout.release_lock, kept_locked)
        again = await gc_run(back)  # not due yet: one wait between checks
        assert again["overreplicated_deleted"] == []
        last = await gc_until_overreplicated_deleted(back)
        assert last["overreplicated_deleted"] == [kept_locked], last
        assert await in_thread(cluster.layout.lock_holder, kept_locked) is None  # GC released its lock
        assert back.gc is not None and back.gc.metrics.overreplicated_deleted == 2
    finally:
        await cluster.stop()


def test_only_a_closed_ledger_that_names_the_bookie_nowhere_is_over_replicated() -> None:
    def ledger(state: LedgerState, *ensembles: tuple[str, ...]) -> LedgerMetadata:
        segments = tuple(Segment(10 * k, e) for k, e in enumerate(ensembles))
        return LedgerMetadata(2, 2, 2, segments, state=state, last_entry_id=30)

    closed = LedgerState.CLOSED
    assert over_replicated(ledger(closed, ("a:1", "b:1")), "c:1")
    assert not over_replicated(ledger(closed, ("c:1", "b:1"), ("a:1", "b:1")), "c:1")  # an old segment
    assert not over_replicated(ledger(LedgerState.OPEN, ("a:1", "b:1")), "c:1")
    assert not over_replicated(ledger(LedgerState.IN_RECOVERY, ("a:1", "b:1")), "c:1")
