"""SASL DIGEST-MD5 between bkctl's client and bkctl bookies (Java's SASLBookieAuthProviderFactory and
SASLClientProviderFactory), on v2 and v3 connections: an allowed account writes and reads; no
credentials, a wrong password or an account outside saslJaasClientAllowedIds is refused and nothing
is written."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from twisted.internet import reactor

from bkctl.client.client import Client
from bkctl.errors import AccessDeniedError, UnauthorizedError
from bkctl.sasl import BOOKIE_FACTORY, ClientSasl
from tests.client.cluster import REQUEST_TIMEOUT_MS, Cluster, bounded
from tests.server_net.live import in_thread, start_bookie, twisted_test

PW = b"pw"
JAAS = """
Bookie {
    org.apache.zookeeper.server.auth.DigestLoginModule required
    user_bookkeeperclient="clientpwd"
    user_stranger="strangerpwd";
};
"""
ALLOWED = ClientSasl("bookkeeperclient", "clientpwd")


@pytest.fixture(autouse=True)
def jaas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "jaas.conf"
    path.write_text(JAAS)
    monkeypatch.setenv("BKCTL_JAAS", str(path))


async def sasl_cluster(tmp_path: Path, count: int) -> Cluster:
    cluster = await Cluster(tmp_path).start(0)
    for index in range(count):
        bookie = await start_bookie(
            tmp_path, f"b{index + 1}", cluster.uri, bookieAuthProviderFactoryClass=BOOKIE_FACTORY
        )
        cluster.bookies.append(bookie)
    return cluster


def client(cluster: Cluster, sasl: ClientSasl | None, protocol: str, seed: int = 1) -> Client:
    assert cluster.layout is not None
    made = Client(
        cluster.layout,
        reactor,
        rng=random.Random(seed),
        protocol=protocol,
        sasl=sasl,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    )
    cluster.clients.append(made)
    return made


def refusals(cluster: Cluster) -> int:
    return sum(bookie.factory.metrics.sasl_refusals for bookie in cluster.bookies)


@pytest.mark.parametrize("protocol", ["v2", "v3"])
@twisted_test
async def test_allowed_writes_and_reads_the_others_are_refused(tmp_path: Path, protocol: str) -> None:
    cluster = await sasl_cluster(tmp_path, 2)
    try:
        lh = await bounded(client(cluster, ALLOWED, protocol).create_ledger(2, 2, 2, password=PW))
        data = [b"entry-%d" % i for i in range(50)]
        assert await bounded(lh.add_many(data)) == list(range(50))
        assert [e.payload for e in await bounded(lh.read(0, 49))] == data
        assert refusals(cluster) == 0

        for seed, sasl, error in (
            (2, None, UnauthorizedError),  # no credentials: every request answered EUA
            (3, ClientSasl("bookkeeperclient", "wrong"), AccessDeniedError),
            (4, ClientSasl("stranger", "strangerpwd"), AccessDeniedError),  # not in .*bookkeeper.*
        ):
            other = client(cluster, sasl, protocol, seed)
            with pytest.raises(error):
                await bounded(other.open_ledger(lh.ledger_id, PW, recovery=True))
        assert refusals(cluster) >= 2
        # Nothing the refused clients sent was applied: the ledger is still open and unfenced.
        assert await bounded(lh.add(b"still the writer's")) == 50
    finally:
        await cluster.stop()


@twisted_test
async def test_the_online_audit_reads_authenticate(tmp_path: Path) -> None:
    """`audit --online` asks the bookies over blocking sockets (pipeline/online.py): with the
    credentials it gets the entries, without them one problem row naming the bookie."""
    from bkctl.pipeline.online import OnlineBookie, holdings

    cluster = await sasl_cluster(tmp_path, 1)
    try:
        lh = await bounded(client(cluster, ALLOWED, "v2").create_ledger(1, 1, 1, password=PW))
        assert await bounded(lh.add_many([b"a", b"b", b"c"])) == [0, 1, 2]
        bookie = cluster.bookies[0]
        host, port = bookie.bookie_id.rsplit(":", 1)
        for sasl in (ALLOWED, None):
            online = OnlineBookie(bookie.bookie_id, host, int(port), sasl)
            rows = await in_thread(lambda o=online: list(holdings(o, [lh.ledger_id], None)))
            problems = [row[7] for row in rows if row[1] == -1]  # pipeline.inventory.problem_row
            if sasl is None:
                assert len(problems) == 1 and bookie.bookie_id in problems[0], rows
            else:
                assert rows and not problems, rows
    finally:
        await cluster.stop()
