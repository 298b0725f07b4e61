"""One pipelined connection per bookie: request timeouts, ordered completion, bounded reconnect backoff.

v2 is the default wire protocol; `protocol="v3"` speaks v3 (protobuf), for bookies that allow only v3
(Java's default). In v3 every request gets a transaction id and replies are matched by it (`_V3` keys);
the callers' API is the same: add frames are built as v2 by the ledger and re-encoded per request.

v2 frames carry no transaction id, so a reply is matched to its request by (opcode, ledger id, entry id).
A bookie answers requests with the same key in the order it got them on one connection, so each key has
a FIFO of waiting requests. A request that times out stays in its FIFO as a tombstone: its late reply is
then swallowed instead of being taken for the reply to a newer request with the same key.

Hot path: no Deferred per request. A waiting request is a 3-item list `[on_reply, argument, deadline]`
(cheaper than an object; `on_reply` is set to None once answered or timed out) and its reply calls
`on_reply(argument, rc, body)`. One timer per connection (requests share one timeout, so deadlines are in
send order and the timer only ever watches the oldest), and the frames of one reactor tick go out in a
single `writeSequence`. Adds arrive already framed and in batches (`send_adds`): the ledger builds one
frame and one `(key, frame, argument)` item per entry and hands the same item to every bookie of its write
set. Replies are cut from the receive buffer in one loop; add responses (the bulk) are matched straight
from the unpacked header without building a response object.

Client-side failures use negative codes beside the bookie's return codes: `RC_TIMEOUT` (no reply in
time) and `RC_UNAVAILABLE` (cannot connect, connection lost, in reconnect backoff, closed).
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet import defer, protocol
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from bkctl import limits
from bkctl.client.sasl_auth import ClientAuth
from bkctl.client.start_tls import ClientUpgrade
from bkctl.errors import AccessDeniedError, ProtocolError, TimeoutError_, UnavailableError, UsageError
from bkctl.model import BookieId
from bkctl.netio import write_now
from bkctl.protocol import wire, wire_v3
from bkctl.sasl import ClientSasl
from bkctl.tls import TlsSettings

log = logging.getLogger(__name__)

RC_TIMEOUT = -1001  # format fact
# A bookie found not registered is looked up again after this long, not at every ledger naming it
UNREGISTERED_RECHECK_S = 1.0  # local bound
RC_UNAVAILABLE = -1002
# The bookie refused this client's SASL credentials (client/sasl_auth.py); -1003 is reads.RC_DIGEST.
RC_UNAUTHENTICATED = -1004

Callback = Callable[[int, bytes], None]
Key = tuple[int, int, int]
# on_reply(argument, rc, body): one function for many requests, the argument tells them apart.
OnReply = Callable[[Any, int, bytes], None]
# What a request is sent as: its key (opcode, ledger id, entry id), its frame, the argument of on_reply.
Item = tuple[Key, bytes, Any]
# bookie id -> the host and port its registration names (None: not registered, or no bookie-rpc endpoint).
Resolver = Callable[[str], "Deferred[tuple[str, int] | None]"]
# A request waiting for its reply: [on_reply or None once answered / timed out, argument, deadline].
_Waiter = list[Any]

_ADD = int(wire.OpCode.ADD_ENTRY)
_READ = int(wire.OpCode.READ_ENTRY)
_ADD_RESPONSE = wire.AddResponse
_READ_RESPONSE = wire.ReadResponse
# Length prefix + response header (header int, rc, ledger id, entry id): an add response is exactly this.
_REPLY_HEAD = struct.Struct(">iIiqq")
_REPLY_HEAD_SIZE = _REPLY_HEAD.size
_ADD_REPLY_SIZE = _REPLY_HEAD_SIZE - wire.LENGTH_PREFIX_SIZE
_FRAME_MIN = wire.HEADER_SIZE
_FRAME_MAX = limits.FRAME_SIZE_MAX
_V3 = -3  # the first item of a v3 request's key: (_V3, txn id, 0)
PROTOCOLS = ("v2", "v3")


def check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise UsageError(f"wire protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")


# Add flags: a writer's, and recovery's (accepted by a fenced bookie), shared by the ledger handle and
# recovery (here, below both, so neither imports the other for them).
ADD_FLAGS = wire.FLAG_NONE
RECOVERY_ADD_FLAGS = wire.FLAG_RECOVERY_ADD | wire.FLAG_HIGH_PRIORITY


def rc_text(rc: int) -> str:
    if rc == RC_TIMEOUT:
        return "timed out"
    if rc == RC_UNAVAILABLE:
        return "unavailable"
    if rc == RC_UNAUTHENTICATED:
        return "authentication refused"
    return wire.rc_name(rc)


def error_for(rc: int, what: str) -> Exception:
    """The bkctl error for a failed request (bookie code or client-side code)."""
    if rc == RC_TIMEOUT:
        return TimeoutError_(f"{what}: no answer within the request timeout")
    if rc == RC_UNAVAILABLE:
        return UnavailableError(f"{what}: bookie unavailable")
    if rc == RC_UNAUTHENTICATED:
        return AccessDeniedError(
            f"{what}: the bookie refused this client's SASL credentials "
            "(clientAuthProviderFactoryClass in --conf, the BookKeeper section of --jaas)"
        )
    return wire.error_for_rc(rc, what)


def _call(callback: Callback, rc: int, body: bytes) -> None:
    """on_reply of single requests whose argument is a plain `callback(rc, body)`."""
    callback(rc, body)


def add_key(ledger_id: int, entry_id: int) -> Key:
    return (_ADD, ledger_id, entry_id)


class _Connection(protocol.Protocol):
    def __init__(self, client: BookieClient) -> None:
        self.client = client
        self.tls: ClientUpgrade | None = None  # with TLS: START_TLS, the handshake, then the channel
        self.auth: ClientAuth | None = None  # with SASL: the AUTH exchange, after TLS

    @property
    def socket(self) -> Any:
        """The transport, untyped: ITransport lacks writeSequence/abortConnection in its stubs."""
        return self.transport

    @property
    def ready(self) -> bool:
        """TLS and SASL (when configured) are done: requests may flow."""
        return (self.tls is None or self.tls.done) and (self.auth is None or self.auth.done)

    def connectionMade(self) -> None:
        self.tls = self.client._upgrade(self.socket)
        if self.tls is None:
            self._secured()

    def _secured(self) -> None:
        """TLS (if any) is up: authenticate (if configured), then the connection is the client's."""
        self.auth = self.client._authenticate(self)
        if self.auth is None:
            self.client._connected(self)

    def dataReceived(self, data: bytes) -> None:
        tls = self.tls
        if tls is None:
            self._plaintext(data)
        elif tls.done:
            plaintext = tls.receive(data)
            if plaintext:
                self._plaintext(plaintext)
        else:
            plaintext = tls.data_received(data)
            if tls.done:
                self._secured()
                if plaintext:
                    self._plaintext(plaintext)

    def _plaintext(self, data: bytes) -> None:
        auth = self.auth
        if auth is not None and not auth.done:
            data = auth.data_received(data)
            if not auth.done:
                return
            self.client._connected(self)
            if not data:
                return
        self.client._data_received(self, data)

    def send(self, chunks: list[bytes]) -> None:
        """Write requests now (netio.write_now), encrypted first on a TLS connection."""
        if self.tls is not None:
            chunks = self.tls.encrypt(chunks)
        write_now(self.socket, chunks)

    def close(self) -> None:
        """Close after what is queued (a TLS connection says close_notify first)."""
        if self.tls is not None:
            self.tls.close()
        else:
            self.socket.loseConnection()

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        if self.tls is not None:
            self.tls.lost(reason)
        if self.auth is not None:
            self.auth.lost()
        if not self.ready:
            refused = self.auth is not None and self.auth.failure is not None
            self.client._connect_failed(reason, RC_UNAUTHENTICATED if refused else RC_UNAVAILABLE)
            return
        self.client._connection_lost(self, reason)


class _Factory(protocol.ClientFactory):
    def __init__(self, client: BookieClient) -> None:
        self.client = client

    def buildProtocol(self, addr: object) -> _Connection:
        return _Connection(self.client)

    def clientConnectionFailed(self, connector: object, reason: Failure) -> None:
        self.client._connect_failed(reason)


class BookieClient:
    """The client side of one bookie. Connects on the first request; see the module docstring."""

    def __init__(
        self,
        bookie_id: str,
        reactor: Any,
        *,
        request_timeout_ms: int = limits.CLIENT_REQUEST_TIMEOUT_MS,
        connect_timeout_ms: int = limits.CLIENT_CONNECT_TIMEOUT_MS,
        backoff_min_ms: int = limits.CLIENT_RECONNECT_BACKOFF_MS_MIN,
        backoff_max_ms: int = limits.CLIENT_RECONNECT_BACKOFF_MS_MAX,
        requests_max: int = limits.CLIENT_REQUESTS_PER_BOOKIE_MAX,
        address: tuple[str, int] | None = None,
        resolver: Resolver | None = None,
        protocol: str = "v2",
        tls: TlsSettings | None = None,
        sasl: ClientSasl | None = None,
    ) -> None:
        check_protocol(protocol)
        self.bookie_id = bookie_id
        self._tls = tls  # every new connection sends START_TLS first (bkctl/tls.py)
        self._sasl = sasl  # then authenticates (bkctl/sasl.py)
        self.protocol = protocol
        self._v3 = protocol == "v3"
        self._txn_id = 0
        self._reactor = reactor
        self._timeout_s = request_timeout_ms / 1000.0
        self._connect_timeout_s = connect_timeout_ms / 1000.0
        self._backoff_min_s = backoff_min_ms / 1000.0
        self._backoff_max_s = backoff_max_ms / 1000.0
        self._requests_max = requests_max
        # Where to connect: a given address; else the `bookie-rpc` endpoint the bookie registered (its id
        # need not be its address, as in Java's DefaultBookieAddressResolver), looked up once and again
        # after a connection fails or drops (the bookie may have moved); else the id itself when it is
        # host:port. A lookup that fails or outlasts the connect timeout (metadata store down) falls back
        # to the last known address, so a metadata outage never stops traffic to bookies.
        self._address: tuple[str, int] | None = address or _address(bookie_id)
        self._resolver = None if address is not None else resolver
        self._resolved = False
        self._unregistered_at = -UNREGISTERED_RECHECK_S  # when a lookup last found no registration
        self._connection: _Connection | None = None
        self._connecting = False
        self._closed = False
        self._backoff_s = 0.0
        self._retry_at = 0.0  # no connection attempt before this reactor time
        # Key -> its waiter, or a deque of them when several share the key (rare).
        self._waiting: dict[Key, _Waiter | deque[_Waiter]] = {}
        self._timeline: deque[_Waiter] = deque()  # in send order = deadline order
        self._in_flight = 0
        self._timer: Any = None
        self._out: list[bytes] = []
        self._flush_call: Any = None
        self._buffer = bytearray()
        self._lost_waiters: list[Deferred[None]] = []
        self.connects = 0  # successful connections, for tests and metrics

    # --- requests -------------------------------------------------------------------------------

    def add(
        self, entry: bytes, master_key: bytes, flags: int, ledger_id: int, entry_id: int, cb: Callback
    ) -> None:
        """ADD_ENTRY of a packaged entry; `cb(rc, b"")`."""
        framed = wire.frame(wire.encode_add_request(entry, master_key, flags))
        self.send_adds([((_ADD, ledger_id, entry_id), framed, cb)], _call)

    def send_adds(self, items: list[Item], on_reply: OnReply) -> None:
        """ADD_ENTRY requests already framed (length prefix included), keys from `add_key`;
        `on_reply(argument, rc, b"")` for each. The frames are written as they are, so one item can go
        to several bookies."""
        if self._v3:
            items = [
                self._v3_item(wire.decode_request(framed[wire.LENGTH_PREFIX_SIZE :]), a)
                for _, framed, a in items
            ]
        self._send(items, on_reply)

    def read(
        self, ledger_id: int, entry_id: int, cb: Callback, flags: int = 0, master_key: bytes | None = None
    ) -> None:
        """READ_ENTRY; `cb(rc, stored entry)`. Entry -1 asks for the bookie's last entry."""
        key = master_key if flags & wire.FLAG_DO_FENCING else None
        request = wire.ReadRequest(wire.PROTOCOL_VERSION, flags, ledger_id, entry_id, key)
        if self._v3:
            self._send([self._v3_item(request, cb)], _call)
            return
        payload = wire.encode_read_request(ledger_id, entry_id, flags, key)
        self._send([((_READ, ledger_id, entry_id), wire.frame(payload), cb)], _call)

    def entries_of_ledger(self, ledger_id: int, cb: Callback) -> None:
        """GET_LIST_OF_ENTRIES_OF_LEDGER (v3 only: `BookieClients.v3` gives a v3 client of any bookie);
        `cb(rc, AvailabilityOfEntriesOfLedger bytes)` (protocol/entry_availability.py)."""
        if not self._v3:
            raise UsageError("the list of a ledger's entries is a v3 request: ask a v3 client")
        self._txn_id += 1
        payload = wire_v3.encode_entries_of_ledger_request(self._txn_id, ledger_id)
        self._send([((_V3, self._txn_id, 0), wire.frame(payload), cb)], _call)

    def bookie_info(self, cb: Callback) -> None:
        """GET_BOOKIE_INFO (v3 only); `cb(rc, wire_v3.BOOKIE_INFO_BODY bytes: total, free disk space)`."""
        if not self._v3:
            raise UsageError("a bookie's disk space is a v3 request: ask a v3 client")
        self._txn_id += 1
        self._send(
            [((_V3, self._txn_id, 0), wire.frame(wire_v3.encode_bookie_info_request(self._txn_id)), cb)],
            _call,
        )

    def _v3_item(self, request: wire.Request, argument: Any) -> Item:
        """The v3 form of a v2 add or read request: a new txn id, its key, its frame."""
        self._txn_id += 1
        txn_id = self._txn_id
        flags = request.flags
        high = bool(flags & wire.FLAG_HIGH_PRIORITY)
        if isinstance(request, wire.AddRequest):
            payload = wire_v3.encode_add_request(
                txn_id,
                request.ledger_id,
                request.entry_id,
                request.master_key,
                request.entry,
                bool(flags & wire.FLAG_RECOVERY_ADD),
                high,
            )
        else:
            assert isinstance(request, wire.ReadRequest)
            fence_key = request.master_key if flags & wire.FLAG_DO_FENCING else None
            payload = wire_v3.encode_read_request(
                txn_id, request.ledger_id, request.entry_id, fence_key, high
            )
        return (_V3, txn_id, 0), wire.frame(payload), argument

    def _send(self, items: list[Item], on_reply: OnReply) -> None:
        refused = self._refused(len(items))
        if refused:
            for _, _, argument in items[len(items) - refused :]:
                self._fail_soon(on_reply, argument, RC_UNAVAILABLE)
            items = items[: len(items) - refused]
            if not items:
                return
        deadline = self._reactor.seconds() + self._timeout_s
        waiting = self._waiting
        timeline = self._timeline.append
        out = self._out.append
        for key, framed, argument in items:
            waiter = [on_reply, argument, deadline]
            queued = waiting.get(key)
            if queued is None:
                waiting[key] = waiter  # the common case: no other request with this key
            elif type(queued) is list:
                waiting[key] = deque((queued, waiter))
            else:
                queued.append(waiter)
            timeline(waiter)
            out(framed)
        self._in_flight += len(items)
        if self._timer is None:
            self._timer = self._reactor.callLater(self._timeout_s, self._expire)
        if self._flush_call is None and self._connection is not None:
            self._flush_call = self._reactor.callLater(0, self._flush)

    def _refused(self, count: int) -> int:
        """How many of `count` new requests must fail now (all when unreachable, the excess at the bound)."""
        if self._closed or (self._address is None and self._resolver is None):
            return count
        if self._connection is None and not self._connecting and not self._connect():
            return count
        excess = self._in_flight + count - self._requests_max
        if excess > 0:
            log.warning("bookie %s: %d requests unanswered, refusing more", self.bookie_id, self._in_flight)
            return min(excess, count)
        return 0

    def _fail_soon(self, on_reply: OnReply, argument: Any, rc: int) -> None:
        # Never call back from inside the caller's request: it may be iterating over its own state.
        self._reactor.callLater(0, on_reply, argument, rc, b"")

    def _flush(self) -> None:
        self._flush_call = None
        if self._connection is not None and self._out:
            out, self._out = self._out, []
            self._connection.send(out)

    # --- replies --------------------------------------------------------------------------------

    def _data_received(self, connection: _Connection, data: bytes) -> None:
        if connection is not self._connection:
            return
        if self._v3:
            self._data_received_v3(connection, data)
            return
        buffer = self._buffer
        buffer += data
        end = len(buffer)
        position = 0
        unpack = _REPLY_HEAD.unpack_from
        answered_one = self._answered
        waiting = self._waiting
        try:
            while end - position >= 4:
                if end - position >= _REPLY_HEAD_SIZE:
                    size, header, rc, ledger_id, entry_id = unpack(buffer, position)
                else:  # too short for an add reply: only the length matters
                    (size,) = wire.FRAME_LENGTH.unpack_from(buffer, position)
                    header = 0
                if not _FRAME_MIN <= size <= _FRAME_MAX:
                    raise ProtocolError(f"reply frame length {size} is not {_FRAME_MIN}..{_FRAME_MAX}")
                start = position + 4
                if end - start < size:
                    break
                position = start + size
                if size == _ADD_REPLY_SIZE and header >> 16 & 0xFF == _ADD and header >> 24:
                    key = (_ADD, ledger_id, entry_id)
                    waiter = waiting.pop(key, None)
                    if type(waiter) is list and waiter[0] is not None:
                        # What _answered does for the usual case (one live request of this key), inline.
                        self._in_flight -= 1
                        on_reply, waiter[0] = waiter[0], None
                        on_reply(waiter[1], rc, b"")
                    else:
                        answered_one(key, waiter, rc, b"")
                else:
                    self._reply(wire.decode_response(bytes(buffer[start:position])))
        except ProtocolError as exc:
            log.warning("bookie %s: bad reply stream, dropping the connection: %s", self.bookie_id, exc)
            position = end
            if connection.socket is not None:
                connection.socket.abortConnection()
        if position:
            # Deleting from the front of a bytearray only moves its start pointer: no copy of the rest.
            del buffer[:position]
        timeline = self._timeline
        while timeline and timeline[0][0] is None:  # answered: nothing left to time out
            timeline.popleft()

    def _data_received_v3(self, connection: _Connection, data: bytes) -> None:
        """v3 replies: each is matched to its request by txn id; its status becomes the v2 code."""
        buffer = self._buffer
        buffer += data
        position = 0
        try:
            while len(buffer) - position >= wire.LENGTH_PREFIX_SIZE:
                (size,) = wire.FRAME_LENGTH.unpack_from(buffer, position)
                if not 1 <= size <= _FRAME_MAX:
                    raise ProtocolError(f"reply frame length {size} is not 1..{_FRAME_MAX}")
                start = position + wire.LENGTH_PREFIX_SIZE
                if len(buffer) - start < size:
                    break
                position = start + size
                response = wire_v3.decode_v3_response(bytes(buffer[start:position]))
                op = response.operation
                if op is not None and op.kind == "getBookieInfoResponse":
                    body: bytes | None = wire_v3.bookie_info_body(op)
                else:
                    body = op.body if op is not None else None
                self._answer((_V3, response.header.txn_id, 0), _rc_of(response.status), body or b"")
        except ProtocolError as exc:
            log.warning("bookie %s: bad v3 reply stream, dropping the connection: %s", self.bookie_id, exc)
            position = len(buffer)
            if connection.socket is not None:
                connection.socket.abortConnection()
        if position:
            del buffer[:position]
        timeline = self._timeline
        while timeline and timeline[0][0] is None:
            timeline.popleft()

    def _reply(self, response: wire.Response) -> None:
        kind = type(response)
        if kind is _ADD_RESPONSE:
            key = (_ADD, response.ledger_id, response.entry_id)  # type: ignore[union-attr]
            body = b""
        elif kind is _READ_RESPONSE:
            key = (_READ, response.ledger_id, response.entry_id)  # type: ignore[union-attr]
            body = response.entry  # type: ignore[union-attr]
        else:
            log.info("bookie %s: ignoring an unexpected %s", self.bookie_id, kind.__name__)
            return
        self._answer(key, response.rc, body)  # type: ignore[union-attr]

    def _answer(self, key: Key, rc: int, body: bytes) -> None:
        self._answered(key, self._waiting.pop(key, None), rc, body)

    def _answered(self, key: Key, queued: _Waiter | deque[_Waiter] | None, rc: int, body: bytes) -> None:
        """Complete the oldest request of `key` (`queued`: what `_waiting` held for it, now popped)."""
        waiting = self._waiting
        if queued is None:
            log.info("bookie %s: reply for %s that nobody waits for", self.bookie_id, key)
            return
        if isinstance(queued, list):
            waiter = queued
        else:
            waiter = queued.popleft()
            if queued:
                waiting[key] = queued
        self._in_flight -= 1
        on_reply = waiter[0]
        if on_reply is not None:  # None: a tombstone, the late reply of a timed-out request
            waiter[0] = None
            on_reply(waiter[1], rc, body)

    def _expire(self) -> None:
        """Time out every request past its deadline; the timer then watches the next oldest one."""
        self._timer = None
        now = self._reactor.seconds()
        timeline = self._timeline
        expired: list[tuple[OnReply, Any]] = []
        while timeline:
            head = timeline[0]
            if head[0] is None:
                timeline.popleft()
                continue
            if head[2] > now:
                break
            timeline.popleft()
            expired.append((head[0], head[1]))
            head[0] = None  # tombstone: stays in its key's FIFO to swallow the late reply
        if timeline:
            self._timer = self._reactor.callLater(max(0.0, timeline[0][2] - now), self._expire)
        if expired:
            log.info("bookie %s: %d requests timed out", self.bookie_id, len(expired))
        for on_reply, argument in expired:
            on_reply(argument, RC_TIMEOUT, b"")

    # --- connection -----------------------------------------------------------------------------

    def _connect(self) -> bool:
        """Start connecting unless in backoff; False when the request must fail now."""
        if self._reactor.seconds() < self._retry_at:
            return False
        self._connecting = True
        self._buffer = bytearray()
        self.resolve().addCallback(lambda _: self._connect_to())
        return True

    def resolve(self) -> Deferred[None]:
        """Look up the bookie's registered address unless known since the last connection failure."""
        if self._resolver is None or self._resolved:
            return defer.succeed(None)
        if self._reactor.seconds() - self._unregistered_at < UNREGISTERED_RECHECK_S:
            return defer.succeed(None)  # a lost bookie is in every ledger a recovery opens
        resolving = self._resolver(self.bookie_id)
        resolving.addTimeout(self._connect_timeout_s, self._reactor)
        return resolving.addCallbacks(self._resolved_to, self._resolve_failed)

    def _resolved_to(self, registered: tuple[str, int] | None) -> None:
        if registered is not None:
            self._address, self._resolved = registered, True
        else:
            self._unregistered_at = self._reactor.seconds()

    def _resolve_failed(self, reason: Failure) -> None:
        # The registration cannot be read (metadata store down): the last known address, if any.
        log.info("bookie %s: address lookup failed: %s", self.bookie_id, reason.getErrorMessage())

    def _connect_to(self) -> None:
        address = self._address
        if self._closed or address is None:
            self._connecting = False
            if address is None:
                log.warning("bookie %s is not registered and its id is not host:port", self.bookie_id)
                self._start_backoff()
            self._fail_all()
            return
        self._address = address
        host, port = address
        self._reactor.connectTCP(host, port, _Factory(self), timeout=self._connect_timeout_s)

    def _connected(self, connection: _Connection) -> None:
        self._connecting = False
        if self._closed:
            connection.close()
            return
        self._connection = connection
        self._backoff_s = 0.0
        self.connects += 1
        transport = connection.socket
        if hasattr(transport, "setTcpNoDelay"):
            transport.setTcpNoDelay(True)
        self._flush()

    def _upgrade(self, transport: Any) -> ClientUpgrade | None:
        if self._tls is None:
            return None
        host = self._address[0] if self._address is not None else ""  # set: _connect_to dialled it
        upgrade = ClientUpgrade(
            transport, self._tls, host, self.bookie_id, self._reactor, self._connect_timeout_s
        )
        upgrade.begin()
        return upgrade

    def _authenticate(self, connection: _Connection) -> ClientAuth | None:
        if self._sasl is None:
            return None
        auth = ClientAuth(
            connection.send,
            connection.socket.abortConnection,
            self._sasl,
            self._v3,
            self.bookie_id,
            self._reactor,
            self._connect_timeout_s,
        )
        auth.begin()
        return auth

    def _connect_failed(self, reason: Failure, rc: int = RC_UNAVAILABLE) -> None:
        self._connecting = False
        self._resolved = False
        log.info("bookie %s: cannot connect: %s", self.bookie_id, reason.getErrorMessage())
        self._start_backoff()
        self._fail_all(rc)

    def _connection_lost(self, connection: _Connection, reason: Failure) -> None:
        if connection is not self._connection:
            return
        self._connection = None
        self._resolved = False
        if not self._closed:
            log.info("bookie %s: connection lost: %s", self.bookie_id, reason.getErrorMessage())
            self._start_backoff()
        self._fail_all()
        waiters, self._lost_waiters = self._lost_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def _start_backoff(self) -> None:
        self._backoff_s = min(self._backoff_max_s, max(self._backoff_min_s, self._backoff_s * 2))
        self._retry_at = self._reactor.seconds() + self._backoff_s

    def _fail_all(self, rc: int = RC_UNAVAILABLE) -> None:
        """Fail every unanswered request (they will never be answered on a new connection)."""
        waiting, self._waiting = self._waiting, {}
        self._timeline = deque()
        self._in_flight = 0
        self._out = []
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        waiters: list[_Waiter] = []
        for queued in waiting.values():
            if type(queued) is list:
                waiters.append(queued)
            else:
                waiters.extend(queued)
        failed = [(w[0], w[1]) for w in waiters if w[0] is not None]
        for waiter in waiters:
            waiter[0] = None
        for on_reply, argument in failed:
            on_reply(argument, rc, b"")

    # --- life -----------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connection is not None

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def disconnect(self) -> Deferred[None]:
        """Drop the connection (pending requests fail); the next request reconnects, backoff allowing."""
        if self._connection is None:
            return defer.succeed(None)
        waiter: Deferred[None] = Deferred()
        self._lost_waiters.append(waiter)
        self._connection.close()
        return waiter

    def close(self) -> Deferred[None]:
        """Fail pending requests, drop the connection and refuse further requests."""
        self._closed = True
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        done = self.disconnect()
        self._fail_all()
        return done


def _rc_of(status: int) -> int:
    """The v2 return code of a v3 status (one the client does not know is an I/O error)."""
    try:
        return int(wire_v3.StatusCode(status).to_return_code())
    except ValueError:
        return int(wire.ReturnCode.EIO)


def _address(bookie_id: str) -> tuple[str, int] | None:
    """The id as an address when it is host:port (a name is only reachable through its registration)."""
    try:
        parsed = BookieId.parse(bookie_id)
    except UsageError:
        return None
    return parsed.host, parsed.port


class BookieClients:
    """The pool: one BookieClient per bookie id, all sharing one reactor and one set of options."""

    def __init__(
        self,
        reactor: Any,
        resolver: Resolver | None = None,
        protocol: str = "v2",
        tls: TlsSettings | None = None,
        sasl: ClientSasl | None = None,
        **options: int,
    ) -> None:
        check_protocol(protocol)
        self._reactor = reactor
        self._resolver = resolver
        self.protocol = protocol
        self._tls = tls
        self._sasl = sasl
        self._options: dict[str, Any] = options  # BookieClient's int keywords
        self._clients: dict[str, BookieClient] = {}
        self._v3_clients: dict[str, BookieClient] = {}  # for v3-only requests of a v2 pool
        self._closed = False

    def get(self, bookie_id: str) -> BookieClient:
        return self._client(self._clients, bookie_id, self.protocol)

    def v3(self, bookie_id: str) -> BookieClient:
        """A v3 client of the bookie, for requests v2 lacks (the list of a ledger's entries): the pool's
        own when it speaks v3, else a second connection used only for them."""
        if self.protocol == "v3":
            return self.get(bookie_id)
        return self._client(self._v3_clients, bookie_id, "v3")

    def _client(self, clients: dict[str, BookieClient], bookie_id: str, protocol: str) -> BookieClient:
        client = clients.get(bookie_id)
        if client is None:
            client = BookieClient(
                bookie_id,
                self._reactor,
                **self._options,
                resolver=self._resolver,
                protocol=protocol,
                tls=self._tls,
                sasl=self._sasl,
            )
            if self._closed:
                client.close()
            clients[bookie_id] = client
        return client

    def resolve(self, bookie_ids: Sequence[str]) -> Deferred[None]:
        """Look up the addresses of these bookies now (a ledger's ensemble, while its metadata is being
        read or written anyway), so that connecting to them later needs no metadata store."""
        looked_up = [self.get(bookie_id).resolve() for bookie_id in bookie_ids]
        done: Deferred[Any] = defer.gatherResults(looked_up, consumeErrors=True)
        return done.addCallback(lambda _: None)

    def __contains__(self, bookie_id: str) -> bool:
        return bookie_id in self._clients

    def close(self) -> Deferred[None]:
        self._closed = True
        closing = [client.close() for client in [*self._clients.values(), *self._v3_clients.values()]]
        done: Deferred[Any] = defer.gatherResults(closing, consumeErrors=True)
        return done.addCallback(lambda _: None)
