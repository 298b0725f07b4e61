"""Autorecovery end to end against real bookies (BookieAutoRecoveryTest, TestReplicationWorker): a
bookie goes, the auditor marks its ledgers, the worker copies them, the marks go, every entry is on every
bookie of its write set, and no ensemble names the lost bookie. Nothing typed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from twisted.internet import defer, reactor

from bkctl.metadata.layout import Layout
from bkctl.recovery.daemon import AutorecoveryDaemon, autorecovery_daemon
from bkctl.recovery.worker import WorkerConfig
from tests.client.cluster import Cluster, bounded
from tests.client.test_ledger import PW, payloads
from tests.recovery.test_bookie_recovery import assert_fully_replicated, write_ledgers
from tests.recovery.test_daemon import until
from tests.server_net.live import in_thread, twisted_test

FAST = WorkerConfig(
    parallel=4, poll_interval_s=0.1, open_ledger_grace_s=0.5, backoff_start_s=0.5, backoff_max_s=2
)


@pytest.mark.parametrize("backend", ["sqlite", "zookeeper"])
@twisted_test
async def test_a_lost_bookie_heals_with_nothing_typed(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    uri = request.getfixturevalue("zk_chroot") if backend == "zookeeper" else None
    cluster = await Cluster(tmp_path, uri).start(4)
    assert cluster.store is not None
    daemon = autorecovery_daemon(Layout(cluster.store), reactor, "ar-1", worker_config=FAST)
    await bounded(daemon.start())
    try:
        ids = await write_ledgers(cluster, 4, 100)
        writer = await bounded(cluster.client(seed=21).create_ledger(3, 3, 2, password=PW))
        await bounded(writer.add_many(payloads(30)))  # open, its writer "crashed"
        victim = writer.ensemble[0]
        await bounded(cluster.bookie(victim).stop())
        layout = cluster.layout
        assert layout is not None

        def healed() -> bool:
            marks = list(layout.underreplicated_ids())
            named = [
                i
                for i, md in layout.read_ledgers(layout.ledger_ids())
                if any(victim in s.ensemble for s in md.segments)
            ]
            return not marks and not named

        await until(healed, "no mark left and no ensemble naming the lost bookie")
        for ledger_id in [*ids, writer.ledger_id]:
            await assert_fully_replicated(cluster, ledger_id, {victim})
        status = daemon.status()
        assert status["ledgers_replicated"] >= 1 and status["auditor"] and victim in status["lost_bookies"]
    finally:
        await bounded(daemon.stop())
        await cluster.stop()


async def _healed_by_the_periodic_check(cluster: Cluster, ledger_id: int, bad: str) -> AutorecoveryDaemon:
    """A daemon whose check of every ledger is due at once started; back once the ledger's first segment
    no longer names `bad`, with no mark left, every entry on every bookie of its write set."""
    from bkctl.recovery.auditor import AuditorConfig

    assert cluster.store is not None and cluster.layout is not None
    layout = cluster.layout
    config = AuditorConfig(periodic_check_interval_s=3600)  # due at once: no check ran before
    daemon = autorecovery_daemon(
        Layout(cluster.store), reactor, "ar", auditor_config=config, worker_config=FAST
    )

    def healed() -> bool:
        current = layout.read_ledger(ledger_id).value
        return not list(layout.underreplicated_ids()) and bad not in current.segments[0].ensemble

    try:
        await bounded(daemon.start())
        await until(healed, f"the fragment on {bad} copied to another bookie and swapped out")
        await assert_fully_replicated(cluster, ledger_id, {bad})
    except BaseException:
        await bounded(daemon.stop())
        raise
    return daemon


@twisted_test
async def test_the_periodic_check_finds_a_wiped_bookie_and_the_worker_repairs_it(tmp_path: Path) -> None:
    """AuditorPeriodicCheckTest: a bookie that is alive but lost its data (here: an ensemble naming a
    bookie that never had the ledger) is found by the check of every ledger, not by the bookie audit."""
    from dataclasses import replace

    from bkctl.model import Segment

    cluster = await Cluster(tmp_path).start(5)
    daemon = None
    try:
        assert cluster.store is not None and cluster.layout is not None
        layout = cluster.layout
        (ledger_id,) = await write_ledgers(cluster, 1, 60)
        versioned = await in_thread(layout.read_ledger, ledger_id)
        ensemble = list(versioned.value.segments[0].ensemble)
        wiped = next(str(b.bookie_id) for b in cluster.bookies if str(b.bookie_id) not in ensemble)
        ensemble[0] = wiped
        md = replace(versioned.value, segments=(Segment(0, tuple(ensemble)),))
        await in_thread(layout.write_ledger, ledger_id, md, versioned.version)
        daemon = await _healed_by_the_periodic_check(cluster, ledger_id, wiped)
        assert daemon.status()["checks_of_all_ledgers"] >= 1
        assert await in_thread(layout.check_ctime, "checkallledgersctime") is not None
    finally:
        if daemon is not None:
            await bounded(daemon.stop())
        await cluster.stop()


@pytest.mark.parametrize("backend", ["sqlite", "zookeeper"])
@twisted_test
async def test_two_bookies_lost_at_once_heal_together(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """Two bookies of one ensemble go at the same moment (a rack's power): one audit marks every ledger
    with both as missing replicas (a second lost bookie audits at once), and the worker copies both
    fragments of each from the one copy left (Qw = E = 3) to the two spare bookies."""
    uri = request.getfixturevalue("zk_chroot") if backend == "zookeeper" else None
    cluster = await Cluster(tmp_path, uri).start(5)
    assert cluster.store is not None and cluster.layout is not None
    layout = cluster.layout
    daemon = autorecovery_daemon(Layout(cluster.store), reactor, "ar-1", worker_config=FAST)
    await bounded(daemon.start())
    try:
        client = cluster.client(seed=7)
        ensemble = [str(b.bookie_id) for b in cluster.bookies[:3]]
        ids = []
        for _ in range(4):
            lh = await bounded(client.create_ledger(3, 3, 2, password=PW, ensemble=ensemble))
            await bounded(lh.add_many(payloads(80)))
            await bounded(lh.close())
            ids.append(lh.ledger_id)
        victims = set(ensemble[:2])
        await bounded(defer.gatherResults([cluster.bookie(v).stop() for v in victims]))

        def healed() -> bool:
            ensembles = [set(g.ensemble) for _, md in layout.read_ledgers(ids) for g in md.segments]
            return not list(layout.underreplicated_ids()) and not any(victims & e for e in ensembles)

        await until(healed, "no mark left and no ensemble naming either lost bookie")
        for ledger_id in ids:
            await assert_fully_replicated(cluster, ledger_id, victims)
        assert victims <= set(daemon.status()["lost_bookies"])
    finally:
        await bounded(daemon.stop())
        await cluster.stop()


@twisted_test
async def test_a_ledger_deleted_while_marked_has_its_mark_dropped_without_a_hot_loop(
    tmp_path: Path, zk_chroot: str
) -> None:
    """Java's pain point on real bookies and ZooKeeper: a ledger that cannot be repaired (both its
    bookies lost) backs off; deleted while marked, its mark is dropped on the next try, and the
    failures metric stays bounded by the backoff (a hot loop would count hundreds)."""
    from bkctl.recovery.metrics import daemon_lines

    cluster = await Cluster(tmp_path, zk_chroot).start(5)
    assert cluster.store is not None and cluster.layout is not None
    layout = cluster.layout
    daemon = autorecovery_daemon(Layout(cluster.store), reactor, "ar-1", worker_config=FAST)
    await bounded(daemon.start())
    try:
        client = cluster.client(seed=3)
        pair = [str(b.bookie_id) for b in cluster.bookies[:2]]
        stuck = await bounded(client.create_ledger(2, 2, 2, password=PW, ensemble=pair))
        await bounded(stuck.add_many(payloads(40)))
        await bounded(stuck.close())
        healthy = await bounded(
            client.create_ledger(3, 2, 2, password=PW, ensemble=[*pair[:1], *_others(cluster, pair)])
        )
        await bounded(healthy.add_many(payloads(40)))
        await bounded(healthy.close())
        await bounded(defer.gatherResults([cluster.bookie(b).stop() for b in pair]))
        await until(lambda: stuck.ledger_id in daemon.worker.stats.failing, "the stuck ledger backing off")
        walks_at_first_failure = daemon.worker.scans
        await until(
            lambda: list(layout.underreplicated_ids()) == [stuck.ledger_id], "the other ledger healed"
        )
        await bounded(client.delete_ledger(stuck.ledger_id))
        # The worker's own bookkeeping too: a mark is gone from ZooKeeper (deleted in a pool thread) a
        # reactor turn before the worker counts its repair done.
        await until(
            lambda: (
                daemon.worker.stats.marks_dropped == 1
                and not list(layout.underreplicated_ids())
                and not daemon.worker.stats.copying
            ),
            "the deleted ledger's mark dropped",
        )
        failures, walks = daemon.worker.stats.failures, daemon.worker.scans - walks_at_first_failure
        assert not daemon.worker.stats.failing
        # At most one try per backoff (it starts at 0.5 s and doubles, five polls of 0.1 s), plus the
        # first tries: counted in walks of the marks, not seconds. A hot loop would try on every walk;
        # the factor 2 leaves room for walks slowed down by a loaded machine.
        assert 1 <= failures <= 3 + walks / 2, (failures, walks)
        # Nothing is retried once the mark is gone: not in the walks of the marks that follow, nor when
        # the backoff's lock release comes (at most backoff_max_s later).
        walked = daemon.worker.scans
        released = time.monotonic() + FAST.backoff_max_s
        await until(
            lambda: daemon.worker.scans >= walked + 3 and time.monotonic() > released, "three more walks"
        )
        assert daemon.worker.stats.failures == failures
        assert await in_thread(layout.lock_holder, stuck.ledger_id) is None
        metrics = "".join(daemon_lines(daemon))
        assert "bkctl_autorecovery_marks_dropped_total 1\n" in metrics
        assert f"bkctl_autorecovery_replication_failures_total {failures}\n" in metrics
        await assert_fully_replicated(cluster, healthy.ledger_id, set(pair))
    finally:
        await bounded(daemon.stop())
        await cluster.stop()


def _others(cluster: Cluster, taken: list[str]) -> list[str]:
    return [str(b.bookie_id) for b in cluster.bookies if str(b.bookie_id) not in taken][:2]


@twisted_test
async def test_disabled_then_enabled_on_real_bookies(tmp_path: Path, zk_chroot: str) -> None:
    """`autorecovery disable` on ZooKeeper with real bookies: a bookie lost meanwhile is not audited and
    a mark written by hand (as `bkctl audit --mark-underreplicated` does) is not repaired; once enabled,
    the auditor audits what it waited for and everything heals."""
    cluster = await Cluster(tmp_path, zk_chroot).start(4)
    assert cluster.store is not None and cluster.layout is not None
    layout = cluster.layout
    daemon = autorecovery_daemon(Layout(cluster.store), reactor, "ar-1", worker_config=FAST)
    await bounded(daemon.start())
    try:
        ids = await write_ledgers(cluster, 4, 60)
        await until(lambda: daemon.auditor is not None and daemon.auditor.ready, "an auditor")
        await in_thread(layout.set_autorecovery_enabled, False)
        await until(lambda: daemon.auditor is not None and not daemon.auditor.enabled, "the auditor paused")
        ensembles = [md.segments[0].ensemble for _, md in await in_thread(layout.read_ledgers, ids)]
        victim = ensembles[0][0]
        await bounded(cluster.bookie(victim).stop())
        by_hand = ids[0]
        await in_thread(layout.mark_underreplicated, by_hand, [victim])
        walked = daemon.worker.scans
        await until(lambda: daemon.worker.scans >= walked + 5, "five walks of the marks while disabled")
        assert await in_thread(lambda: list(layout.underreplicated_ids())) == [by_hand]
        assert await in_thread(layout.lock_holder, by_hand) is None
        status = daemon.status()
        assert status["audits"] == 0 and status["ledgers_replicated"] == 0 and status["copying"] == []
        assert victim in status["lost_bookies"]
        await in_thread(layout.set_autorecovery_enabled, True)

        def healed() -> bool:
            named = [
                i for i, md in layout.read_ledgers(ids) if any(victim in s.ensemble for s in md.segments)
            ]
            return not list(layout.underreplicated_ids()) and not named

        await until(healed, "healed once enabled")
        for ledger_id in ids:
            await assert_fully_replicated(cluster, ledger_id, {victim})
        assert daemon.status()["audits"] >= 1
    finally:
        await bounded(daemon.stop())
        await cluster.stop()


@twisted_test
async def test_copies_missed_by_acknowledged_adds_are_healed_without_fencing_the_writer(
    tmp_path: Path,
) -> None:
    """Found by the chaos checker: with Qa < Qw, entries acknowledged by Qa bookies were left
    short of the copy the last one never took. The writer now changes its ensemble and marks the ledger
    naming that bookie; the worker checks every entry, moves the sealed fragment off it, and the writer,
    never fenced, goes on and closes."""
    cluster = await Cluster(tmp_path).start(4)
    assert cluster.store is not None and cluster.layout is not None
    layout = cluster.layout
    daemon = autorecovery_daemon(Layout(cluster.store), reactor, "ar-1", worker_config=FAST)
    try:
        hung = await cluster.silent_bookie()  # registered, connects, never answers
        client = cluster.client(seed=4, request_timeout_ms=300)
        ensemble = [*(str(b.bookie_id) for b in cluster.bookies[:2]), hung]
        writer = await bounded(client.create_ledger(3, 3, 2, password=PW, ensemble=ensemble))
        assert await bounded(writer.add_many(payloads(20))) == list(range(20))  # by the other two
        await until(lambda: hung not in writer.ensemble, "the writer's ensemble change")
        await bounded(daemon.start())

        def healed() -> bool:
            segments = layout.read_ledger(writer.ledger_id).value.segments
            return not list(layout.underreplicated_ids()) and all(hung not in s.ensemble for s in segments)

        await until(healed, "the missed copies made elsewhere and the mark gone", timeout_s=60)
        assert await bounded(writer.add_many(payloads(5))) == list(range(20, 25))  # never fenced
        await bounded(writer.close())
        await assert_fully_replicated(cluster, writer.ledger_id, {hung})
    finally:
        await bounded(daemon.stop())
        await cluster.stop()


async def _write_with_a_gap(cluster: Cluster, gap: range) -> tuple[int, str]:
    """A closed 3-3-2 ledger of 30 entries whose third bookie never got the entries in `gap`: what a
    writer killed while that bookie was slow leaves (acknowledged by the other two). Its first and last
    entries are there, so only the list of entries the bookie holds shows the gap."""
    from bkctl.protocol.entry import package_entry

    client = cluster.client(seed=8)
    handle = await bounded(client.create_ledger(3, 3, 2, password=PW))
    short = handle.ensemble[2]
    acked: list[defer.Deferred[int]] = []
    length = 0
    for entry_id, payload in enumerate(payloads(30)):
        length += len(payload)
        body = package_entry(
            handle.digest, handle.ledger_id, entry_id, entry_id - 1, length, payload, handle.mac
        )
        for bookie in handle.ensemble:
            if bookie == short and entry_id in gap:
                continue
            done: defer.Deferred[int] = defer.Deferred()
            client.bookies.get(bookie).add(
                body, handle.master_key, 0, handle.ledger_id, entry_id, lambda rc, _, d=done: d.callback(rc)
            )
            acked.append(done)
    assert set(await bounded(defer.gatherResults(acked))) == {0}
    await bounded(defer.ensureDeferred(handle.close_metadata(29, length)))
    return handle.ledger_id, short


@twisted_test
async def test_entries_missing_between_a_fragments_first_and_last_are_found_and_healed(
    tmp_path: Path,
) -> None:
    """Found by the chaos run: a live bookie lacking entries in the middle of its fragment passed the
    first-and-last check forever. The check now also compares the entries the bookie lists."""
    from bkctl.recovery.checker import MISSING, check_ledger

    cluster = await Cluster(tmp_path).start(4)
    daemon = None
    try:
        assert cluster.store is not None and cluster.layout is not None
        ledger_id, short = await _write_with_a_gap(cluster, range(10, 20))
        check = await bounded(defer.ensureDeferred(check_ledger(cluster.client(seed=3), ledger_id)))
        bad = [(s.fragment.bookie, s.state, s.entries) for s in check.states if not s.ok]
        assert bad == [(short, MISSING, list(range(10, 20)))]
        daemon = await _healed_by_the_periodic_check(cluster, ledger_id, short)
    finally:
        if daemon is not None:
            await bounded(daemon.stop())
        await cluster.stop()


@twisted_test
async def test_a_bookie_back_empty_under_its_own_id_is_refilled_in_place(tmp_path: Path) -> None:
    """A wiped disk started under the same id (BookKeeper #3905): its cookie is made again, the auditor
    sees the new cookie and marks the ledgers naming the bookie, the worker checks them and copies what
    it lacks back to it in place, the ensembles unchanged: with 3 bookies and ensembles of 3 no other
    bookie can take the copy. Its absence alone marks nothing (lostBookieRecoveryDelay of an hour)."""
    from tests.server_net.live import start_bookie

    cluster = await Cluster(tmp_path).start(3)
    assert cluster.store is not None and cluster.layout is not None
    layout = cluster.layout
    await in_thread(layout.set_lost_bookie_recovery_delay, 3600)
    daemon = autorecovery_daemon(Layout(cluster.store), reactor, "ar", worker_config=FAST)
    await bounded(daemon.start())
    try:
        ids = await write_ledgers(cluster, 3, 40)
        wiped = str(cluster.bookies[0].bookie_id)
        await until(lambda: layout.cookie_generations([wiped])[wiped][1] is not None, "first cookie seen")
        before = {i: md.segments for i, md in await in_thread(lambda: list(layout.read_ledgers(ids)))}
        await bounded(cluster.bookies[0].stop())
        await in_thread(layout.delete_cookie, wiped)  # `bkctl bookie format`: cookie and data gone
        port = wiped.rsplit(":", 1)[1]
        cluster.bookies[0] = await start_bookie(tmp_path, "b1-empty", cluster.uri, bookiePort=port)
        assert str(cluster.bookies[0].bookie_id) == wiped

        def refilled() -> bool:
            gens = layout.cookie_generations([wiped])[wiped]
            return gens[0] == gens[1] and not list(layout.underreplicated_ids())

        await until(refilled, "the new cookie audited and every mark gone")
        after = {i: md.segments for i, md in await in_thread(lambda: list(layout.read_ledgers(ids)))}
        assert after == before  # refilled in place: no ensemble changed
        for ledger_id in ids:
            await assert_fully_replicated(cluster, ledger_id, set())
        assert daemon.status()["ledgers_replicated"] >= len(ids)
    finally:
        await bounded(daemon.stop())
        await cluster.stop()
