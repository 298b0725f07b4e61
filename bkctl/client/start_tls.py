"""The client's side of START_TLS: on a fresh connection, ask for TLS, then run the TLS handshake and
protect every byte after it with the connection's TlsChannel (bkctl/tls_channel.py).

As Java's PerChannelBookieClient does with a TLS provider configured: the first frame on a new
connection is a v3 START_TLS request; on EOK the client starts the TLS handshake (verifying the bookie's
certificate, see bkctl/tls.py) and only then sends requests, v2 ones included. Any other answer (a
bookie without TLS answers EBADREQ), an answer that does not decode, a failed handshake, or no answer
and no handshake within the connect timeout fails the connection: Java reports a SecurityException,
bkctl fails the waiting requests as it does for a bookie it cannot reach (RC_UNAVAILABLE) and logs why,
once. With TLS 1.3 a bookie that rejects the client's certificate says so only after the client's
handshake ended: that alert arrives with the first replies and fails the connection the same way.
"""

from __future__ import annotations

import logging
from typing import Any

from twisted.python.failure import Failure

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.netio import write_now
from bkctl.protocol import wire, wire_v3
from bkctl.tls import TlsSettings, client_context
from bkctl.tls_channel import TlsChannel, TlsError, describe

log = logging.getLogger("bkctl.client.bookie_client")

# Any id does: START_TLS is alone on a new connection and its answer is checked by operation (v3
# requests after it count their ids from 1).
START_TLS_TXN_ID = 0


class ClientUpgrade:
    """One connection's START_TLS exchange, TLS handshake and, once `done`, its TLS channel."""

    def __init__(
        self, transport: Any, settings: TlsSettings, host: str, bookie_id: str, reactor: Any, timeout_s: float
    ) -> None:
        self._transport = transport
        self._settings = settings
        self._host = host
        self._bookie_id = bookie_id
        self._buffer = bytearray()
        self.channel: TlsChannel | None = None  # EOK came: the handshake is under way, then protects
        self.done = False  # handshake completed: requests may flow
        self._failure: str | None = None
        self._timer = reactor.callLater(timeout_s, self._timed_out)

    def begin(self) -> None:
        self._transport.write(wire.frame(wire_v3.encode_start_tls_request(START_TLS_TXN_ID)))

    def data_received(self, data: bytes) -> bytes:
        """Bytes from the bookie before the handshake completed: the answer to START_TLS, then the
        handshake. Returns plaintext that came right behind the handshake (usually b"")."""
        if self._failure is not None:
            return b""
        if self.channel is not None:
            return self._handshake(data)
        self._buffer += data
        answer_size = self._answer_size()
        if answer_size is None:
            return b""
        payload = bytes(self._buffer[wire.LENGTH_PREFIX_SIZE : answer_size])
        rest = bytes(self._buffer[answer_size:])
        self._buffer.clear()
        if self._answered(payload):
            return self._handshake(rest)
        return b""

    def receive(self, data: bytes) -> bytes:
        """Ciphertext from the bookie once `done`: its plaintext (b"" if none, or if the session failed,
        which closes the connection)."""
        assert self.channel is not None
        try:
            plaintext = self.channel.receive(data)
        except TlsError as exc:
            self._fail(f"TLS connection failed: {exc}")
            return b""
        if self.channel.output_pending:  # an answer to a key update
            self._transport.write(self.channel.take_output())
        if self.channel.peer_closed:
            self.close()
        return plaintext

    def encrypt(self, chunks: list[bytes]) -> list[bytes]:
        """Requests as ciphertext, one chunk for netio.write_now."""
        assert self.channel is not None
        return [self.channel.encrypt(chunks)]

    def close(self) -> None:
        """Close the connection, with a close_notify first once the session is up."""
        if self.channel is not None and self.done:
            self._transport.write(self.channel.close())
        self._transport.loseConnection()

    def lost(self, reason: Failure) -> None:
        """Log why a connection failed in its upgrade (unless that was logged when it happened)."""
        self._cancel_timer()
        if self._failure is None and not self.done:
            stage = "TLS handshake" if self.channel is not None else "START_TLS"
            log.warning("bookie %s: %s failed: %s", self._bookie_id, stage, describe(reason.value))

    def _answer_size(self) -> int | None:
        """The framed START_TLS answer's size once it is all buffered (None: more needed or failed)."""
        if len(self._buffer) < wire.LENGTH_PREFIX_SIZE:
            return None
        size: int = wire.FRAME_LENGTH.unpack_from(self._buffer, 0)[0]
        if not 0 < size <= limits.FRAME_SIZE_MAX:
            self._fail(f"START_TLS answer frame length {size}")
            return None
        if len(self._buffer) < wire.LENGTH_PREFIX_SIZE + size:
            return None
        return wire.LENGTH_PREFIX_SIZE + size

    def _answered(self, payload: bytes) -> bool:
        """Check the answer to START_TLS; on EOK start the handshake (the ClientHello goes out)."""
        try:
            response = wire_v3.decode_v3_response(payload)
        except ProtocolError as exc:
            self._fail(f"undecodable START_TLS answer: {exc}")
            return False
        if response.header.operation != wire_v3.OperationType.START_TLS:
            self._fail(f"answer to START_TLS is a {wire_v3.operation_name(response.header.operation)}")
            return False
        if response.status != wire_v3.StatusCode.EOK:
            status = wire_v3.status_name(response.status)
            self._fail(f"the bookie refused START_TLS ({status}: is TLS configured on it?)")
            return False
        # The host name goes to OpenSSL only when it is to be checked (it matches IPs and `*.` names).
        host = self._host.rstrip(".") if self._settings.hostname_verification else None
        self.channel = TlsChannel(client_context(self._settings), server_side=False, server_hostname=host)
        self._transport.write(self.channel.take_output())
        return True

    def _handshake(self, data: bytes) -> bytes:
        assert self.channel is not None
        if not data:
            return b""
        try:
            plaintext = self.channel.receive(data)
        except TlsError as exc:
            self._fail(f"TLS handshake failed: {exc}")
            return b""
        if self.channel.output_pending:  # the client's Finished (and certificate)
            self._transport.write(self.channel.take_output())
        if self.channel.handshake_done:
            self.done = True
            self._cancel_timer()
        return plaintext

    def _fail(self, why: str) -> None:
        self._failure = why
        log.warning("bookie %s: %s", self._bookie_id, why)
        if self.channel is not None and self.channel.output_pending:
            # The alert, so the bookie knows why: sent now, as the abort drops what is queued.
            write_now(self._transport, [self.channel.take_output()])
        self._transport.abortConnection()

    def _timed_out(self) -> None:
        self._timer = None
        self._fail("no START_TLS answer or TLS handshake within the connect timeout")

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
