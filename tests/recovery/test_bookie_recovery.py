"""Manual recovery against real bookies (BookKeeper's BookieRecoveryTest, TestLedgerChecker,
TestLedgerFragmentReplication scenarios): every fragment of a dead bookie copied, the survivors swapped
into the ensembles, every entry readable from every bookie of its write set."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from twisted.internet import defer, reactor, threads

from bkctl.client.client import Client
from bkctl.client.single_bookie import read_from_bookie
from bkctl.errors import UsageError
from bkctl.metadata.layout import Layout
from bkctl.metadata.metered import MeteredStore, OpsRate
from bkctl.model import LedgerMetadata, LedgerState
from bkctl.recovery.bookie_recovery import (
    BookieRecovery,
    RecoveryOptions,
    RegisteredBookies,
    admin_open,
    recover_ledger_replicas,
)
from bkctl.recovery.checker import BOOKIE_DOWN, MISSING, check_fragments, check_ledger
from bkctl.recovery.fragments import fragments
from tests.client.cluster import Cluster, bounded
from tests.client.test_ledger import PW, payloads
from tests.conftest import StoreTarget
from tests.server.helpers import wait_until
from tests.server_net.live import in_thread, twisted_test


async def write_ledgers(cluster: Cluster, count: int, entries: int, *, close: bool = True) -> list[int]:
    client = cluster.client(seed=11)
    ids = []
    for _ in range(count):
        lh = await bounded(client.create_ledger(3, 2, 2, password=PW))
        await bounded(lh.add_many(payloads(entries)))
        if close:
            await bounded(lh.close())
        ids.append(lh.ledger_id)
    return ids


async def assert_fully_replicated(cluster: Cluster, ledger_id: int, gone: set[str]) -> None:
    """Every entry on every bookie of its write set, and no ensemble naming a gone bookie."""
    client = cluster.client(seed=5)
    handle = await bounded(admin_open(client, ledger_id, recovery=False))
    md = handle.metadata
    assert not any(b in gone for s in md.segments for b in s.ensemble), md.segments
    last = md.last_entry_id if handle.is_closed else handle.last_add_confirmed
    for fragment in fragments(ledger_id, md, last):
        wanted = list(fragment.entries())
        found, failures = await bounded(read_from_bookie(handle, fragment.bookie, wanted))
        assert failures == [] and [e.entry_id for e in found] == wanted, (fragment, failures)


async def kill(cluster: Cluster, index: int) -> str:
    service = cluster.bookies[index]
    await bounded(service.stop())
    return str(service.bookie_id)


@pytest.mark.parametrize("backend", ["sqlite", "zookeeper"])
@twisted_test
async def test_recover_a_dead_bookie_onto_placement_chosen_bookies(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    uri = request.getfixturevalue("zk_chroot") if backend == "zookeeper" else None
    cluster = await Cluster(tmp_path, uri).start(4)
    try:
        ids = await write_ledgers(cluster, 3, 50)
        dead = await kill(cluster, 0)
        client = cluster.client(seed=3)
        report = await bounded(BookieRecovery(client, RecoveryOptions((dead,))).run())
        named = [
            i
            for i in ids
            if dead in (await in_thread(cluster.layout.read_ledger, i)).value.segments[0].ensemble
        ]  # type: ignore[union-attr]
        assert named == [] and report.ledgers_unrecoverable == [] and report.ledgers_skipped == []
        assert report.ledgers_recovered == report.ledgers_total >= 1
        assert report.copied.entries > 0
        for ledger_id in ids:
            await assert_fully_replicated(cluster, ledger_id, {dead})
        again = await bounded(BookieRecovery(client, RecoveryOptions((dead,))).run())
        assert (again.ledgers_total, again.copied.entries) == (0, 0)  # idempotent: nothing left
    finally:
        await cluster.stop()


@twisted_test
async def test_dry_run_changes_nothing_and_target_is_honoured(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(3)
    try:
        ids = await write_ledgers(cluster, 2, 20)
        spare = await cluster.add_bookie()
        dead = await kill(cluster, 0)
        client = cluster.client(seed=3)
        before = [(await in_thread(cluster.layout.read_ledger, i)).version for i in ids]  # type: ignore[union-attr]
        dry = await bounded(BookieRecovery(client, RecoveryOptions((dead,), dry_run=True)).run())
        after = [(await in_thread(cluster.layout.read_ledger, i)).version for i in ids]  # type: ignore[union-attr]
        assert before == after and dry.copied.entries == 0
        assert [step.ledger_id for step in dry.plan] == ids
        assert all(dead in s.old_ensemble and dead not in s.new_ensemble for s in dry.plan)
        for step in dry.plan:  # bytes: the average entry (length / 20) times the 13 or 14 it held (Qw=2 of 3)
            md = (await in_thread(cluster.layout.read_ledger, step.ledger_id)).value  # type: ignore[union-attr]
            assert (step.segment, step.first_entry_id, step.last_entry_id) == (0, 0, 19)
            assert step.bytes == round(md.length / 20 * step.entries) and step.entries in (13, 14)
            assert set(step.as_dict()) >= {"ledger_id", "segment", "entries", "bytes", "new_ensemble"}
        spare_id = str(spare.bookie_id)
        report = await bounded(BookieRecovery(client, RecoveryOptions((dead,), target=spare_id)).run())
        assert report.ledgers_recovered == 2
        for ledger_id in ids:
            md = (await in_thread(cluster.layout.read_ledger, ledger_id)).value  # type: ignore[union-attr]
            assert spare_id in md.segments[0].ensemble
            await assert_fully_replicated(cluster, ledger_id, {dead})
        with pytest.raises(UsageError, match="not a registered"):
            await bounded(BookieRecovery(client, RecoveryOptions((dead,), target="127.0.0.1:1")).run())
    finally:
        await cluster.stop()


@twisted_test
async def test_open_ledger_is_fenced_and_closed_then_recovered(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(4)
    try:
        writer = await bounded(cluster.client().create_ledger(3, 3, 2, password=PW))
        await bounded(writer.add_many(payloads(30)))
        # Every copy answered first: a third copy still in flight to the bookie killed next would make the
        # writer change its ensemble (another scenario, tested with the racing writer).
        await bounded(writer.wait_answered())
        dead = await kill(cluster, cluster.bookies.index(cluster.bookie(writer.ensemble[0])))
        client = cluster.client(seed=3)
        skipped = await bounded(BookieRecovery(client, RecoveryOptions((dead,), skip_open=True)).run())
        # The dry run shows the last segment it will fence then copy: up to the last entry a survivor holds.
        (step,) = (await bounded(BookieRecovery(client, RecoveryOptions((dead,), dry_run=True)).run())).plan
        assert (step.segment, step.first_entry_id, step.last_entry_id, step.entries) == (0, 0, 29, 30)
        assert step.bytes is not None and step.bytes == sum(len(p) for p in payloads(30))
        assert [s["ledger_id"] for s in skipped.ledgers_skipped] == [writer.ledger_id]
        report = await bounded(BookieRecovery(client, RecoveryOptions((dead,))).run())
        assert report.ledgers_recovered == 1
        md = (await in_thread(cluster.layout.read_ledger, writer.ledger_id)).value  # type: ignore[union-attr]
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 29
        await assert_fully_replicated(cluster, writer.ledger_id, {dead})
    finally:
        await cluster.stop()


@twisted_test
async def test_unrecoverable_entries_are_reported_as_ranges(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(3)
    try:
        client = cluster.client(seed=2)
        lh = await bounded(client.create_ledger(3, 1, 1, password=PW))  # one copy of each entry
        await bounded(lh.add_many(payloads(9)))
        await bounded(lh.close())
        await cluster.add_bookie()
        dead = await kill(cluster, 0)
        report = await bounded(BookieRecovery(client, RecoveryOptions((dead,))).run())
        index = lh.ensemble.index(dead)
        lost = [e for e in range(9) if e % 3 == index]
        assert report.ledgers_unrecoverable == [
            {"ledger_id": lh.ledger_id, "entries": [[e, e] for e in lost]}
        ]
        md = (await in_thread(cluster.layout.read_ledger, lh.ledger_id)).value  # type: ignore[union-attr]
        assert dead in md.segments[0].ensemble  # left as it was: no data moved, nothing pretended
    finally:
        await cluster.stop()


@twisted_test
async def test_checker_tells_missing_from_down(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(3)
    try:
        (ledger_id,) = await write_ledgers(cluster, 1, 12)
        client = cluster.client(seed=4)
        handle = await bounded(admin_open(client, ledger_id, recovery=False))
        frags = fragments(ledger_id, handle.metadata, 11)
        states = await bounded(check_fragments(handle, frags, full=True))
        assert all(s.ok for s in states)
        gone = frags[0].bookie
        states = await bounded(check_fragments(handle, frags, down={gone}))
        assert {s.state for s in states if s.fragment.bookie == gone} == {BOOKIE_DOWN}
        # A bookie asked for entries of a ledger it never had: "missing" (a wiped disk looks like this).
        empty = str((await cluster.add_bookie()).bookie_id)
        wiped = dataclasses.replace(frags[0], bookie=empty)
        state = (await bounded(check_fragments(handle, [wiped], full=True)))[0]
        assert (state.state, state.entries) == (MISSING, list(frags[0].entries()))
    finally:
        await cluster.stop()


@twisted_test
async def test_target_already_in_an_ensemble_gets_another_bookie_there(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(4)
    try:
        client = cluster.client(seed=9)
        lh = await bounded(client.create_ledger(3, 2, 2, password=PW))
        await bounded(lh.add_many(payloads(10)))
        await bounded(lh.close())
        await cluster.add_bookie()
        dead = lh.ensemble[0]
        await bounded(cluster.bookie(dead).stop())
        busy = lh.ensemble[1]  # a target that is already in the ensemble
        report = await bounded(BookieRecovery(client, RecoveryOptions((dead,), target=busy)).run())
        assert report.ledgers_recovered == 1 and report.target_overrides == 1
        await assert_fully_replicated(cluster, lh.ledger_id, {dead})
    finally:
        await cluster.stop()


@twisted_test
async def test_a_corrupt_copy_is_skipped_and_reported(tmp_path: Path) -> None:
    """Entry 4 is corrupt on the first replica of its write set: the next one's copy goes to the target."""
    from bkctl.model import DigestType
    from bkctl.protocol.entry import package_entry
    from tests.client.test_ledger import _raw_add

    cluster = await Cluster(tmp_path).start(3)
    try:
        client = cluster.client(seed=8)
        lh = await bounded(client.create_ledger(3, 3, 3, digest=DigestType.CRC32C, password=PW))
        await bounded(lh.add_many(payloads(9)))
        await bounded(lh.close())
        good = package_entry(DigestType.CRC32C, lh.ledger_id, 4, 3, 0, b"x")
        first, dead = lh.ensemble[4 % 3], lh.ensemble[(4 + 2) % 3]  # entry 4: write set idx 1, 2, 0
        assert await _raw_add(client.bookies.get(first), good[:-1] + b"!", 4, lh.ledger_id) == 0  # corrupt
        await cluster.add_bookie()
        await bounded(cluster.bookie(dead).stop())
        report = await bounded(BookieRecovery(client, RecoveryOptions((dead,))).run())
        assert report.ledgers_recovered == 1 and report.corrupt == [(lh.ledger_id, 4, first)]
        assert report.as_dict()["corrupt_copies"] == [
            {"ledger_id": lh.ledger_id, "entry_id": 4, "bookie": first}
        ]
    finally:
        await cluster.stop()


@twisted_test
async def test_a_survivor_that_dies_mid_copy_is_replaced_by_another_replica(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(3)
    try:
        client = cluster.client(seed=12)
        lh = await bounded(client.create_ledger(3, 3, 2, password=PW))  # every entry on all three
        await bounded(lh.add_many([bytes(2000)] * 600))
        await bounded(lh.close())
        spare = await cluster.add_bookie()
        dead, dying = lh.ensemble[0], lh.ensemble[1]
        await bounded(cluster.bookie(dead).stop())
        run = BookieRecovery(client, RecoveryOptions((dead,), rate_bytes_per_s=400_000))  # ~3 s of copying
        recovering = defer.ensureDeferred(run.run())
        # Some entries copied (a ~3 s copy: still going) before the second replica goes.
        await wait_until(lambda: run.report.copied.entries > 0 or recovering.called)
        assert run.report.copied.entries > 0 or not recovering.called
        await bounded(cluster.bookie(dying).stop())  # the replica it was reading from goes too
        report = await bounded(recovering, 60)
        assert report.ledgers_recovered == 1, report.as_dict()
        handle = await bounded(admin_open(cluster.client(seed=2), lh.ledger_id, recovery=False))
        found, failures = await bounded(read_from_bookie(handle, str(spare.bookie_id), list(range(600))))
        assert failures == [] and len(found) == 600
    finally:
        await cluster.stop()


@twisted_test
async def test_a_ledger_deleted_during_the_run_is_passed_over_quietly(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(4)
    try:
        ids = await write_ledgers(cluster, 2, 10)
        first = (await in_thread(cluster.layout.read_ledger, ids[0])).value.segments[0].ensemble[0]  # type: ignore[union-attr]
        dead = await kill(cluster, [str(b.bookie_id) for b in cluster.bookies].index(first))
        client = cluster.client(seed=3)
        run = BookieRecovery(client, RecoveryOptions((dead,)))
        original = run.recover_ledger

        async def delete_first(ledger_id: int) -> None:  # the ledger goes between the scan and its repair
            if ledger_id == ids[0]:
                await bounded(client.delete_ledger(ledger_id))
            await original(ledger_id)

        run.recover_ledger = delete_first  # type: ignore[method-assign]
        report = await bounded(run.run())
        named = [i for i in ids if i != ids[0]]
        assert report.ledgers_skipped == [] and report.ledgers_deleted == (
            1 if report.ledgers_total == 2 else 0
        )
        for ledger_id in named:
            await assert_fully_replicated(cluster, ledger_id, {dead})
    finally:
        await cluster.stop()


async def rewrite_place(cluster: Cluster, ledger_id: int, segment: int, index: int, bookie: str) -> None:
    """Name `bookie` at one place of a segment's ensemble: a live bookie that never had those entries,
    as a wiped or replaced disk looks to every reader."""
    from bkctl.model import Segment

    assert cluster.layout is not None
    versioned = await in_thread(cluster.layout.read_ledger, ledger_id)
    segments = list(versioned.value.segments)  # type: ignore[union-attr]
    ensemble = list(segments[segment].ensemble)
    ensemble[index] = bookie
    segments[segment] = Segment(segments[segment].first_entry_id, tuple(ensemble))
    updated = dataclasses.replace(versioned.value, segments=tuple(segments))  # type: ignore[union-attr]
    await in_thread(cluster.layout.write_ledger, ledger_id, updated, versioned.version)  # type: ignore[union-attr]


async def assert_check_clean(cluster: Cluster, ledger_id: int) -> None:
    check = await bounded(check_ledger(cluster.client(seed=6), ledger_id, full=True))
    assert [s for s in check.states if not s.ok] == []


def outsider(cluster: Cluster, *ensembles: Sequence[str]) -> str:
    """A running bookie in none of `ensembles`."""
    named = {b for ensemble in ensembles for b in ensemble}
    return next(
        str(b.bookie_id) for b in cluster.bookies if b.state == "read-write" and str(b.bookie_id) not in named
    )


@twisted_test
async def test_a_live_bookie_lacking_entries_in_one_segment_may_take_another_segments_copies(
    tmp_path: Path,
) -> None:
    """Found by the chaos checker: two live bookies each lacking a segment's entries got no target when
    every other bookie was in the ensemble or down (recovery excluded both from every segment)."""
    from bkctl.model import Segment

    cluster = await Cluster(tmp_path).start(5)
    try:
        assert cluster.layout is not None
        (ledger_id,) = await write_ledgers(cluster, 1, 40)
        versioned = await in_thread(cluster.layout.read_ledger, ledger_id)
        a, b, c = versioned.value.segments[0].ensemble
        x = outsider(cluster, (a, b, c))
        y = outsider(cluster, (a, b, c, x))
        segments = (Segment(0, (a, b, x)), Segment(20, (a, b, y)))  # x and y never had their entries
        await in_thread(
            cluster.layout.write_ledger,
            ledger_id,
            dataclasses.replace(versioned.value, segments=segments),
            versioned.version,
        )
        await bounded(cluster.bookie(c).stop())  # no bookie left outside both ensembles
        report = await bounded(recover_ledger_replicas(cluster.client(seed=3), ledger_id, full=True))
        assert report.ledgers_recovered == 1, report.as_dict()
        await assert_check_clean(cluster, ledger_id)
    finally:
        await cluster.stop()


@twisted_test
async def test_ledger_recover_heals_a_dead_bookie_and_a_live_one_that_lost_its_entries(
    tmp_path: Path,
) -> None:
    cluster = await Cluster(tmp_path).start(5)
    try:
        dead_ledger, wiped_ledger = await write_ledgers(cluster, 2, 40)
        client = cluster.client(seed=3)
        dead = (await in_thread(cluster.layout.read_ledger, dead_ledger)).value.segments[0].ensemble[1]  # type: ignore[union-attr]
        await bounded(cluster.bookie(dead).stop())
        report = await bounded(recover_ledger_replicas(client, dead_ledger, full=True))
        assert report.ledgers_recovered == 1 and report.failed_bookies == [dead]
        await assert_check_clean(cluster, dead_ledger)
        await assert_fully_replicated(cluster, dead_ledger, {dead})
        # A live bookie named where it never had the entries: the checker finds them missing, they move.
        ensemble = (await in_thread(cluster.layout.read_ledger, wiped_ledger)).value.segments[0].ensemble  # type: ignore[union-attr]
        wiped = outsider(cluster, ensemble)
        await rewrite_place(cluster, wiped_ledger, 0, 0, wiped)
        report = await bounded(recover_ledger_replicas(client, wiped_ledger, full=True))
        assert report.ledgers_recovered == 1 and wiped in report.failed_bookies
        await assert_check_clean(cluster, wiped_ledger)
        again = await bounded(recover_ledger_replicas(client, wiped_ledger, full=True))
        assert (again.ledgers_total, again.copied.entries) == (0, 0)
    finally:
        await cluster.stop()


@twisted_test
async def test_ledger_recover_never_fences_an_open_ledger_for_a_live_bookie(tmp_path: Path) -> None:
    """A live bookie of the writer's ensemble lacks entries of an earlier segment: that segment's copy
    moves; the writer goes on. Another open ledger's last segment names a live bookie without its
    entries: they are copied back to it in place (the writer's ensemble cannot change under it)."""
    cluster = await Cluster(tmp_path).start(5)
    try:
        writer = await bounded(cluster.client(seed=21).create_ledger(3, 3, 2, password=PW))
        await bounded(writer.add_many(payloads(20)))
        await bounded(cluster.bookie(writer.ensemble[2]).stop())
        await bounded(writer.add_many(payloads(5)))  # an ensemble change: segment 1 from entry 20
        live = writer.ensemble[2]
        await rewrite_place(cluster, writer.ledger_id, 0, 2, live)  # it never had entries 0..19
        client = cluster.client(seed=3)
        report = await bounded(recover_ledger_replicas(client, writer.ledger_id, full=True))
        assert report.ledgers_recovered == 1 and report.ledgers_skipped == [], report.as_dict()
        md = (await in_thread(cluster.layout.read_ledger, writer.ledger_id)).value  # type: ignore[union-attr]
        assert md.state is LedgerState.OPEN and live not in md.segments[0].ensemble
        assert md.segments[1].ensemble == tuple(writer.ensemble)
        await bounded(writer.add_many(payloads(3)))  # not fenced: the writer still writes
        await assert_check_clean(cluster, writer.ledger_id)

        idle = await bounded(cluster.client(seed=22).create_ledger(3, 3, 2, password=PW))
        await bounded(idle.add_many(payloads(12)))
        await bounded(idle.add_many(payloads(1)))  # carries LAC 11 to the bookies; the writer stops here
        empty = outsider(cluster, idle.ensemble)
        await rewrite_place(cluster, idle.ledger_id, 0, 1, empty)
        report = await bounded(recover_ledger_replicas(client, idle.ledger_id, full=True))
        step = report.plan[0]
        assert (step.old_ensemble, report.fragments_copied) == (step.new_ensemble, 1), report.as_dict()
        md = (await in_thread(cluster.layout.read_ledger, idle.ledger_id)).value  # type: ignore[union-attr]
        assert md.state is LedgerState.OPEN and empty in md.segments[0].ensemble
        assert (step.entries, report.copied.entries) == (12, 12)  # 0..11, up to the last add confirmed
        await assert_check_clean(cluster, idle.ledger_id)
    finally:
        await cluster.stop()


@twisted_test
async def test_only_the_ledger_asked_for_and_a_failed_target_is_a_usage_error(tmp_path: Path) -> None:
    from bkctl.errors import ExitCode

    cluster = await Cluster(tmp_path).start(3)
    try:
        ids = await write_ledgers(cluster, 2, 10)  # both on all three bookies
        await cluster.add_bookie()
        dead = await kill(cluster, 0)
        client = cluster.client(seed=3)
        with pytest.raises(UsageError, match="one of the failed bookies") as raised:
            await bounded(BookieRecovery(client, RecoveryOptions((dead,), target=dead)).run())
        assert raised.value.exit_code == ExitCode.USAGE
        report = await bounded(BookieRecovery(client, RecoveryOptions((dead,), ledger=ids[1])).run())
        assert (report.ledgers_total, report.ledgers_recovered) == (1, 1)
        still = (await in_thread(cluster.layout.read_ledger, ids[0])).value  # type: ignore[union-attr]
        assert dead in still.segments[0].ensemble
        await assert_fully_replicated(cluster, ids[1], {dead})
    finally:
        await cluster.stop()


@twisted_test
async def test_a_ledger_without_enough_live_bookies_is_reported_and_the_others_go_on(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(4)
    try:
        client = cluster.client(seed=7)
        wide = await bounded(client.create_ledger(4, 2, 2, password=PW))  # every bookie: no spare left
        narrow = await bounded(client.create_ledger(3, 2, 2, password=PW))
        for lh in (wide, narrow):
            await bounded(lh.add_many(payloads(10)))
            await bounded(lh.close())
        dead = narrow.ensemble[0]
        await bounded(cluster.bookie(dead).stop())
        report = await bounded(BookieRecovery(client, RecoveryOptions((dead,))).run())
        assert report.ledgers_recovered == 1 and report.ledgers_unrecoverable == []
        assert [s["ledger_id"] for s in report.ledgers_skipped] == [wide.ledger_id]
        assert "not enough bookies" in report.ledgers_skipped[0]["reason"]
        await assert_fully_replicated(cluster, narrow.ledger_id, {dead})
    finally:
        await cluster.stop()


@twisted_test
async def test_force_recovers_a_registered_bookie(tmp_path: Path) -> None:
    from bkctl.commands.output import OutputFormat
    from bkctl.commands.recover import _run
    from bkctl.errors import ConflictError

    cluster = await Cluster(tmp_path).start(4)
    try:
        (ledger_id,) = await write_ledgers(cluster, 1, 30)
        alive = (await in_thread(cluster.layout.read_ledger, ledger_id)).value.segments[0].ensemble[0]  # type: ignore[union-attr]
        client = cluster.client(seed=3)
        options = RecoveryOptions((alive,))
        with pytest.raises(ConflictError, match="is registered: it is alive"):
            await bounded(_run(client, options, False, False, OutputFormat.json))
        report = await bounded(_run(client, options, True, False, OutputFormat.json))
        assert report.ledgers_recovered == 1
        await assert_fully_replicated(cluster, ledger_id, {alive})
    finally:
        await cluster.stop()


class WriterRacesTheSwap(Layout):
    """The recovery's metadata: just before its first ledger write, the live writer changes its
    ensemble, so the swap's compare-and-set finds the version moved and must read and apply again."""

    def __init__(self, store: Any, race: Callable[[], Any]) -> None:
        super().__init__(store)
        self.race, self.writes = race, 0

    def write_ledger(self, ledger_id: int, metadata: LedgerMetadata, version: int) -> int:
        self.writes += 1
        if self.writes == 1:
            threads.blockingCallFromThread(reactor, self.race)
        return super().write_ledger(ledger_id, metadata, version)


@twisted_test
async def test_a_writers_ensemble_change_during_the_swap_is_kept(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(6)
    try:
        writer = await bounded(cluster.client(seed=21).create_ledger(3, 3, 2, password=PW))
        await bounded(writer.add_many(payloads(20)))
        dead = writer.ensemble[2]
        await bounded(cluster.bookie(dead).stop())
        await bounded(writer.add_many(payloads(5)))  # segment 1 without the dead bookie
        first = list(writer.metadata.segments[0].ensemble)
        target = outsider(cluster, first, writer.ensemble)

        async def change() -> None:  # a bookie of the writer's ensemble goes: its next add replaces it
            await bounded(cluster.bookie(writer.ensemble[2]).stop())
            await bounded(writer.add_many(payloads(5)))

        layout = WriterRacesTheSwap(cluster.store, lambda: defer.ensureDeferred(change()))
        client = Client(layout, reactor, rng=random.Random(3), request_timeout_ms=1500)
        try:
            report = await bounded(BookieRecovery(client, RecoveryOptions((dead,), target=target)).run())
        finally:
            await bounded(client.close())
        assert report.ledgers_recovered == 1 and layout.writes == 2  # the lost CAS, then the one that won
        md = (await in_thread(cluster.layout.read_ledger, writer.ledger_id)).value  # type: ignore[union-attr]
        assert md.state is LedgerState.OPEN and len(md.segments) == 3  # both of the writer's changes kept
        assert list(md.segments[0].ensemble) == [target if b == dead else b for b in first]
        assert md.segments[2].ensemble == tuple(writer.ensemble)
        await bounded(writer.add_many(payloads(2)))
        await bounded(writer.close())  # the writer's close keeps the swap too
        closed = (await in_thread(cluster.layout.read_ledger, writer.ledger_id)).value  # type: ignore[union-attr]
        assert closed.state is LedgerState.CLOSED and closed.segments == md.segments
        handle = await bounded(admin_open(cluster.client(seed=2), writer.ledger_id, recovery=False))
        found, failures = await bounded(read_from_bookie(handle, target, list(range(20))))
        assert failures == [] and len(found) == 20
    finally:
        await cluster.stop()


@twisted_test
async def test_repairs_asking_at_once_share_one_read_of_the_registered_bookies(
    store_target: StoreTarget,
) -> None:
    store = store_target.open()
    layout = Layout(store)
    await in_thread(layout.init_cluster)
    await in_thread(layout.register_bookie, "127.0.0.1:3181")
    metered = MeteredStore(store, OpsRate(1_000_000))
    client = Client(Layout(metered), reactor)
    try:
        await bounded(defer.ensureDeferred(RegisteredBookies(client).lists()))
        one_read = metered.rate.requests
        shared = RegisteredBookies(client)  # 16 repairs meet its cache empty
        answers = await bounded(
            defer.gatherResults([defer.ensureDeferred(shared.lists()) for _ in range(16)])
        )
        assert answers == [(["127.0.0.1:3181"], [])] * 16
        assert metered.rate.requests == 2 * one_read
    finally:
        await bounded(client.close())
