"""BookieClient protocol logic on a fake reactor: StringTransport for the socket, the reactor's Clock
for timeouts and backoff. No real bookie here (tests/client/test_ledger*.py use real ones)."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from bkctl.client.bookie_client import (
    RC_TIMEOUT,
    RC_UNAVAILABLE,
    BookieClient,
    BookieClients,
    add_key,
    error_for,
)
from bkctl.errors import FencedError, TimeoutError_, UnavailableError, UsageError
from bkctl.model import DigestType
from bkctl.protocol import wire, wire_v3
from bkctl.protocol.entry import master_key, package_entry

KEY = master_key(b"pw")
EOK = wire.ReturnCode.EOK


# These tests drive BookieClient by hand, the v3 ones at the end (tests/client/conftest.py).
BOTH_PROTOCOLS = False


def entry(ledger_id: int, entry_id: int, payload: bytes = b"x") -> bytes:
    return package_entry(DigestType.CRC32, ledger_id, entry_id, entry_id - 1, entry_id + 1, payload)


class Harness:
    def __init__(self, protocol: str = "v2", **options: int) -> None:
        self.reactor = MemoryReactorClock()
        self.client = BookieClient("127.0.0.1:3181", self.reactor, protocol=protocol, **options)
        self.results: list[tuple[str, int, bytes]] = []
        self.transport: StringTransport | None = None

    def cb(self, name: str) -> Any:
        return lambda rc, body: self.results.append((name, rc, body))

    def accept(self) -> StringTransport:
        """Complete the connection attempt the client made last."""
        host, port, factory, _timeout, _ = self.reactor.tcpClients[-1]
        assert (host, port) == ("127.0.0.1", 3181)
        proto = factory.buildProtocol(None)
        self.transport = StringTransport()
        proto.makeConnection(self.transport)
        self.proto = proto
        return self.transport

    def refuse(self) -> None:
        _, _, factory, _, _ = self.reactor.tcpClients[-1]
        factory.clientConnectionFailed(None, Failure(ConnectionRefusedError()))

    def sent(self) -> list[wire.Request]:
        assert self.transport is not None
        decoder = wire.FrameDecoder()
        decoder.feed(self.transport.value())
        self.transport.clear()
        return [wire.decode_request(p) for p in decoder.frames()]

    def reply(self, *payloads: bytes) -> None:
        self.proto.dataReceived(b"".join(wire.frame(p) for p in payloads))


def test_connects_on_first_request_and_batches_frames_per_tick() -> None:
    h = Harness()
    for i in range(3):
        h.client.add(entry(5, i), KEY, 0, 5, i, h.cb(f"a{i}"))
    assert len(h.reactor.tcpClients) == 1
    t = h.accept()
    assert t.value() != b""  # queued frames go out once connected
    sent = h.sent()
    assert [(r.ledger_id, r.entry_id) for r in sent] == [(5, 0), (5, 1), (5, 2)]  # type: ignore[union-attr]
    h.client.read(5, 1, h.cb("r1"))
    assert t.value() == b""  # not before the reactor turns
    h.reactor.advance(0)
    (read,) = h.sent()
    assert isinstance(read, wire.ReadRequest) and read.master_key is None


def test_replies_complete_by_key_in_order_and_out_of_order_keys() -> None:
    h = Harness()
    h.client.add(entry(5, 0), KEY, 0, 5, 0, h.cb("a0"))
    h.client.add(entry(5, 1), KEY, 0, 5, 1, h.cb("a1"))
    h.client.read(5, 0, h.cb("r0a"))
    h.client.read(5, 0, h.cb("r0b"))
    h.accept()
    h.reply(
        wire.encode_add_response(EOK, 5, 1),
        wire.encode_read_response(EOK, 5, 0, b"first"),
        wire.encode_add_response(wire.ReturnCode.EFENCED, 5, 0),
        wire.encode_read_response(wire.ReturnCode.ENOENTRY, 5, 0),
    )
    assert h.results == [
        ("a1", EOK, b""),
        ("r0a", EOK, b"first"),
        ("a0", wire.ReturnCode.EFENCED, b""),
        ("r0b", wire.ReturnCode.ENOENTRY, b""),
    ]
    assert h.client.in_flight == 0


def test_fencing_read_carries_the_key_and_matches_the_minus_one_reply() -> None:
    h = Harness()
    h.client.read(8, -1, h.cb("fence"), wire.FLAG_DO_FENCING, KEY)
    h.accept()
    (req,) = h.sent()
    assert isinstance(req, wire.ReadRequest)
    assert (req.flags, req.entry_id, req.master_key) == (wire.FLAG_DO_FENCING, -1, KEY)
    # The bookie answers with its last entry but says entry -1 in the header.
    h.reply(wire.encode_read_response(EOK, 8, -1, entry(8, 3)))
    assert h.results == [("fence", EOK, entry(8, 3))]


def test_timeout_then_late_reply_is_swallowed_by_the_tombstone() -> None:
    h = Harness(request_timeout_ms=1000)
    h.client.read(5, 0, h.cb("old"))
    h.accept()
    h.reactor.advance(0.5)
    h.client.read(5, 1, h.cb("other"))
    h.reactor.advance(0.6)  # the first is past its deadline, the second not
    assert h.results == [("old", RC_TIMEOUT, b"")]
    h.client.read(5, 0, h.cb("new"))
    h.reply(wire.encode_read_response(EOK, 5, 0, b"late"))  # the answer to "old"
    assert [r[0] for r in h.results] == ["old"]
    h.reply(wire.encode_read_response(EOK, 5, 0, b"fresh"))
    assert h.results[-1] == ("new", EOK, b"fresh")
    h.reactor.advance(0.5)
    assert h.results[-1] == ("other", RC_TIMEOUT, b"")
    assert h.client.connected  # a timeout does not drop the connection


def test_connection_lost_fails_pending_and_reconnects_after_backoff() -> None:
    h = Harness(backoff_min_ms=100, backoff_max_ms=400)
    h.client.read(5, 0, h.cb("r"))
    h.accept()
    h.proto.connectionLost(Failure(ConnectionRefusedError()))
    assert h.results == [("r", RC_UNAVAILABLE, b"")]
    # In backoff: fail fast (asynchronously), no new connection attempt.
    h.client.read(5, 0, h.cb("fast"))
    h.reactor.advance(0)
    assert h.results[-1] == ("fast", RC_UNAVAILABLE, b"")
    assert len(h.reactor.tcpClients) == 1
    h.reactor.advance(0.1)
    h.client.read(5, 0, h.cb("again"))
    assert len(h.reactor.tcpClients) == 2
    h.refuse()  # second failure: backoff doubles
    assert h.results[-1] == ("again", RC_UNAVAILABLE, b"")
    h.reactor.advance(0.15)
    h.client.read(5, 0, h.cb("still"))
    h.reactor.advance(0)
    assert len(h.reactor.tcpClients) == 2
    h.reactor.advance(0.1)
    h.client.read(5, 0, h.cb("ok"))
    h.accept()
    h.reply(wire.encode_read_response(EOK, 5, 0, b"e"))
    assert h.results[-1] == ("ok", EOK, b"e")
    assert h.client.connects == 2


def test_backoff_is_bounded() -> None:
    h = Harness(backoff_min_ms=100, backoff_max_ms=250)
    for _ in range(6):
        h.reactor.advance(1)
        h.client.read(5, 0, h.cb("r"))
        h.refuse()
    assert h.client._backoff_s == pytest.approx(0.25)


def test_garbage_from_the_bookie_drops_the_connection() -> None:
    h = Harness()
    h.client.read(5, 0, h.cb("r"))
    t = h.accept()
    h.proto.dataReceived(b"\xff\xff\xff\xff")
    assert t.disconnecting
    h.proto.connectionLost(Failure(ConnectionRefusedError()))
    assert h.results == [("r", RC_UNAVAILABLE, b"")]


def test_request_bound_and_closed_client() -> None:
    h = Harness(requests_max=2)
    for i in range(3):
        h.client.read(5, i, h.cb(f"r{i}"))
    h.reactor.advance(0)
    assert h.results == [("r2", RC_UNAVAILABLE, b"")]
    h.client.close()
    assert sorted(r[0] for r in h.results) == ["r0", "r1", "r2"]
    h.client.read(5, 9, h.cb("late"))
    h.reactor.advance(0)
    assert h.results[-1] == ("late", RC_UNAVAILABLE, b"")


def test_send_adds_batches_shared_items_and_refuses_only_the_excess() -> None:
    h = Harness(requests_max=3)
    replies: list[tuple[str, int]] = []
    items = [
        (add_key(5, i), wire.frame(wire.encode_add_request(entry(5, i), KEY)), f"a{i}") for i in range(4)
    ]
    h.client.send_adds(items, lambda argument, rc, body: replies.append((argument, rc)))
    h.reactor.advance(0)
    assert replies == [("a3", RC_UNAVAILABLE)]  # over the bound: the last one only, and not synchronously
    h.accept()
    assert [r.entry_id for r in h.sent()] == [0, 1, 2]  # type: ignore[union-attr]
    h.reply(*(wire.encode_add_response(EOK, 5, i) for i in (1, 0, 2)))
    assert replies[1:] == [("a1", EOK), ("a0", EOK), ("a2", EOK)]
    assert h.client.in_flight == 0


def test_unreachable_bookie_id_fails_requests() -> None:
    reactor = MemoryReactorClock()
    client = BookieClient("not-a-host-port", reactor)
    got: list[int] = []
    client.read(1, 0, lambda rc, body: got.append(rc))
    reactor.advance(0)
    assert got == [RC_UNAVAILABLE] and not reactor.tcpClients


def test_pool_and_errors() -> None:
    reactor = MemoryReactorClock()
    pool = BookieClients(reactor, request_timeout_ms=100)
    assert pool.get("127.0.0.1:1") is pool.get("127.0.0.1:1")
    assert "127.0.0.1:1" in pool
    pool.close()
    assert isinstance(error_for(RC_TIMEOUT, "x"), TimeoutError_)
    assert isinstance(error_for(RC_UNAVAILABLE, "x"), UnavailableError)
    assert isinstance(error_for(wire.ReturnCode.EFENCED, "x"), FencedError)


def test_addresses_are_looked_up_once_again_after_a_failure_and_a_hung_lookup_falls_back() -> None:
    reactor = MemoryReactorClock()
    lookups: list[Deferred[tuple[str, int] | None]] = []

    def resolver(bookie_id: str) -> Deferred[tuple[str, int] | None]:
        lookups.append(Deferred())
        return lookups[-1]

    client = BookieClient("127.0.0.1:3181", reactor, resolver=resolver, connect_timeout_ms=2000)
    client.read(1, 0, lambda rc, body: None)
    lookups[0].callback(("127.0.0.1", 4000))
    assert [c[:2] for c in reactor.tcpClients] == [("127.0.0.1", 4000)]  # the registered endpoint
    _, _, factory, _, _ = reactor.tcpClients[-1]
    factory.clientConnectionFailed(None, Failure(ConnectionRefusedError()))
    reactor.advance(10)  # past the reconnect backoff
    client.read(1, 0, lambda rc, body: None)
    assert len(lookups) == 2  # looked up again: the bookie may have moved
    reactor.advance(2)  # the metadata store does not answer within the connect timeout
    assert [c[:2] for c in reactor.tcpClients][-1] == ("127.0.0.1", 4000)  # the last known address
    assert len(lookups) == 2


# --- v3 ------------------------------------------------------------------------------------------------


def sent_v3(h: Harness) -> list[wire_v3.V3Request]:
    assert h.transport is not None
    decoder = wire.FrameDecoder()
    decoder.feed(h.transport.value())
    h.transport.clear()
    return [wire_v3.decode_v3_request(p) for p in decoder.frames()]


def v3_reply(request: wire_v3.V3Request, status: int, **fields: Any) -> bytes:
    operation = request.header.operation
    op = wire_v3.Operation(wire_v3.response_kind(operation), status=status, **fields)
    return wire_v3.encode_response(operation, request.header.txn_id, status, op)


def test_v3_requests_are_java_shaped_and_replies_match_by_txn_id() -> None:
    h = Harness("v3")
    h.client.add(entry(5, 0), KEY, 0, 5, 0, h.cb("a0"))
    h.client.add(entry(5, 0), KEY, wire.FLAG_RECOVERY_ADD | wire.FLAG_HIGH_PRIORITY, 5, 0, h.cb("a0r"))
    h.client.read(5, 0, h.cb("r0"))
    h.client.read(5, -1, h.cb("fence"), wire.FLAG_DO_FENCING | wire.FLAG_HIGH_PRIORITY, KEY)
    h.accept()
    add, recovery_add, read, fence = sent_v3(h)
    assert [r.header.txn_id for r in (add, recovery_add, read, fence)] == [1, 2, 3, 4]
    assert add.operation == wire_v3.Operation(
        "addRequest", ledger_id=5, entry_id=0, master_key=KEY, body=entry(5, 0)
    )
    assert (recovery_add.header.priority, recovery_add.operation and recovery_add.operation.flag) == (100, 1)
    assert read.operation == wire_v3.Operation("readRequest", ledger_id=5, entry_id=0)
    assert fence.operation == wire_v3.Operation(
        "readRequest", ledger_id=5, entry_id=-1, master_key=KEY, flag=wire_v3.READ_FLAG_FENCE_LEDGER
    )
    assert fence.header.priority == wire_v3.HIGH_PRIORITY
    h.reply(
        v3_reply(fence, 0, ledger_id=5, entry_id=-1, body=entry(5, 2)),
        v3_reply(add, wire_v3.StatusCode.EFENCED, ledger_id=5, entry_id=0),
        wire_v3.encode_status_response(read, wire_v3.StatusCode.EBADREQ),  # no operation message
        v3_reply(recovery_add, 0, ledger_id=5, entry_id=0),
    )
    assert h.results == [
        ("fence", EOK, entry(5, 2)),
        ("a0", wire.ReturnCode.EFENCED, b""),
        ("r0", wire.ReturnCode.EBADREQ, b""),
        ("a0r", EOK, b""),
    ]
    assert h.client.in_flight == 0


def test_v3_timeout_late_reply_and_garbage() -> None:
    h = Harness("v3", request_timeout_ms=1000)
    h.client.read(5, 0, h.cb("old"))
    h.accept()
    (old,) = sent_v3(h)
    h.reactor.advance(1.1)
    h.client.read(5, 0, h.cb("new"))
    h.reactor.advance(0)
    (new,) = sent_v3(h)
    h.reply(v3_reply(old, 0, ledger_id=5, entry_id=0, body=b"late"))  # swallowed: "old" timed out
    h.reply(v3_reply(new, 0, ledger_id=5, entry_id=0, body=b"fresh"))
    assert h.results == [("old", RC_TIMEOUT, b""), ("new", EOK, b"fresh")]
    h.client.read(5, 1, h.cb("r"))
    h.reactor.advance(0)
    h.proto.dataReceived(wire.frame(b"\x0a\x7f"))  # a response cut short: the stream is dropped
    assert h.transport is not None and h.transport.disconnecting


def test_unknown_protocol_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="v4"):
        BookieClient("127.0.0.1:3181", MemoryReactorClock(), protocol="v4")
    with pytest.raises(UsageError):
        BookieClients(MemoryReactorClock(), protocol="v1")
