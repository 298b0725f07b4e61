"""Our client on data a Java BookKeeper 4.14.8 cluster wrote: the three bookies of snapshot 1 (served by
bkctl bookies from copies of their directories) with the ledger metadata of ZooKeeper dump 1.

Ledger 1's writer stopped without closing (OPEN in dump 1); Java's ReplicationWorker later recovered
it, and dump 5 records the result: CLOSED, last entry 49, length 290. Our recovery must reach exactly
that. Ledgers 0 and 3 (closed) read back with the Java payloads `L<ledger>-E<entry>`.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from bkctl.model import LedgerState
from bkctl.protocol.metadata_format import decode_ledger_metadata
from bkctl.server import cookies
from bkctl.server.config import load_config
from bkctl.server.service import BookieService
from tests.client.cluster import Cluster, bounded
from tests.conftest import JAVA_BOOKIES, JAVA_ZK_DUMPS
from tests.server_net.live import bookie_flags, in_thread, twisted_test

JAVA_INSTANCE_ID = "76a3f9d8-1a95-4d6d-9ea6-d348aaecafd7"
PASSWORD = b"testpasswd"
DUMP_1 = JAVA_ZK_DUMPS / "zk-dump-1-after-ledgers.json"
DUMP_5 = JAVA_ZK_DUMPS / "zk-dump-5-final-with-wire-capture-ledgers.json"


def ledger_znode(dump: Path, ledger_id: int) -> bytes:
    node = json.loads(dump.read_text())[f"/ledgers/00/0000/L{ledger_id:04d}"]
    return base64.b64decode(node["data_b64"])


def prepare(tmp_path: Path) -> str:
    """Copies of bookie1-3, an SQLite cluster with the Java instance id, ledgers 0-3 from dump 1 and
    cookies rewritten for the copies' directories (what `bkctl bookie cookie update` does)."""
    path = tmp_path / "metadata.db"
    with SqliteStore(path) as store:
        layout = Layout(store)
        layout.init_cluster(instance_id=JAVA_INSTANCE_ID)
        for ledger_id in range(4):
            store.create(layout.ledger_path(ledger_id), ledger_znode(DUMP_1, ledger_id), make_parents=True)
        for n in (1, 2, 3):
            base = tmp_path / f"b{n}"
            shutil.copytree(JAVA_BOOKIES / f"bookie{n}", base)
            config = load_config(bookie_flags(base, bookieId=f"127.0.0.1:3318{n}"))
            cookies.update_cookies(config, layout, f"127.0.0.1:3318{n}")
    return f"sqlite://{path}"


async def start_java_bookies(cluster: Cluster, tmp_path: Path, uri: str) -> None:
    """bkctl bookies serving the copies `prepare` made of bookie1-3, under their Java bookie ids."""
    for n in (1, 2, 3):
        config = load_config(bookie_flags(tmp_path / f"b{n}", bookieId=f"127.0.0.1:3318{n}"))
        cluster.bookies.append(await bounded(BookieService(config, uri).start()))


@twisted_test
async def test_recovery_and_reads_of_java_written_ledgers(tmp_path: Path) -> None:
    uri = await in_thread(prepare, tmp_path)
    cluster = await Cluster(tmp_path, uri).start(0)
    try:
        await start_java_bookies(cluster, tmp_path, uri)
        client = cluster.client()  # the Java ids name ports we do not listen on: found by registration

        recovered = await bounded(client.open_ledger(1, PASSWORD))
        java = decode_ledger_metadata(ledger_znode(DUMP_5, 1))
        assert (java.state, java.last_entry_id, java.length) == (LedgerState.CLOSED, 49, 290)
        assert (recovered.last_add_confirmed, recovered.length) == (49, 290)
        assert recovered.metadata.state is LedgerState.CLOSED
        entries = await bounded(recovered.read(0, 49))
        assert [e.payload for e in entries] == [f"L1-E{i}".encode() for i in range(50)]

        for ledger_id, count in ((0, 1000), (3, 200)):
            handle = await bounded(client.open_ledger(ledger_id, PASSWORD))
            assert handle.is_closed and handle.last_add_confirmed == count - 1
            got = await bounded(handle.read(0, count - 1))
            assert [e.payload for e in got] == [f"L{ledger_id}-E{i}".encode() for i in range(count)]
    finally:
        await cluster.stop()
