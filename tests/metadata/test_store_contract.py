"""The store contract: every behaviour of bkctl.metadata.store, on SQLite and on a real ZooKeeper.

Each test runs once per backend (the `store` / `store_target` fixtures are parametrized), so passing
here means both backends behave identically, ZooKeeper's semantics included.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from bkctl import limits
from bkctl.errors import (
    BadVersionError,
    EphemeralParentError,
    NodeExistsError,
    NotEmptyError,
    NotFoundError,
    UnavailableError,
    UsageError,
)
from bkctl.metadata.store import (
    CheckOp,
    CreateOp,
    DeleteOp,
    MetadataStore,
    SetOp,
    Stat,
)
from bkctl.metadata.stores import open_store
from tests.conftest import REPO, StoreTarget
from tests.metadata import workers

WAIT_S = 10.0


def wait_until(predicate: Callable[[], bool], timeout_s: float = WAIT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.005)


class Recorder:
    """Collects callback calls (thread-safe) and remembers which thread made them."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.threads: list[str] = []
        self._lock = threading.Lock()

    def data(self, data: bytes | None, stat: Stat | None) -> None:
        self._add(None if stat is None else (data, stat.version))

    def children(self, names: list[str] | None) -> None:
        self._add(names)

    def _add(self, value: Any) -> None:
        with self._lock:
            self.calls.append(value)
            self.threads.append(threading.current_thread().name)

    def wait_for(self, value: Any, timeout_s: float = WAIT_S) -> None:
        wait_until(
            lambda: bool(self.calls) and self.calls[-1] == value, timeout_s, f"callback with {value!r}"
        )


# --- create / get / exists ---------------------------------------------------------------------------


def test_create_then_get(store: MetadataStore) -> None:
    assert store.create("/a", b"hello") == "/a"
    data, stat = store.get("/a")
    assert data == b"hello"
    assert (stat.version, stat.cversion, stat.num_children, stat.data_length) == (0, 0, 0, 5)
    assert stat.ephemeral_owner == 0
    assert stat.ctime_ms == stat.mtime_ms and stat.ctime_ms > 1_500_000_000_000
    assert stat.czxid == stat.mzxid
    assert store.exists("/a") == stat


def test_create_defaults_to_empty_data(store: MetadataStore) -> None:
    store.create("/empty")
    assert store.get("/empty")[0] == b""


def test_create_existing_fails(store: MetadataStore) -> None:
    store.create("/a")
    with pytest.raises(NodeExistsError):
        store.create("/a", b"again")
    with pytest.raises(NodeExistsError):
        store.create("/")


def test_create_without_parent_fails(store: MetadataStore) -> None:
    with pytest.raises(NotFoundError):
        store.create("/missing/child")
    assert store.exists("/missing") is None


def test_create_each_creates_each_node_on_its_own(store: MetadataStore) -> None:
    store.create("/locks")
    store.create("/locks/b", b"theirs")
    nodes = [(f"/locks/{name}", name.encode()) for name in "abc"]
    assert store.create_each(nodes, ephemeral=True) == [True, False, True]
    assert store.get("/locks/b")[0] == b"theirs"  # the one there is untouched, the others made
    data, stat = store.get("/locks/c")
    assert data == b"c" and stat.ephemeral_owner == store.session_id
    assert store.create_each([]) == []
    with pytest.raises(NotFoundError):
        store.create_each([("/missing/x", b"")])


def test_multi_each_applies_each_batch_on_its_own(store: MetadataStore) -> None:
    store.create("/m")
    store.create("/m/taken", b"theirs")
    answers = store.multi_each(
        [
            [CreateOp("/m/a"), CreateOp("/m/a/x", b"1")],
            [CreateOp("/m/b"), CreateOp("/m/taken", b"ours")],  # fails whole: /m/b is not made
            [],
            [CreateOp("/missing/c")],
        ]
    )
    assert answers[0] == ["/m/a", "/m/a/x"] and answers[2] == []
    assert isinstance(answers[1], NodeExistsError) and isinstance(answers[3], NotFoundError)
    assert store.children("/m") == ["a", "taken"] and store.get("/m/a/x")[0] == b"1"


def test_make_parents(store: MetadataStore) -> None:
    store.create("/a")
    assert store.create("/a/b/c/d", b"leaf", make_parents=True) == "/a/b/c/d"
    for path in ("/a/b", "/a/b/c"):
        data, stat = store.get(path)
        assert data == b"" and stat.ephemeral_owner == 0 and stat.num_children == 1
    assert store.get("/a")[1].cversion == 1
    store.ensure_path("/a/b/c")  # exists already: no error
    store.ensure_path("/x/y")
    assert store.exists("/x/y") is not None


def test_get_and_exists_missing(store: MetadataStore) -> None:
    with pytest.raises(NotFoundError):
        store.get("/nope")
    assert store.exists("/nope") is None


def test_binary_data_round_trips(store: MetadataStore) -> None:
    blob = bytes(range(256)) * 100
    store.create("/bin", blob)
    assert store.get("/bin")[0] == blob
    assert store.get("/bin")[1].data_length == len(blob)


# --- get_many ----------------------------------------------------------------------------------------

# The backend's own bulk read, and the base class's one-by-one default run on the same backend.
GET_MANY = {
    "backend": lambda store, paths: store.get_many(paths),
    "default": lambda store, paths: MetadataStore.get_many(store, paths),
}


@pytest.mark.parametrize("impl", GET_MANY)
def test_get_many_present_and_missing_in_order(store: MetadataStore, impl: str) -> None:
    store.create("/a", b"1")
    store.create("/a/b", b"2")
    store.set("/a/b", b"22")
    store.create("/c")
    paths = ["/c", "/missing", "/a/b", "/a", "/a/b", "/a/missing/deeper", "/"]
    got = GET_MANY[impl](store, paths)
    assert got == [None if store.exists(p) is None else store.get(p) for p in paths]
    assert [None if g is None else g[0] for g in got] == [b"", None, b"22", b"1", b"22", None, b""]
    assert got[2] is not None and got[2][1].version == 1


@pytest.mark.parametrize("impl", GET_MANY)
def test_get_many_of_nothing(store: MetadataStore, impl: str) -> None:
    assert GET_MANY[impl](store, []) == []


def test_get_many_beyond_one_window(store: MetadataStore) -> None:
    """More paths than ZooKeeper's window and SQLite's chunk: every answer still in its place."""
    count = limits.METADATA_GET_MANY_WINDOW + limits.SQLITE_GET_MANY_CHUNK + 7
    store.create("/many")
    for start in range(0, count, limits.METADATA_MULTI_OPS_MAX):
        ids = range(start, min(start + limits.METADATA_MULTI_OPS_MAX, count))
        store.multi([CreateOp(f"/many/n{i:05d}", str(i).encode()) for i in ids])
    # Newest first, every third path missing: order is ours, not the store's.
    wanted = [f"/many/n{i:05d}" if i % 3 else f"/many/gone{i}" for i in reversed(range(count))]
    got = store.get_many(wanted)
    assert len(got) == count
    for i, node in zip(reversed(range(count)), got, strict=True):
        assert (node is None) if i % 3 == 0 else (node is not None and node[0] == str(i).encode())


def test_get_many_bad_path_reads_nothing(store: MetadataStore) -> None:
    with pytest.raises(UsageError):
        store.get_many(["/", "relative"])
    store.close()
    with pytest.raises(UnavailableError):
        store.get_many(["/"])


# --- set (CAS) ---------------------------------------------------------------------------------------


def test_set_bumps_version(store: MetadataStore) -> None:
    store.create("/a", b"1")
    created = store.get("/a")[1]
    stat = store.set("/a", b"22")
    assert stat.version == 1 and stat.data_length == 2
    assert stat.czxid == created.czxid and stat.mzxid > created.mzxid
    assert stat.mtime_ms >= created.mtime_ms and stat.ctime_ms == created.ctime_ms
    assert store.get("/a") == (b"22", stat)
    assert store.set("/a", b"3", version=1).version == 2


def test_set_with_stale_version_fails(store: MetadataStore) -> None:
    store.create("/a", b"1")
    store.set("/a", b"2", version=0)
    with pytest.raises(BadVersionError):
        store.set("/a", b"3", version=0)
    assert store.get("/a")[0] == b"2"


def test_set_missing_fails(store: MetadataStore) -> None:
    with pytest.raises(NotFoundError):
        store.set("/nope", b"x")


def test_set_does_not_touch_parent(store: MetadataStore) -> None:
    store.create("/p")
    store.create("/p/c")
    before = store.get("/p")[1]
    store.set("/p/c", b"x")
    assert store.get("/p")[1] == before


# --- delete ------------------------------------------------------------------------------------------


def test_delete(store: MetadataStore) -> None:
    store.create("/p")
    store.create("/p/c")
    store.delete("/p/c")
    assert store.exists("/p/c") is None
    parent = store.get("/p")[1]
    assert parent.cversion == 2 and parent.num_children == 0


def test_delete_checks_version(store: MetadataStore) -> None:
    store.create("/a")
    store.set("/a", b"x")
    with pytest.raises(BadVersionError):
        store.delete("/a", version=0)
    store.delete("/a", version=1)
    assert store.exists("/a") is None


def test_delete_missing_fails(store: MetadataStore) -> None:
    with pytest.raises(NotFoundError):
        store.delete("/nope")


def test_delete_with_children_fails(store: MetadataStore) -> None:
    store.create("/p")
    store.create("/p/c")
    with pytest.raises(NotEmptyError):
        store.delete("/p")
    with pytest.raises(BadVersionError):  # the version is checked before the children
        store.delete("/p", version=5)


def test_delete_recursive(store: MetadataStore) -> None:
    store.create("/keep")
    store.create("/p/a/b", make_parents=True)
    store.create("/p/a/c")
    store.create("/p/d")
    store.create("/pp")  # shares the prefix, must survive
    with pytest.raises(BadVersionError):
        store.delete("/p", version=3, recursive=True)
    assert store.exists("/p/a/b") is not None
    store.delete("/p", recursive=True)
    assert store.children("/") == ["keep", "pp"]
    with pytest.raises(NotFoundError):
        store.delete("/p", recursive=True)


def test_root_cannot_be_deleted(store: MetadataStore) -> None:
    with pytest.raises(UsageError):
        store.delete("/")


# --- children ----------------------------------------------------------------------------------------


def test_children_sorted_names(store: MetadataStore) -> None:
    store.create("/p")
    assert store.children("/p") == []
    for name in ("b", "a", "c10", "c9", "Z"):
        store.create(f"/p/{name}")
    store.create("/p/a/deep")
    assert store.children("/p") == ["Z", "a", "b", "c10", "c9"]
    assert store.get("/p")[1].num_children == 5


def test_children_of_missing_fails(store: MetadataStore) -> None:
    with pytest.raises(NotFoundError):
        store.children("/nope")


def test_children_of_root(store: MetadataStore) -> None:
    assert store.children("/") == []
    store.create("/x")
    assert store.children("/") == ["x"]


# --- sequential --------------------------------------------------------------------------------------


def test_sequential_names_follow_parent_cversion(store: MetadataStore) -> None:
    store.create("/q")
    assert store.create("/q/item-", sequential=True) == "/q/item-0000000000"
    assert store.create("/q/item-", sequential=True) == "/q/item-0000000001"
    store.create("/q/plain")  # every child creation counts
    assert store.create("/q/other-", b"d", sequential=True) == "/q/other-0000000003"
    store.delete("/q/plain")  # counted by cversion, not by the sequence (ZooKeeper 3.8, measured)
    assert store.get("/q")[1].cversion == 5
    assert store.create("/q/item-", sequential=True) == "/q/item-0000000004"
    assert store.get("/q/other-0000000003")[0] == b"d"
    assert store.children("/q") == [
        "item-0000000000",
        "item-0000000001",
        "item-0000000004",
        "other-0000000003",
    ]


def test_sequence_ignores_deletions(store_target: StoreTarget) -> None:
    store, other = store_target.open(), store_target.open()
    store.create("/q")
    for i in range(3):
        store.create(f"/q/x{i}")
        store.delete(f"/q/x{i}")
    other.create("/q/eph", ephemeral=True)
    other.close()  # a session's end deletes too
    assert store.get("/q")[1].cversion == 8
    assert store.create("/q/s-", sequential=True) == "/q/s-0000000004"


def test_sequential_with_make_parents(store: MetadataStore) -> None:
    assert store.create("/ids/idgen/ID-", sequential=True, make_parents=True) == "/ids/idgen/ID-0000000000"


def test_sequential_at_root(store: MetadataStore) -> None:
    first = store.create("/L", sequential=True)
    assert first.startswith("/L") and len(first) == 12 and first[2:].isdigit()


# --- ephemeral ---------------------------------------------------------------------------------------


def test_ephemeral_owned_by_session(store: MetadataStore) -> None:
    store.create("/e", b"me", ephemeral=True)
    stat = store.get("/e")[1]
    assert stat.ephemeral_owner == store.session_id != 0


def test_ephemeral_cannot_have_children(store: MetadataStore) -> None:
    store.create("/e", ephemeral=True)
    with pytest.raises(EphemeralParentError):
        store.create("/e/child")
    with pytest.raises(EphemeralParentError):
        store.create("/e/child/grandchild", make_parents=True)


def test_ephemeral_sequential(store: MetadataStore) -> None:
    store.create("/votes")
    path = store.create("/votes/V_", ephemeral=True, sequential=True)
    assert path == "/votes/V_0000000000"
    assert store.get(path)[1].ephemeral_owner == store.session_id


def test_ephemeral_gone_when_store_closes(store_target: StoreTarget) -> None:
    owner, observer = store_target.open(), store_target.open()
    assert owner.session_id != observer.session_id
    owner.create("/bookie", ephemeral=True)
    owner.create("/persistent")
    assert observer.exists("/bookie") is not None
    owner.close()
    assert observer.exists("/bookie") is None
    assert observer.exists("/persistent") is not None
    assert observer.get("/")[1].num_children == 1


def test_ephemeral_gone_after_owner_killed(store_target: StoreTarget) -> None:
    observer = store_target.open()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.metadata.workers",
            "hold-ephemeral",
            store_target.uri,
            "/bookie",
            "1000",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready"), line
        assert observer.exists("/bookie") is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
        # The 1 s lease expires; the wait's bound only stops a lease that never expires from hanging.
        wait_until(lambda: observer.exists("/bookie") is None, what="the killed owner's ephemeral to go")
    finally:
        proc.kill()
        proc.wait(5)


def test_paused_owner_loses_lease_then_registers_again(store_target: StoreTarget) -> None:
    """A process paused past its session timeout (GC pause, SIGSTOP) loses its ephemeral nodes; when
    it runs again it learns so through on_session_lost and registers under a new session."""
    observer = store_target.open()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.metadata.workers",
            "hold-ephemeral",
            store_target.uri,
            "/bookie",
            "1000",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = int(proc.stdout.readline().split()[1])
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(lambda: observer.exists("/bookie") is None, what="the paused owner's ephemeral to go")
        os.kill(proc.pid, signal.SIGCONT)
        line = proc.stdout.readline()  # bounded: the worker exits by itself after 60 s
        assert line.startswith("lost"), line
        second = int(line.split()[1])
        assert second != first
        wait_until(lambda: observer.exists("/bookie") is not None, what="the owner to register again")
        stat = observer.exists("/bookie")
        assert stat is not None and stat.ephemeral_owner == second
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(5)


def test_session_lost_drops_ephemerals_and_calls_back(store_target: StoreTarget) -> None:
    store, observer = store_target.open(), store_target.open()
    store.create("/bookie", b"1", ephemeral=True)
    old_session = store.session_id
    recreated = threading.Event()

    def on_lost() -> None:  # what an owner does: register again under the new session
        store.create("/bookie", b"2", ephemeral=True)
        recreated.set()

    store.on_session_lost(on_lost)
    store_target.expire(store)
    assert recreated.wait(WAIT_S), "session-lost callback not called"
    assert store.session_id != old_session
    data, stat = observer.get("/bookie")
    assert data == b"2" and stat.ephemeral_owner == store.session_id


def test_session_lost_subscription_cancel(store_target: StoreTarget) -> None:
    store = store_target.open()
    calls: list[int] = []
    store.on_session_lost(lambda: calls.append(1)).cancel()
    done = threading.Event()
    store.on_session_lost(done.set)
    store_target.expire(store)
    assert done.wait(WAIT_S)
    assert calls == []


# --- multi -------------------------------------------------------------------------------------------


def test_multi_applies_all(store: MetadataStore) -> None:
    store.create("/a", b"0")
    results = store.multi(
        [
            CreateOp("/m", b"x"),
            CreateOp("/m/child"),  # sees the create above
            CreateOp("/m/seq-", sequential=True),
            CheckOp("/a", 0),
            SetOp("/a", b"1", 0),
            DeleteOp("/m/child"),
        ]
    )
    assert results[:3] == ["/m", "/m/child", "/m/seq-0000000001"]
    assert results[3] is None and results[5] is None
    assert isinstance(results[4], Stat) and results[4].version == 1
    assert store.get("/a")[0] == b"1"
    assert store.children("/m") == ["seq-0000000001"]


@pytest.mark.parametrize(
    ("ops", "error"),
    [
        ([CreateOp("/new"), CreateOp("/a")], NodeExistsError),
        ([CreateOp("/new"), CheckOp("/a", 7)], BadVersionError),
        ([CreateOp("/new"), SetOp("/a", b"z", 3)], BadVersionError),
        ([CreateOp("/new"), DeleteOp("/gone")], NotFoundError),
        ([CreateOp("/new"), CreateOp("/gone/x")], NotFoundError),
        ([CreateOp("/new"), DeleteOp("/a")], NotEmptyError),
        ([CreateOp("/new", ephemeral=True), CreateOp("/new/x")], EphemeralParentError),
        ([CreateOp("/new"), SetOp("/a", b"changed"), CheckOp("/nope", 0)], NotFoundError),
    ],
)
def test_multi_is_all_or_nothing(store: MetadataStore, ops: list[Any], error: type[Exception]) -> None:
    store.create("/a", b"0")
    store.create("/a/kid")
    with pytest.raises(error):
        store.multi(ops)
    assert store.exists("/new") is None
    assert store.get("/a")[0] == b"0" and store.get("/a")[1].version == 0
    assert store.get("/a")[1].cversion == 1


def test_multi_empty(store: MetadataStore) -> None:
    assert store.multi([]) == []


# --- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["", "a", "/a/", "//a", "/a//b", "/a/./b", "/a/../b", "/.", "/a\x00b", "/a\x1fb"]
)
def test_bad_paths_are_usage_errors(store: MetadataStore, path: str) -> None:
    for call in (
        lambda: store.create(path),
        lambda: store.get(path),
        lambda: store.exists(path),
        lambda: store.set(path, b""),
        lambda: store.delete(path),
        lambda: store.children(path),
        lambda: store.get_many(["/", path]),
    ):
        with pytest.raises(UsageError):
            call()


def test_bad_arguments(store: MetadataStore) -> None:
    store.create("/a")
    with pytest.raises(UsageError):
        store.create("/big", b"x" * 1_000_001)
    with pytest.raises(UsageError):
        store.set("/a", "text")  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        store.set("/a", b"", version=-2)
    with pytest.raises(UsageError):
        store.multi([CreateOp("/x")] * 1001)


def test_closed_store_is_unavailable(store: MetadataStore) -> None:
    store.close()
    store.close()  # idempotent
    with pytest.raises(UnavailableError):
        store.get("/")
    with pytest.raises(UnavailableError):
        store.create("/x")


def test_context_manager_closes(store_target: StoreTarget) -> None:
    with store_target.open() as store:
        store.create("/e", ephemeral=True)
    with store_target.open() as other:
        assert other.exists("/e") is None


# --- watches -----------------------------------------------------------------------------------------


def test_data_watch_fires_for_every_change(store: MetadataStore) -> None:
    seen = Recorder()
    sub = store.watch_data("/w", seen.data)
    assert seen.calls == [None]  # first call before watch_data returns: absent node
    store.create("/w", b"0")
    seen.wait_for((b"0", 0))
    for i in range(1, 21):
        store.set("/w", str(i).encode())
        seen.wait_for((str(i).encode(), i))
    store.delete("/w")
    seen.wait_for(None)
    store.create("/w", b"again")  # the watch survives deletion
    seen.wait_for((b"again", 0))
    assert len(seen.calls) == 24
    sub.cancel()
    store.set("/w", b"after cancel")
    barrier = Recorder()
    store.watch_data("/w", barrier.data)
    store.set("/w", b"barrier")
    barrier.wait_for((b"barrier", 2))
    assert len(seen.calls) == 24 and not sub.active


def test_data_watch_ignores_children(store: MetadataStore) -> None:
    store.create("/p", b"x")
    seen = Recorder()
    store.watch_data("/p", seen.data)
    store.create("/p/c")
    store.delete("/p/c")
    store.set("/p", b"y")
    seen.wait_for((b"y", 1))
    assert seen.calls == [(b"x", 0), (b"y", 1)]


def test_data_watch_burst_reports_latest(store: MetadataStore) -> None:
    store.create("/w", b"start")
    seen = Recorder()
    store.watch_data("/w", seen.data)
    for i in range(50):
        store.set("/w", str(i).encode())
    seen.wait_for((b"49", 50))
    versions = [call[1] for call in seen.calls]
    assert versions == sorted(versions)  # never goes back in time


def test_children_watch_fires_for_every_change(store: MetadataStore) -> None:
    store.create("/p")
    seen = Recorder()
    store.watch_children("/p", seen.children)
    assert seen.calls == [[]]
    expected: list[str] = []
    for i in range(10):
        store.create(f"/p/c{i}")
        expected.append(f"c{i}")
        seen.wait_for(expected)
    for i in range(10):
        store.delete(f"/p/c{i}")
        seen.wait_for(expected[i + 1 :])
    assert len(seen.calls) == 21


def test_children_watch_ignores_child_data(store: MetadataStore) -> None:
    store.create("/p")
    store.create("/p/a")
    seen = Recorder()
    store.watch_children("/p", seen.children)
    store.set("/p/a", b"data")
    store.set("/p", b"own data")
    store.create("/p/a/grandchild")
    store.create("/p/b")  # the barrier
    seen.wait_for(["a", "b"])
    assert seen.calls == [["a"], ["a", "b"]]


def test_children_watch_ends_when_node_deleted(store: MetadataStore) -> None:
    store.create("/p")
    store.create("/p/a")
    seen = Recorder()
    sub = store.watch_children("/p", seen.children)
    store.delete("/p", recursive=True)
    seen.wait_for(None)
    assert not sub.active
    store.create("/p")
    store.create("/p/new")
    barrier = Recorder()
    store.watch_children("/p", barrier.children)
    barrier.wait_for(["new"])
    assert seen.calls[-1] is None


def test_children_watch_of_missing_fails(store: MetadataStore) -> None:
    with pytest.raises(NotFoundError):
        store.watch_children("/nope", Recorder().children)


def test_watches_see_other_sessions(store_target: StoreTarget) -> None:
    watcher, writer = store_target.open(), store_target.open()
    data, kids = Recorder(), Recorder()
    writer.create("/p")
    watcher.watch_data("/p", data.data)
    watcher.watch_children("/p", kids.children)
    writer.set("/p", b"v1")
    data.wait_for((b"v1", 1))
    writer.create("/p/e", ephemeral=True)
    kids.wait_for(["e"])
    writer.close()  # the ephemeral goes with the session: a change too
    kids.wait_for([])


def test_watch_callbacks_run_on_a_store_thread(store: MetadataStore) -> None:
    seen = Recorder()
    store.watch_data("/t", seen.data)
    store.create("/t")
    seen.wait_for((b"", 0))
    me = threading.current_thread().name
    assert seen.threads[0] == me and seen.threads[1] != me


def test_watch_callback_may_call_the_store(store: MetadataStore) -> None:
    store.create("/src")
    store.create("/dst")

    def copy(data: bytes | None, stat: Stat | None) -> None:
        if data:
            store.set("/dst", data)

    store.watch_data("/src", copy)
    store.set("/src", b"copied")
    wait_until(lambda: store.get("/dst")[0] == b"copied", what="the callback's write")


def test_failing_callback_does_not_stop_others(store: MetadataStore) -> None:
    def broken(data: bytes | None, stat: Stat | None) -> None:
        if stat is not None:
            raise RuntimeError("callback bug")

    seen = Recorder()
    store.watch_data("/x", broken)
    store.watch_data("/x", seen.data)
    store.create("/x", b"1")
    seen.wait_for((b"1", 0))
    store.set("/x", b"2")
    seen.wait_for((b"2", 1))


# --- several processes -------------------------------------------------------------------------------

PROCESSES = 3


def test_concurrent_cas_loses_no_update(store_target: StoreTarget) -> None:
    store = store_target.open()
    store.create("/counter", b"0")
    per_process = 100
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(PROCESSES) as pool:
        jobs = [
            pool.apply_async(workers.cas_increments, (store_target.uri, "/counter", per_process))
            for _ in range(PROCESSES)
        ]
        retries = [job.get(timeout=120) for job in jobs]
    data, stat = store.get("/counter")
    assert int(data) == PROCESSES * per_process
    assert stat.version == PROCESSES * per_process
    assert all(r >= 0 for r in retries)


def test_concurrent_sequential_names_unique_and_ordered(store_target: StoreTarget) -> None:
    store = store_target.open()
    store.create("/idgen")
    per_process = 50
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(PROCESSES) as pool:
        jobs = [
            pool.apply_async(workers.sequential_creates, (store_target.uri, "/idgen/ID-", per_process))
            for _ in range(PROCESSES)
        ]
        created = [job.get(timeout=120) for job in jobs]
    for names in created:
        assert names == sorted(names)  # each process sees its own ids increase
    every = sorted(name for names in created for name in names)
    assert every == [f"/idgen/ID-{i:010d}" for i in range(PROCESSES * per_process)]
    assert store.children("/idgen") == [name.rsplit("/", 1)[1] for name in every]


def test_concurrent_sequential_from_threads(store: MetadataStore) -> None:
    store.create("/t")
    names: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(25):
            name = store.create("/t/n-", sequential=True)
            with lock:
                names.append(name)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert sorted(names) == [f"/t/n-{i:010d}" for i in range(100)]


def test_open_store_by_uri(store_target: StoreTarget) -> None:
    with open_store(store_target.uri, session_timeout_ms=2000) as store:
        store.create("/via-uri", b"1")
    assert store_target.open().get("/via-uri")[0] == b"1"
