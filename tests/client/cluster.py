"""A throwaway cluster for client tests: in-process bookies (BookieService, 127.0.0.1 port 0) on a
SQLite file or a ZooKeeper chroot, and a Client on the reactor. Every wait is bounded."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from twisted.internet import defer, protocol, reactor
from twisted.internet.task import deferLater

from bkctl.client.client import Client
from bkctl.metadata.layout import Layout
from bkctl.metadata.store import MetadataStore
from bkctl.metadata.stores import open_store
from bkctl.server.service import BookieService
from tests.server_net.live import in_thread, start_bookie

WAIT_S = 20.0
# Fast failure detection in tests; production defaults are in bkctl.limits.
REQUEST_TIMEOUT_MS = 1500
# The bookies' wire protocol of `Cluster.client()`: tests/client/conftest.py runs each test with both.
PROTOCOL = "v2"


class Cluster:
    def __init__(self, tmp_path: Path, uri: str | None = None) -> None:
        self.tmp_path = tmp_path
        self.uri = uri or f"sqlite://{tmp_path / 'metadata.db'}"
        self.bookies: list[BookieService] = []
        self.store: MetadataStore | None = None
        self.layout: Layout | None = None
        self.clients: list[Client] = []
        self._silent: list[Any] = []

    async def start(self, bookies: int) -> Cluster:
        self.store = await in_thread(open_store, self.uri)
        self.layout = Layout(self.store)
        if await in_thread(self.layout.instance_id) is None:
            await in_thread(self.layout.init_cluster)
        for _ in range(bookies):
            await self.add_bookie()
        return self

    async def add_bookie(self) -> BookieService:
        name = f"b{len(self.bookies) + 1}"
        service = await start_bookie(self.tmp_path, name, self.uri)
        self.bookies.append(service)
        return service

    def client(self, seed: int = 1, **options: int) -> Client:
        assert self.layout is not None
        options.setdefault("request_timeout_ms", REQUEST_TIMEOUT_MS)
        client = Client(self.layout, reactor, rng=random.Random(seed), protocol=PROTOCOL, **options)
        self.clients.append(client)
        return client

    def bookie(self, bookie_id: str) -> BookieService:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)

    async def silent_bookie(self) -> str:
        """A registered bookie that accepts connections and never answers (a hung process)."""
        factory = protocol.Factory.forProtocol(protocol.Protocol)
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self._silent.append(port)
        bookie_id = f"127.0.0.1:{port.getHost().port}"
        assert self.layout is not None
        await in_thread(self.layout.register_bookie, bookie_id)
        return bookie_id

    async def unregister(self, bookie_id: str) -> None:
        assert self.layout is not None
        await in_thread(self.layout.unregister_bookie, bookie_id)

    async def stop(self) -> None:
        for client in self.clients:
            await bounded(client.close())
        for service in self.bookies:
            await bounded(service.stop())
        for port in self._silent:
            await bounded(defer.maybeDeferred(port.stopListening))
        if self.store is not None:
            await in_thread(self.store.close)


async def bounded(d: Any, timeout_s: float = WAIT_S) -> Any:
    """Await a Deferred, failing the test (not hanging it) after `timeout_s`."""
    d = defer.ensureDeferred(d) if not isinstance(d, defer.Deferred) else d
    d.addTimeout(timeout_s, reactor)
    return await d


async def sleep(seconds: float) -> None:
    await deferLater(reactor, seconds, lambda: None)
