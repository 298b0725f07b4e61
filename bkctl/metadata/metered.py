"""A metadata store that asks at most `ops_per_s` requests a second of the store it wraps.

An autorecovery daemon's metadata requests go through one (`replicationMetadataOpsPerSecond`), so a
heal of thousands of ledgers cannot flood ZooKeeper while the cluster's own clients need it. Each
request waits (in the pool thread that makes it) until it is due at the rate; time left idle is
credited for at most BURST_S, so a pause is not followed by an unbounded burst. A read of many nodes
counts one request per multiRead batch, a create of many nodes one per node; watches and sessions are
not requests made here and pass through.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence

from bkctl.errors import BkctlError
from bkctl.metadata.store import (
    ChildrenCallback,
    DataCallback,
    MetadataStore,
    Op,
    OpResult,
    SessionCallback,
    Stat,
    Subscription,
)
from bkctl.metadata.zookeeper import MULTI_READ_PATHS

BURST_S = 1.0  # local bound: how much of the rate may go at once after a pause


class OpsRate:
    """Requests a second, shared by every thread that asks (`wait(n)` blocks until `n` are due)."""

    def __init__(self, ops_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if ops_per_s <= 0:
            raise ValueError(f"a metadata request rate must be positive, not {ops_per_s}")
        self.ops_per_s = ops_per_s
        self._clock = clock
        self._due = clock() - BURST_S  # when the requests counted so far are due, at the rate
        self._lock = threading.Lock()
        self.requests = 0

    def delay_for(self, count: int) -> float:
        """Count `count` requests; how long the caller waits before making them."""
        with self._lock:
            now = self._clock()
            start = max(self._due, now - BURST_S)
            self._due = start + count / self.ops_per_s
            self.requests += count
            return max(0.0, start - now)

    def wait(self, count: int = 1) -> None:
        delay = self.delay_for(count)
        if delay > 0:
            time.sleep(delay)


class MeteredStore(MetadataStore):
    """`inner`, each request first waiting its turn at `rate`."""

    def __init__(self, inner: MetadataStore, rate: OpsRate) -> None:
        self.inner, self.rate = inner, rate

    @property
    def session_id(self) -> int:
        return self.inner.session_id

    def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> str:
        self.rate.wait()
        return self.inner.create(
            path, data, ephemeral=ephemeral, sequential=sequential, make_parents=make_parents
        )

    def create_each(self, nodes: Sequence[tuple[str, bytes]], *, ephemeral: bool = False) -> list[bool]:
        self.rate.wait(max(1, len(nodes)))
        return self.inner.create_each(nodes, ephemeral=ephemeral)

    def get(self, path: str) -> tuple[bytes, Stat]:
        self.rate.wait()
        return self.inner.get(path)

    def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, Stat] | None]:
        self.rate.wait(max(1, math.ceil(len(paths) / MULTI_READ_PATHS)))
        return self.inner.get_many(paths)

    def exists(self, path: str) -> Stat | None:
        self.rate.wait()
        return self.inner.exists(path)

    def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        self.rate.wait()
        return self.inner.set(path, data, version)

    def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        self.rate.wait()
        self.inner.delete(path, version, recursive=recursive)

    def children(self, path: str) -> list[str]:
        self.rate.wait()
        return self.inner.children(path)

    def multi(self, ops: Sequence[Op]) -> list[OpResult]:
        self.rate.wait()
        return self.inner.multi(ops)

    def multi_each(self, batches: Sequence[Sequence[Op]]) -> list[list[OpResult] | BkctlError]:
        self.rate.wait(max(1, len(batches)))
        return self.inner.multi_each(batches)

    def watch_data(self, path: str, callback: DataCallback) -> Subscription:
        return self.inner.watch_data(path, callback)

    def watch_children(self, path: str, callback: ChildrenCallback) -> Subscription:
        return self.inner.watch_children(path, callback)

    def on_session_lost(self, callback: SessionCallback) -> Subscription:
        return self.inner.on_session_lost(callback)

    def close(self) -> None:
        """The inner store is its owner's to close."""
