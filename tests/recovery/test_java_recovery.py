"""Issue 11 item 5: manual recovery on a Java BookKeeper 4.14.8 cluster's data. bkctl bookies serve
copies of the Java bookies' directories with the ledger metadata of its ZooKeeper dump; bookie3 of
that cluster plays the dead bookie; every ledger it held is copied to a spare bkctl bookie and reads
back, on every bookie of its write set, with the Java payloads."""

from __future__ import annotations

from pathlib import Path

from bkctl.client.single_bookie import read_from_bookie
from bkctl.recovery.bookie_recovery import BookieRecovery, RecoveryOptions, admin_open
from bkctl.recovery.fragments import fragments
from bkctl.server.config import load_config
from bkctl.server.service import BookieService
from tests.client.cluster import Cluster, bounded
from tests.client.test_java_data import prepare
from tests.server_net.live import bookie_flags, in_thread, start_bookie, twisted_test

DEAD = "127.0.0.1:33183"


@twisted_test
async def test_recover_java_bookie3_onto_a_bkctl_spare(tmp_path: Path) -> None:
    uri = await in_thread(prepare, tmp_path)
    cluster = await Cluster(tmp_path, uri).start(0)
    try:
        for n in (1, 2):  # bookie3 is dead: never started
            config = load_config(bookie_flags(tmp_path / f"b{n}", bookieId=f"127.0.0.1:3318{n}"))
            cluster.bookies.append(await bounded(BookieService(config, uri).start()))
        spare = await start_bookie(tmp_path, "spare", uri)  # not b3: that is the Java bookie3's copy
        cluster.bookies.append(spare)
        client = cluster.client()
        for service in cluster.bookies:  # the Java ids name ports we do not listen on
            client.bookies.set_address(service.bookie_id, "127.0.0.1", service.port)
        report = await bounded(BookieRecovery(client, RecoveryOptions((DEAD,))).run(), 60)
        assert report.ledgers_unrecoverable == [] and report.ledgers_skipped == [], report.as_dict()
        assert report.ledgers_recovered == report.ledgers_total > 0 and report.copied.entries > 0
        for ledger_id in range(4):
            handle = await bounded(admin_open(client, ledger_id, recovery=False))
            md = handle.metadata
            assert all(DEAD not in s.ensemble for s in md.segments), (ledger_id, md.segments)
            for fragment in fragments(ledger_id, md, md.last_entry_id):
                wanted = list(fragment.entries())
                found, failures = await bounded(read_from_bookie(handle, fragment.bookie, wanted))
                assert failures == [], (ledger_id, fragment.bookie, failures)
                assert [e.payload for e in found] == [f"L{ledger_id}-E{e}".encode() for e in wanted]
        assert str(spare.bookie_id) in {
            b
            for i in range(4)
            for s in (await bounded(admin_open(client, i, recovery=False))).metadata.segments
            for b in s.ensemble
        }
    finally:
        await cluster.stop()
