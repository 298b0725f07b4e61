"""The client's START_TLS exchange on a StringTransport and a task.Clock: what it sends, the handshake
against an in-memory bookie channel, and every way it gives up on the connection before TLS (refusal, a
wrong or garbled answer, silence, a failed handshake)."""

from __future__ import annotations

from pathlib import Path

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from bkctl.client.start_tls import START_TLS_TXN_ID, ClientUpgrade
from bkctl.protocol import wire, wire_v3
from bkctl.tls import TlsSettings, server_context
from bkctl.tls_channel import TlsChannel
from tests.tls_certs import Certificates, write_certificates


class Transport(StringTransport):
    def __init__(self) -> None:
        super().__init__()
        self.aborted = False

    def abortConnection(self) -> None:
        self.aborted = True


def upgrade(settings: TlsSettings | None = None) -> tuple[ClientUpgrade, Transport, Clock]:
    transport, clock = Transport(), Clock()
    up = ClientUpgrade(transport, settings or TlsSettings(), "127.0.0.1", "b1", clock, 2.0)
    up.begin()
    return up, transport, clock


def answer(status: int, operation: int = wire_v3.OperationType.START_TLS) -> bytes:
    request = wire_v3.V3Request(wire_v3.PacketHeader(3, operation, START_TLS_TXN_ID), None)
    if operation == wire_v3.OperationType.START_TLS:
        return wire.frame(wire_v3.encode_start_tls_response(START_TLS_TXN_ID, status))
    return wire.frame(wire_v3.encode_status_response(request, status))


def test_sends_start_tls_first() -> None:
    _, transport, _ = upgrade()
    assert transport.value() == wire.frame(wire_v3.encode_start_tls_request(START_TLS_TXN_ID))


def bookie_channel(certs: Certificates) -> TlsChannel:
    return TlsChannel(
        server_context(TlsSettings(certificate_path=certs.bookie.cert, key_path=certs.bookie.key)), True
    )


def test_eok_split_anywhere_starts_tls_then_the_handshake(tmp_path: Path) -> None:
    certs = write_certificates(tmp_path)
    up, transport, clock = upgrade(TlsSettings(trust_path=certs.ca, hostname_verification=True))
    eok = answer(wire_v3.StatusCode.EOK)
    transport.clear()
    for index in range(len(eok)):
        up.data_received(eok[index : index + 1])
    hello = transport.value()
    assert hello[:1] == b"\x16" and not transport.aborted  # a handshake record: the ClientHello
    bookie = bookie_channel(certs)
    bookie.receive(hello)
    transport.clear()
    assert up.data_received(bookie.take_output()) == b"" and up.done and not clock.getDelayedCalls()
    finished = transport.value()
    assert bookie.receive(finished + up.encrypt([b"request"])[0]) == b"request"
    assert up.receive(bookie.encrypt([b"reply"])) == b"reply"


def test_a_failed_handshake_aborts(tmp_path: Path) -> None:
    certs = write_certificates(tmp_path)
    up, transport, _ = upgrade(TlsSettings(trust_path=certs.other_ca))  # not the bookie's CA
    up.data_received(answer(wire_v3.StatusCode.EOK))
    bookie = bookie_channel(certs)
    bookie.receive(transport.value()[len(wire.frame(wire_v3.encode_start_tls_request(0))) :])
    up.data_received(bookie.take_output())
    assert transport.aborted and not up.done


def test_refusal_wrong_answer_garbage_and_silence_abort() -> None:
    for data in (
        answer(wire_v3.StatusCode.EBADREQ),  # a bookie without TLS
        answer(wire_v3.StatusCode.EOK, wire_v3.OperationType.READ_LAC),
        wire.frame(b"\x08\x01\x10"),
        b"\xff\xff\xff\xff",
    ):
        up, transport, _ = upgrade()
        up.data_received(data)
        assert transport.aborted and up.channel is None, data
        assert not up.done
    up, transport, clock = upgrade()
    clock.advance(2.0)
    assert transport.aborted
