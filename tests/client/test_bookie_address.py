"""Bookie ids that are not the bookie's address (Java's `bookieId` option, 4.12+): the client connects
where the bookie's registration says (its `bookie-rpc` endpoint), as Java's DefaultBookieAddressResolver
does, so ledgers on such bookies are written, read and recovered with no address given by hand."""

from __future__ import annotations

from pathlib import Path

from bkctl.protocol import metadata_format as mf
from tests.client.cluster import Cluster, bounded
from tests.client.test_ledger import PW, payloads
from tests.server_net.live import in_thread, start_bookie, twisted_test


@twisted_test
async def test_named_bookies_are_reached_at_their_registered_endpoint(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(0)
    try:
        for name in ("alpha", "beta", "gamma"):
            cluster.bookies.append(await start_bookie(tmp_path, name, cluster.uri, bookieId=f"bookie-{name}"))
        client = cluster.client()
        writer = await bounded(client.create_ledger(3, 2, 2, password=PW))
        assert sorted(writer.ensemble) == ["bookie-alpha", "bookie-beta", "bookie-gamma"]
        await bounded(writer.add_many(payloads(50)))
        await bounded(writer.close())
        reader = await bounded(cluster.client(seed=2).open_ledger(writer.ledger_id, password=PW))
        entries = await bounded(reader.read(0, 49))
        assert [e.payload for e in entries] == payloads(50)
    finally:
        await cluster.stop()


@twisted_test
async def test_the_address_comes_from_the_registration_not_the_id(tmp_path: Path) -> None:
    """A host:port id whose bookie listens elsewhere (a Java cluster's ids on copied data dirs)."""
    cluster = await Cluster(tmp_path).start(0)
    try:
        cluster.bookies.append(await start_bookie(tmp_path, "b1", cluster.uri, bookieId="127.0.0.1:1"))
        assert cluster.layout is not None
        port = cluster.bookies[0].port
        info = await in_thread(cluster.layout.bookie_service_info, "127.0.0.1:1")
        assert mf.BookieEndpoint("bookie", port, "127.0.0.1", "bookie-rpc") in info.endpoints
        assert await in_thread(cluster.layout.bookie_rpc_address, "127.0.0.1:1") == ("127.0.0.1", port)
        writer = await bounded(cluster.client().create_ledger(1, 1, 1, password=PW))
        await bounded(writer.add_many(payloads(5)))
        assert await in_thread(cluster.layout.bookie_rpc_address, "127.0.0.1:2") is None  # not registered
    finally:
        await cluster.stop()
