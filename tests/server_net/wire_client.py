"""A tiny blocking v2 test client built from bkctl.protocol.wire (plain sockets, no Twisted).

Tests and the benchmark use it against live bookies; it pipelines by sending many frames before
reading replies, and every receive is bounded by the socket timeout.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable

from bkctl.model import DigestType
from bkctl.protocol import entry as entry_codec
from bkctl.protocol import wire, wire_v3

PASSWORD = b"secret"
MASTER_KEY = entry_codec.master_key(PASSWORD)


def package(ledger_id: int, entry_id: int, payload: bytes, lac: int = -1, length: int = 0) -> bytes:
    """A CRC32C packaged entry, as a client would send it."""
    return entry_codec.package_entry(
        DigestType.CRC32C, ledger_id, entry_id, lac, length or len(payload), payload
    )


class WireClient:
    def __init__(self, host: str, port: int, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = wire.FrameDecoder()
        self._ready: list[bytes] = []

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_payloads(self, payloads: Iterable[bytes]) -> None:
        self.sock.sendall(b"".join(wire.frame(p) for p in payloads))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self, count: int) -> list[wire.Response]:
        """The next `count` responses (socket timeout bounds the wait)."""
        out: list[wire.Response] = []
        while len(out) < count:
            if not self._ready:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError(f"bookie closed the connection after {len(out)} of {count} replies")
                self.decoder.feed(data)
                self._ready = self.decoder.frames()
                continue
            out.append(wire.decode_response(self._ready.pop(0)))
        return out

    def receive_v3(self, count: int) -> list[wire_v3.V3Response]:
        """The next `count` v3 responses (socket timeout bounds the wait)."""
        out: list[wire_v3.V3Response] = []
        while len(out) < count:
            if not self._ready:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError(f"bookie closed the connection after {len(out)} of {count} replies")
                self.decoder.feed(data)
                self._ready = self.decoder.frames()
                continue
            out.append(wire_v3.decode_v3_response(self._ready.pop(0)))
        return out

    def closed_by_peer(self) -> bool:
        """True once the bookie has closed the connection (EOF or reset) within the timeout."""
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    # --- one-call helpers ---------------------------------------------------------------------------

    def add(
        self, ledger_id: int, entry_id: int, payload: bytes, key: bytes = MASTER_KEY, flags: int = 0
    ) -> wire.AddResponse:
        self.send_payloads([wire.encode_add_request(package(ledger_id, entry_id, payload), key, flags)])
        (response,) = self.receive(1)
        assert isinstance(response, wire.AddResponse)
        return response

    def add_many(self, ledger_id: int, payloads: list[bytes], first: int = 0) -> list[wire.Response]:
        requests = [
            wire.encode_add_request(package(ledger_id, first + i, p), MASTER_KEY)
            for i, p in enumerate(payloads)
        ]
        self.send_payloads(requests)
        return self.receive(len(requests))

    def read(self, ledger_id: int, entry_id: int) -> wire.ReadResponse:
        self.send_payloads([wire.encode_read_request(ledger_id, entry_id)])
        (response,) = self.receive(1)
        assert isinstance(response, wire.ReadResponse)
        return response

    def fence(self, ledger_id: int, key: bytes = MASTER_KEY, entry_id: int = -1) -> wire.ReadResponse:
        flags = wire.FLAG_DO_FENCING | wire.FLAG_HIGH_PRIORITY
        self.send_payloads([wire.encode_read_request(ledger_id, entry_id, flags, key)])
        (response,) = self.receive(1)
        assert isinstance(response, wire.ReadResponse)
        return response


def bad_length_frame(length: int) -> bytes:
    return struct.pack(">i", length)
