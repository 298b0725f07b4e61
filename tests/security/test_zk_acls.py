"""ZooKeeper with SASL and creator-only ACLs (zkEnableSecurity): what bkctl creates, only bkctl's
credentials may change; refusals are one error with exit 9 at once, never a retry to the deadline."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from bkctl.errors import AccessDeniedError, ExitCode, UsageError
from bkctl.metadata.layout import Layout
from bkctl.metadata.retry import RetryPolicy
from bkctl.metadata.zk_auth import ZkAuth, zk_auth
from bkctl.metadata.zk_server import ZooKeeperServer
from bkctl.metadata.zookeeper import ZooKeeperStore
from tests.security.conftest import ZK_PASSWORD, ZK_USER, client_jaas

SECURE = ZkAuth(secure_acls=True, sasl_user=ZK_USER, sasl_password=ZK_PASSWORD)
# A retry deadline far beyond what a test waits: a refusal must not ride it out.
LONG_RETRY = RetryPolicy(deadline_ms=60_000)


@pytest.fixture
def root() -> str:
    return f"/sec-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def secure_store(zookeeper_sasl: ZooKeeperServer) -> Iterator[ZooKeeperStore]:
    with ZooKeeperStore(zookeeper_sasl.hosts, auth=SECURE, retry=LONG_RETRY) as store:
        yield store


def test_created_nodes_are_creator_only_and_kept_on_rewrite(
    zookeeper_sasl: ZooKeeperServer, secure_store: ZooKeeperStore, root: str
) -> None:
    secure_store.create(f"{root}/a/b", b"1", make_parents=True)
    secure_store.set(f"{root}/a/b", b"2")
    raw = KazooClient(zookeeper_sasl.hosts, sasl_options={
        "mechanism": "DIGEST-MD5", "username": ZK_USER, "password": ZK_PASSWORD,
    })  # fmt: skip
    raw.start(timeout=10)
    try:
        for path in (root, f"{root}/a", f"{root}/a/b"):
            acls, _ = raw.get_acls(path)
            assert [(a.perms, a.id.scheme, a.id.id) for a in acls] == [(31, "sasl", ZK_USER)], path
    finally:
        raw.stop()
        raw.close()


def test_an_unauthenticated_client_cannot_read_change_or_delete(
    zookeeper_sasl: ZooKeeperServer, secure_store: ZooKeeperStore, root: str
) -> None:
    # ZooKeeper checks a delete against the parent's ACL: the node's parent is bkctl's too, as every
    # node below a cluster's root is.
    node = f"{root}/node"
    secure_store.create(node, b"mine", make_parents=True)
    with ZooKeeperStore(zookeeper_sasl.hosts, auth=ZkAuth(), retry=LONG_RETRY) as anonymous:
        started = time.monotonic()
        for attempt in (
            lambda: anonymous.set(node, b"theirs"),
            lambda: anonymous.delete(node),
            lambda: anonymous.get(node),
            lambda: anonymous.create(f"{node}/child"),
            lambda: anonymous.delete(root, recursive=True),
        ):
            with pytest.raises(AccessDeniedError, match="NoAuth") as refused:
                attempt()
            assert refused.value.exit_code == ExitCode.UNAUTHORIZED
        assert time.monotonic() - started < LONG_RETRY.deadline_ms / 1000  # not retried to the deadline
    raw = KazooClient(zookeeper_sasl.hosts)  # kazoo itself, as any other ZooKeeper client
    raw.start(timeout=10)
    try:
        with pytest.raises(NoAuthError):
            raw.set(node, b"theirs")
        with pytest.raises(NoAuthError):
            raw.delete(node)
    finally:
        raw.stop()
        raw.close()
    assert secure_store.get(node)[0] == b"mine"


def test_another_account_is_refused_too(
    zookeeper_sasl: ZooKeeperServer, secure_store: ZooKeeperStore, root: str
) -> None:
    secure_store.create(f"{root}/node", b"mine", make_parents=True)
    other = ZkAuth(secure_acls=True, sasl_user="other", sasl_password="other-secret")
    with ZooKeeperStore(zookeeper_sasl.hosts, auth=other) as store:
        for attempt in (lambda: store.set(f"{root}/node", b"theirs"), lambda: store.delete(f"{root}/node")):
            with pytest.raises(AccessDeniedError):
                attempt()


def test_a_wrong_password_is_refused_when_the_store_opens(zookeeper_sasl: ZooKeeperServer) -> None:
    wrong = ZkAuth(sasl_user=ZK_USER, sasl_password="wrong")
    with pytest.raises(AccessDeniedError, match="credentials"):
        ZooKeeperStore(zookeeper_sasl.hosts, auth=wrong, retry=LONG_RETRY)


def test_security_without_credentials_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="zkEnableSecurity=true needs ZooKeeper credentials"):
        ZooKeeperStore("127.0.0.1:1", auth=ZkAuth(secure_acls=True))


def test_credentials_from_the_jaas_file_and_conf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zookeeper_sasl: ZooKeeperServer, root: str
) -> None:
    monkeypatch.setenv("BKCTL_JAAS", str(client_jaas(tmp_path)))
    auth = zk_auth({"zkEnableSecurity": "true"})
    assert auth == ZkAuth(True, ZK_USER, ZK_PASSWORD, None, auth.source)
    with ZooKeeperStore(zookeeper_sasl.hosts, auth=auth) as store:
        Layout(store, f"{root}/ledgers").init_cluster()
        assert Layout(store, f"{root}/ledgers").instance_id() is not None
