"""Shared fixtures. The golden files from a real Java BookKeeper live in tests/data (see its README)."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from bkctl.errors import UnavailableError
from bkctl.metadata.sqlite import SqliteStore
from bkctl.metadata.store import MetadataStore
from bkctl.metadata.zk_server import ZooKeeperServer
from bkctl.metadata.zookeeper import ZooKeeperStore

# No per-example deadline in property tests: a wall-clock limit fails them on a loaded machine, not on a
# bug (a slow example is still found by the durations report).
settings.register_profile("bkctl", deadline=None)
settings.load_profile("bkctl")

REPO = Path(__file__).resolve().parents[1]
JAVA_TESTDATA = REPO / "tests" / "data" / "bookkeeper-java"
JAVA_BOOKIES = JAVA_TESTDATA / "bookies-snapshot1"
JAVA_SHELL_OUTPUT = JAVA_TESTDATA / "shell-output"
JAVA_ZK_DUMPS = JAVA_TESTDATA / "zk"
JAVA_WIRE = JAVA_TESTDATA / "wire"


# --- the edit-test loop's subset: `scripts/test --quick` ---------------------------------------------

# Under 3 minutes on 2 cores: the codecs and inspectors, the storage engine in process, the metadata
# stores and layout, the client's and the auditor's pure parts. Tests marked slow or spark are left out
# even here. CI (`scripts/test`) runs everything.
QUICK = (
    "tests/test_entry.py",
    "tests/test_entry_availability.py",
    "tests/test_entrylog_format.py",
    "tests/test_fastadd.py",
    "tests/test_golden_data.py",
    "tests/test_index_format.py",
    "tests/test_journal_format.py",
    "tests/test_metadata_format.py",
    "tests/test_netio.py",
    "tests/test_output.py",
    "tests/test_quorum.py",
    "tests/test_tidy.py",
    "tests/test_tls_channel.py",
    "tests/test_tls_settings.py",
    "tests/test_wire.py",
    "tests/test_wire_v3.py",
    # tests/server/ without its SIGKILL and property-scan files (10-20 s each on 2 cores)
    "tests/server/test_corrupt_files.py",
    "tests/server/test_disk_errors.py",
    "tests/server/test_foreign_mark.py",
    "tests/server/test_gc_moves.py",
    "tests/server/test_java_dirs.py",
    "tests/server/test_journal.py",
    "tests/server/test_storage.py",
    "tests/server/test_storage_kind.py",
    "tests/server/test_storage_v3.py",
    "tests/server/test_torn_tail.py",
    "tests/server/test_write_cache.py",
    "tests/layout/test_layout.py",
    "tests/metadata/test_store_sqlite.py",
    "tests/metadata/test_store_uri.py",
    "tests/metadata/test_zk_multiread.py",
    "tests/client/test_bookie_client.py",
    "tests/client/test_capture.py",
    "tests/client/test_placement.py",
    "tests/recovery/test_audit.py",
    "tests/recovery/test_config.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick", action="store_true", help="run only the quick subset (tests/conftest.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--quick"):
        return
    keep, drop = [], []
    for item in items:
        rel = Path(item.path).relative_to(REPO).as_posix()
        listed = any(rel == quick or (quick.endswith("/") and rel.startswith(quick)) for quick in QUICK)
        marked = item.get_closest_marker("slow") or item.get_closest_marker("spark")
        (keep if listed and not marked else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


# --- metadata store: one throwaway ZooKeeper per test session (per xdist worker), a chroot per test -----


@pytest.fixture(scope="session")
def zookeeper() -> Iterator[ZooKeeperServer]:
    """Debian's ZooKeeper 3.8 on a free 127.0.0.1 port (tickTime 200 ms). Fails, never skips."""
    yield from serving(ZooKeeperServer(), "the test ZooKeeper")


def serving(server: ZooKeeperServer, what: str) -> Iterator[ZooKeeperServer]:
    """A session fixture's body: `server` started (a failure fails the test, never skips it), then stopped."""
    try:
        server.start()
    except UnavailableError as exc:
        pytest.fail(f"{what} did not start: {exc}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole test session (its JVM takes seconds to start)."""
    from bkctl.pipeline.session import spark_session

    session = spark_session("local[2]")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()


@pytest.fixture
def zk_admin(zookeeper: ZooKeeperServer) -> Iterator[ZooKeeperStore]:
    """A client of the whole tree (no chroot), to create this test's chroot.

    Per test, not per session: a live kazoo client calls `random` on its connection thread (ping
    jitter), which hypothesis reports as "random module inside strategies" in whatever @given test
    happens to be drawing at that moment. ~20 ms per ZooKeeper test buys every other test silence.
    """
    with ZooKeeperStore(zookeeper.hosts) as admin:
        yield admin


def new_zk_chroot(zookeeper: ZooKeeperServer, admin: ZooKeeperStore, name: str) -> str:
    """Create /test-<name>-<random> and return the connect string chrooted there."""
    chroot = f"/test-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:60]}-{uuid.uuid4().hex[:8]}"
    admin.create(chroot)
    return zookeeper.hosts + chroot


@pytest.fixture
def zk_chroot(zookeeper: ZooKeeperServer, zk_admin: ZooKeeperStore, request: pytest.FixtureRequest) -> str:
    """A connect string chrooted to a fresh, empty node of the session ZooKeeper."""
    return new_zk_chroot(zookeeper, zk_admin, request.node.name)


class StoreTarget:
    """One empty backing store (a SQLite file or a ZooKeeper chroot) that tests open stores on.

    `uri` opens it from another process too; `open()` gives another store (another session) on it;
    `expire(store)` ends a store's session from outside, as a lost lease / expired session would.
    """

    def __init__(self, backend: str, uri: str, session_timeout_ms: int) -> None:
        self.backend, self.uri, self.session_timeout_ms = backend, uri, session_timeout_ms
        self._stores: list[MetadataStore] = []

    def open(self, **kwargs: int) -> MetadataStore:
        kwargs.setdefault("session_timeout_ms", self.session_timeout_ms)
        store: MetadataStore
        if self.backend == "sqlite":
            store = SqliteStore(self.uri.removeprefix("sqlite://"), **kwargs)
        else:
            store = ZooKeeperStore(self.uri, **kwargs)
        self._stores.append(store)
        return store

    def expire(self, store: MetadataStore) -> None:
        if isinstance(store, ZooKeeperStore):
            # ZooKeeper's own "expire now": a second client joins the session and closes it.
            from kazoo.client import KazooClient

            clone = KazooClient(store.hosts, client_id=store._client.client_id)
            clone.start(timeout=5)
            clone.stop()
            clone.close()
        else:
            assert isinstance(store, SqliteStore)
            with sqlite3.connect(store.path, isolation_level=None) as conn:
                conn.execute("UPDATE sessions SET expires_at_ms = 0 WHERE id = ?", (store.session_id,))
            conn.close()

    def close_all(self) -> None:
        for store in self._stores:
            store.close()


BACKENDS = ("sqlite", "zookeeper")


# Threads of a metadata store: SQLite's session and events threads, kazoo's connection and workers.
STORE_THREAD_PREFIXES = ("bkctl-sqlite-",)
STORE_THREAD_SUFFIXES = ("(zk_loop)", "(_thread_worker)")
THREAD_EXIT_WAIT_S = 2.0


def store_threads() -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith(STORE_THREAD_PREFIXES) or t.name.endswith(STORE_THREAD_SUFFIXES)
    ]


@pytest.fixture(scope="module", autouse=True)
def no_store_outlives_its_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test module that leaves a metadata store open (its threads running) behind it.

    A leaked store keeps a session (ephemeral nodes, leases) and threads that disturb later tests:
    kazoo's ping jitter uses `random`, which hypothesis then blames on the @given test drawing.
    """
    before = set(store_threads())
    yield
    deadline = time.monotonic() + THREAD_EXIT_WAIT_S
    leaked = [t for t in store_threads() if t not in before]
    while leaked and time.monotonic() < deadline:  # close() has returned; give threads a moment to end
        time.sleep(0.05)
        leaked = [t for t in leaked if t.is_alive()]
    if leaked:
        names = ", ".join(sorted(t.name for t in leaked))
        pytest.fail(f"{request.node.nodeid}: metadata store threads still running after the module: {names}")


@pytest.fixture(params=BACKENDS)
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreTarget]:
    """Each contract test runs once per backend, on a fresh SQLite file or a fresh ZooKeeper chroot."""
    if request.param == "sqlite":
        target = StoreTarget("sqlite", f"sqlite://{tmp_path / 'metadata.db'}", 2000)
    else:
        zookeeper = request.getfixturevalue("zookeeper")
        admin = request.getfixturevalue("zk_admin")
        target = StoreTarget("zookeeper", new_zk_chroot(zookeeper, admin, request.node.name), 2000)
    yield target
    target.close_all()


@pytest.fixture
def store(store_target: StoreTarget) -> MetadataStore:
    """A fresh, empty store of each backend (parametrized: every test using it runs twice)."""
    return store_target.open()
