"""A tiny blocking test client built from bkctl.protocol.wire (plain sockets, no Twisted).

Tests and the benchmark use it against live bookies; it pipelines by sending many frames before
reading replies, and every receive is bounded by the socket timeout. With `protocol="v3"` its
one-call helpers (add, add_many, read, read_many, fence) send v3 requests as a Java client does and
give the answers back as v2 responses (the v3 status mapped to the v2 code of the same name), so one
test runs over both protocols.
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
    def __init__(self, host: str, port: int, timeout_s: float = 10.0, protocol: str = "v2") -> None:
        self.protocol = protocol
        self._txn = 0
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
        return [wire.decode_response(p) for p in self._payloads(count)]

    def receive_v3(self, count: int) -> list[wire_v3.V3Response]:
        """The next `count` v3 responses (socket timeout bounds the wait)."""
        return [wire_v3.decode_v3_response(p) for p in self._payloads(count)]

    def _payloads(self, count: int) -> list[bytes]:
        out: list[bytes] = []
        while len(out) < count:
            if not self._ready:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError(f"bookie closed the connection after {len(out)} of {count} replies")
                self.decoder.feed(data)
                self._ready = self.decoder.frames()
                continue
            out.append(self._ready.pop(0))
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
        self.send_payloads(
            [self._add_request(ledger_id, entry_id, package(ledger_id, entry_id, payload), key, flags)]
        )
        (response,) = self.replies(1)
        assert isinstance(response, wire.AddResponse)
        return response

    def add_many(self, ledger_id: int, payloads: list[bytes], first: int = 0) -> list[wire.Response]:
        requests = [
            self._add_request(ledger_id, first + i, package(ledger_id, first + i, p), MASTER_KEY, 0)
            for i, p in enumerate(payloads)
        ]
        self.send_payloads(requests)
        return self.replies(len(requests))

    def read(self, ledger_id: int, entry_id: int) -> wire.ReadResponse:
        (response,) = self.read_many(ledger_id, [entry_id])
        return response

    def read_many(self, ledger_id: int, entry_ids: list[int]) -> list[wire.ReadResponse]:
        """Pipelined reads, answered in order."""
        self.send_payloads([self._read_request(ledger_id, e, 0, None) for e in entry_ids])
        responses = self.replies(len(entry_ids))
        assert all(isinstance(r, wire.ReadResponse) for r in responses)
        return responses  # type: ignore[return-value]

    def fence(self, ledger_id: int, key: bytes = MASTER_KEY, entry_id: int = -1) -> wire.ReadResponse:
        flags = wire.FLAG_DO_FENCING | wire.FLAG_HIGH_PRIORITY
        self.send_payloads([self._read_request(ledger_id, entry_id, flags, key)])
        (response,) = self.replies(1)
        assert isinstance(response, wire.ReadResponse)
        return response

    # --- the two protocols ----------------------------------------------------------------------------

    def replies(self, count: int) -> list[wire.Response]:
        """The next `count` answers as v2 responses, whichever protocol the client speaks."""
        if self.protocol == "v2":
            return self.receive(count)
        out: list[wire.Response] = []
        for response in self.receive_v3(count):
            op = response.operation
            assert op is not None and op.ledger_id is not None and op.entry_id is not None, response
            rc = int(wire_v3.StatusCode(response.status).to_return_code())
            if response.header.operation == wire_v3.OperationType.ADD_ENTRY:
                out.append(wire.AddResponse(3, rc, op.ledger_id, op.entry_id))
            else:
                out.append(wire.ReadResponse(3, rc, op.ledger_id, op.entry_id, op.body or b""))
        return out

    def _next_txn(self) -> int:
        self._txn += 1
        return self._txn

    def _add_request(self, ledger_id: int, entry_id: int, body: bytes, key: bytes, flags: int) -> bytes:
        if self.protocol == "v2":
            return wire.encode_add_request(body, key, flags)
        recovery, high = bool(flags & wire.FLAG_RECOVERY_ADD), bool(flags & wire.FLAG_HIGH_PRIORITY)
        return wire_v3.encode_add_request(self._next_txn(), ledger_id, entry_id, key, body, recovery, high)

    def _read_request(self, ledger_id: int, entry_id: int, flags: int, key: bytes | None) -> bytes:
        if self.protocol == "v2":
            return wire.encode_read_request(ledger_id, entry_id, flags, key)
        fence_key = key if flags & wire.FLAG_DO_FENCING else None
        high = bool(flags & wire.FLAG_HIGH_PRIORITY)
        return wire_v3.encode_read_request(self._next_txn(), ledger_id, entry_id, fence_key, high)


def bad_length_frame(length: int) -> bytes:
    return struct.pack(">i", length)
