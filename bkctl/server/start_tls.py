"""The bookie's side of START_TLS: answer the v3 request, then switch the connection to TLS.

As a Java bookie does (BookieRequestProcessor.processStartTLSRequestV3): without TLS configured the
answer is EBADREQ and the connection stays as it is; with TLS the EOK answer goes out in the clear and
the next bytes are the client's TLS handshake. After it the connection carries v2 or v3 frames as
before: every byte read goes through the connection's TlsChannel (bkctl/tls_channel.py, `received`
here) and the frame loop gets all the plaintext of one socket read at once; every write is encrypted
by `BookieProtocol.send` and goes out through netio.write_now like plaintext. The client's first
requests may come in the same read as its handshake's Finished: they are served.

bkctl is stricter about when: START_TLS must come before anything else waits for an answer and alone in
its read, since plaintext pipelined behind it (or replies still owed in plaintext) could be
taken for protected traffic. A failed handshake is logged with the peer and counted in /metrics.

`tlsRequired` (bkctl's key; Java 4.14.8 serves plaintext clients even with tlsClientAuthentication):
until its handshake a connection is served START_TLS and AUTH only; any other request is answered
EUA, as Java answers a connection that has not authenticated, and counted.
"""

from __future__ import annotations

import logging
import weakref

from twisted.python.failure import Failure

from bkctl.errors import ProtocolError
from bkctl.netio import write_now
from bkctl.protocol import wire, wire_v3
from bkctl.server.connection import Connection
from bkctl.tls_channel import TlsChannel, TlsError, describe

log = logging.getLogger("bkctl.bookie")

HANDSHAKING = "handshaking"
PROTECTED = "protected"
FAILED = "failed"  # the TLS session failed (logged, counted): the connection is closing
_refusing: weakref.WeakSet[Connection] = weakref.WeakSet()  # connections already logged as refused


def answer(connection: Connection, request: wire_v3.V3Request, payload_size: int) -> None:
    """Answer a START_TLS request (`payload_size`: its frame's payload, to see that nothing follows)."""
    txn_id = request.header.txn_id
    context = connection.factory.tls_context
    metrics = connection.factory.metrics
    alone = len(connection._buffer) == wire.LENGTH_PREFIX_SIZE + payload_size and not connection._out
    if context is None or connection.tls_state is not None or connection.replies_owed or not alone:
        if context is None:
            log.warning("bookie: START_TLS from %s but TLS is not configured: EBADREQ", connection.peer)
        else:
            log.warning("bookie: START_TLS from %s not first or not alone: EBADREQ", connection.peer)
        metrics.bad_requests += 1
        reply = wire_v3.encode_start_tls_response(txn_id, wire_v3.StatusCode.EBADREQ)
        connection._out.append(wire.frame(reply))
        return
    reply = wire_v3.encode_start_tls_response(txn_id, wire_v3.StatusCode.EOK)
    write_now(connection.transport, [wire.frame(reply)])  # in the clear, ahead of the handshake
    connection.tls_state = HANDSHAKING
    connection.tls = TlsChannel(context, server_side=True)


def received(connection: Connection, channel: TlsChannel, data: bytes) -> bytes:
    """Ciphertext read from the connection in, its plaintext out (b"" when there is none yet, or the
    session failed: then the connection is closing)."""
    handshaking = not channel.handshake_done
    try:
        plaintext = channel.receive(data)
    except TlsError as exc:
        _failed(connection, channel, str(exc))
        return b""
    if channel.output_pending:  # the handshake's messages, or an answer to a key update
        write_now(connection.transport, [channel.take_output()])
    if handshaking and channel.handshake_done:
        _handshake_done(connection)
    if channel.peer_closed:
        # close_notify: nothing more will come; answer with ours and close (replies still owed drop).
        connection.close()
    return plaintext


def _handshake_done(connection: Connection) -> None:
    connection.tls_state = PROTECTED
    connection.factory.metrics.tls_handshakes += 1
    connection.protected()


def _failed(connection: Connection, channel: TlsChannel, why: str) -> None:
    """The session failed: log with the peer, count a handshake's failure, send the alert, close."""
    if connection.tls_state == HANDSHAKING:
        connection.factory.metrics.tls_handshake_failures += 1
        log.warning("bookie: TLS handshake with %s failed: %s", connection.peer, why)
    else:
        log.warning("bookie: TLS connection with %s failed: %s", connection.peer, why)
    connection.tls_state = FAILED
    connection.broken()
    if channel.output_pending:
        write_now(connection.transport, [channel.take_output()])
    connection.drop()


def refused(connection: Connection, payload: bytes) -> bool:
    """TLS required and the connection is not protected yet: answer anything but START_TLS and AUTH
    with EUA (True); what does not decode goes on to the usual EBADREQ (False)."""
    try:
        if wire_v3.is_v2_frame(payload):
            request = wire.decode_request(payload)
            if isinstance(request, wire.AuthRequest):
                return False
            reply = wire.encode_error_response(request, wire.ReturnCode.EUA)
        else:
            v3 = wire_v3.decode_v3_request(payload)
            if v3.header.operation in (wire_v3.OperationType.START_TLS, wire_v3.OperationType.AUTH):
                return False
            reply = wire_v3.encode_status_response(v3, wire_v3.StatusCode.EUA)
    except ProtocolError:
        return False
    if connection not in _refusing:  # once per connection: a plaintext writer sends thousands
        _refusing.add(connection)
        log.warning("bookie: requests from %s without TLS (tlsRequired) are answered EUA", connection.peer)
    connection.factory.metrics.tls_required_refusals += 1
    connection._out.append(wire.frame(reply))
    return True


def connection_lost(connection: Connection, reason: Failure) -> None:
    """A connection that ends during its handshake failed it: log the peer and why, count it."""
    if connection.tls_state != HANDSHAKING:
        return
    connection.factory.metrics.tls_handshake_failures += 1
    log.warning("bookie: TLS handshake with %s failed: %s", connection.peer, describe(reason.value))
