"""What the chaos writer and reader processes share: a client on the metadata store, one worker that
logs to its history file, SIGTERM asking it to stop, and a port helper for the runner."""

from __future__ import annotations

import random
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from twisted.internet import defer, task

from benchmarks.chaos.history import HistoryLog
from bkctl.client.client import Client
from bkctl.metadata.stores import layout_at


class Worker(Protocol):
    stopping: bool

    async def run(self) -> None: ...


def run_worker(metadata: str, history: Path, make: Callable[[Client, HistoryLog], Worker]) -> None:
    """Run `make(client, log)`'s worker until it returns or SIGTERM asks it to stop; exits the process."""
    log = HistoryLog(history)
    with layout_at(metadata) as layout:

        async def run(reactor: Any) -> None:
            client = Client(layout, reactor)
            worker = make(client, log)
            signal.signal(signal.SIGTERM, lambda *_: setattr(worker, "stopping", True))
            try:
                await worker.run()
            finally:
                await client.close()
                log.close()

        task.react(lambda reactor: defer.ensureDeferred(run(reactor)))


def free_base_port(count: int) -> int:
    """A port p with p .. p+count-1 free now (bookies restart on the same ids, hence the same ports)."""
    for _ in range(100):
        base = random.randrange(20000, 60000)
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free ports")
