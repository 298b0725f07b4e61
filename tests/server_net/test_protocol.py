"""BookieProtocol logic on a StringTransport with an in-memory storage: pipelining, one write per
fsync batch, backpressure, fencing reads, bad input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, succeed
from twisted.internet.testing import StringTransport

from bkctl.protocol import entry_availability, wire, wire_v3
from bkctl.protocol.protobuf import bytes_field, encode_fields, varint_field
from bkctl.server.config import load_config
from bkctl.server.protocol import BookieFactory, BookieProtocol, deliver_durable
from tests.server_net.wire_client import MASTER_KEY, package
from tests.test_wire import TO_BOOKIE, V2, payloads, stream_of

EOK = wire.ReturnCode.EOK
OTHER_KEY = bytes(20)


class MemoryStorage:
    """Enough of Storage for the protocol: master keys, fencing, tokens held until `sync()`."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], bytes] = {}
        self.keys: dict[int, bytes] = {}
        self.fenced: set[int] = set()
        self.tokens: list[object] = []
        self.read_only = False

    def add(
        self, ledger_id: int, entry_id: int, key: bytes, entry: bytes, recovery: bool, token: object
    ) -> int:
        if self.read_only:
            return wire.ReturnCode.EREADONLY
        if self.keys.setdefault(ledger_id, key) != key:
            return wire.ReturnCode.EUA
        if ledger_id in self.fenced and not recovery:
            return wire.ReturnCode.EFENCED
        self.entries[ledger_id, entry_id] = entry
        self.tokens.append(token)
        return EOK

    def fence(self, ledger_id: int, key: bytes, token: object) -> int:
        if self.keys.setdefault(ledger_id, key) != key:
            return wire.ReturnCode.EUA
        self.fenced.add(ledger_id)
        self.tokens.append(token)
        return EOK

    def read(self, ledger_id: int, entry_id: int) -> tuple[int, bytes]:
        if ledger_id not in self.keys:
            return wire.ReturnCode.ENOLEDGER, b""
        if entry_id == -1:
            entry_id = max((e for (lid, e) in self.entries if lid == ledger_id), default=-1)
        data = self.entries.get((ledger_id, entry_id))
        return (EOK, data) if data is not None else (wire.ReturnCode.ENOENTRY, b"")

    def entry_availability(self, ledger_id: int) -> Deferred[tuple[int, bytes]]:
        if ledger_id not in self.keys:
            return succeed((wire.ReturnCode.ENOLEDGER, b""))
        return succeed(
            (EOK, entry_availability.encode(sorted(e for lid, e in self.entries if lid == ledger_id)))
        )

    def sync(self, count: int | None = None) -> None:
        """The journal's fsync: deliver the first `count` tokens (all by default) as one batch."""
        count = len(self.tokens) if count is None else count
        batch, self.tokens = self.tokens[:count], self.tokens[count:]
        if batch:
            deliver_durable(batch)


class CountingTransport(StringTransport):
    def __init__(self) -> None:
        super().__init__(peerAddress=IPv4Address("TCP", "10.0.0.9", 4242))
        self.writes = 0
        self.no_delay = False

    def write(self, data: bytes) -> None:
        self.writes += 1
        super().write(data)

    def writeSequence(self, seq: list[bytes]) -> None:  # type: ignore[override]
        self.writes += 1
        super().write(b"".join(seq))

    def setTcpNoDelay(self, enabled: bool) -> None:
        self.no_delay = enabled


def connect(storage: MemoryStorage, **kwargs: int | bool) -> tuple[BookieProtocol, CountingTransport]:
    factory = BookieFactory(storage, **kwargs)
    proto = factory.buildProtocol(None)
    assert proto is not None
    transport = CountingTransport()
    proto.makeConnection(transport)
    return proto, transport


def replies(transport: CountingTransport) -> list[wire.Response]:
    decoder = wire.FrameDecoder()
    decoder.feed(transport.value())
    transport.clear()
    return [wire.decode_response(p) for p in decoder.frames()]


def add_frame(
    ledger_id: int, entry_id: int, payload: bytes = b"x", key: bytes = MASTER_KEY, flags: int = 0
) -> bytes:
    return wire.frame(wire.encode_add_request(package(ledger_id, entry_id, payload), key, flags))


def test_pipelined_adds_one_write_per_fsync_batch() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(b"".join(add_frame(1, e) for e in range(5)))
    assert transport.value() == b"" and proto.pending == 5
    storage.sync(3)
    assert transport.writes == 1
    assert [(r.rc, r.entry_id) for r in replies(transport)] == [(EOK, 0), (EOK, 1), (EOK, 2)]
    storage.sync()
    assert transport.writes == 2
    assert [r.entry_id for r in replies(transport)] == [3, 4]
    assert proto.pending == 0


def test_batch_spanning_connections_writes_once_each() -> None:
    storage = MemoryStorage()
    a, ta = connect(storage)
    b, tb = connect(storage)
    a.dataReceived(add_frame(1, 0) + add_frame(1, 1))
    b.dataReceived(add_frame(2, 0))
    a.dataReceived(add_frame(1, 2))
    storage.sync()
    assert (ta.writes, tb.writes) == (1, 1)
    assert [r.entry_id for r in replies(ta)] == [0, 1, 2]
    assert [(r.ledger_id, r.entry_id) for r in replies(tb)] == [(2, 0)]


def test_frames_split_at_every_byte() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    data = add_frame(7, 0, b"hello") + add_frame(7, 1, b"world")
    for i in range(len(data)):
        proto.dataReceived(data[i : i + 1])
    storage.sync()
    assert [r.entry_id for r in replies(transport)] == [0, 1]
    assert storage.entries[7, 1] == package(7, 1, b"world")


def test_errors_are_answered_at_once() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(add_frame(1, 0))
    proto.dataReceived(add_frame(1, 1, key=OTHER_KEY))
    (reply,) = replies(transport)
    assert (reply.rc, reply.entry_id) == (wire.ReturnCode.EUA, 1)
    storage.read_only = True
    proto.dataReceived(add_frame(1, 2) + add_frame(1, 3))
    assert transport.writes == 2  # both errors in one write
    assert [r.rc for r in replies(transport)] == [wire.ReturnCode.EREADONLY] * 2
    assert proto.pending == 1


def test_reads_and_last_entry() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(add_frame(3, 0, b"a") + add_frame(3, 1, b"b"))
    storage.sync()
    transport.clear()
    reads = [(3, 1), (3, -1), (3, 9), (4, 0)]
    proto.dataReceived(b"".join(wire.frame(wire.encode_read_request(lid, eid)) for lid, eid in reads))
    got = replies(transport)
    assert all(isinstance(r, wire.ReadResponse) for r in got)
    assert [(r.rc, r.ledger_id, r.entry_id) for r in got] == [
        (EOK, 3, 1),
        (EOK, 3, -1),
        (wire.ReturnCode.ENOENTRY, 3, 9),
        (wire.ReturnCode.ENOLEDGER, 4, 0),
    ]
    assert got[0].entry == got[1].entry == package(3, 1, b"b")  # type: ignore[union-attr]
    assert got[2].entry == b""  # type: ignore[union-attr]


def test_fencing_read_answers_after_the_fence_is_durable() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(add_frame(5, 0, b"z"))
    storage.sync()
    transport.clear()
    flags = wire.FLAG_DO_FENCING | wire.FLAG_HIGH_PRIORITY
    proto.dataReceived(wire.frame(wire.encode_read_request(5, 0, flags, MASTER_KEY)))
    assert transport.value() == b"" and proto.pending == 1
    storage.sync()
    (reply,) = replies(transport)
    assert isinstance(reply, wire.ReadResponse)
    assert (reply.rc, reply.entry) == (EOK, package(5, 0, b"z"))
    proto.dataReceived(add_frame(5, 1))
    assert replies(transport)[0].rc == wire.ReturnCode.EFENCED  # type: ignore[union-attr]
    proto.dataReceived(add_frame(5, 1, flags=wire.FLAG_RECOVERY_ADD))
    storage.sync()
    assert replies(transport)[0].rc == EOK  # type: ignore[union-attr]


def test_fencing_read_with_wrong_key_or_without_key() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(add_frame(5, 0))
    flags = wire.FLAG_DO_FENCING
    proto.dataReceived(wire.frame(wire.encode_read_request(5, 0, flags, OTHER_KEY)))
    # A version 1 fencing read carries no key: it cannot be allowed to fence.
    proto.dataReceived(wire.frame(wire.encode_read_request(5, 0, flags, None, version=1)))
    assert [r.rc for r in replies(transport)] == [wire.ReturnCode.EUA, wire.ReturnCode.EUA]  # type: ignore[union-attr]
    assert 5 not in storage.fenced


def test_auth_unknown_opcode_and_malformed_requests() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(wire.frame(wire.encode_auth_request("SASL", b"hi")))
    proto.dataReceived(wire.frame(wire.encode_unknown_request(2, wire.OpCode.GET_BOOKIE_INFO, 0, b"\0" * 8)))
    short_add = struct.pack(">I", wire.pack_header(2, wire.OpCode.ADD_ENTRY, 0)) + b"short"
    proto.dataReceived(wire.frame(short_add))
    got = replies(transport)
    assert isinstance(got[0], wire.AuthResponse) and got[0].plugin_name == wire.AUTH_DISABLED_PLUGIN
    assert isinstance(got[1], wire.UnknownResponse) and got[1].opcode == wire.OpCode.GET_BOOKIE_INFO
    assert struct.unpack_from(">i", got[1].body)[0] == wire.ReturnCode.EBADREQ
    assert isinstance(got[2], wire.AddResponse)
    assert (got[2].rc, got[2].ledger_id, got[2].entry_id) == (wire.ReturnCode.EBADREQ, -1, -1)
    assert not transport.disconnecting
    proto.dataReceived(add_frame(1, 0))
    storage.sync()
    assert replies(transport)[0].rc == EOK  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "bad",
    [
        struct.pack(">i", -1),
        struct.pack(">i", 2),
        struct.pack(">i", 1 << 30),
        wire.frame(b"\x08\x01\x10\x02"),  # a v3 (protobuf) frame: not spoken
        wire.frame(b"\x00\x01\x02\x03"),  # legacy header with junk in the middle bytes
    ],
)
def test_unframeable_input_closes_after_answering_what_came_before(bad: bytes) -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    read = wire.frame(wire.encode_read_request(1, 0))
    proto.dataReceived(read + bad + read)
    assert transport.disconnecting
    assert transport.producerState == "paused"
    assert [r.rc for r in replies(transport)] == [wire.ReturnCode.ENOLEDGER]  # type: ignore[union-attr]
    assert proto.factory.metrics.frames_rejected == 1


def test_nagle_is_off_unless_configured_on() -> None:
    # Small reply batches behind an unacknowledged one would wait for the client's delayed ACK (40 ms).
    assert connect(MemoryStorage())[1].no_delay
    assert not connect(MemoryStorage(), tcp_no_delay=False)[1].no_delay
    assert load_config({"serverTcpNoDelay": "false"}).tcp_no_delay is False
    assert load_config().tcp_no_delay is True


def test_oversized_frame_uses_the_configured_limit() -> None:
    proto, transport = connect(MemoryStorage(), frame_size_max=1024)
    proto.dataReceived(add_frame(1, 0, b"x" * 2000))
    assert transport.disconnecting


def test_backpressure_on_pending_adds() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage, pending_adds_max=4)
    proto.dataReceived(b"".join(add_frame(1, e) for e in range(3)))
    assert transport.producerState == "producing"
    proto.dataReceived(add_frame(1, 3))
    assert transport.producerState == "paused" and proto.reading_paused
    storage.sync(1)  # 3 pending: above the resume mark (half)
    assert transport.producerState == "paused"
    storage.sync(1)  # 2 pending
    assert transport.producerState == "producing"
    storage.sync()
    assert proto.factory.metrics.read_pauses == 1


def test_backpressure_on_unread_replies() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    assert transport.producer is proto  # registered as the transport's streaming producer
    proto.pauseProducing()  # what the transport does when its write buffer is full
    assert transport.producerState == "paused"
    proto.dataReceived(add_frame(1, 0))
    storage.sync()  # replies still go out (the buffer is bounded by not reading more requests)
    assert transport.producerState == "paused"
    proto.resumeProducing()
    assert transport.producerState == "producing"


def test_closed_connection_drops_its_replies() -> None:
    storage = MemoryStorage()
    factory = BookieFactory(storage)
    a, b = factory.buildProtocol(None), factory.buildProtocol(None)
    assert a is not None and b is not None
    ta, tb = CountingTransport(), CountingTransport()
    a.makeConnection(ta)
    b.makeConnection(tb)
    a.dataReceived(add_frame(1, 0))
    b.dataReceived(add_frame(2, 0))
    a.connectionLost()
    storage.sync()
    assert ta.value() == b""
    assert [r.ledger_id for r in replies(tb)] == [2]
    assert a.factory.metrics.connections_open == 1


def test_factory_refuses_until_ready() -> None:
    factory = BookieFactory(MemoryStorage())
    factory.ready = False
    assert factory.buildProtocol(None) is None
    assert factory.metrics.connections_refused == 1


@pytest.mark.parametrize("opcode", list(wire.OpCode))
def test_ebadreq_answer_has_the_shape_of_the_opcode(opcode: wire.OpCode) -> None:
    """A header-only frame cannot be decoded; its EBADREQ answer must still decode as a response."""
    proto, transport = connect(MemoryStorage())
    proto.dataReceived(wire.frame(struct.pack(">I", wire.pack_header(2, opcode, 0)) + b"\x01"))
    (reply,) = replies(transport)  # decode_response raises on a malformed reply
    assert not transport.disconnecting
    if opcode in (wire.OpCode.ADD_ENTRY, wire.OpCode.READ_ENTRY, wire.OpCode.BATCH_READ_ENTRY):
        assert reply.rc == wire.ReturnCode.EBADREQ  # type: ignore[union-attr]


class RecordingStorage(MemoryStorage):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, ...]] = []

    def add(
        self, ledger_id: int, entry_id: int, key: bytes, entry: bytes, recovery: bool, token: object
    ) -> int:
        self.calls.append((ledger_id, entry_id, key, entry, recovery))
        return wire.ReturnCode.EREADONLY


@settings(max_examples=200, deadline=None)
@given(
    version=st.sampled_from([0, 1, 2]),
    flags=st.sampled_from([0, 1, 2, 4, 6, 0xFFFF]),
    ids=st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1)),
    key=st.binary(min_size=20, max_size=20),
    tail=st.binary(max_size=40),
)
def test_add_fast_path_agrees_with_the_codec(
    version: int, flags: int, ids: tuple[int, int], key: bytes, tail: bytes
) -> None:
    if version == 0:
        flags = 0
    payload = wire.encode_add_request(struct.pack(">qq", *ids) + tail, key, flags, version)
    request = wire.decode_request(payload)
    assert isinstance(request, wire.AddRequest)
    storage = RecordingStorage()
    proto, transport = connect(storage)  # type: ignore[arg-type]
    proto.dataReceived(wire.frame(payload))
    recovery = bool(request.flags & wire.FLAG_RECOVERY_ADD)
    assert storage.calls == [
        (request.ledger_id, request.entry_id, request.master_key, request.entry, recovery)
    ]
    (reply,) = replies(transport)
    assert wire.encode_response(reply) == wire.encode_add_response(
        wire.ReturnCode.EREADONLY, request.ledger_id, request.entry_id, request.version
    )


@pytest.mark.parametrize("index", range(len(V2)))
def test_a_java_clients_stream_split_anywhere_is_handled_the_same(index: int) -> None:
    # The bookie frames the stream itself (the add fast path reads from its receive buffer): every cut
    # of a real Java client's request stream must give the same storage state and the same replies.
    stream = stream_of(payloads(V2[index], TO_BOOKIE))

    def outcome(*parts: bytes) -> tuple[bytes, object, object, object]:
        storage = MemoryStorage()
        proto, transport = connect(storage)
        for part in parts:
            proto.dataReceived(part)
        storage.sync()
        assert not transport.disconnecting
        return transport.value(), storage.entries, storage.keys, storage.fenced

    whole = outcome(stream)
    assert whole[0]  # the capture's requests are answered
    for cut in range(1, len(stream)):
        assert outcome(stream[:cut], stream[cut:]) == whole, cut


def test_v3_list_of_entries_is_answered_and_other_v3_requests_get_ebadreq() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(b"".join(add_frame(7, e) for e in (0, 1, 3, 4)))
    storage.sync()
    replies(transport)
    asks = [wire_v3.encode_entries_of_ledger_request(txn, lid) for txn, lid in ((11, 7), (12, 8))]
    read_lac = encode_fields([
        bytes_field(1, encode_fields([varint_field(1, 3), varint_field(2, wire_v3.OperationType.READ_LAC),
                                      varint_field(3, 13)])),
        bytes_field(104, encode_fields([varint_field(1, 7)])),
    ])  # fmt: skip
    proto.dataReceived(b"".join(wire.frame(p) for p in (*asks, read_lac)))
    decoder = wire.FrameDecoder()
    decoder.feed(transport.value())
    got = {r.header.txn_id: r for r in map(wire_v3.decode_v3_response, decoder.frames())}
    assert got[11].status == wire_v3.StatusCode.EOK and got[11].operation is not None
    assert list(entry_availability.entry_ids(got[11].operation.body or b"")) == [0, 1, 3, 4]
    assert got[12].status == wire_v3.StatusCode.ENOLEDGER
    assert got[13].status == wire_v3.StatusCode.EBADREQ
    assert got[13].header.operation == wire_v3.OperationType.READ_LAC
    assert not transport.disconnecting
