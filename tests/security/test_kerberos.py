"""Kerberos (SASL GSSAPI) against a real MIT KDC (the session's `realm`): to a ZooKeeper that
authenticates with GSSAPI, and between bkctl's client and bkctl's bookies, with the JAAS sections Java
reads (Krb5LoginModule, keyTab, principal). With the ticket everything works; without one, or as a
principal outside saslJaasClientAllowedIds, one line and exit 9, at once, and nothing is written."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from bkctl.errors import AccessDeniedError, ExitCode, ProtocolError, UnauthorizedError, UsageError
from bkctl.kerberos import LAYER_NONE, GssapiClient, GssapiServer, KerberosLogin
from bkctl.metadata.layout import Layout
from bkctl.metadata.retry import RetryPolicy
from bkctl.metadata.zk_auth import ZkAuth, zk_auth
from bkctl.metadata.zk_server import ZooKeeperServer
from bkctl.metadata.zookeeper import ZooKeeperStore
from bkctl.sasl import BOOKIE_FACTORY, CLIENT_FACTORY, BookieSaslKeys, ClientSasl, bookie_sasl, client_sasl
from tests.client.cluster import Cluster, bounded
from tests.conftest import REPO
from tests.security.conftest import KRB_BOOKIE, KRB_CLIENT, KRB_INTRUDER, Realm, secure_conf
from tests.security.test_bookie_sasl import client
from tests.server_net.live import in_thread, start_bookie, twisted_test

PW = b"pw"
COMMAND_S = 90.0  # a bound far beyond a command's own: a refusal retried to a deadline fails the test
LONG_RETRY = RetryPolicy(deadline_ms=600_000)


def login(realm: Realm, name: str) -> KerberosLogin:
    return KerberosLogin(realm.principal(name), str(realm.keytabs[name]), f"test login {name}")


def bkctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bkctl", *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=COMMAND_S,
        check=False,
    )


# --- ZooKeeper -------------------------------------------------------------------------------------


def test_zookeeper_with_a_keytab_creates_creator_only_nodes(
    realm: Realm, zookeeper_kerberos: ZooKeeperServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BKCTL_JAAS", str(realm.jaas(tmp_path, Client=KRB_CLIENT)))
    auth = zk_auth({"zkEnableSecurity": "true"})
    assert auth.kerberos == KerberosLogin(
        realm.principal(KRB_CLIENT), str(realm.keytabs[KRB_CLIENT]), auth.source
    )
    root = f"/krb-{uuid.uuid4().hex[:8]}"
    with ZooKeeperStore(zookeeper_kerberos.hosts, auth=auth, retry=LONG_RETRY) as store:
        Layout(store, f"{root}/ledgers").init_cluster()
        assert Layout(store, f"{root}/ledgers").instance_id() is not None
    raw = KazooClient(zookeeper_kerberos.hosts, **auth.kazoo_kwargs())
    raw.start(timeout=10)
    try:
        acls, _ = raw.get_acls(f"{root}/ledgers")
        assert [(a.perms, a.id.scheme, a.id.id) for a in acls] == [(31, "sasl", realm.principal(KRB_CLIENT))]
    finally:
        raw.stop()
        raw.close()
    with (
        ZooKeeperStore(zookeeper_kerberos.hosts, auth=ZkAuth(), retry=LONG_RETRY) as anonymous,
        pytest.raises(AccessDeniedError, match="NoAuth"),
    ):
        anonymous.set(f"{root}/ledgers", b"theirs")


def test_zookeeper_without_a_ticket_is_one_line_and_exit_9(
    realm: Realm, zookeeper_kerberos: ZooKeeperServer, tmp_path: Path
) -> None:
    # useTicketCache with an empty cache: no ticket, and bkctl never prompts for a password.
    jaas = tmp_path / "no-ticket.conf"
    jaas.write_text(
        "Client {\n    com.sun.security.auth.module.Krb5LoginModule required\n"
        f'    useTicketCache=true principal="{realm.principal(KRB_CLIENT)}";\n}};\n'
    )
    env = {
        **os.environ,
        "KRB5CCNAME": f"FILE:{tmp_path / 'empty-ccache'}",
        "BKCTL_METADATA_TIMEOUT_MS": str(LONG_RETRY.deadline_ms),
    }
    env.pop("BKCTL_CONF", None)
    uri = f"zk://{zookeeper_kerberos.hosts}/krb-{uuid.uuid4().hex[:8]}/ledgers"
    result = bkctl("--jaas", str(jaas), "--metadata", uri, "ledger", "list", env=env)
    assert result.returncode == ExitCode.UNAUTHORIZED, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Kerberos login of" in lines[0] and "Traceback" not in result.stderr, lines


def test_unusable_kerberos_sections_are_usage_errors(
    realm: Realm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jaas = realm.jaas(tmp_path, Client=KRB_CLIENT, Bookie=KRB_BOOKIE)
    keytab = str(realm.keytabs[KRB_CLIENT])
    monkeypatch.setenv("BKCTL_JAAS", str(jaas))
    for old, new, error in (
        (keytab, str(tmp_path / "missing"), "is not a readable file"),
        ("useKeyTab=true", "useKeyTab=false", "bkctl cannot prompt for a password"),
    ):
        jaas.write_text(realm.jaas(tmp_path, Client=KRB_CLIENT).read_text().replace(old, new))
        with pytest.raises(UsageError, match=error):
            zk_auth({})
    # A bookie's keytab without the bookie's principal stops its start, not its first client.
    jaas.write_text(realm.jaas(tmp_path, Bookie=KRB_BOOKIE).read_text().replace(
        str(realm.keytabs[KRB_BOOKIE]), keytab))  # fmt: skip
    with pytest.raises(UsageError, match="Kerberos login"):
        bookie_sasl(BookieSaslKeys())


# --- between bkctl's client and bkctl's bookies -------------------------------------------------------


@pytest.mark.parametrize("protocol", ["v2", "v3"])
@twisted_test
async def test_bookies_serve_kerberos_clients_and_refuse_the_others(
    realm: Realm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    monkeypatch.setenv("BKCTL_JAAS", str(realm.jaas(tmp_path, Bookie=KRB_BOOKIE, BookKeeper=KRB_CLIENT)))
    allowed = client_sasl({"clientAuthProviderFactoryClass": CLIENT_FACTORY})
    assert allowed is not None and allowed.kerberos == login(realm, KRB_CLIENT)
    cluster = await Cluster(tmp_path).start(0)
    try:
        for index in range(2):
            bookie = await start_bookie(
                tmp_path, f"b{index + 1}", cluster.uri, bookieAuthProviderFactoryClass=BOOKIE_FACTORY
            )
            cluster.bookies.append(bookie)
        lh = await bounded(client(cluster, allowed, protocol).create_ledger(2, 2, 2, password=PW))
        data = [b"entry-%d" % i for i in range(20)]
        assert await bounded(lh.add_many(data)) == list(range(20))
        assert [e.payload for e in await bounded(lh.read(0, 19))] == data

        intruder = login(realm, KRB_INTRUDER)
        for seed, sasl, error in (
            (2, None, UnauthorizedError),  # no credentials: every request answered EUA
            # Not in .*bookkeeper.*: refused on its last token, which the client does not wait on (as
            # with Java's bookies), so its first requests are answered EUA.
            (3, ClientSasl(intruder.principal or "", "", intruder), UnauthorizedError),
        ):
            with pytest.raises(error):
                await bounded(
                    client(cluster, sasl, protocol, seed).open_ledger(lh.ledger_id, PW, recovery=True)
                )
        assert sum(bookie.factory.metrics.sasl_refusals for bookie in cluster.bookies) >= 1
        # Nothing the refused clients sent was applied: the ledger is still open and unfenced.
        assert await bounded(lh.add(b"still the writer's")) == 20

        # `audit --online` asks over blocking sockets (pipeline/online.py), with the same login.
        from bkctl.pipeline.online import OnlineBookie, holdings

        bookie = cluster.bookies[0]
        host, port = bookie.bookie_id.rsplit(":", 1)
        online = OnlineBookie(bookie.bookie_id, host, int(port), allowed)
        rows = await in_thread(lambda: list(holdings(online, [lh.ledger_id], None)))
        assert rows and not [row for row in rows if row[1] == -1], rows  # no problem row
    finally:
        await cluster.stop()


# --- the whole cluster, as an operator runs it ----------------------------------------------------------


@pytest.mark.slow
def test_a_kerberos_cluster_from_the_command_line(
    realm: Realm, zookeeper_kerberos: ZooKeeperServer, tmp_path: Path
) -> None:
    """cluster init, a bookie process and `ledger write|read` with one JAAS file (Client, Bookie,
    BookKeeper: Krb5LoginModule) and one conf (zkEnableSecurity, both SASL providers); an anonymous
    read of the same ledger is exit 9."""
    from tests.server_net.live import BookieProcess

    jaas = realm.jaas(tmp_path, Client=KRB_CLIENT, Bookie=KRB_BOOKIE, BookKeeper=KRB_CLIENT)
    conf = secure_conf(
        tmp_path, bookieAuthProviderFactoryClass=BOOKIE_FACTORY, clientAuthProviderFactoryClass=CLIENT_FACTORY
    )
    uri = f"zk://{zookeeper_kerberos.hosts}/krb-{uuid.uuid4().hex[:8]}/ledgers"
    env = {**os.environ, "BKCTL_METADATA": uri, "BKCTL_CONF": str(conf), "BKCTL_JAAS": str(jaas)}
    env.pop("BKCTL_OUTPUT", None)
    assert bkctl("cluster", "init", env=env).returncode == 0
    bookie = BookieProcess(
        ["--port", "0", "-j", str(tmp_path / "j"), "-l", str(tmp_path / "l")],
        env={"BKCTL_METADATA": uri, "BKCTL_CONF": str(conf), "BKCTL_JAAS": str(jaas)},
    )
    try:
        bookie.wait_serving()
        wrote = bkctl(
            "-o", "json", "ledger", "write", "-E", "1", "-Qw", "1", "-Qa", "1", "--entries", "5", env=env
        )
        assert wrote.returncode == 0, wrote.stderr
        ledger_id = str(json.loads(wrote.stdout)["ledger_id"])
        read = bkctl("-o", "json", "ledger", "read", ledger_id, env=env)
        assert read.returncode == 0 and len(json.loads(read.stdout)) == 5, read.stderr
        anonymous = {key: value for key, value in env.items() if key not in ("BKCTL_JAAS", "BKCTL_CONF")}
        refused = bkctl("ledger", "read", ledger_id, env=anonymous)
        assert refused.returncode == ExitCode.UNAUTHORIZED, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    finally:
        bookie.terminate()


# --- RFC 4752's security-layer negotiation, in process --------------------------------------------------


def exchange(client: GssapiClient, server: GssapiServer, last: bytes | None = None) -> None:
    """Run the exchange to its end; `last` (unwrapped) replaces the client's security-layer answer."""
    token = client.process(None)
    for _ in range(8):  # bound: GSSAPI with Kerberos takes three client tokens
        if client.complete and last is not None:
            token = bytes(client._context.wrap(last, False).message)
        answer = server.step(token)
        if answer is None:
            return
        token = client.process(answer)
    raise AssertionError("the exchange did not end")


def test_the_security_layer_negotiation_and_its_refusals(realm: Realm) -> None:
    bookie = login(realm, KRB_BOOKIE)
    host = KRB_BOOKIE.split("/", 1)[1]
    client = GssapiClient(login(realm, KRB_CLIENT), "bookkeeper", host)
    server = GssapiServer(bookie, lambda name: "bookkeeper" in name)
    exchange(client, server)
    assert server.complete and server.user == realm.principal(KRB_CLIENT)

    for answer, why in (
        (struct.pack("!I", LAYER_NONE << 24) + b"someone-else@BKCTL.TEST", "may not act as"),
        (struct.pack("!I", 0x04 << 24), "security layer 0x4"),  # confidentiality: never offered
    ):
        client = GssapiClient(login(realm, KRB_CLIENT), "bookkeeper", host)
        server = GssapiServer(bookie, lambda name: True)
        with pytest.raises(ProtocolError, match=why):
            exchange(client, server, last=answer)
        assert not server.complete

    intruder = GssapiClient(login(realm, KRB_INTRUDER), "bookkeeper", host)
    with pytest.raises(ProtocolError, match="not an allowed id"):
        exchange(intruder, GssapiServer(bookie, lambda name: "bookkeeper" in name))
    with pytest.raises(ProtocolError, match="not found in Kerberos database"):
        GssapiClient(login(realm, KRB_CLIENT), "bookkeeper", "no-such-host.test").process(None)
