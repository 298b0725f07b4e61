"""A real bookie on 127.0.0.1 port 0 with TLS, driven by a blocking socket and bkctl's own TlsChannel:
several TLS records in one socket read (one run of the frame loop), a record split over reads, the
handshake's Finished and the first requests in one read, a connection closed mid-handshake (counted),
backpressure on a client that does not read its replies, and close_notify both ways."""

from __future__ import annotations

import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bkctl import tls
from bkctl.protocol import wire, wire_v3
from bkctl.server.service import BookieService
from bkctl.tls_channel import TlsChannel
from tests.server_net.live import WAIT_S, in_thread, start_bookie, twisted_test
from tests.server_net.test_protocol import add_frame
from tests.tls_certs import Certificates, write_certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Certificates]:
    yield write_certificates(tmp_path_factory.mktemp("certs"))


async def with_tls_bookie(
    tmp_path: Path, certs: Certificates, scenario: Callable[[BookieService], Awaitable[None]]
) -> None:
    """Run `scenario` against a bookie with TLS configured (not required), stopped afterwards."""
    bookie = await start_bookie(
        tmp_path,
        tlsProviderFactoryClass=tls.JAVA_PROVIDER_FACTORY,
        tlsCertificatePath=str(certs.bookie.cert),
        tlsKeyStore=str(certs.bookie.key),
    )
    try:
        await scenario(bookie)
    finally:
        await bookie.stop()


class TlsClient:
    """A blocking client: START_TLS in the clear, then frames through a TlsChannel."""

    def __init__(self, port: int, certs: Certificates) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(wire.frame(wire_v3.encode_start_tls_request(1)))
        self.decoder = wire.FrameDecoder()
        self.decoder.feed(self._recv())
        (answer,) = self.decoder.frames()
        assert wire_v3.decode_v3_response(answer).status == wire_v3.StatusCode.EOK
        context = tls.client_context(tls.TlsSettings(trust_path=certs.ca))
        self.channel = TlsChannel(context, server_side=False)
        self.sock.sendall(self.channel.take_output())  # ClientHello

    def finish_handshake(self, then: bytes = b"") -> None:
        """Read the bookie's flight; send the Finished, with `then` (plaintext) in the same write."""
        while not self.channel.handshake_done:
            self.channel.receive(self._recv())
        self.sock.sendall(self.channel.take_output() + (self.channel.encrypt([then]) if then else b""))

    def replies(self, count: int) -> list[Any]:
        frames: list[bytes] = []
        while len(frames) < count:
            self.decoder.feed(self.channel.receive(self._recv()))
            frames.extend(self.decoder.frames())
        return [wire.decode_response(frame) for frame in frames]

    def _recv(self) -> bytes:
        data = self.sock.recv(1 << 20)
        assert data, "the bookie closed the connection"
        return data


def adds(ledger_id: int, count: int, payload: bytes = b"x") -> list[bytes]:
    return [add_frame(ledger_id, entry_id, payload) for entry_id in range(count)]


def frame_loop_runs(bookie: BookieService) -> list[int]:
    """Count the bookie's frame-loop runs on its (one) connection."""
    (connection,) = bookie.factory.connections
    runs = [0]
    frames = connection._frames

    def counted(data: bytes) -> str | None:
        runs[0] += 1
        return frames(data)

    connection._frames = counted  # type: ignore[method-assign]
    return runs


@twisted_test
async def test_records_in_one_read_split_records_and_finished_with_requests(
    tmp_path: Path, certs: Certificates
) -> None:
    async def scenario(bookie: BookieService) -> None:
        client = await in_thread(TlsClient, bookie.port, certs)
        # The first add rides in the same write (so read) as the handshake's Finished.
        await in_thread(client.finish_handshake, add_frame(1, 0))
        assert [r.rc for r in await in_thread(client.replies, 1)] == [wire.ReturnCode.EOK]
        runs = frame_loop_runs(bookie)
        # Ten records, one per add, in one write: one socket read, one run of the frame loop.
        records = b"".join(client.channel.encrypt([frame]) for frame in adds(2, 10))
        await in_thread(client.sock.sendall, records)
        assert [r.entry_id for r in await in_thread(client.replies, 10)] == list(range(10))
        assert runs == [1]
        # A record split over two reads: nothing until its last byte, then all of it.
        record = client.channel.encrypt(adds(3, 5, b"y" * 3000))

        def split() -> None:
            client.sock.sendall(record[: len(record) // 2])
            time.sleep(0.2)
            client.sock.sendall(record[len(record) // 2 :])

        await in_thread(split)
        assert [r.entry_id for r in await in_thread(client.replies, 5)] == list(range(5))
        assert runs == [2]
        metrics = bookie.factory.metrics
        assert (metrics.tls_handshakes, metrics.tls_handshake_failures) == (1, 0)
        client.sock.close()

    await with_tls_bookie(tmp_path, certs, scenario)


@twisted_test
async def test_a_connection_closed_mid_handshake_is_a_failure(tmp_path: Path, certs: Certificates) -> None:
    async def scenario(bookie: BookieService) -> None:
        client = await in_thread(TlsClient, bookie.port, certs)  # ClientHello sent, then gone
        client.sock.close()
        await wait_for(lambda: bookie.factory.metrics.tls_handshake_failures == 1)
        assert bookie.factory.metrics.tls_handshakes == 0

    await with_tls_bookie(tmp_path, certs, scenario)


@twisted_test
async def test_backpressure_on_a_tls_client_that_does_not_read(tmp_path: Path, certs: Certificates) -> None:
    async def scenario(bookie: BookieService) -> None:
        client = await in_thread(TlsClient, bookie.port, certs)
        await in_thread(client.finish_handshake, add_frame(1, 0, b"z" * 500_000))
        await in_thread(client.replies, 1)
        read = wire.frame(wire.encode_read_request(1, 0, 0, None))
        # 100 reads of a 500 KB entry: 50 MB of replies the client does not read yet.
        await in_thread(client.sock.sendall, client.channel.encrypt([read] * 100))
        await wait_for(lambda: bookie.factory.metrics.read_pauses >= 1)
        replies = await in_thread(client.replies, 100)
        assert {r.rc for r in replies} == {wire.ReturnCode.EOK}
        (size,) = {len(r.entry) for r in replies}
        assert size > 500_000  # the entry and its header
        client.sock.close()

    await with_tls_bookie(tmp_path, certs, scenario)


@twisted_test
async def test_close_notify_both_ways(tmp_path: Path, certs: Certificates) -> None:
    async def scenario(bookie: BookieService) -> None:
        client = await in_thread(TlsClient, bookie.port, certs)
        await in_thread(client.finish_handshake)
        await in_thread(client.sock.sendall, client.channel.close())  # the client's close_notify

        def bookie_closes() -> bytes:
            received = b""
            while data := client.sock.recv(65536):
                received += data
            return received

        assert await in_thread(client.channel.receive, await in_thread(bookie_closes)) == b""
        assert client.channel.peer_closed  # the bookie answered with its close_notify, then closed
        # The bookie closing (it stops): a close_notify first, then the end of the stream.
        other = await in_thread(TlsClient, bookie.port, certs)
        await in_thread(other.finish_handshake)
        await wait_for(lambda: bookie.factory.metrics.tls_handshakes == 2)  # both ends are up
        bookie.factory.close_all()
        other.channel.receive(await in_thread(lambda: other.sock.recv(65536)))
        assert other.channel.peer_closed

    await with_tls_bookie(tmp_path, certs, scenario)


async def wait_for(predicate: Any, timeout_s: float = WAIT_S) -> None:
    from twisted.internet import reactor, task

    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await task.deferLater(reactor, 0.02, lambda: None)
