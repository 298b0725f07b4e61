"""The auditor's placement check and the workers' repair on real bookies (6, in 3 racks x 2, Pulsar's
rack map): a closed ledger planted with two copies in one rack is found, marked
(repairedPlacementPolicyNotAdheringBookieEnable), and a worker moves one replica, copy then swap; the
ledger then spans the racks, every entry on every bookie of its write set, no mark left."""

from __future__ import annotations

from pathlib import Path

from twisted.internet import reactor

from bkctl.client.placement import RACKAWARE
from bkctl.metadata.layout import Layout
from bkctl.metadata.racks import RackEntry, set_rack
from bkctl.recovery.auditor import AuditorConfig
from bkctl.recovery.daemon import autorecovery_daemon
from bkctl.recovery.placement_check import check_placement, ledger_placement
from bkctl.recovery.policy import placement_from_properties
from tests.client.cluster import Cluster, bounded
from tests.client.test_ledger import PW, payloads
from tests.recovery.test_autorecovery import FAST
from tests.recovery.test_bookie_recovery import assert_fully_replicated
from tests.recovery.test_daemon import until
from tests.server_net.live import in_thread, twisted_test

PROPERTIES = {
    "ensemblePlacementPolicy": RACKAWARE,
    "reppDnsResolverClass": "org.apache.pulsar.bookie.rackawareness.BookieRackAffinityMapping",
    "minNumRacksPerWriteQuorum": "3",
}


async def racked_cluster(tmp_path: Path) -> tuple[Cluster, list[str], dict[str, str]]:
    """Six bookies, 3 racks x 2 in Pulsar's rack map."""
    cluster = await Cluster(tmp_path).start(6)
    assert cluster.store is not None
    ids = sorted(str(b.bookie_id) for b in cluster.bookies)
    racks = {bookie: f"/rack{i // 2}" for i, bookie in enumerate(ids)}
    for bookie, rack in racks.items():
        await in_thread(set_rack, cluster.store, RackEntry("default", bookie, rack))
    return cluster, ids, racks


@twisted_test
async def test_a_writers_ensembles_and_its_ensemble_change_span_the_racks(tmp_path: Path) -> None:
    cluster, _, racks = await racked_cluster(tmp_path)
    try:
        assert cluster.store is not None
        writer = cluster.client(seed=4)
        writer.placement = placement_from_properties(PROPERTIES, cluster.store, writer.rng)
        lh = await bounded(writer.create_ledger(3, 3, 2, password=PW))
        assert len({racks[b] for b in lh.ensemble}) == 3
        await bounded(lh.add_many(payloads(20)))
        failed = lh.ensemble[1]
        await bounded(cluster.bookie(failed).stop())
        await bounded(lh.add_many(payloads(20)))  # the ensemble changes: its rack-mate takes the place
        segments = lh.metadata.segments
        assert len(segments) == 2 and failed not in segments[1].ensemble
        assert len({racks[b] for b in segments[1].ensemble}) == 3
        await bounded(lh.close())
    finally:
        await cluster.stop()


@twisted_test
async def test_a_ledger_in_two_racks_is_found_and_moved_to_three(tmp_path: Path) -> None:
    cluster, ids, racks = await racked_cluster(tmp_path)
    daemon = None
    try:
        assert cluster.store is not None and cluster.layout is not None
        layout = cluster.layout
        # planted: rack0 twice, rack1 once, written by a client that does not know the racks
        writer = cluster.client(seed=3)
        lh = await bounded(writer.create_ledger(3, 3, 2, password=PW, ensemble=[ids[0], ids[1], ids[2]]))
        await bounded(lh.add_many(payloads(40)))
        await bounded(lh.close())
        policy = placement_from_properties(PROPERTIES, cluster.store)
        report = await in_thread(check_placement, layout, policy)
        assert report.closed_audited == 1 and list(report.not_adhering) == [lh.ledger_id]
        (segment,) = await in_thread(ledger_placement, policy, lh.metadata)
        assert segment.move in (ids[0], ids[1]) and "spans 2 rack(s), needs 3" in segment.violations[0].reason

        config = AuditorConfig(placement_check_interval_s=3600, repair_placement=True)  # due at once
        daemon = autorecovery_daemon(
            Layout(cluster.store), reactor, "ar", auditor_config=config, worker_config=FAST,
            placement_policy=placement_from_properties(PROPERTIES, cluster.store),
        )  # fmt: skip
        await bounded(daemon.start())

        def spans_three() -> bool:
            md = layout.read_ledger(lh.ledger_id).value
            return (
                not list(layout.underreplicated_ids())
                and len({racks[b] for b in md.segments[0].ensemble}) == 3
            )

        await until(spans_three, "one replica moved to the third rack")
        await assert_fully_replicated(cluster, lh.ledger_id, {segment.move})
        auditor = daemon.auditor
        assert auditor is not None and auditor.stats.placement_checks >= 1
        assert auditor.stats.ledgers_not_adhering == 1  # what the check found (Java's gauge)
        assert daemon.status()["NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY"] == 1
    finally:
        if daemon is not None:
            await bounded(daemon.stop())
        await cluster.stop()
