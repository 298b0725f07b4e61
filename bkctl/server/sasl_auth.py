"""The bookie's side of SASL: nothing but the AUTH exchange (and START_TLS) before a client authenticated.

As Java's AuthHandler.ServerSideHandler with SASLBookieAuthProviderFactory (bkctl/sasl.py has the keys):
- AUTH requests (v3, and v2's AuthRequest of pre-protobuf clients) carry the plugin name `sasl` and the
  client's SASL token; the answer carries the bookie's next token (DIGEST-MD5: the challenge, then
  `rspauth`, bkctl/protocol/sasl_digest.py; GSSAPI: the context's tokens, then the security-layer
  offer, bkctl/kerberos.py). GSSAPI's last client token gets no answer, as from Java's bookie: the
  client is done once it sent it. Another plugin name closes the connection, as in Java.
- Before the exchange completed, a v3 request is answered EUA (START_TLS goes through), a v2 add or
  read is answered EUA, anything else closes the connection.
- A refused client (unknown name, wrong password, not an allowed id) is logged with its peer and why,
  counted (/metrics `bookie_sasl_refusals`), answered EUA on v3, and the connection is closed.
After the exchange the connection is served as any other; a further AUTH gets Java's
"authentication disabled" answer (server/protocol.py, protocol_v3.py).
"""

from __future__ import annotations

import logging
from typing import Final

from bkctl.errors import ProtocolError
from bkctl.kerberos import GssapiServer
from bkctl.protocol import wire, wire_v3
from bkctl.protocol.sasl_digest import DigestMd5Server
from bkctl.protocol.wire_v3 import Operation
from bkctl.sasl import PLUGIN_NAME, BookieSasl
from bkctl.server.connection import Connection

log = logging.getLogger("bkctl.bookie")
REFUSED: Final = b"refused"  # _step's mark for a refused client (a real token is never compared to it)


class ServerAuth:
    """One connection's SASL state on the bookie."""

    def __init__(self, settings: BookieSasl) -> None:
        self.mechanism: DigestMd5Server | GssapiServer
        if settings.kerberos is not None:
            self.mechanism = GssapiServer(settings.kerberos, settings.allows)
            self.name = "GSSAPI"
        else:
            self.mechanism = DigestMd5Server(settings.users, settings.allows)
            self.name = "DIGEST-MD5"

    @property
    def authenticated(self) -> bool:
        return self.mechanism.complete


def gated(connection: Connection, auth: ServerAuth, payload: bytes) -> bool:
    """Handle one request of a connection not yet authenticated; True when it was (False: serve it)."""
    try:
        if wire_v3.is_v2_frame(payload):
            return _v2(connection, auth, wire.decode_request(payload))
        return _v3(connection, auth, wire_v3.decode_v3_request(payload))
    except ProtocolError:
        return False  # undecodable: the usual EBADREQ path


def _v2(connection: Connection, auth: ServerAuth, request: wire.Request) -> bool:
    if isinstance(request, wire.AuthRequest):
        if request.plugin_name != PLUGIN_NAME:
            return _close(connection, f"AUTH with plugin {request.plugin_name!r}, not {PLUGIN_NAME!r}")
        token = _step(connection, auth, request.payload)
        if token is not None and token is not REFUSED:
            connection.queue(wire.frame(wire.encode_auth_response(PLUGIN_NAME, token, request.version)))
        return True
    if isinstance(request, wire.AddRequest | wire.ReadRequest):
        _unauthenticated(connection)
        connection.queue(wire.frame(wire.encode_error_response(request, wire.ReturnCode.EUA)))
        return True
    return _close(connection, "a request before authenticating")


def _v3(connection: Connection, auth: ServerAuth, request: wire_v3.V3Request) -> bool:
    operation = request.header.operation
    if operation == wire_v3.OperationType.START_TLS:
        return False
    if operation != wire_v3.OperationType.AUTH:
        _unauthenticated(connection)
        connection.queue(wire.frame(wire_v3.encode_status_response(request, wire_v3.StatusCode.EUA)))
        return True
    op = request.operation
    if op is None or op.plugin_name != PLUGIN_NAME:
        name = None if op is None else op.plugin_name
        return _close(connection, f"AUTH with plugin {name!r}, not {PLUGIN_NAME!r}")
    token = _step(connection, auth, op.body or b"")
    if token is REFUSED:
        connection.queue(wire.frame(wire_v3.encode_status_response(request, wire_v3.StatusCode.EUA)))
        return True
    if token is None:
        return True
    answer = Operation("authResponse", plugin_name=PLUGIN_NAME, body=token)
    connection.queue(wire.frame(wire_v3.encode_status_response(request, wire_v3.StatusCode.EOK, answer)))
    return True


def _step(connection: Connection, auth: ServerAuth, token: bytes) -> bytes | None:
    """The bookie's next token, None when there is none to send (the exchange completed on the
    client's last token), REFUSED when the client is refused (logged, counted, closing)."""
    try:
        answer = auth.mechanism.step(token)
    except ProtocolError as exc:
        connection.factory.metrics.sasl_refusals += 1
        log.warning("bookie: SASL authentication of %s refused: %s", connection.peer, exc)
        _close_after_replies(connection)
        return REFUSED
    if auth.authenticated:
        log.info("bookie: %s authenticated as %s (SASL %s)", connection.peer, auth.mechanism.user, auth.name)
    return answer


def _unauthenticated(connection: Connection) -> None:
    connection.factory.metrics.sasl_unauthenticated_requests += 1


def _close(connection: Connection, why: str) -> bool:
    log.warning("bookie: closing connection from %s: %s", connection.peer, why)
    connection.factory.metrics.sasl_refusals += 1
    _close_after_replies(connection)
    return True


def _close_after_replies(connection: Connection) -> None:
    """Read nothing more; close once this read's replies (the EUA) went out."""
    connection.broken()
    connection.factory.reactor.callLater(0, connection.close)
