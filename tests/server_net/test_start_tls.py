"""START_TLS on the bookie, as protocol logic on a StringTransport: Java's bytes, EBADREQ without TLS (the
connection stays usable), EOK in the clear then the switch, and START_TLS refused out of turn."""

from __future__ import annotations

from typing import Any

from twisted.python.failure import Failure

from bkctl.protocol import wire, wire_v3
from bkctl.server.protocol import BookieFactory, BookieProtocol
from tests.server_net.test_protocol import CountingTransport, MemoryStorage, add_frame, replies

# Java's encoding (protobuf fields in number order): header {version 3, START_TLS, txnId 5}, status, and
# for EOK the empty startTLSResponse (field 106).
START_TLS_REQUEST = bytes.fromhex("0a06080310091805d20600")
START_TLS_EOK = bytes.fromhex("0a060803100918051000d20600")
START_TLS_EBADREQ = bytes.fromhex("0a06080310091805109403")


class TlsTransport(CountingTransport):
    """Records startTLS and what had been written before it (that part goes out in the clear)."""

    def __init__(self) -> None:
        super().__init__()
        self.started_with: Any = None
        self.before_tls = b""

    def startTLS(self, context: Any) -> None:
        self.started_with = context
        self.before_tls = self.value()


def connect(context: object | None) -> tuple[BookieProtocol, TlsTransport, BookieFactory]:
    factory = BookieFactory(MemoryStorage(), tls_context=context)
    proto = factory.buildProtocol(None)
    assert proto is not None
    transport = TlsTransport()
    proto.makeConnection(transport)
    return proto, transport, factory


def v3_replies(transport: CountingTransport) -> list[bytes]:
    decoder = wire.FrameDecoder()
    decoder.feed(transport.value())
    transport.clear()
    return list(decoder.frames())


def test_codec_matches_javas_bytes() -> None:
    assert wire_v3.encode_start_tls_request(5) == START_TLS_REQUEST
    assert wire_v3.encode_start_tls_response(5, wire_v3.StatusCode.EOK) == START_TLS_EOK
    assert wire_v3.encode_start_tls_response(5, wire_v3.StatusCode.EBADREQ) == START_TLS_EBADREQ
    request = wire_v3.decode_v3_request(START_TLS_REQUEST)
    assert request.header.operation == wire_v3.OperationType.START_TLS and request.header.txn_id == 5
    assert request.operation is not None and request.operation.kind == "startTLSRequest"


def test_without_tls_start_tls_gets_ebadreq_and_the_connection_goes_on() -> None:
    proto, transport, factory = connect(None)
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    assert v3_replies(transport) == [START_TLS_EBADREQ]
    assert transport.started_with is None and factory.metrics.bad_requests == 1
    proto.dataReceived(add_frame(1, 0))  # plain v2 traffic still served, as by a Java bookie
    factory.storage.sync()  # type: ignore[attr-defined]
    assert [r.rc for r in replies(transport)] == [wire.ReturnCode.EOK]


def test_with_tls_eok_goes_out_in_the_clear_then_the_connection_switches() -> None:
    context = object()
    proto, transport, factory = connect(context)
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    assert transport.started_with is context
    assert transport.before_tls == wire.frame(START_TLS_EOK)
    assert proto.tls_state == "handshaking"
    proto.handshakeCompleted()
    assert proto.tls_state == "protected" and factory.metrics.tls_handshakes == 1


def test_a_handshake_that_fails_is_counted() -> None:
    proto, _, factory = connect(object())
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    proto.connectionLost(Failure(ConnectionError("peer went away")))
    assert factory.metrics.tls_handshake_failures == 1 and factory.metrics.tls_handshakes == 0


def test_start_tls_out_of_turn_is_refused() -> None:
    # Plaintext pipelined behind START_TLS, or a reply still owed in plaintext, could be taken for
    # protected traffic: refused, and the connection is not switched.
    proto, transport, _ = connect(object())
    proto.dataReceived(wire.frame(START_TLS_REQUEST) + add_frame(1, 0))
    assert v3_replies(transport)[0] == START_TLS_EBADREQ and transport.started_with is None
    proto, transport, _ = connect(object())
    proto.dataReceived(add_frame(1, 0))  # waiting for its fsync
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    assert v3_replies(transport) == [START_TLS_EBADREQ] and transport.started_with is None
    proto, transport, _ = connect(object())
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    proto.handshakeCompleted()
    transport.clear()
    proto.dataReceived(wire.frame(START_TLS_REQUEST))  # a second one, inside TLS
    assert v3_replies(transport) == [START_TLS_EBADREQ]


def test_tls_required_serves_only_start_tls_and_auth_before_the_handshake() -> None:
    factory = BookieFactory(MemoryStorage(), tls_context=object(), tls_required=True)
    proto = factory.buildProtocol(None)
    assert proto is not None
    transport = TlsTransport()
    proto.makeConnection(transport)
    read = wire.frame(wire.encode_read_request(1, 0, 0, None))
    proto.dataReceived(add_frame(1, 0) + read)
    assert [(type(r).__name__, r.rc) for r in replies(transport)] == [  # type: ignore[union-attr]
        ("AddResponse", wire.ReturnCode.EUA),
        ("ReadResponse", wire.ReturnCode.EUA),
    ]
    read_lac = wire_v3.encode_entries_of_ledger_request(9, 1)
    proto.dataReceived(wire.frame(read_lac))
    (answer,) = map(wire_v3.decode_v3_response, v3_replies(transport))
    assert answer.status == wire_v3.StatusCode.EUA and answer.header.txn_id == 9
    assert factory.metrics.tls_required_refusals == 3 and not factory.storage.entries  # type: ignore[attr-defined]
    proto.dataReceived(wire.frame(wire.encode_auth_request("AuthDisabledPlugin", b"")))
    assert isinstance(replies(transport)[0], wire.AuthResponse)
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    assert transport.before_tls == wire.frame(START_TLS_EOK)
    transport.clear()
    proto.handshakeCompleted()
    proto.dataReceived(add_frame(1, 0))  # protected now: served, by the add fast path
    factory.storage.sync()  # type: ignore[attr-defined]
    assert [r.rc for r in replies(transport)] == [wire.ReturnCode.EOK]  # type: ignore[union-attr]
