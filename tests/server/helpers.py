"""Shared helpers of the storage engine tests: configs under tmp_path, durable-token collectors, waits."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock, deferLater

from bkctl.model import DigestType
from bkctl.protocol import entry
from bkctl.server.storage import Storage, StorageConfig

PASSWORD = b"testpasswd"
KEY = entry.master_key(PASSWORD)
OTHER_KEY = entry.master_key(b"other")
WAIT_S = 10.0


def config(tmp_path: Path, **overrides: Any) -> StorageConfig:
    settings: dict[str, Any] = {
        "journal_dirs": (tmp_path / "journal",),
        "ledger_dirs": (tmp_path / "ledgers",),
        "journal_prealloc_size": 1024 * 1024,
        "journal_max_group_wait_ms": 1.0,
        "flush_interval_ms": 3_600_000,  # tests checkpoint explicitly
    }
    settings.update(overrides)
    return StorageConfig(**settings)


def journal_dirs(tmp_path: Path, count: int) -> tuple[Path, ...]:
    """`count` journal dirs: tmp_path/journal (the single-journal default), then journal1, journal2, ..."""
    return (tmp_path / "journal", *(tmp_path / f"journal{i}" for i in range(1, count)))


def ledger_dirs(tmp_path: Path, count: int) -> tuple[Path, ...]:
    """`count` ledger dirs: tmp_path/ledgers (the single-dir default), then ledgers1, ledgers2, ..."""
    return (tmp_path / "ledgers", *(tmp_path / f"ledgers{i}" for i in range(1, count)))


def packaged(ledger_id: int, entry_id: int, payload: bytes | None = None) -> bytes:
    data = payload if payload is not None else f"L{ledger_id}-E{entry_id}".encode()
    return entry.package_entry(
        DigestType.CRC32C, ledger_id, entry_id, entry_id - 1, 10 * (entry_id + 1), data
    )


class Durable:
    """Collects on_durable batches."""

    def __init__(self) -> None:
        self.batches: list[list[object]] = []

    def __call__(self, tokens: list[object]) -> None:
        self.batches.append(list(tokens))

    @property
    def tokens(self) -> list[object]:
        return [t for batch in self.batches for t in batch]


def wait_until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> Deferred[None]:
    """Poll `predicate` on the real reactor every millisecond; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s

    async def poll() -> None:
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout_s} s")
            await deferLater(reactor, 0.001, lambda: None)

    return Deferred.fromCoroutine(poll())


def started(tmp_path: Path, durable: Durable | None = None, **overrides: Any) -> Storage:
    storage = Storage(config(tmp_path, **overrides), durable if durable is not None else Durable(), reactor)
    storage.start()
    return storage


class ThreadedClock(Clock):
    """task.Clock plus callFromThread: calls from other threads queue up until `run_from_threads`."""

    def __init__(self) -> None:
        super().__init__()
        self.from_threads: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...]]] = queue.Queue()

    def callFromThread(self, f: Callable[..., Any], *args: Any) -> None:
        self.from_threads.put((f, args))

    def run_from_threads(self, count: int = 1, timeout_s: float = WAIT_S) -> None:
        for _ in range(count):
            f, args = self.from_threads.get(timeout=timeout_s)
            f(*args)

    def run_until(self, predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        """Run calls from threads until `predicate` holds (the sync thread may merge batches)."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            f, args = self.from_threads.get(timeout=max(0.001, deadline - time.monotonic()))
            f(*args)


def abandon(storage: Storage) -> None:
    """Leave a storage as kill -9 would: no drain, no checkpoint (its sync thread is ended, files stay)."""
    if storage._periodic is not None and storage._periodic.active():
        storage._periodic.cancel()
    for journal in storage._journals:
        journal._sync.submit(None)
    for journal in storage._journals:
        journal._sync.join(WAIT_S)


TestFunction = TypeVar("TestFunction", bound=Callable[..., Any])


def twisted_test(function: TestFunction) -> TestFunction:
    """pytest_twisted.ensureDeferred with its type kept (the plugin's decorator is untyped)."""
    return cast(TestFunction, pytest_twisted.ensureDeferred(function))
