"""write_now: a batch goes straight to an idle socket; whatever the kernel does not take keeps its order."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from twisted.internet.testing import StringTransport

from bkctl.limits import IOV_MAX
from bkctl.netio import write_now


class _Transport:
    """The FileDescriptor fields write_now reads, over a real non-blocking socket; queued bytes land in
    `queued` as Twisted's writeSequence would keep them."""

    def __init__(self, sock: socket.socket) -> None:
        self.socket = sock
        self.connected = True
        self.disconnecting = False
        self._writeDisconnected = False
        self.dataBuffer = b""
        self._tempDataLen = 0
        self.queued: list[bytes] = []

    def writeSequence(self, chunks: list[bytes]) -> None:
        self.queued.extend(chunks)
        self._tempDataLen += sum(map(len, chunks))


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    yield ours, theirs
    ours.close()
    theirs.close()


def _drain(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    got = bytearray()
    while True:
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            return bytes(got)
        if not data:
            return bytes(got)
        got += data


def test_an_idle_socket_gets_the_batch_at_once(pair: tuple[socket.socket, socket.socket]) -> None:
    transport = _Transport(pair[0])
    write_now(transport, [b"one", b"two", b"three"])
    assert transport.queued == []
    assert _drain(pair[1]) == b"onetwothree"


def test_what_the_kernel_refuses_is_queued_in_order(pair: tuple[socket.socket, socket.socket]) -> None:
    transport = _Transport(pair[0])
    chunks = [bytes([n]) * 10_000 for n in range(1, 60)]  # far more than the socket buffers hold
    write_now(transport, chunks)
    sent = _drain(pair[1])
    assert transport.queued and len(sent) < sum(map(len, chunks))
    assert sent + b"".join(transport.queued) == b"".join(chunks)


def test_nothing_overtakes_bytes_already_queued(pair: tuple[socket.socket, socket.socket]) -> None:
    transport = _Transport(pair[0])
    transport.dataBuffer = b"earlier"
    write_now(transport, [b"later"])
    assert transport.queued == [b"later"] and _drain(pair[1]) == b""


def test_a_closed_peer_leaves_the_error_to_the_transport(pair: tuple[socket.socket, socket.socket]) -> None:
    transport = _Transport(pair[0])
    pair[1].close()
    write_now(transport, [b"lost"])
    assert transport.queued == [b"lost"]


def test_long_batches_and_other_transports_are_queued(pair: tuple[socket.socket, socket.socket]) -> None:
    transport = _Transport(pair[0])
    chunks = [b"x"] * (IOV_MAX + 1)
    write_now(transport, chunks)
    assert transport.queued == chunks
    string = StringTransport()
    write_now(string, [b"a", b"b"])
    assert string.value() == b"ab"


def test_a_tls_transport_always_queues(pair: tuple[socket.socket, socket.socket]) -> None:
    # After startTLS the socket carries TLS records: plaintext must never be sent to it directly.
    transport = _Transport(pair[0])
    transport.TLS = True  # type: ignore[attr-defined]
    write_now(transport, [b"one", b"two"])
    assert transport.queued == [b"one", b"two"]
    assert _drain(pair[1]) == b""
