"""The client's side of SASL: on a new connection (after TLS, if any), authenticate before any request.

As Java's AuthHandler.ClientSideHandler with SASLClientProviderFactory (bkctl/sasl.py has the keys):
the client sends AUTH (v3, or v2's AuthRequest on a v2 connection) with the plugin name `sasl` and its
first token (empty for DIGEST-MD5), then answers each of the bookie's tokens with pure-sasl's
DIGEST-MD5 client until the bookie's `rspauth` checked out, or with bkctl/kerberos.py's GSSAPI client
(the bookie's principal SERVICE/HOST@REALM, HOST the bookie id's host as Java's client names it) until
it sent its security-layer answer, which Java's bookie does not answer; requests flow only then. A
bookie without authentication answers `AuthDisabledPlugin`, which counts as done, as in Java. A
refusal (EUA, an undecodable or foreign answer, the connection closed, or no end within the connect
timeout) fails the connection: its requests fail with RC_UNAUTHENTICATED (exit 9 in commands) and
the reason is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.kerberos import GssapiClient, java_host_name
from bkctl.protocol import wire, wire_v3
from bkctl.protocol.sasl_digest import HOST, SERVICE
from bkctl.protocol.wire_v3 import Operation, OperationType
from bkctl.sasl import PLUGIN_NAME, ClientSasl

log = logging.getLogger("bkctl.client.bookie_client")

AUTH_TXN_ID = 0  # alone on the connection: its answers are told by operation


class ClientAuth:
    """One connection's AUTH exchange; `done` once the bookie accepted the client."""

    def __init__(
        self,
        send: Callable[[list[bytes]], None],
        abort: Callable[[], None],
        settings: ClientSasl,
        v3: bool,
        bookie_id: str,
        reactor: Any,
        timeout_s: float,
    ) -> None:
        self._send, self._abort, self._v3, self._bookie_id = send, abort, v3, bookie_id
        self._settings = settings
        self._sasl: Any = None  # made in begin(): a Kerberos login may fail, and that fails the connection
        self._buffer = bytearray()
        self.done = False
        self.failure: str | None = None
        # A Java bookie answers nothing to a client it refuses (its AuthHandler logs and keeps the
        # connection): then only this timeout ends the exchange. No reactor: a blocking socket's own
        # timeout bounds the exchange (pipeline/online.py).
        why = "no end of the SASL exchange within the connect timeout (refused?)"
        self._timer = None if reactor is None else reactor.callLater(timeout_s, self._fail, why)

    def begin(self) -> None:
        settings = self._settings
        try:
            if settings.kerberos is not None:
                host = java_host_name(self._bookie_id.rsplit(":", 1)[0].strip("[]"))
                self._sasl = GssapiClient(settings.kerberos, settings.service, host)
                self._token(self._sasl.process(None))
                return
        except ProtocolError as exc:
            self._fail(str(exc))
            return
        from puresasl.client import SASLClient

        self._sasl = SASLClient(
            HOST, SERVICE, mechanism="DIGEST-MD5", username=settings.user, password=settings.password
        )
        self._token(b"")

    def data_received(self, data: bytes) -> bytes:
        """The bookie's bytes while authenticating; what came after the exchange's end (usually b"")."""
        self._buffer += data
        while not self.done and self.failure is None and len(self._buffer) >= wire.LENGTH_PREFIX_SIZE:
            size: int = wire.FRAME_LENGTH.unpack_from(self._buffer, 0)[0]
            if not 0 < size <= limits.FRAME_SIZE_MAX:
                self._fail(f"AUTH answer frame length {size}")
                break
            end = wire.LENGTH_PREFIX_SIZE + size
            if len(self._buffer) < end:
                break
            payload = bytes(self._buffer[wire.LENGTH_PREFIX_SIZE : end])
            del self._buffer[:end]
            self._answer(payload)
        if not self.done:
            return b""
        rest = bytes(self._buffer)
        self._buffer.clear()
        return rest

    def lost(self) -> None:
        """The connection closed during the exchange: the bookie refused (v2 closes without a word)."""
        if not self.done and self.failure is None:
            self._fail("the bookie closed the connection during SASL authentication (credentials refused?)")

    def _answer(self, payload: bytes) -> None:
        try:
            plugin, token = self._decode(payload)
        except ProtocolError as exc:
            self._fail(f"bad AUTH answer: {exc}")
            return
        if plugin == wire.AUTH_DISABLED_PLUGIN:
            log.info("bookie %s: authentication is not enabled there", self._bookie_id)
            self._finish()
            return
        if plugin != PLUGIN_NAME:
            self._fail(f"AUTH answer from plugin {plugin!r}, not {PLUGIN_NAME!r}")
            return
        try:
            response = self._sasl.process(token)
        except Exception as exc:  # pure-sasl raises its own SASLError / SASLProtocolException
            self._fail(f"the bookie's SASL token was refused: {exc}")
            return
        if not self._sasl.complete or response:
            self._token(response or b"")  # GSSAPI's last token completes the client as it is sent
        if self._sasl.complete:
            self._finish()

    def _decode(self, payload: bytes) -> tuple[str, bytes]:
        if not self._v3:
            response = wire.decode_response(payload)
            if not isinstance(response, wire.AuthResponse):
                raise ProtocolError(f"a {type(response).__name__} during authentication")
            return response.plugin_name, response.payload
        v3 = wire_v3.decode_v3_response(payload)
        if v3.header.operation != OperationType.AUTH:
            raise ProtocolError(f"a {wire_v3.operation_name(v3.header.operation)} during authentication")
        if v3.status != wire_v3.StatusCode.EOK or v3.operation is None:
            self._refused(wire_v3.status_name(v3.status))
            raise ProtocolError(f"status {wire_v3.status_name(v3.status)}")
        return v3.operation.plugin_name or "", v3.operation.body or b""

    def _refused(self, status: str) -> None:
        log.warning("bookie %s refused this client's SASL credentials (%s)", self._bookie_id, status)

    def _token(self, token: bytes) -> None:
        if self._v3:
            request = wire_v3.encode_request(
                OperationType.AUTH, AUTH_TXN_ID, Operation("authRequest", plugin_name=PLUGIN_NAME, body=token)
            )
        else:
            request = wire.encode_auth_request(PLUGIN_NAME, token)
        self._send([wire.frame(request)])

    def _finish(self) -> None:
        self.done = True
        self._cancel_timer()

    def _fail(self, why: str) -> None:
        if self.failure is not None or self.done:
            return
        self.failure = why
        self._cancel_timer()
        log.warning("bookie %s: %s", self._bookie_id, why)
        self._abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
