"""Recovery of a Java BookKeeper 4.14.8 cluster's data, by manual recovery and by autorecovery. bkctl bookies
serve copies of the Java bookies' directories under their Java ids with the ledger metadata of its
ZooKeeper dump; bookie3 of that cluster plays the dead bookie (never started). Every ledger it held is
copied to a spare bkctl bookie, by `recover` or by an autorecovery daemon taking over the Java
auditor's state, and reads back, on every bookie of its write set, with the Java payloads. No address is
given by hand: the client finds the Java ids' bookies through their registrations."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from twisted.internet import reactor

from bkctl.client.client import Client
from bkctl.client.single_bookie import read_from_bookie
from bkctl.metadata.layout import Layout
from bkctl.metadata.underreplication import underreplicated_subpath
from bkctl.model import LedgerState
from bkctl.recovery.bookie_recovery import BookieRecovery, RecoveryOptions, admin_open
from bkctl.recovery.daemon import autorecovery_daemon
from bkctl.recovery.fragments import fragments
from bkctl.server.config import load_config
from bkctl.server.service import BookieService
from tests.client.cluster import Cluster, bounded
from tests.client.test_java_data import DUMP_5, prepare
from tests.recovery.test_autorecovery import FAST
from tests.recovery.test_daemon import until
from tests.server_net.live import bookie_flags, in_thread, start_bookie, twisted_test

DEAD = "127.0.0.1:33183"
LEDGERS = range(4)  # dump 1: ledgers 0-3, all with a copy on bookie3; ledger 1 still OPEN


async def java_cluster_without_bookie3(tmp_path: Path) -> tuple[Cluster, BookieService]:
    """Bookie1 and bookie2 under their Java ids, and a spare bkctl bookie (the last one)."""
    uri = await in_thread(prepare, tmp_path)
    cluster = await Cluster(tmp_path, uri).start(0)
    for n in (1, 2):
        config = load_config(bookie_flags(tmp_path / f"b{n}", bookieId=f"127.0.0.1:3318{n}"))
        cluster.bookies.append(await bounded(BookieService(config, uri).start()))
    spare = await start_bookie(tmp_path, "spare", uri)  # not b3: that is the Java bookie3's copy
    cluster.bookies.append(spare)
    return cluster, spare


async def assert_healed_with_java_payloads(client: Client, spare: BookieService) -> None:
    ensembles: set[str] = set()
    for ledger_id in LEDGERS:
        handle = await bounded(admin_open(client, ledger_id, recovery=False))
        md = handle.metadata
        assert md.state is LedgerState.CLOSED and all(DEAD not in s.ensemble for s in md.segments), md
        ensembles.update(b for s in md.segments for b in s.ensemble)
        for fragment in fragments(ledger_id, md, md.last_entry_id):
            wanted = list(fragment.entries())
            found, failures = await bounded(read_from_bookie(handle, fragment.bookie, wanted))
            assert failures == [], (ledger_id, fragment.bookie, failures)
            assert [e.payload for e in found] == [f"L{ledger_id}-E{e}".encode() for e in wanted]
    assert str(spare.bookie_id) in ensembles


@twisted_test
async def test_recover_java_bookie3_onto_a_bkctl_spare(tmp_path: Path) -> None:
    cluster, spare = await java_cluster_without_bookie3(tmp_path)
    try:
        client = cluster.client()
        report = await bounded(BookieRecovery(client, RecoveryOptions((DEAD,))).run(), 60)
        assert report.ledgers_unrecoverable == [] and report.ledgers_skipped == [], report.as_dict()
        assert report.ledgers_recovered == report.ledgers_total > 0 and report.copied.entries > 0
        await assert_healed_with_java_payloads(client, spare)
    finally:
        await cluster.stop()


def take_java_autorecovery_state(layout: Layout) -> None:
    """The under-replication tree Java's autorecovery left in dump 5 (LAYOUT, the auditor node naming a
    Java daemon long gone, lostBookieRecoveryDelay 0), and a mark Java's auditor wrote for ledger 3,
    byte for byte in its format (text UnderreplicatedLedgerFormat)."""
    dump = json.loads(DUMP_5.read_text())
    for path, node in dump.items():
        if path.startswith("/ledgers/underreplication/"):
            data = base64.b64decode(node["data_b64"])
            if layout.store.exists(path) is None:
                layout.store.create(path, data, make_parents=True)
            else:  # made by init_cluster
                layout.store.set(path, data, -1)
    mark = f'replica: "{DEAD}"\nctime: 1795313617468\n'.encode()
    path = "/ledgers/underreplication/ledgers" + underreplicated_subpath(3)
    layout.store.create(path, mark, make_parents=True)


@twisted_test
async def test_autorecovery_takes_over_a_java_clusters_state_and_heals_it(tmp_path: Path) -> None:
    cluster, spare = await java_cluster_without_bookie3(tmp_path)
    layout = cluster.layout
    assert layout is not None
    daemon = autorecovery_daemon(layout, reactor, "bkctl-ar", worker_config=FAST)
    try:
        await in_thread(take_java_autorecovery_state, layout)
        assert await in_thread(layout.last_elected_auditor) == "127.0.0.1:33189"
        await bounded(daemon.start())

        def healed() -> bool:
            named = [
                i for i, md in layout.read_ledgers(LEDGERS) if any(DEAD in s.ensemble for s in md.segments)
            ]
            return not list(layout.underreplicated_ids()) and not named

        await until(healed, "no mark left and no ensemble naming Java's bookie3", 60)
        assert await in_thread(layout.last_elected_auditor) == "bkctl-ar"
        assert DEAD in daemon.status()["lost_bookies"]
        await assert_healed_with_java_payloads(cluster.client(), spare)
        ledger_1 = await bounded(admin_open(cluster.client(seed=3), 1, recovery=False))
        assert ledger_1.metadata.last_entry_id == 49  # fenced and closed where Java's worker closed it
    finally:
        await bounded(daemon.stop())
        await cluster.stop()
