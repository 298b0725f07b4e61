"""bkctl client <-> bkctl bookies over TLS (START_TLS then v2 frames, as Java's v2 client does): adds,
reads and fencing; client certificates required and missing; a certificate from the wrong CA; a plain
client on TLS bookies (served, as by Java) and a TLS client on a bookie without TLS (refused)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from twisted.internet import reactor

from bkctl.client.client import Client
from bkctl.errors import FencedError, UnauthorizedError, UnavailableError
from bkctl.server.service import BookieService
from bkctl.tls import JAVA_PROVIDER_FACTORY, TlsSettings
from tests.client.cluster import REQUEST_TIMEOUT_MS, Cluster, bounded
from tests.server_net.live import start_bookie, twisted_test
from tests.tls_certs import Certificates, Pem, write_certificates

PW = b"pw"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Certificates]:
    yield write_certificates(tmp_path_factory.mktemp("certs"))


def tls_keys(identity: Pem, trust: Path | None = None) -> dict[str, str]:
    """A bookie's TLS keys as in a Java bk_server.conf; with `trust`, client certificates are required."""
    keys = {
        "tlsProviderFactoryClass": JAVA_PROVIDER_FACTORY,
        "tlsCertificatePath": str(identity.cert),
        "tlsKeyStore": str(identity.key),
        "tlsKeyStoreType": "PEM",
    }
    if trust is not None:
        keys.update(tlsTrustStore=str(trust), tlsTrustStoreType="PEM", tlsClientAuthentication="true")
    return keys


async def tls_cluster(tmp_path: Path, count: int, keys: dict[str, str]) -> Cluster:
    cluster = await Cluster(tmp_path).start(0)
    for index in range(count):
        cluster.bookies.append(await start_bookie(tmp_path, f"b{index + 1}", cluster.uri, **keys))
    return cluster


def tls_client(cluster: Cluster, settings: TlsSettings | None, seed: int = 1) -> Client:
    assert cluster.layout is not None
    client = Client(
        cluster.layout, reactor, rng=random.Random(seed), tls=settings, request_timeout_ms=REQUEST_TIMEOUT_MS
    )
    cluster.clients.append(client)
    return client


def handshakes(bookies: list[BookieService]) -> tuple[int, int]:
    """(handshakes done, handshakes failed) over these bookies."""
    metrics = [bookie.factory.metrics for bookie in bookies]
    return sum(m.tls_handshakes for m in metrics), sum(m.tls_handshake_failures for m in metrics)


@twisted_test
async def test_adds_reads_and_fencing_over_tls(tmp_path: Path, certs: Certificates) -> None:
    cluster = await tls_cluster(tmp_path, 3, tls_keys(certs.bookie))
    try:
        trust = TlsSettings(trust_path=certs.ca, hostname_verification=True)  # 127.0.0.1 is in the cert
        writer = tls_client(cluster, trust)
        lh = await bounded(writer.create_ledger(3, 2, 2, password=PW))
        data = [b"entry-%d" % i * (i % 7 + 1) for i in range(200)]
        assert await bounded(lh.add_many(data)) == list(range(200))
        assert [e.payload for e in await bounded(lh.read(0, 199))] == data
        assert handshakes(cluster.bookies) == (3, 0)

        recovered = await bounded(tls_client(cluster, trust, 2).open_ledger(lh.ledger_id, PW, recovery=True))
        assert recovered.is_closed and recovered.last_add_confirmed == 199
        with pytest.raises(FencedError):
            await bounded(lh.add(b"after the fence"))
    finally:
        await cluster.stop()


@twisted_test
async def test_client_certificates_required_presented_and_missing(
    tmp_path: Path, certs: Certificates
) -> None:
    cluster = await tls_cluster(tmp_path, 1, tls_keys(certs.bookie, trust=certs.ca))
    try:
        with_cert = TlsSettings(
            certificate_path=certs.client.cert,
            key_path=certs.client.key,
            trust_path=certs.ca,
            client_auth=True,
        )
        lh = await bounded(tls_client(cluster, with_cert).create_ledger(1, 1, 1, password=PW))
        assert await bounded(lh.add_many([b"a", b"b"])) == [0, 1]
        assert handshakes(cluster.bookies) == (1, 0)

        without = tls_client(cluster, TlsSettings(trust_path=certs.ca), 2)
        with pytest.raises(UnavailableError):
            late = await bounded(without.create_ledger(1, 1, 1, password=PW))
            await bounded(late.add(b"refused"))
        assert handshakes(cluster.bookies)[1] >= 1  # logged with the peer and counted

        other_ca = TlsSettings(
            certificate_path=certs.other_client.cert,
            key_path=certs.other_client.key,
            trust_path=certs.ca,
            client_auth=True,
        )
        with pytest.raises(UnavailableError):
            late = await bounded(tls_client(cluster, other_ca, 3).create_ledger(1, 1, 1, password=PW))
            await bounded(late.add(b"refused"))
    finally:
        await cluster.stop()


@twisted_test
async def test_a_bookie_certificate_from_another_ca_is_rejected(tmp_path: Path, certs: Certificates) -> None:
    cluster = await tls_cluster(tmp_path, 1, tls_keys(certs.other_bookie))
    try:
        client = tls_client(cluster, TlsSettings(trust_path=certs.ca))
        with pytest.raises(UnavailableError):
            lh = await bounded(client.create_ledger(1, 1, 1, password=PW))
            await bounded(lh.add(b"never sent"))
        assert handshakes(cluster.bookies)[0] == 0  # the client gave up in the handshake
    finally:
        await cluster.stop()


@twisted_test
async def test_plain_and_tls_clients_against_tls_and_plain_bookies(
    tmp_path: Path, certs: Certificates
) -> None:
    cluster = await tls_cluster(tmp_path, 1, tls_keys(certs.bookie))
    try:
        # A bookie with TLS still serves a client that never asks for it (Java's behaviour).
        lh = await bounded(tls_client(cluster, None).create_ledger(1, 1, 1, password=PW))
        assert await bounded(lh.add(b"in the clear")) == 0
        assert handshakes(cluster.bookies) == (0, 0)
        # A bookie without TLS answers START_TLS with EBADREQ: the TLS client gives that bookie up and
        # writes to the TLS bookie instead (an ensemble change).
        plain = await start_bookie(tmp_path, "plain", cluster.uri)
        cluster.bookies.append(plain)
        client = tls_client(cluster, TlsSettings(trust_path=certs.ca), 2)
        moved = await bounded(client.create_ledger(1, 1, 1, password=PW, ensemble=[plain.bookie_id]))
        assert await bounded(moved.add(b"not over plain TCP")) == 0
        assert moved.ensemble == [cluster.bookies[0].bookie_id]
        assert plain.factory.metrics.bad_requests >= 1 and handshakes(cluster.bookies) == (1, 0)
    finally:
        await cluster.stop()


@twisted_test
async def test_a_plain_client_on_a_bookie_requiring_tls(tmp_path: Path, certs: Certificates) -> None:
    # tlsRequired (bkctl's key): nothing is served before the handshake; requests get EUA, as a Java
    # bookie answers a connection that has not authenticated.
    cluster = await tls_cluster(tmp_path, 1, {**tls_keys(certs.bookie), "tlsRequired": "true"})
    try:
        lh = await bounded(
            tls_client(cluster, TlsSettings(trust_path=certs.ca)).create_ledger(1, 1, 1, password=PW)
        )
        assert await bounded(lh.add(b"protected")) == 0
        plain = tls_client(cluster, None, 2)
        with pytest.raises(UnauthorizedError):
            reader = await bounded(plain.open_ledger(lh.ledger_id, PW, recovery=False))
            await bounded(reader.read(0, 0))
        assert cluster.bookies[0].factory.metrics.tls_required_refusals >= 1
    finally:
        await cluster.stop()


@twisted_test
async def test_host_names_are_checked_only_when_asked(tmp_path: Path, certs: Certificates) -> None:
    # Java's default (tlsHostnameVerificationEnabled=false): the chain is checked, not the name.
    cluster = await tls_cluster(tmp_path, 1, tls_keys(certs.elsewhere))  # for elsewhere.test only
    try:
        lh = await bounded(
            tls_client(cluster, TlsSettings(trust_path=certs.ca)).create_ledger(1, 1, 1, password=PW)
        )
        assert await bounded(lh.add(b"chain checked")) == 0
        checking = tls_client(cluster, TlsSettings(trust_path=certs.ca, hostname_verification=True), 2)
        with pytest.raises(UnavailableError):
            late = await bounded(checking.create_ledger(1, 1, 1, password=PW))
            await bounded(late.add(b"name checked: 127.0.0.1 is not elsewhere.test"))
        assert handshakes(cluster.bookies)[0] == 1  # the refused one ends on the bookie side soon after
    finally:
        await cluster.stop()


@twisted_test
async def test_new_connections_pick_up_changed_client_certificate_files(
    tmp_path: Path, certs: Certificates
) -> None:
    """tlsCertFilesRefreshDurationSeconds on the client: its certificate and key files are replaced
    (one from a CA the bookie does not trust, then one it does) and the next connections made after
    the refresh period present the new ones; no client is rebuilt."""
    import shutil
    import time

    from tests.client.cluster import sleep

    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    shutil.copy(certs.other_client.cert, cert)
    shutil.copy(certs.other_client.key, key)
    settings = TlsSettings(cert, key, trust_path=certs.ca, client_auth=True, refresh_s=1)
    cluster = await tls_cluster(tmp_path, 1, tls_keys(certs.bookie, trust=certs.ca))
    try:

        async def write(seed: int) -> bool:
            try:
                lh = await bounded(tls_client(cluster, settings, seed).create_ledger(1, 1, 1, password=PW))
                await bounded(lh.add(b"x"))
            except UnavailableError:
                return False
            return True

        assert not await write(1)  # the bookie does not trust other_ca
        shutil.copy(certs.client.cert, cert)
        shutil.copy(certs.client.key, key)
        deadline, seed = time.monotonic() + 30, 2
        while not await write(seed):
            assert time.monotonic() < deadline, "the client never presented its new certificate"
            seed += 1
            await sleep(0.2)
        assert handshakes(cluster.bookies)[0] >= 1
    finally:
        await cluster.stop()
