"""BookieProtocol logic on a StringTransport with an in-memory storage: pipelining, one write per
fsync batch, backpressure, fencing reads, bad input. The tests taking `dialect` run over v2 and v3."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, succeed
from twisted.internet.testing import StringTransport

from bkctl.protocol import entry_availability, wire, wire_v3
from bkctl.server.config import load_config
from bkctl.server.protocol import BookieFactory, BookieProtocol, deliver_durable
from tests.server_net.wire_client import MASTER_KEY, package
from tests.test_wire import TO_BOOKIE, payloads, stream_of
from tests.test_wire import V2 as V2_CAPTURE
from tests.test_wire_v3 import V3 as V3_CAPTURE

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
        self.lacs: dict[int, bytes] = {}
        self.watchers: list[tuple[int, int, Callable[[], None]]] = []

    def add(
        self, ledger_id: int, entry_id: int, key: bytes, entry: bytes, recovery: bool, token: object
    ) -> int:
        if self.read_only:
            return wire.ReturnCode.EREADONLY
        if self.keys.setdefault(ledger_id, key) != key:
            return wire.ReturnCode.EUA
        if ledger_id in self.fenced and not recovery:
            return wire.ReturnCode.EFENCED
        self.entries[ledger_id, entry_id] = bytes(entry)
        self.tokens.append(token)
        lac = struct.unpack_from(">q", entry, 16)[0]
        self._wake(ledger_id, lac)
        return EOK

    def _wake(self, ledger_id: int, lac: int | None) -> None:
        woken = [w for w in self.watchers if w[0] == ledger_id and (lac is None or lac > w[1])]
        self.watchers = [w for w in self.watchers if w not in woken]
        for _, _, notify in woken:
            notify()

    def fence(self, ledger_id: int, key: bytes, token: object) -> int:
        if self.keys.setdefault(ledger_id, key) != key:
            return wire.ReturnCode.EUA
        self.fenced.add(ledger_id)
        self.tokens.append(token)
        self._wake(ledger_id, None)
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

    # --- the v3 operations ---

    def explicit_lac(self, ledger_id: int) -> bytes | None:
        return self.lacs.get(ledger_id)

    def is_fenced(self, ledger_id: int) -> bool:
        return ledger_id in self.fenced

    def write_lac(self, ledger_id: int, key: bytes, body: bytes, token: object) -> int:
        if self.read_only:
            return wire.ReturnCode.EREADONLY
        if self.keys.setdefault(ledger_id, key) != key:
            return wire.ReturnCode.EUA
        self.lacs[ledger_id] = body
        self.tokens.append(token)
        return EOK

    def force_ledger(self, ledger_id: int, token: object) -> int:
        self.tokens.append(token)
        return EOK

    def last_add_confirmed(self, ledger_id: int) -> tuple[int, int]:
        rc, last = self.read(ledger_id, -1)
        if rc == wire.ReturnCode.ENOLEDGER:
            return rc, -1
        return EOK, struct.unpack_from(">q", last, 16)[0] if last else -1

    def watch_lac(self, ledger_id: int, previous_lac: int, notify: Callable[[], None]) -> bool:
        rc, lac = self.last_add_confirmed(ledger_id)
        if rc != EOK or lac > previous_lac or ledger_id in self.fenced:
            return False
        self.watchers.append((ledger_id, previous_lac, notify))
        return True

    def unwatch_lac(self, ledger_id: int, notify: Callable[[], None]) -> None:
        self.watchers = [w for w in self.watchers if w[2] is not notify]

    def disk_space(self) -> tuple[int, int]:
        return 10**12, 4 * 10**11

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


def connect(storage: MemoryStorage, **kwargs: Any) -> tuple[BookieProtocol, CountingTransport]:
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


@dataclass(frozen=True)
class Reply:
    """An answer of either protocol, in v2 terms (v3 statuses mapped to the v2 code of the same name)."""

    rc: int
    ledger_id: int
    entry_id: int
    entry: bytes = b""


class V2:
    name = "v2"

    def add(
        self,
        ledger_id: int,
        entry_id: int,
        payload: bytes = b"x",
        key: bytes = MASTER_KEY,
        recovery: bool = False,
    ) -> bytes:
        return add_frame(ledger_id, entry_id, payload, key, wire.FLAG_RECOVERY_ADD if recovery else 0)

    def read(self, ledger_id: int, entry_id: int, fence: bool = False, key: bytes | None = None) -> bytes:
        flags = wire.FLAG_DO_FENCING | wire.FLAG_HIGH_PRIORITY if fence else 0
        return wire.frame(wire.encode_read_request(ledger_id, entry_id, flags, key if fence else None))

    def replies(self, transport: CountingTransport) -> list[Reply]:
        out = []
        for r in replies(transport):
            assert isinstance(r, wire.AddResponse | wire.ReadResponse)
            out.append(Reply(r.rc, r.ledger_id, r.entry_id, getattr(r, "entry", b"")))
        return out


class V3:
    """v3 frames as a Java client sends them (txn ids counting up, priority on recovery requests)."""

    name = "v3"

    def __init__(self) -> None:
        self.txn = itertools.count(1)

    def add(
        self,
        ledger_id: int,
        entry_id: int,
        payload: bytes = b"x",
        key: bytes = MASTER_KEY,
        recovery: bool = False,
    ) -> bytes:
        body = package(ledger_id, entry_id, payload)
        return wire.frame(
            wire_v3.encode_add_request(next(self.txn), ledger_id, entry_id, key, body, recovery, recovery)
        )

    def read(self, ledger_id: int, entry_id: int, fence: bool = False, key: bytes | None = None) -> bytes:
        if fence and key is None:  # a fencing read without the master key (refused: EUA)
            op = wire_v3.Operation("readRequest", ledger_id=ledger_id, entry_id=entry_id, flag=1)
            return wire.frame(wire_v3.encode_request(OP.READ_ENTRY, next(self.txn), op))
        payload = wire_v3.encode_read_request(
            next(self.txn), ledger_id, entry_id, key if fence else None, fence
        )
        return wire.frame(payload)

    def replies(self, transport: CountingTransport) -> list[Reply]:
        out = []
        for response in v3_replies(transport):
            op = response.operation
            assert op is not None and op.status == response.status
            assert op.ledger_id is not None and op.entry_id is not None
            rc = wire_v3.StatusCode(response.status).to_return_code()
            out.append(Reply(rc, op.ledger_id, op.entry_id, op.body or b""))
        return out


OP = wire_v3.OperationType
Dialect = V2 | V3


@pytest.fixture(params=["v2", "v3"])
def dialect(request: pytest.FixtureRequest) -> Dialect:
    return V2() if request.param == "v2" else V3()


def v3_replies(transport: CountingTransport) -> list[wire_v3.V3Response]:
    decoder = wire.FrameDecoder()
    decoder.feed(transport.value())
    transport.clear()
    return [wire_v3.decode_v3_response(p) for p in decoder.frames()]


def test_pipelined_adds_one_write_per_fsync_batch(dialect: Dialect) -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(b"".join(dialect.add(1, e) for e in range(5)))
    assert transport.value() == b"" and proto.pending == 5
    storage.sync(3)
    assert transport.writes == 1
    assert [(r.rc, r.entry_id) for r in dialect.replies(transport)] == [(EOK, 0), (EOK, 1), (EOK, 2)]
    storage.sync()
    assert transport.writes == 2
    assert [r.entry_id for r in dialect.replies(transport)] == [3, 4]
    assert proto.pending == 0


def test_batch_spanning_connections_writes_once_each(dialect: Dialect) -> None:
    storage = MemoryStorage()
    a, ta = connect(storage)
    b, tb = connect(storage)
    a.dataReceived(dialect.add(1, 0) + dialect.add(1, 1))
    b.dataReceived(dialect.add(2, 0))
    a.dataReceived(dialect.add(1, 2))
    storage.sync()
    assert (ta.writes, tb.writes) == (1, 1)
    assert [r.entry_id for r in dialect.replies(ta)] == [0, 1, 2]
    assert [(r.ledger_id, r.entry_id) for r in dialect.replies(tb)] == [(2, 0)]


def test_frames_split_at_every_byte(dialect: Dialect) -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    data = dialect.add(7, 0, b"hello") + dialect.add(7, 1, b"world")
    for i in range(len(data)):
        proto.dataReceived(data[i : i + 1])
    storage.sync()
    assert [r.entry_id for r in dialect.replies(transport)] == [0, 1]
    assert storage.entries[7, 1] == package(7, 1, b"world")


def test_errors_are_answered_at_once(dialect: Dialect) -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(dialect.add(1, 0))
    proto.dataReceived(dialect.add(1, 1, key=OTHER_KEY))
    (reply,) = dialect.replies(transport)
    assert (reply.rc, reply.entry_id) == (wire.ReturnCode.EUA, 1)
    storage.read_only = True
    proto.dataReceived(dialect.add(1, 2) + dialect.add(1, 3))
    assert transport.writes == 2  # both errors in one write
    assert [r.rc for r in dialect.replies(transport)] == [wire.ReturnCode.EREADONLY] * 2
    assert proto.pending == 1


def test_reads_and_last_entry(dialect: Dialect) -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(dialect.add(3, 0, b"a") + dialect.add(3, 1, b"b"))
    storage.sync()
    transport.clear()
    reads = [(3, 1), (3, -1), (3, 9), (4, 0)]
    proto.dataReceived(b"".join(dialect.read(lid, eid) for lid, eid in reads))
    got = dialect.replies(transport)
    assert [(r.rc, r.ledger_id, r.entry_id) for r in got] == [
        (EOK, 3, 1),
        (EOK, 3, -1),
        (wire.ReturnCode.ENOENTRY, 3, 9),
        (wire.ReturnCode.ENOLEDGER, 4, 0),
    ]
    assert got[0].entry == got[1].entry == package(3, 1, b"b")
    assert got[2].entry == b""


def test_fencing_read_answers_after_the_fence_is_durable(dialect: Dialect) -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(dialect.add(5, 0, b"z"))
    storage.sync()
    transport.clear()
    proto.dataReceived(dialect.read(5, 0, fence=True, key=MASTER_KEY))
    assert transport.value() == b"" and proto.pending == 1
    storage.sync()
    (reply,) = dialect.replies(transport)
    assert (reply.rc, reply.entry) == (EOK, package(5, 0, b"z"))
    proto.dataReceived(dialect.add(5, 1))
    assert dialect.replies(transport)[0].rc == wire.ReturnCode.EFENCED
    proto.dataReceived(dialect.add(5, 1, recovery=True))
    storage.sync()
    assert dialect.replies(transport)[0].rc == EOK


def test_fencing_read_with_wrong_key_or_without_key(dialect: Dialect) -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(dialect.add(5, 0))
    proto.dataReceived(dialect.read(5, 0, fence=True, key=OTHER_KEY))
    if isinstance(dialect, V2):
        # A version 1 fencing read carries no key: it cannot be allowed to fence.
        no_key = wire.encode_read_request(5, 0, wire.FLAG_DO_FENCING, None, version=1)
        proto.dataReceived(wire.frame(no_key))
    else:
        proto.dataReceived(dialect.read(5, 0, fence=True, key=None))
    assert [r.rc for r in dialect.replies(transport)] == [wire.ReturnCode.EUA, wire.ReturnCode.EUA]
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
        wire.frame(b"\x08\x01\x10\x02"),  # protobuf, but field 1 (the header) is not a message
        wire.frame(b"\x0a\x06\x08\x03\x10\x02\x18"),  # a v3 header cut short
        wire.frame(b"\x12\x02\x08\x01"),  # a v3 request without a header
        wire.frame(b"\x0a\x02\x08\x03\xaa\x06\x7f"),  # a v3 operation running past the frame
        wire.frame(b"\x05\x01\x02\x03"),  # neither v2 (version <= 2) nor protobuf (tag >= 8)
        wire.frame(b"\x00\x01\x02\x03"),  # legacy header with junk in the middle bytes
    ],
)
def test_unframeable_input_closes_after_answering_what_came_before(bad: bytes, dialect: Dialect) -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    read = dialect.read(1, 0)
    proto.dataReceived(read + bad + read)
    assert transport.disconnecting
    assert transport.producerState == "paused"
    assert [r.rc for r in dialect.replies(transport)] == [wire.ReturnCode.ENOLEDGER]
    assert proto.factory.metrics.frames_rejected == 1


def test_nagle_is_off_unless_configured_on() -> None:
    # Small reply batches behind an unacknowledged one would wait for the client's delayed ACK (40 ms).
    assert connect(MemoryStorage())[1].no_delay
    assert not connect(MemoryStorage(), tcp_no_delay=False)[1].no_delay
    assert load_config({"serverTcpNoDelay": "false"}).tcp_no_delay is False
    assert load_config().tcp_no_delay is True


def test_oversized_frame_uses_the_configured_limit(dialect: Dialect) -> None:
    proto, transport = connect(MemoryStorage(), frame_size_max=1024)
    proto.dataReceived(dialect.add(1, 0, b"x" * 2000))
    assert transport.disconnecting


def test_backpressure_on_pending_adds(dialect: Dialect) -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage, pending_adds_max=4)
    proto.dataReceived(b"".join(dialect.add(1, e) for e in range(3)))
    assert transport.producerState == "producing"
    proto.dataReceived(dialect.add(1, 3))
    assert transport.producerState == "paused" and proto.reading_paused
    storage.sync(1)  # 3 pending: above the resume mark (half)
    assert transport.producerState == "paused"
    storage.sync(1)  # 2 pending
    assert transport.producerState == "producing"
    storage.sync()
    assert proto.factory.metrics.read_pauses == 1


def test_backpressure_on_unread_replies(dialect: Dialect) -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    assert transport.producer is proto  # registered as the transport's streaming producer
    proto.pauseProducing()  # what the transport does when its write buffer is full
    assert transport.producerState == "paused"
    proto.dataReceived(dialect.add(1, 0))
    storage.sync()  # replies still go out (the buffer is bounded by not reading more requests)
    assert transport.producerState == "paused"
    proto.resumeProducing()
    assert transport.producerState == "producing"


def test_closed_connection_drops_its_replies(dialect: Dialect) -> None:
    storage = MemoryStorage()
    factory = BookieFactory(storage)
    a, b = factory.buildProtocol(None), factory.buildProtocol(None)
    assert a is not None and b is not None
    ta, tb = CountingTransport(), CountingTransport()
    a.makeConnection(ta)
    b.makeConnection(tb)
    a.dataReceived(dialect.add(1, 0))
    b.dataReceived(dialect.add(2, 0))
    a.connectionLost()
    storage.sync()
    assert ta.value() == b""
    assert [r.ledger_id for r in dialect.replies(tb)] == [2]
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
        self.calls.append((ledger_id, entry_id, key, bytes(entry), recovery))
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


@pytest.mark.parametrize("index", range(len(V2_CAPTURE) + len(V3_CAPTURE)))
def test_a_java_clients_stream_split_anywhere_is_handled_the_same(index: int) -> None:
    # The bookie frames the stream itself (the add fast path reads from its receive buffer): every cut
    # of a real Java client's request stream (v2 and v3) must give the same storage state and replies.
    connection = (V2_CAPTURE + V3_CAPTURE)[index]
    stream = stream_of(payloads(connection, TO_BOOKIE))

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
