"""A ZooKeeper of its own that authenticates clients with SASL DIGEST-MD5 (its JAAS Server section),
once per test session, and the JAAS / conf files a secured cluster's processes are given.

Separate from the shared session ZooKeeper: only the tests of this directory pay for its start."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkctl.errors import UnavailableError
from bkctl.metadata.zk_server import ZooKeeperServer

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
    server = ZooKeeperServer(sasl_users=SASL_USERS)
    try:
        server.start()
    except UnavailableError as exc:
        pytest.fail(f"the SASL ZooKeeper did not start: {exc}")
    yield server
    server.stop()
