"""The online audit's connection probe: every bookie at once, a wait said once, a bookie that does not
accept in time reported with why (real sockets on 127.0.0.1)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from bkctl.pipeline.online import probe_connections


@contextmanager
def _full_listener() -> Iterator[tuple[str, int]]:
    """A listener whose accept queue is full: the next connection's SYN is dropped, so connect waits."""
    with ExitStack() as stack:
        listener = stack.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        for _ in range(4):  # bounded: enough to fill a backlog of 0 (+1) on Linux
            filler = stack.enter_context(socket.socket())
            filler.settimeout(0.5)
            try:
                filler.connect(address)
            except TimeoutError:
                break
        yield address


def test_the_probe_says_its_wait_once_and_names_what_did_not_answer() -> None:
    told: list[str] = []
    with socket.socket() as open_one, socket.socket() as closed_one, _full_listener() as full:
        open_one.bind(("127.0.0.1", 0))
        open_one.listen(8)
        closed_one.bind(("127.0.0.1", 0))  # bound, never listening: refused at once
        addresses = {"up": open_one.getsockname(), "refusing": closed_one.getsockname(), "silent": full}
        refused = probe_connections(addresses, told.append, timeout_s=3.0)
    assert set(refused) == {"refusing", "silent"}
    assert "refused" in refused["refusing"].lower()
    assert told == ["waiting for 1 bookie(s) to accept a connection (up to 3 s)"]
