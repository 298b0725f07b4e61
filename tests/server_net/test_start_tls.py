"""START_TLS on the bookie, as protocol logic on a StringTransport with a real TLS handshake against an
in-memory client channel: Java's bytes, EBADREQ without TLS (the connection stays usable), EOK in the
clear then the switch, START_TLS refused out of turn, handshake failures counted once, tlsRequired."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import pytest
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from bkctl import tls
from bkctl.protocol import wire, wire_v3
from bkctl.server.protocol import BookieFactory, BookieProtocol
from bkctl.tls_channel import TlsChannel
from tests.server_net.test_protocol import CountingTransport, MemoryStorage, add_frame, replies
from tests.server_net.test_protocol_v3 import add, long_poll
from tests.tls_certs import Certificates, write_certificates

# Java's encoding (protobuf fields in number order): header {version 3, START_TLS, txnId 5}, status, and
# for EOK the empty startTLSResponse (field 106).
START_TLS_REQUEST = bytes.fromhex("0a06080310091805d20600")
START_TLS_EOK = bytes.fromhex("0a060803100918051000d20600")
START_TLS_EBADREQ = bytes.fromhex("0a06080310091805109403")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Certificates]:
    yield write_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def context(certs: Certificates) -> ssl.SSLContext:
    return tls.server_context(tls.TlsSettings(certificate_path=certs.bookie.cert, key_path=certs.bookie.key))


def connect(
    context: ssl.SSLContext | None, tls_required: bool = False
) -> tuple[BookieProtocol, CountingTransport, BookieFactory]:
    factory = BookieFactory(MemoryStorage(), tls_context=context, tls_required=tls_required)
    proto = factory.buildProtocol(None)
    assert proto is not None
    transport = CountingTransport()
    proto.makeConnection(transport)
    return proto, transport, factory


def handshake(proto: BookieProtocol, transport: CountingTransport, certs: Certificates) -> TlsChannel:
    """Run a client's TLS handshake with the bookie after its EOK; the client's channel."""
    client = TlsChannel(tls.client_context(tls.TlsSettings(trust_path=certs.ca)), server_side=False)
    transport.clear()
    proto.dataReceived(client.take_output())  # ClientHello
    client.receive(transport.value())  # ServerHello .. Finished
    transport.clear()
    proto.dataReceived(client.take_output())  # the client's Finished
    assert client.handshake_done
    return client


def decrypted(client: TlsChannel, transport: CountingTransport) -> CountingTransport:
    """What the bookie wrote, decrypted, in a transport the reply decoders read."""
    plain = CountingTransport()
    plain.write(client.receive(transport.value()))
    transport.clear()
    return plain


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
    assert proto.tls is None and factory.metrics.bad_requests == 1
    proto.dataReceived(add_frame(1, 0))  # plain v2 traffic still served, as by a Java bookie
    factory.storage.sync()  # type: ignore[attr-defined]
    assert [r.rc for r in replies(transport)] == [wire.ReturnCode.EOK]


def test_with_tls_eok_goes_out_in_the_clear_then_the_connection_switches(
    context: ssl.SSLContext, certs: Certificates
) -> None:
    proto, transport, factory = connect(context)
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    assert transport.value() == wire.frame(START_TLS_EOK)
    assert proto.tls is not None and proto.tls_state == "handshaking"
    client = handshake(proto, transport, certs)
    assert proto.tls_state == "protected" and factory.metrics.tls_handshakes == 1
    proto.dataReceived(client.encrypt([add_frame(1, 0), add_frame(1, 1)]))
    factory.storage.sync()  # type: ignore[attr-defined]
    assert [r.rc for r in replies(decrypted(client, transport))] == [wire.ReturnCode.EOK] * 2


def test_a_handshake_that_fails_is_counted_once(context: ssl.SSLContext) -> None:
    proto, _, factory = connect(context)
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    proto.connectionLost(Failure(ConnectionError("peer went away")))
    assert factory.metrics.tls_handshake_failures == 1 and factory.metrics.tls_handshakes == 0
    proto, transport, factory = connect(context)
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    transport.clear()
    proto.dataReceived(bytes.fromhex("16030100050100000100"))  # a handshake record, a broken ClientHello
    assert transport.disconnecting and proto.tls_state == "failed"
    assert transport.value()[:1] == b"\x15"  # an alert record tells the client why
    proto.connectionLost(Failure(ConnectionError("closed")))
    assert factory.metrics.tls_handshake_failures == 1


def test_start_tls_out_of_turn_is_refused(context: ssl.SSLContext, certs: Certificates) -> None:
    # Plaintext pipelined behind START_TLS, or a reply still owed in plaintext, could be taken for
    # protected traffic: refused, and the connection is not switched.
    proto, transport, _ = connect(context)
    proto.dataReceived(wire.frame(START_TLS_REQUEST) + add_frame(1, 0))
    assert v3_replies(transport)[0] == START_TLS_EBADREQ and proto.tls is None
    proto, transport, _ = connect(context)
    proto.dataReceived(add_frame(1, 0))  # waiting for its fsync
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    assert v3_replies(transport) == [START_TLS_EBADREQ] and proto.tls is None
    proto, transport, _ = connect(context)
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    client = handshake(proto, transport, certs)
    proto.dataReceived(client.encrypt([wire.frame(START_TLS_REQUEST)]))  # a second one, inside TLS
    assert v3_replies(decrypted(client, transport)) == [START_TLS_EBADREQ]


def test_start_tls_is_refused_while_a_long_poll_waits(context: ssl.SSLContext) -> None:
    # The poll's answer is owed in plaintext: it must not meet the switch (it used to abort the connection).
    storage, clock = MemoryStorage(), Clock()
    factory = BookieFactory(storage, tls_context=context, reactor=clock)
    proto = factory.buildProtocol(None)
    assert proto is not None
    transport = CountingTransport()
    proto.makeConnection(transport)
    proto.dataReceived(add(6, 0) + add(6, 1, lac=0))
    storage.sync()
    transport.clear()
    proto.dataReceived(long_poll(6, previous_lac=0, timeout_ms=500))
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    assert v3_replies(transport) == [START_TLS_EBADREQ] and proto.tls is None
    clock.advance(1)  # the poll times out and is answered, in the clear, on a connection still open
    [answer] = [wire_v3.decode_v3_response(frame) for frame in v3_replies(transport)]
    assert answer.operation is not None and answer.operation.max_lac == 0
    assert not transport.disconnecting
    proto.dataReceived(wire.frame(START_TLS_REQUEST))  # nothing owed now: accepted
    assert transport.value() == wire.frame(START_TLS_EOK)


def test_tls_required_serves_only_start_tls_and_auth_before_the_handshake(
    context: ssl.SSLContext, certs: Certificates
) -> None:
    proto, transport, factory = connect(context, tls_required=True)
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
    assert transport.value() == wire.frame(START_TLS_EOK)
    client = handshake(proto, transport, certs)
    proto.dataReceived(client.encrypt([add_frame(1, 0)]))  # protected now: served, by the add fast path
    factory.storage.sync()  # type: ignore[attr-defined]
    assert [r.rc for r in replies(decrypted(client, transport))] == [wire.ReturnCode.EOK]  # type: ignore[union-attr]


def test_requests_in_the_read_of_the_clients_finished_are_served(
    context: ssl.SSLContext, certs: Certificates
) -> None:
    # A client sends its first requests right behind its Finished: the bookie may read both at once,
    # even with tlsRequired (the handshake completes before the frame loop looks at the requests).
    proto, transport, factory = connect(context, tls_required=True)
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    client = TlsChannel(tls.client_context(tls.TlsSettings(trust_path=certs.ca)), server_side=False)
    transport.clear()
    proto.dataReceived(client.take_output())
    client.receive(transport.value())
    transport.clear()
    proto.dataReceived(client.take_output() + client.encrypt([add_frame(1, 0)]))
    factory.storage.sync()  # type: ignore[attr-defined]
    assert [r.rc for r in replies(decrypted(client, transport))] == [wire.ReturnCode.EOK]  # type: ignore[union-attr]
    assert factory.metrics.tls_handshakes == 1 and factory.metrics.tls_required_refusals == 0


def test_close_notify_is_answered_with_close_notify(context: ssl.SSLContext, certs: Certificates) -> None:
    proto, transport, _ = connect(context)
    proto.dataReceived(wire.frame(START_TLS_REQUEST))
    client = handshake(proto, transport, certs)
    proto.dataReceived(client.close())
    assert transport.disconnecting
    assert client.receive(transport.value()) == b"" and client.peer_closed
