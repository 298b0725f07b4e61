"""The client's side of START_TLS: on a fresh connection, ask for TLS, then hand the socket to TLS.

As Java's PerChannelBookieClient does with a TLS provider configured: the first frame on a new
connection is a v3 START_TLS request; on EOK the client starts the TLS handshake (verifying the bookie's
certificate, see bkctl/tls.py) and only then sends requests, v2 ones included. Any other answer (a
bookie without TLS answers EBADREQ), an answer that does not decode, or no answer and no handshake
within the connect timeout fails the connection: Java reports a SecurityException, bkctl fails the
waiting requests as it does for a bookie it cannot reach (RC_UNAVAILABLE) and logs why, once.
"""

from __future__ import annotations

import logging
from typing import Any

from twisted.python.failure import Failure

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.protocol import wire, wire_v3
from bkctl.tls import TlsSettings, client_context, describe

log = logging.getLogger("bkctl.client.bookie_client")

# Any id does: START_TLS is alone on a new connection and its answer is checked by operation (v3
# requests after it count their ids from 1).
START_TLS_TXN_ID = 0


class ClientUpgrade:
    """One connection's START_TLS exchange and TLS handshake; `done` once requests may flow."""

    def __init__(
        self, transport: Any, settings: TlsSettings, host: str, bookie_id: str, reactor: Any, timeout_s: float
    ) -> None:
        self._transport = transport
        self._settings = settings
        self._host = host
        self._bookie_id = bookie_id
        self._buffer = bytearray()
        self._answered = False  # EOK came: the handshake is under way
        self.done = False  # handshake completed: requests may flow
        self._failure: str | None = None
        self._timer = reactor.callLater(timeout_s, self._timed_out)

    def begin(self) -> None:
        self._transport.write(wire.frame(wire_v3.encode_start_tls_request(START_TLS_TXN_ID)))

    def data_received(self, data: bytes) -> None:
        """The bookie's answer to START_TLS (nothing else may come before the handshake)."""
        if self._answered or self._failure is not None:
            return
        self._buffer += data
        if len(self._buffer) < wire.LENGTH_PREFIX_SIZE:
            return
        (size,) = wire.FRAME_LENGTH.unpack_from(self._buffer, 0)
        if not 0 < size <= limits.FRAME_SIZE_MAX:
            self._fail(f"START_TLS answer frame length {size}")
            return
        if len(self._buffer) < wire.LENGTH_PREFIX_SIZE + size:
            return
        payload = bytes(self._buffer[wire.LENGTH_PREFIX_SIZE :])
        try:
            response = wire_v3.decode_v3_response(payload)
        except ProtocolError as exc:
            self._fail(f"undecodable START_TLS answer: {exc}")
            return
        if response.header.operation != wire_v3.OperationType.START_TLS:
            self._fail(f"answer to START_TLS is a {wire_v3.operation_name(response.header.operation)}")
        elif response.status != wire_v3.StatusCode.EOK:
            status = wire_v3.status_name(response.status)
            self._fail(f"the bookie refused START_TLS ({status}: is TLS configured on it?)")
        else:
            self._answered = True
            self._transport.startTLS(client_context(self._settings, self._host))

    def handshake_done(self) -> None:
        self.done = True
        self._cancel_timer()

    def lost(self, reason: Failure) -> None:
        """Log why a connection failed in its upgrade, or died of a TLS error after it: with TLS 1.3 a
        bookie that rejects the client's certificate says so only after the client's handshake ended."""
        self._cancel_timer()
        if self._failure is not None:
            return  # logged when it happened
        if not self.done:
            stage = "TLS handshake" if self._answered else "START_TLS"
            log.warning("bookie %s: %s failed: %s", self._bookie_id, stage, describe(reason.value))
        elif type(reason.value).__module__.startswith("OpenSSL"):
            log.warning("bookie %s: TLS connection failed: %s", self._bookie_id, describe(reason.value))

    def _fail(self, why: str) -> None:
        self._failure = why
        log.warning("bookie %s: %s", self._bookie_id, why)
        self._transport.abortConnection()

    def _timed_out(self) -> None:
        self._timer = None
        self._fail("no START_TLS answer or TLS handshake within the connect timeout")

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
