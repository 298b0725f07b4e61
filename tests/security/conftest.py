"""A ZooKeeper of its own that authenticates clients with SASL DIGEST-MD5 (its JAAS Server section),
once per test session, and the JAAS / conf files a secured cluster's processes are given; for the
Kerberos tests a KDC and a ZooKeeper authenticating with GSSAPI, once per session too.

Separate from the shared session ZooKeeper: only the tests of this directory pay for its start."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkctl.errors import UnavailableError
from bkctl.kerberos import canonical_host_name, java_host_name
from bkctl.metadata.kdc import Kdc
from bkctl.metadata.zk_server import ServerKerberos, ZooKeeperServer
from tests.conftest import serving

# The ZooKeeper accounts; bkctl authenticates as ZK_USER (the JAAS Client section).
ZK_USER, ZK_PASSWORD = "bookkeeper", "zk-secret"
SASL_USERS = {ZK_USER: ZK_PASSWORD, "other": "other-secret"}


def client_jaas(tmp_path: Path, user: str = ZK_USER, password: str = ZK_PASSWORD) -> Path:
    """A JAAS file with the ZooKeeper client's section, as a Java bookie's."""
    path = tmp_path / f"jaas-{user}-{uuid.uuid4().hex[:6]}.conf"
    path.write_text(
        "Client {\n"
        "    org.apache.zookeeper.server.auth.DigestLoginModule required\n"
        f'    username="{user}"\n    password="{password}";\n}};\n'
    )
    return path


def secure_conf(tmp_path: Path, **keys: str) -> Path:
    """A bk_server.conf with zkEnableSecurity=true (and `keys`)."""
    path = tmp_path / f"bk-{uuid.uuid4().hex[:6]}.conf"
    lines = {"zkEnableSecurity": "true", **keys}
    path.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
    return path


@pytest.fixture(scope="session")
def zookeeper_sasl() -> Iterator[ZooKeeperServer]:
    """Debian's ZooKeeper with SASLAuthenticationProvider and DIGEST-MD5 accounts. Fails, never skips."""
    yield from serving(ZooKeeperServer(sasl_users=SASL_USERS), "the SASL ZooKeeper")


# --- Kerberos: one KDC per test session, shared by every Kerberos test -------------------------------

# The servers' principals name their host as Java's clients do: ZooKeeper's canonicalized, a bookie's
# an IP address's reverse-DNS name (127.0.0.1: `localhost` with a usual /etc/hosts).
KRB_ZOOKEEPER = f"zookeeper/{canonical_host_name('127.0.0.1')}"
KRB_BOOKIE = f"bookkeeper/{java_host_name('127.0.0.1')}"  # bookkeeper.sasl.servicename / its host
KRB_CLIENT = "bookkeeper-client"  # bkctl's: inside saslJaasClientAllowedIds' default .*bookkeeper.*
KRB_INTRUDER = "intruder"  # a valid Kerberos user that is not an allowed id


class Realm:
    """The session KDC and the keytab of each principal it was given."""

    def __init__(self, kdc: Kdc) -> None:
        self.kdc = kdc
        self.keytabs = {
            name: kdc.add_principal(name) for name in (KRB_ZOOKEEPER, KRB_BOOKIE, KRB_CLIENT, KRB_INTRUDER)
        }

    def principal(self, name: str) -> str:
        return self.kdc.principal(name)

    def login_module(self, name: str) -> str:
        """Java's Krb5LoginModule entry logging `name` in from its keytab."""
        return (
            "    com.sun.security.auth.module.Krb5LoginModule required\n"
            f'    useKeyTab=true keyTab="{self.keytabs[name]}" storeKey=true useTicketCache=false\n'
            f'    principal="{self.principal(name)}";\n'
        )

    def jaas(self, tmp_path: Path, **sections: str) -> Path:
        """A JAAS file with one Krb5LoginModule section per `Section=principal name`."""
        path = tmp_path / f"jaas-krb-{uuid.uuid4().hex[:6]}.conf"
        path.write_text("".join(f"{s} {{\n{self.login_module(n)}}};\n" for s, n in sections.items()))
        return path


@pytest.fixture(scope="session")
def realm() -> Iterator[Realm]:
    """Debian's MIT KDC on 127.0.0.1 (a port chosen now), with the principals above; KRB5_CONFIG names
    its krb5.conf for this process and every process it starts. Fails, never skips."""
    kdc = Kdc()
    try:
        kdc.start()
        made = Realm(kdc)
    except UnavailableError as exc:
        kdc.stop()
        pytest.fail(f"the KDC did not start: {exc}")
    patch = pytest.MonkeyPatch()
    patch.setenv("KRB5_CONFIG", str(kdc.krb5_conf))
    yield made
    patch.undo()
    kdc.stop()


@pytest.fixture(scope="session")
def zookeeper_kerberos(realm: Realm) -> Iterator[ZooKeeperServer]:
    """Debian's ZooKeeper authenticating clients with SASL GSSAPI (its JAAS Server section logs in as
    KRB_ZOOKEEPER from a keytab). Fails, never skips."""
    kerberos = ServerKerberos(
        realm.principal(KRB_ZOOKEEPER), realm.keytabs[KRB_ZOOKEEPER], realm.kdc.krb5_conf
    )
    yield from serving(ZooKeeperServer(kerberos=kerberos), "the Kerberos ZooKeeper")
