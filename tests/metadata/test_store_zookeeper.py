"""What only the ZooKeeper backend has: connecting, chroots, a server that goes away, kazoo's logging."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from bkctl.errors import ExitCode, NotFoundError, UnavailableError
from bkctl.metadata.retry import RetryPolicy
from bkctl.metadata.stores import open_store
from bkctl.metadata.zk_multiread import MultiRead
from bkctl.metadata.zk_server import ZooKeeperServer, free_port
from bkctl.metadata.zookeeper import ZooKeeperStore
from tests.conftest import REPO


@pytest.mark.parametrize("form", ["bare", "zk"])
def test_unreachable_zookeeper_fails_fast(form: str) -> None:
    port = free_port()  # nothing listens there
    uri = f"127.0.0.1:{port}" if form == "bare" else f"zk://127.0.0.1:{port}/ledgers"
    # connect_timeout_ms bounds the wait; how fast it fails is measured in benchmarks/, not here.
    with pytest.raises(UnavailableError) as info:
        open_store(uri, connect_timeout_ms=500)
    assert info.value.exit_code == ExitCode.UNAVAILABLE
    assert "\n" not in str(info.value) and f"127.0.0.1:{port}" in str(info.value)


def test_unreachable_zookeeper_prints_nothing_else() -> None:
    """kazoo's connection warnings must not reach stderr: the one-line error is all a user sees."""
    code = (
        "import sys\n"
        "from bkctl.metadata.stores import open_store\n"
        "try:\n"
        f"    open_store('127.0.0.1:{free_port()}', connect_timeout_ms=500)\n"
        "except Exception as exc:\n"
        "    sys.stderr.write(f'{exc}\\n')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr


def test_missing_chroot(zookeeper: ZooKeeperServer) -> None:
    with pytest.raises(NotFoundError, match="chroot"):
        ZooKeeperStore(zookeeper.hosts + "/no-such-chroot")


def test_kazoo_logger_is_quiet(zk_chroot: str) -> None:
    with ZooKeeperStore(zk_chroot):
        logger = logging.getLogger("kazoo")
        assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)


def test_server_gone_gives_unavailable_within_bound() -> None:
    with ZooKeeperServer() as server:
        # A generous connect timeout: a cold JVM under a loaded CI machine can take a second to accept.
        retry = RetryPolicy(deadline_ms=2000, backoff_start_ms=100, backoff_max_ms=500)
        store = ZooKeeperStore(server.hosts, session_timeout_ms=1000, connect_timeout_ms=2000, retry=retry)
        store.create("/x")
        server.stop()
        # The retry deadline bounds the wait (plus at most one more try, bounded by session + connect
        # timeout); an endless retry would hang here rather than raise.
        with pytest.raises(UnavailableError):
            store.get("/x")
        store.close()


def test_session_id_and_repr(zk_chroot: str) -> None:
    with ZooKeeperStore(zk_chroot) as store:
        assert store.session_id > 0
        assert hex(store.session_id) in repr(store)


def test_get_many_falls_back_to_gets_without_multi_read(
    zk_chroot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZooKeeper < 3.6 answers multiRead with UNIMPLEMENTED, as 3.8 answers an opcode it does not know."""
    monkeypatch.setattr(MultiRead, "type", 99)
    with ZooKeeperStore(zk_chroot) as store:
        store.create("/a", b"1")
        assert store.get_many(["/a", "/b", "/a"]) == [store.get("/a"), None, store.get("/a")]
        assert not store._multi_read  # remembered: the next call goes straight to pipelined gets
        assert store.get_many(["/b", "/a"]) == [None, store.get("/a")]


def test_get_many_without_chroot(zk_admin: ZooKeeperStore, zk_chroot: str) -> None:
    chroot = "/" + zk_chroot.split("/", 1)[1]
    assert zk_admin.get_many(["/", chroot, chroot + "/none"]) == [
        zk_admin.get("/"),
        zk_admin.get(chroot),
        None,
    ]
