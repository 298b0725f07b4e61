"""ZooKeeper paused past every session timeout (SIGSTOP, as a long GC pause or an election
does) never fails a healthy operation. A dedicated ZooKeeper (the session one keeps serving the rest)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkctl import limits
from bkctl.metadata.retry import RetryPolicy
from bkctl.metadata.store import CheckOp, CreateOp, SetOp, Stat
from bkctl.metadata.zk_server import ZooKeeperServer
from bkctl.metadata.zookeeper import ZooKeeperStore
from bkctl.model import LedgerState
from tests.client.cluster import Cluster, bounded, sleep
from tests.client.test_ledger import PW, payloads
from tests.metadata.test_store_contract import wait_until
from tests.server_net.live import in_thread, twisted_test

SESSION_MS = 1000  # the server's tick is 200 ms: sessions of 0.4-4 s
PAUSE_S = 3.0  # longer than every session timeout: each session expires
POLICY = RetryPolicy(deadline_ms=30_000, backoff_start_ms=50, backoff_max_ms=500)


@pytest.fixture(scope="module")
def zk() -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tick_ms=200)
    try:
        server.start()
    except Exception as exc:  # a test that cannot run its server fails, it does not skip
        pytest.fail(f"the outage test's ZooKeeper did not start: {exc}")
    yield server
    server.stop()


def refuses(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


STOP_WAIT_S = 5.0  # local bound


def _wait_stopped(pid: int) -> None:
    """Until every thread of the process is stopped: SIGSTOP takes effect as each thread next runs, so a
    JVM thread on the other core could still answer a request sent right after the kill."""
    deadline = time.monotonic() + STOP_WAIT_S
    tasks = Path(f"/proc/{pid}/task")
    while time.monotonic() < deadline:
        if all(_task_state(task) in "tTX" for task in tasks.iterdir()):
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} not stopped {STOP_WAIT_S} s after SIGSTOP")


def _task_state(task: Path) -> str:
    """One thread's state letter from /proc (X: it ended meanwhile)."""
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "X"


class Paused:
    """SIGSTOP the server now, SIGCONT it after `seconds` from a thread (bounded, always resumed)."""

    def __init__(self, server: ZooKeeperServer, seconds: float) -> None:
        assert server.pid is not None
        self.pid = server.pid
        # Set just before SIGCONT: an answer seen while it is clear came during the pause.
        self.resumed = threading.Event()
        os.kill(self.pid, signal.SIGSTOP)
        _wait_stopped(self.pid)
        self.timer = threading.Timer(seconds, self._resume)
        self.timer.start()

    def _resume(self) -> None:
        self.resumed.set()
        os.kill(self.pid, signal.SIGCONT)

    def join(self) -> None:
        self.timer.join()


def test_operations_issued_during_a_pause_complete_after_it(zk: ZooKeeperServer) -> None:
    with ZooKeeperStore(zk.hosts, session_timeout_ms=SESSION_MS, retry=POLICY) as store:
        store.create("/outage-a", b"1")
        pause = Paused(zk, PAUSE_S)
        store.set("/outage-a", b"2", version=0)  # waits through the pause and the session's expiry
        assert pause.resumed.is_set()  # it waited for ZooKeeper, it did not fail
        store.create("/outage-b", b"x")
        path = store.create("/outage-v-", b"vote", ephemeral=True, sequential=True)
        pause.join()
        assert store.get("/outage-a")[0] == b"2" and store.get("/outage-a")[1].version == 1
        assert store.get("/outage-b")[0] == b"x"
        # Created once, whatever the retries: one vote.
        assert [n for n in store.children("/") if n.startswith("outage-v-")] == [path.rsplit("/", 1)[1]]


def test_a_get_many_issued_during_a_pause_completes_after_it(zk: ZooKeeperServer) -> None:
    """A bulk read (ledger list, recover scans, the auditor) of more nodes than one multiRead window
    rides through the pause too, with every answer right and in order."""
    count = 2 * limits.METADATA_GET_MANY_WINDOW + 7
    root = f"/many-{os.getpid()}-{int(time.time() * 1000)}"
    paths = [f"{root}/n{i:05d}" for i in range(count)]
    with ZooKeeperStore(zk.hosts, session_timeout_ms=SESSION_MS, retry=POLICY) as store:
        store.create(root)
        for start in range(0, count, limits.METADATA_MULTI_OPS_MAX):
            store.multi(
                [CreateOp(p, p.encode()) for p in paths[start : start + limits.METADATA_MULTI_OPS_MAX]]
            )
        wanted = [*paths[:500], f"{root}/absent", *paths[500:]]
        pause = Paused(zk, PAUSE_S)
        try:
            found = store.get_many(wanted)
            assert pause.resumed.is_set()  # it waited for ZooKeeper, it did not fail
        finally:
            pause.join()
        assert len(found) == count + 1 and found[500] is None
        assert [node[0] if node else None for node in found] == [
            None if p.endswith("absent") else p.encode() for p in wanted
        ]


def test_a_multi_issued_during_a_pause_completes_after_it(zk: ZooKeeperServer) -> None:
    """Cluster init's multi (and any other) waits through the pause and is applied once: a try that
    reached the server before the connection dropped is told from a conflict (each op's path its own)."""
    root = f"/multi-{os.getpid()}-{int(time.time() * 1000)}"
    with ZooKeeperStore(zk.hosts, session_timeout_ms=SESSION_MS, retry=POLICY) as store:
        store.create(root, b"0")
        store.create(f"{root}/c", b"c")
        ops = [CreateOp(f"{root}/a", b"a"), SetOp(root, b"1", version=0), CheckOp(f"{root}/c", 0)]
        pause = Paused(zk, PAUSE_S)
        try:
            results = store.multi(ops)
        finally:
            pause.join()
        assert results[0] == f"{root}/a" and isinstance(results[1], Stat) and results[1].version == 1
        assert store.get(root)[0] == b"1" and store.get(f"{root}/a")[0] == b"a"


def test_a_deadline_bounds_the_wait(zk: ZooKeeperServer) -> None:
    """With a 1 s deadline, a get during a long pause fails (exit 6) before ZooKeeper comes back."""
    short = RetryPolicy(deadline_ms=1000, backoff_start_ms=50, backoff_max_ms=200)
    with ZooKeeperStore(
        zk.hosts, session_timeout_ms=SESSION_MS, connect_timeout_ms=500, retry=short
    ) as store:
        pause = Paused(zk, 3 * PAUSE_S)
        try:
            with pytest.raises(Exception) as raised:
                store.get("/")
            failed_during_pause = not pause.resumed.is_set()
        finally:
            pause.join()
        assert getattr(raised.value, "exit_code", None) == 6
        assert failed_during_pause  # it failed during the pause, not after it


@twisted_test
async def test_a_writer_rides_through_a_pause_during_its_adds_and_its_close(
    zk: ZooKeeperServer, tmp_path: Path
) -> None:
    """The trial's scenario: adds need no metadata and go on; the close waits for ZooKeeper."""
    admin = ZooKeeperStore(zk.hosts)
    chroot = f"/writer-{os.getpid()}-{int(time.time() * 1000)}"
    admin.create(chroot)
    admin.close()
    os.environ["BKCTL_METADATA_TIMEOUT_MS"] = "30000"
    try:
        cluster = await Cluster(tmp_path, zk.hosts + chroot).start(3)
        try:
            writer = await bounded(cluster.client().create_ledger(3, 2, 2, password=PW))
            await bounded(writer.add_many(payloads(100)))
            pause = Paused(zk, PAUSE_S)
            await bounded(writer.add_many(payloads(100)))  # no metadata needed
            closing = writer.close()
            await sleep(0.5)
            assert not closing.called  # waiting for ZooKeeper, not failed
            await bounded(closing, 30)
            await in_thread(pause.join)
            md = (await in_thread(cluster.layout.read_ledger, writer.ledger_id)).value  # type: ignore[union-attr]
            assert (md.state, md.last_entry_id) == (LedgerState.CLOSED, 199)
            reader = await bounded(cluster.client(seed=3).open_ledger(writer.ledger_id, PW))
            assert len(await bounded(reader.read(0, 199))) == 200
        finally:
            await cluster.stop()
    finally:
        os.environ.pop("BKCTL_METADATA_TIMEOUT_MS", None)


@twisted_test
async def test_an_ensemble_change_and_a_recovery_open_wait_for_zookeeper(
    zk: ZooKeeperServer, tmp_path: Path
) -> None:
    """A bookie fails while ZooKeeper is paused: the ensemble change waits for it, then the write goes
    on; a recovery open started during a pause completes after it."""
    admin = ZooKeeperStore(zk.hosts)
    chroot = f"/change-{os.getpid()}-{int(time.time() * 1000)}"
    admin.create(chroot)
    admin.close()
    os.environ["BKCTL_METADATA_TIMEOUT_MS"] = "30000"
    try:
        cluster = await Cluster(tmp_path, zk.hosts + chroot).start(4)
        try:
            writer = await bounded(cluster.client().create_ledger(3, 2, 2, password=PW))
            await bounded(writer.add_many(payloads(50)))
            victim = cluster.bookie(writer.ensemble[0])
            pause = Paused(zk, PAUSE_S)
            await bounded(victim.stop(), 30)  # its unregistration waits for ZooKeeper too
            await bounded(writer.add_many(payloads(50)), 30)  # the ensemble change waited, then went on
            await in_thread(pause.join)
            assert victim.bookie_id not in writer.ensemble
            # A second pause during a recovery open by another client.
            pause = Paused(zk, PAUSE_S)
            reader = await bounded(cluster.client(seed=5).open_ledger(writer.ledger_id, PW), 30)
            await in_thread(pause.join)
            assert reader.is_closed and reader.last_add_confirmed == 99
            assert len(await bounded(reader.read(0, 99))) == 100
        finally:
            await cluster.stop()
    finally:
        os.environ.pop("BKCTL_METADATA_TIMEOUT_MS", None)


def test_zookeeper_killed_and_restarted_on_its_data_directory() -> None:
    """kill -9, the port refusing connections for 2 s, then ZooKeeper back on the same data: the
    sessions of before survive (ZooKeeper keeps them), and operations issued meanwhile complete."""
    with (
        ZooKeeperServer(tick_ms=200) as server,
        ZooKeeperStore(server.hosts, session_timeout_ms=4000, retry=POLICY) as store,
    ):
        store.create("/restart", b"0")
        done: list[object] = []
        restarting = threading.Thread(target=server.restart, args=(2.0,))
        restarting.start()
        wait_until(lambda: refuses(server.port), what="the port to refuse connections")  # down now
        done.append(store.set("/restart", b"1", version=0))
        done.append(store.create("/restart-b", b"b"))
        restarting.join(60)
        assert store.get("/restart") == (b"1", store.get("/restart")[1])
        assert store.get("/restart")[1].version == 1 and store.exists("/restart-b") is not None
        assert len(done) == 2
