"""kazoo's select on poll(2): select's contract on real sockets."""

from __future__ import annotations

import socket

import pytest

from bkctl.metadata.zk_poll import PollHandler, poll_select


def test_readers_and_writers_as_select_gives_them() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert poll_select([a], [], [], 0) == ([], [], [])  # nothing to read: the timeout
        assert poll_select([a], [b], [], 0) == ([], [b], [])
        b.sendall(b"x")
        assert poll_select([a, b.fileno()], [], [], 0.5) == ([a], [], [])
        assert PollHandler().select([a], [a], [], 0) == ([a], [a], [])


def test_a_closed_peer_wakes_the_reader() -> None:
    a, b = socket.socketpair()
    with a:
        b.close()
        readers, _, _ = poll_select([a], [], [], 1.0)
        assert readers == [a] and a.recv(1) == b""


def test_a_negative_timeout_is_refused() -> None:
    with pytest.raises(ValueError):
        poll_select([], [], [], -1)
