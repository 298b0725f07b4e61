"""The bookie's v2 wire protocol on Twisted: a thin adapter from bkctl.protocol.wire to Storage.

Hot path (see docs/bookie.md, "Running a bookie"): `dataReceived` frames the stream itself and reads a
version 2 add's length, header, master key and ids with one unpack; the entry is sliced once from the
receive buffer and goes to `Storage.add` with a token `(protocol, framed EOK reply)`, no Deferred and
no other call per add. Every other request is decoded by bkctl.protocol.wire. When the journal's fsync
covers a batch, `deliver_durable` (Storage's `on_durable`) groups the batch's replies by connection
and sends them with ONE write per connection. Replies that need no fsync (reads, errors) are collected
during one `dataReceived` and written once at its end.

Bounds: a frame larger than `frame_size_max` (or a malformed length) closes the connection, since the
stream cannot be resynchronised; a well-framed but malformed request gets EBADREQ. A connection with
too many adds waiting for the fsync, or whose replies are not being read (the transport asks its
registered producer to pause), stops being read until it drains: backpressure, not unbounded buffers.
"""

from __future__ import annotations

import logging
import ssl
import struct
from functools import partial
from typing import Any, Final, cast

from twisted.internet import protocol
from twisted.internet.interfaces import IPushProducer
from twisted.python.failure import Failure
from zope.interface import implementer

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.netio import write_now
from bkctl.protocol import wire, wire_v3
from bkctl.sasl import BookieSasl
from bkctl.server import sasl_auth, start_tls
from bkctl.server.connection import NetworkMetrics, StorageApi, timed_read
from bkctl.server.protocol_v3 import LateReply, V3Requests
from bkctl.server.sasl_auth import ServerAuth
from bkctl.tls_channel import TlsChannel, TlsError

log = logging.getLogger("bkctl.bookie")

_EOK: Final = int(wire.ReturnCode.EOK)
_EBADREQ: Final = int(wire.ReturnCode.EBADREQ)
_EUA: Final = int(wire.ReturnCode.EUA)
_ADD_RESPONSE_PREFIX: Final = wire.frame_prefix(wire.RESPONSE_FIXED_SIZE)

# The add fast path (most frames a bookie sees): one unpack of the length prefix, header, master key and
# the entry's ids, the layout wire.decode_request reads for a version 2 ADD_ENTRY (tests/server_net
# checks they agree). The entry starts after the master key.
_FRAMED_ADD: Final = struct.Struct(f">iI{limits.MASTER_KEY_SIZE}sqq")
_ADD_SIZE_MIN: Final = _FRAMED_ADD.size - wire.LENGTH_PREFIX_SIZE  # up to the entry's ids
_ADD_ENTRY_OFFSET: Final = wire.LENGTH_PREFIX_SIZE + wire.HEADER_SIZE + limits.MASTER_KEY_SIZE
_ADD_V2_HEADER_HIGH: Final = wire.pack_header(wire.PROTOCOL_VERSION, wire.OpCode.ADD_ENTRY, 0) >> 16
_RECOVERY_ADD: Final = int(wire.FLAG_RECOVERY_ADD)
_FRAME_SIZE_MIN: Final = wire.HEADER_SIZE
_V2_VERSION_MAX: Final = wire.PROTOCOL_VERSION_MAX  # a higher first byte is a v3 (protobuf) frame
# A framed add reply in one pack: length prefix, header, rc, ledger id, entry id.
_FRAMED_ADD_RESPONSE: Final = struct.Struct(">iIiqq")
_ADD_V2_RESPONSE_HEADER: Final = wire.pack_header(wire.PROTOCOL_VERSION, wire.OpCode.ADD_ENTRY, 0)


# What the protocols hand to Storage.add (and the journal's other records) as their token: the
# connection and its framed reply, or a LateReply made once the record is durable. Storage and the
# journal carry tokens without looking at them (`object`); only this module makes and reads them.
AddToken = tuple["BookieProtocol", "bytes | LateReply"]


def deliver_durable(tokens: list[object]) -> None:
    """Storage's `on_durable`: one write per connection per fsync batch, replies in journal order."""
    by_connection: dict[BookieProtocol, list[bytes]] = {}
    for connection, reply in cast(list[AddToken], tokens):  # made by this module only, see AddToken
        replies = by_connection.get(connection)
        if replies is None:
            replies = by_connection[connection] = []
        if isinstance(reply, LateReply):
            replies.append(reply.make())  # a fencing read: the entry is read now the fence is durable
        else:
            replies.append(reply)
    for connection, replies in by_connection.items():
        connection.durable(replies)


def deliver_lost(tokens: list[object]) -> None:
    """Storage's `on_lost`: the journal failed and these adds will never be durable. Their connections
    are closed (the replies already sent stay valid), so each client fails them at once and moves on
    to other bookies; an add is never acknowledged without its journal record."""
    connections = {connection for connection, _ in cast(list[AddToken], tokens)}
    for connection in connections:
        if connection.transport is not None:
            log.warning("bookie: closing connection from %s: its adds cannot be journaled", connection.peer)
            connection.close()


def framed(payload: bytes) -> bytes:
    return wire.frame_prefix(len(payload)) + payload


@implementer(IPushProducer)
class BookieProtocol(protocol.Protocol):
    """One client connection. Requests are pipelined; replies go out as soon as each is known."""

    def __init__(self, factory: BookieFactory) -> None:
        self.factory = factory
        self.storage = factory.storage
        self._buffer = bytearray()  # received bytes not yet part of a handled frame
        self._frame_size_max = factory.frame_size_max
        self._broken = False  # a bad frame length was seen: nothing after it is read
        self._pending_max = factory.pending_adds_max
        self._resume_at = factory.pending_adds_max // 2
        self.pending = 0  # adds and fences waiting for the journal's fsync
        self._out: list[bytes] = []
        self._writes_paused = False  # the transport's write buffer is full
        self._reading_paused = False
        self.peer = "?"
        self.tls_state: str | None = None  # set by START_TLS (server/start_tls.py)
        self.tls: TlsChannel | None = None  # after START_TLS: every byte in and out goes through it
        self._unprotected = factory.tls_required  # tlsRequired, before the handshake: see _frames
        # SASL on, before the client authenticated (server/sasl_auth.py); None when it is off or done.
        self.auth: ServerAuth | None = ServerAuth(factory.sasl) if factory.sasl is not None else None
        self._transport: Any = None  # the ITransport, untyped: zope interfaces and mypy do not mix
        self._v3 = V3Requests(self)  # v3 (protobuf) frames: server/protocol_v3.py

    # --- connection life ------------------------------------------------------------------------

    def connectionMade(self) -> None:
        self._transport = self.transport
        if hasattr(self._transport, "bufferSize"):  # a TCP transport (StringTransport in unit tests)
            self._transport.bufferSize = limits.BOOKIE_READ_SIZE
        if self.factory.tcp_no_delay and hasattr(self._transport, "setTcpNoDelay"):
            # Replies are small writes: with Nagle on, a batch written while the previous one is not yet
            # acknowledged waits for the client's delayed ACK, 40 ms on Linux, every add of the client
            # stalled behind it (measured: 40-44 ms gaps in a 3-bookie run, several per 10 s).
            self._transport.setTcpNoDelay(True)
        peer = self._transport.getPeer()
        self.peer = f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"
        # As a streaming producer the transport tells us when its write buffer is full.
        self._transport.registerProducer(self, True)
        self.factory.connection_made(self)

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.connected = False
        self.factory.connection_lost(self)
        start_tls.connection_lost(self, reason)
        self._v3.close()
        # Replies of adds still in the journal are dropped in `durable` (self.connected is 0 now).

    @property
    def replies_owed(self) -> bool:
        """Replies that go out after this read: adds and fences in the journal, v3 long polls and scans."""
        return self.pending > 0 or self._v3.replies_owed

    def protected(self) -> None:
        self._unprotected = False

    def _gated(self, payload: bytes) -> bool:
        """A frame before TLS (tlsRequired) or SASL completed: True when answered here."""
        if self._unprotected and start_tls.refused(self, payload):
            return True
        auth = self.auth
        if auth is None or auth.authenticated:
            return False
        return sasl_auth.gated(self, auth, payload)

    def broken(self) -> None:
        """Nothing more is read from this connection (it is closing)."""
        self._broken = True

    def drop(self) -> None:
        """Close after what is queued, without a close_notify (the TLS session failed)."""
        self._transport.loseConnection()

    def close(self) -> None:
        """Close after what is queued, with a TLS close_notify first on a TLS connection."""
        channel = self.tls
        close_notify = channel.close() if channel is not None and channel.handshake_done else b""
        if close_notify:
            write_now(self._transport, [close_notify])
        self._transport.loseConnection()

    def send(self, chunks: list[bytes]) -> None:
        """Write framed replies now (netio.write_now), encrypted first on a TLS connection."""
        channel = self.tls
        if channel is not None:
            try:
                chunks = [channel.encrypt(chunks)]
            except TlsError as exc:  # mid-handshake: START_TLS is refused while replies are owed
                log.warning("bookie: closing connection from %s: %s", self.peer, exc)
                self._transport.abortConnection()
                return
        write_now(self._transport, chunks)

    # --- IPushProducer: the transport's write buffer -------------------------------------------

    def pauseProducing(self) -> None:
        self._writes_paused = True
        self._update_reading()

    def resumeProducing(self) -> None:
        self._writes_paused = False
        self._update_reading()

    def stopProducing(self) -> None:
        self._writes_paused = True

    def _update_reading(self) -> None:
        if not self.connected:
            return
        transport = self._transport
        if not self._reading_paused:
            if self._writes_paused or self.pending >= self._pending_max:
                self._reading_paused = True
                self.factory.metrics.read_pauses += 1
                transport.pauseProducing()
        elif not self._writes_paused and self.pending <= self._resume_at:
            self._reading_paused = False
            transport.resumeProducing()

    @property
    def reading_paused(self) -> bool:
        return self._reading_paused

    # --- requests -------------------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self._broken:
            return
        channel = self.tls
        if channel is not None:
            data = start_tls.received(self, channel, data)  # all of this read's plaintext, or b""
            if not data or self._broken:
                return
        problem = None
        try:
            problem = self._frames(data)
        except ProtocolError as exc:
            problem = str(exc)
        if self._out:
            out, self._out = self._out, []
            self.send(out)
        if problem is not None:
            self._broken = True
            self._reject(problem)
        elif self.pending >= self._pending_max:
            self._update_reading()

    def _frames(self, data: bytes) -> str | None:
        """Handle every complete frame buffered; a bad length ends the stream (its reason is returned)."""
        buffer = self._buffer
        buffer += data
        end = len(buffer)
        position = 0
        unpack_add = _FRAMED_ADD.unpack_from
        head_size = _FRAMED_ADD.size
        frame_size_max = self._frame_size_max
        add = self.storage.add
        pack = _FRAMED_ADD_RESPONSE.pack
        reply_size = wire.RESPONSE_FIXED_SIZE
        # tlsRequired before its handshake, or SASL before the client authenticated (only then does
        # this loop's view change: `_gated` looks again for each frame).
        gated = self._unprotected or (self.auth is not None and not self.auth.authenticated)
        v3_frame = self._v3.frame
        v3_add = wire_v3.v3_add  # C when built, else its Python reference
        problem = None
        try:
            while end - position >= wire.LENGTH_PREFIX_SIZE:
                if end - position >= head_size:
                    size, header, master_key, ledger_id, entry_id = unpack_add(buffer, position)
                else:  # too short for an add: only the length matters
                    (size,) = wire.FRAME_LENGTH.unpack_from(buffer, position)
                    header = 0
                if not _FRAME_SIZE_MIN <= size <= frame_size_max:
                    problem = wire.bad_frame_length(size, frame_size_max)
                    break
                start = position
                position += wire.LENGTH_PREFIX_SIZE + size
                if position > end:
                    position = start
                    break
                if gated and self._gated(bytes(buffer[start + wire.LENGTH_PREFIX_SIZE : position])):
                    continue  # answered EUA (tlsRequired, SASL), or an AUTH step
                if header >> 16 == _ADD_V2_HEADER_HIGH and size >= _ADD_SIZE_MIN:
                    # A version 2 add, the bookie's hottest path: handled here, not in _handle. The entry
                    # is a bytearray, one copy out of the buffer (storage copies it into its cache).
                    entry = buffer[start + _ADD_ENTRY_OFFSET : position]
                    recovery = header & _RECOVERY_ADD != 0
                    reply = pack(reply_size, _ADD_V2_RESPONSE_HEADER, _EOK, ledger_id, entry_id)
                    rc = add(ledger_id, entry_id, master_key, entry, recovery, (self, reply))
                    if rc == _EOK:
                        self.pending += 1
                    else:
                        self._out.append(pack(reply_size, _ADD_V2_RESPONSE_HEADER, rc, ledger_id, entry_id))
                elif buffer[start + wire.LENGTH_PREFIX_SIZE] <= _V2_VERSION_MAX:
                    self._handle(bytes(buffer[start + wire.LENGTH_PREFIX_SIZE : position]))
                elif (v3 := v3_add(buffer, start + wire.LENGTH_PREFIX_SIZE, position)) is not None:
                    # A Java-shaped v3 add (a Java client's default), as hot: one C call when it was
                    # built (protocol/_fastadd.c) gives the entry's ids, bounds and the EOK reply.
                    ledger_id, entry_id, master_key, body_start, body_end, recovery, reply = v3
                    entry = buffer[body_start:body_end]
                    rc = add(ledger_id, entry_id, master_key, entry, recovery, (self, reply))
                    if rc == _EOK:
                        self.pending += 1
                    else:
                        self._v3.refused_add(buffer, start + wire.LENGTH_PREFIX_SIZE, position, rc)
                else:
                    v3_frame(buffer, start + wire.LENGTH_PREFIX_SIZE, position)
        finally:
            if position:
                # Deleting from the front of a bytearray only moves its start pointer: no copy of the rest.
                del buffer[:position]
        return problem

    def queue(self, reply: bytes) -> None:
        """A framed reply, written with the others at the end of this `dataReceived`."""
        self._out.append(reply)

    def start_tls(self, request: wire_v3.V3Request, size: int) -> None:
        """START_TLS (v3; `size`: the request's payload bytes): server/start_tls.py answers EOK and starts
        the handshake, or EBADREQ as Java's bookie does without TLS configured."""
        start_tls.answer(self, request, size)

    def _handle(self, payload: bytes) -> None:
        """Any version 2 request but a well-formed add (those are handled in `_frames`)."""
        try:
            request = wire.decode_request(payload)
        except ProtocolError as exc:
            self._bad_request(payload, exc)
            return
        if isinstance(request, wire.AddRequest):
            self._add(request)
        elif isinstance(request, wire.ReadRequest):
            self._read(request)
        elif isinstance(request, wire.BatchReadRequest):
            self._batch_read(request)
        elif isinstance(request, wire.AuthRequest):
            # No authentication: answer like a Java bookie with the AuthDisabled plugin.
            self._out.append(framed(wire.encode_auth_response(version=request.version)))
        else:
            self.factory.metrics.bad_requests += 1
            self._out.append(framed(wire.encode_error_response(request, _EBADREQ)))

    def _add(self, request: wire.AddRequest) -> None:
        ledger_id, entry_id = request.ledger_id, request.entry_id
        recovery = bool(request.flags & wire.FLAG_RECOVERY_ADD)
        reply = _ADD_RESPONSE_PREFIX + wire.encode_add_response(_EOK, ledger_id, entry_id, request.version)
        rc = self.storage.add(ledger_id, entry_id, request.master_key, request.entry, recovery, (self, reply))
        if rc == _EOK:
            self.pending += 1
        else:
            self._out.append(
                _ADD_RESPONSE_PREFIX + wire.encode_add_response(rc, ledger_id, entry_id, request.version)
            )

    def _read(self, request: wire.ReadRequest) -> None:
        if request.flags & wire.FLAG_DO_FENCING:
            self._fence(request)
            return
        rc, entry = timed_read(self.storage, self.factory.metrics, request.ledger_id, request.entry_id)
        self._out.append(self._read_reply(request, rc, entry))

    def _fence(self, request: wire.ReadRequest) -> None:
        if request.master_key is None:
            # Fencing without a key (a version 0/1 client) cannot prove it may fence: EUA, like Java.
            self._out.append(self._read_reply(request, _EUA, b""))
            return
        late = LateReply(partial(self.fencing_read_reply, request))
        rc = self.storage.fence(request.ledger_id, request.master_key, (self, late))
        if rc == _EOK:
            self.pending += 1
        else:
            self._out.append(self._read_reply(request, rc, b""))

    def fencing_read_reply(self, request: wire.ReadRequest) -> bytes:
        """The answer to a fencing read, made once the fence is durable: the entry it asked for."""
        rc, entry = self.storage.read(request.ledger_id, request.entry_id)
        return self._read_reply(request, rc, entry)

    @staticmethod
    def _read_reply(request: wire.ReadRequest, rc: int, entry: bytes) -> bytes:
        payload = wire.encode_read_response(
            rc, request.ledger_id, request.entry_id, entry if rc == _EOK else b"", request.version
        )
        return framed(payload)

    def _batch_read(self, request: wire.BatchReadRequest) -> None:
        if request.flags & wire.FLAG_DO_FENCING or request.max_count <= 0 or request.entry_id < 0:
            # Fencing batch reads are not something a Java client sends; refuse rather than guess.
            self.factory.metrics.bad_requests += 1
            self._out.append(framed(wire.encode_error_response(request, _EBADREQ)))
            return
        entries, rc = self._read_range(request)
        payload = wire.encode_batch_read_response(
            rc, request.ledger_id, request.entry_id, request.request_id, entries, request.version
        )
        self._out.append(framed(payload))

    def _read_range(self, request: wire.BatchReadRequest) -> tuple[list[bytes], int]:
        """Entries from `entry_id` on, within max_count, max_size and the frame limit; the first
        entry's error is the answer's rc, a later one just ends the batch."""
        size_max = min(
            request.max_size if request.max_size > 0 else limits.FRAME_SIZE_MAX, limits.FRAME_SIZE_MAX
        )
        size = wire.RESPONSE_FIXED_SIZE + 12
        entries: list[bytes] = []
        for entry_id in range(request.entry_id, request.entry_id + min(request.max_count, 10_000)):
            rc, entry = self.storage.read(request.ledger_id, entry_id)
            if rc != _EOK:
                return entries, rc if not entries else _EOK
            if size + 4 + len(entry) > size_max and entries:
                break
            if size + 4 + len(entry) > limits.FRAME_SIZE_MAX - 4:
                break
            entries.append(entry)
            size += 4 + len(entry)
        return entries, _EOK

    # --- bad input ------------------------------------------------------------------------------

    def _bad_request(self, payload: bytes, exc: ProtocolError) -> None:
        """A well-framed request that does not decode: EBADREQ if its header says what it was."""
        try:
            version, opcode, flags = wire.unpack_header(payload)
        except ProtocolError:
            raise ProtocolError(f"undecodable frame header: {exc}") from None
        log.info("bookie: bad request from %s: %s", self.peer, exc)
        self.factory.metrics.bad_requests += 1
        self._out.append(framed(wire.encode_error_response(_placeholder(version, opcode, flags), _EBADREQ)))

    def _reject(self, reason: str) -> None:
        log.warning("bookie: closing connection from %s: %s", self.peer, reason)
        self.factory.metrics.frames_rejected += 1
        # Stop reading at once (nothing more from this stream can be trusted), then close after the
        # replies already queued.
        if not self._reading_paused:
            self._reading_paused = True
            self._transport.pauseProducing()
        self.close()

    # --- durable replies ------------------------------------------------------------------------

    def durable(self, replies: list[bytes]) -> None:
        """The journal made `replies`' requests durable: send them in one write."""
        self.pending -= len(replies)
        if not self.connected:
            return
        self.send(replies)
        if self._reading_paused:
            self._update_reading()


def _placeholder(version: int, opcode: int, flags: int) -> wire.Request:
    """A request of the undecodable frame's opcode with unknown (-1) ids: its EBADREQ answer then
    has the shape a client expects for that opcode."""
    unknown = wire.UNKNOWN_ID
    if opcode == wire.OpCode.ADD_ENTRY:
        return wire.AddRequest(version, flags, b"", unknown, unknown, b"")
    if opcode == wire.OpCode.READ_ENTRY:
        return wire.ReadRequest(version, flags, unknown, unknown, None)
    if opcode == wire.OpCode.BATCH_READ_ENTRY:
        return wire.BatchReadRequest(version, flags, unknown, unknown, unknown, 0, 0, None)
    if opcode == wire.OpCode.AUTH:
        return wire.AuthRequest(version, flags, "", b"")
    return wire.UnknownRequest(version, opcode, flags, b"")


class BookieFactory(protocol.Factory):
    """Makes a BookieProtocol per connection once `ready` (storage replayed); refuses before."""

    def __init__(
        self,
        storage: StorageApi,
        frame_size_max: int = limits.FRAME_SIZE_MAX,
        pending_adds_max: int = limits.BOOKIE_PENDING_ADDS_PER_CONNECTION_MAX,
        tcp_no_delay: bool = True,
        tls_context: ssl.SSLContext | None = None,
        tls_required: bool = False,
        reactor: Any = None,
        sasl: BookieSasl | None = None,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.reactor = reactor  # long-poll reads' timeouts
        self.storage = storage
        self.tls_context = tls_context  # bkctl.tls.server_context; None: START_TLS answered EBADREQ
        self.tls_required = tls_required  # only START_TLS and AUTH before the handshake
        self.sasl = sasl  # only START_TLS and AUTH before a client authenticated (bkctl/sasl.py)
        self.frame_size_max = frame_size_max
        self.pending_adds_max = pending_adds_max
        self.tcp_no_delay = tcp_no_delay
        self.metrics = NetworkMetrics()
        self.connections: set[BookieProtocol] = set()
        self.ready = True

    def buildProtocol(self, addr: object) -> BookieProtocol | None:
        if not self.ready:
            self.metrics.connections_refused += 1
            return None
        return BookieProtocol(self)

    def connection_made(self, connection: BookieProtocol) -> None:
        self.connections.add(connection)
        self.metrics.connections_open += 1
        self.metrics.connections_total += 1

    def connection_lost(self, connection: BookieProtocol) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            self.metrics.connections_open -= 1

    def close_all(self) -> None:
        """Drop every client connection (the bookie is stopping)."""
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.close()
