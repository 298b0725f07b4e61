"""Fixtures for the layout and metadata-command tests: the Java ZooKeeper dumps loaded into a store."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from bkctl.metadata.store import MetadataStore
from tests.conftest import JAVA_ZK_DUMPS, StoreTarget

DUMP_1 = JAVA_ZK_DUMPS / "zk-dump-1-after-ledgers.json"
DUMP_5 = JAVA_ZK_DUMPS / "zk-dump-5-final-with-wire-capture-ledgers.json"


def read_dump(path: Path) -> dict[str, dict[str, Any]]:
    loaded: dict[str, dict[str, Any]] = json.loads(path.read_text())
    return loaded


def dump_bytes(path: Path, znode: str) -> bytes:
    return base64.b64decode(read_dump(path)[znode]["data_b64"])


def load_dump(store: MetadataStore, path: Path, prefix: str = "") -> int:
    """Create every znode of a dump (except ZooKeeper's own) under `prefix`; return the node count.

    Ephemeral znodes (ephemeralOwner != 0) become ephemeral nodes of `store`'s session, so they vanish
    when it closes, as the bookies' registrations would. Each node is set `version` times so node
    versions match the dump too.
    """
    count = 0
    for znode, node in read_dump(path).items():  # depth-first: parents come first
        if znode == "/" or znode == "/zookeeper" or znode.startswith("/zookeeper/"):
            continue
        target = prefix + znode
        data = base64.b64decode(node["data_b64"])
        ephemeral = node["stat"]["ephemeralOwner"] != 0
        store.create(target, data, ephemeral=ephemeral, make_parents=True)
        for _ in range(node["stat"]["version"]):
            store.set(target, data)
        count += 1
    return count


class LoadedDump:
    """A store target holding a dump; `store` is the loading session (it owns the ephemeral nodes)."""

    def __init__(self, target: StoreTarget, store: MetadataStore, path: Path) -> None:
        self.target, self.store, self.path = target, store, path

    @property
    def uri(self) -> str:
        return self.target.uri


@pytest.fixture
def dump1(store_target: StoreTarget) -> LoadedDump:
    store = store_target.open()
    load_dump(store, DUMP_1)
    return LoadedDump(store_target, store, DUMP_1)


@pytest.fixture
def dump5(store_target: StoreTarget) -> LoadedDump:
    store = store_target.open()
    load_dump(store, DUMP_5)
    return LoadedDump(store_target, store, DUMP_5)
