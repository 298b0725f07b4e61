"""Hypothesis state machine: random operations on each backend must match a tiny in-memory model."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from bkctl.errors import (
    BadVersionError,
    BkctlError,
    EphemeralParentError,
    NodeExistsError,
    NotEmptyError,
    NotFoundError,
)
from bkctl.metadata.store import (
    SEQUENTIAL_FORMAT,
    CheckOp,
    CreateOp,
    DeleteOp,
    MetadataStore,
    Op,
    SetOp,
    join,
    parent_of,
)
from tests.conftest import StoreTarget

NAMES = st.sampled_from(["a", "b", "c", "s-"])
DATA = st.binary(max_size=8)
KINDS = ["create", "set", "delete", "check"]
VERSION_DELTAS = st.sampled_from([None, 0, 1])


@dataclass
class Node:
    data: bytes = b""
    version: int = 0
    cversion: int = 0
    seq: int = 0
    ephemeral: bool = False
    children: set[str] = field(default_factory=set)


class Model:
    """ZooKeeper's rules in a few lines; errors in the order ZooKeeper checks them."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {"/": Node()}

    def create(self, op: CreateOp) -> str:
        parent = self.nodes.get(parent_of(op.path))
        if parent is None:
            raise NotFoundError(op.path)
        path = op.path + SEQUENTIAL_FORMAT % parent.seq if op.sequential else op.path
        if path in self.nodes:
            raise NodeExistsError(path)
        if parent.ephemeral:
            raise EphemeralParentError(path)
        self.nodes[path] = Node(op.data, ephemeral=op.ephemeral)
        parent.children.add(path.rsplit("/", 1)[1])
        parent.cversion += 1
        parent.seq += 1
        return path

    def _node(self, path: str, version: int) -> Node:
        node = self.nodes.get(path)
        if node is None:
            raise NotFoundError(path)
        if version not in (-1, node.version):
            raise BadVersionError(path)
        return node

    def set(self, op: SetOp) -> None:
        node = self._node(op.path, op.version)
        node.data, node.version = op.data, node.version + 1

    def delete(self, op: DeleteOp) -> None:
        node = self._node(op.path, op.version)
        if node.children:
            raise NotEmptyError(op.path)
        del self.nodes[op.path]
        parent = self.nodes[parent_of(op.path)]
        parent.children.discard(op.path.rsplit("/", 1)[1])
        parent.cversion += 1

    def apply(self, op: Op) -> str | None:
        if isinstance(op, CreateOp):
            return self.create(op)
        if isinstance(op, SetOp):
            self.set(op)
        elif isinstance(op, DeleteOp):
            self.delete(op)
        else:
            self._node(op.path, op.version)
        return None


def outcome(call: Callable[[], object]) -> object:
    """The value, or the error class: what the model and the backend must agree on."""
    try:
        return call()
    except BkctlError as exc:
        return type(exc)


def make_machine(open_store: Callable[[], MetadataStore]) -> type[RuleBasedStateMachine]:
    class StoreMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.store = open_store()
            self.model = Model()

        def teardown(self) -> None:
            self.store.close()

        def paths(self) -> list[str]:
            return sorted(self.model.nodes)

        def pick(self, index: int, missing: bool) -> str:
            paths = self.paths()
            path = paths[index % len(paths)]
            return join(path, "zz") if missing else path

        @rule(index=st.integers(0, 50), name=NAMES, data=DATA, ephemeral=st.booleans(), missing=st.booleans())
        def create(self, index: int, name: str, data: bytes, ephemeral: bool, missing: bool) -> None:
            op = CreateOp(join(self.pick(index, missing), name), data, ephemeral, sequential=name == "s-")
            got = outcome(
                lambda: self.store.create(op.path, op.data, ephemeral=op.ephemeral, sequential=op.sequential)
            )
            assert got == outcome(lambda: self.model.create(op))

        @rule(index=st.integers(0, 50), data=DATA, version_delta=VERSION_DELTAS, missing=st.booleans())
        def set(self, index: int, data: bytes, version_delta: int | None, missing: bool) -> None:
            op = SetOp(self.pick(index, missing), data, self._version(index, version_delta, missing))
            got = outcome(lambda: self.store.set(op.path, op.data, op.version))
            want = outcome(lambda: self.model.set(op))
            assert (got if isinstance(got, type) else None) == want

        @rule(index=st.integers(1, 50), version_delta=st.sampled_from([None, 0, 1]), missing=st.booleans())
        def delete(self, index: int, version_delta: int | None, missing: bool) -> None:
            path = self.pick(index, missing)
            if path == "/":
                return
            op = DeleteOp(path, self._version(index, version_delta, missing))
            got = outcome(lambda: self.store.delete(op.path, op.version))
            assert got == outcome(lambda: self.model.delete(op))

        @rule(
            ops=st.lists(
                st.tuples(st.sampled_from(KINDS), st.integers(0, 50), NAMES, st.sampled_from([None, 0, 1])),
                min_size=1,
                max_size=3,
            )
        )
        def multi(self, ops: list[tuple[str, int, str, int | None]]) -> None:
            built = [self._op(*spec) for spec in ops]
            built = [op for op in built if not (isinstance(op, DeleteOp) and op.path == "/")]
            trial = copy.deepcopy(self.model)
            want: object
            try:
                want = [trial.apply(op) for op in built]
            except BkctlError as exc:
                want = type(exc)
            got = outcome(lambda: self.store.multi(built))
            if isinstance(want, list):
                assert isinstance(got, list)
                assert [r if isinstance(r, str) else None for r in got] == want
                self.model = trial
            else:
                assert got == want

        def _op(self, kind: str, index: int, name: str, version_delta: int | None) -> Op:
            path = self.pick(index, False)
            if kind == "create":
                return CreateOp(join(path, name), b"m", sequential=name == "s-")
            version = self._version(index, version_delta, False)
            if kind == "set":
                return SetOp(path, b"m", version)
            if kind == "delete":
                return DeleteOp(path, version)
            return CheckOp(path, max(version, 0))

        def _version(self, index: int, delta: int | None, missing: bool) -> int:
            if delta is None or missing:
                return -1
            return self.model.nodes[self.pick(index, False)].version + delta

        @rule(index=st.integers(0, 50))
        def compare_node(self, index: int) -> None:
            path = self.pick(index, False)
            node = self.model.nodes[path]
            data, stat = self.store.get(path)
            assert (data, stat.version, stat.cversion, stat.num_children) == (
                node.data,
                node.version,
                node.cversion,
                len(node.children),
            )
            assert (stat.ephemeral_owner != 0) == node.ephemeral
            assert self.store.children(path) == sorted(node.children)

        @invariant()
        def root_children_match(self) -> None:
            assert self.store.children("/") == sorted(self.model.nodes["/"].children)

    return StoreMachine


@pytest.mark.slow
def test_backend_matches_model(store_target: StoreTarget, request: pytest.FixtureRequest) -> None:
    counter = iter(range(10_000))

    def fresh_store() -> MetadataStore:
        # Every example starts from an empty store: a new SQLite file or a new ZooKeeper chroot.
        if store_target.backend == "sqlite":
            tmp = request.getfixturevalue("tmp_path")
            return StoreTarget("sqlite", f"sqlite://{tmp / f'model-{next(counter)}.db'}", 2000).open()
        from tests.conftest import new_zk_chroot

        hosts = new_zk_chroot(
            request.getfixturevalue("zookeeper"), request.getfixturevalue("zk_admin"), "model"
        )
        return StoreTarget("zookeeper", hosts, 2000).open()

    run_state_machine_as_test(
        make_machine(fresh_store),
        settings=settings(
            max_examples=25,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
