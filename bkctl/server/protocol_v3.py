"""The bookie's v3 (protobuf) requests: the same storage calls as the v2 path, answered in v3 frames.

A connection's requests are v2 or v3 frame by frame (by the first byte, as wire_v3.is_v2_frame); each
connection has a `V3Requests` for its v3 frames. Answers follow Java 4.14's processors
(BookieRequestProcessor and the *ProcessorV3 classes): the response header carries version, operation
and txnId; the frame's status and the operation message's status are the same; AUTH and unknown
operations echo the request's header.

Java-shaped adds take `wire_v3.v3_add` in `BookieProtocol._frames`, next to the v2 add (one C call where
`bkctl/protocol/_fastadd.c` was built, else `match_add`'s regular expression and `add_reply`; no protobuf
objects either way), and reply through Storage's on_durable token exactly like v2 adds, answered with the
request's raw varints; other adds take `_add_request`, with the same answers. Unlike Java:
- DEFERRED_SYNC adds are acknowledged after the fsync like the others (stronger, never weaker).
- Priority orders nothing (one reactor thread answers in arrival order); a read-only bookie takes the
  adds flagged RECOVERY_ADD, which Java's clients always send with high priority.
- A fencing read answers once the fence record is durable (Java reads the entry first), as the v2 path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Final

from bkctl.errors import ProtocolError
from bkctl.protocol import wire, wire_v3
from bkctl.protocol.wire_v3 import Operation, OperationType, StatusCode, V3Request
from bkctl.server.connection import Connection, timed_read

log = logging.getLogger("bkctl.bookie")

_EOK: Final = int(wire.ReturnCode.EOK)
_ENOENTRY: Final = int(wire.ReturnCode.ENOENTRY)
# v2 return code (what Storage answers) -> the v3 status of the same meaning.
STATUS_OF_RC: Final = {int(wire.ReturnCode[s.name]): int(s) for s in StatusCode}
_LAST_ENTRY: Final = wire.LAST_ENTRY_ID
_ENTRY_IDS: Final = wire_v3.ENTRY_IDS
_S = StatusCode


def status_of(rc: int) -> int:
    return STATUS_OF_RC.get(rc, int(_S.EIO))


class LateReply:
    """A storage token whose reply is made when the journal delivers it (a fencing read reads the
    entry once the fence is durable); `deliver_durable` calls `make()`."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], bytes]) -> None:
        self.make = make


def framed(payload: bytes) -> bytes:
    return wire.frame_prefix(len(payload)) + payload


class V3Requests:
    """The v3 requests of one connection."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.storage = connection.storage
        self._handlers: dict[int, Callable[[V3Request, Operation], None]] = {
            OperationType.ADD_ENTRY: self._add_request,
            OperationType.READ_ENTRY: self._read,
            OperationType.READ_LAC: self._read_lac,
            OperationType.WRITE_LAC: self._write_lac,
            OperationType.FORCE_LEDGER: self._force_ledger,
            OperationType.GET_BOOKIE_INFO: self._bookie_info,
            OperationType.GET_LIST_OF_ENTRIES_OF_LEDGER: self._entries_of_ledger,
        }
        # Waiting long-poll reads: txn id -> (their timeout call, their LAC watch, ledger id).
        self._polls: dict[int, tuple[Any, Callable[[], None], int]] = {}
        self._scans = 0  # GET_LIST_OF_ENTRIES_OF_LEDGER answers being made off the reactor

    # --- dispatch -------------------------------------------------------------------------------

    def frame(self, buffer: bytearray, start: int, end: int) -> None:
        """One v3 frame payload, buffer[start:end], but a Java-shaped add (`BookieProtocol._frames` takes
        those, the hot path, through `wire_v3.v3_add`). Undecodable protobuf raises ProtocolError (the
        connection closes: its stream cannot be trusted); a decodable but wrong request gets EBADREQ."""
        try:
            request = wire_v3.decode_v3_request(bytes(buffer[start:end]))
        except ProtocolError as exc:
            raise ProtocolError(f"undecodable v3 request: {exc}") from None
        self.request(request, end - start)

    def refused_add(self, buffer: bytearray, start: int, end: int, rc: int) -> None:
        """The storage refused a Java-shaped add, buffer[start:end]: its answer with Java's status (rare,
        so made in Python from the request's raw varints)."""
        self.connection.queue(wire_v3.refused_add_reply(buffer, start, end, status_of(rc)))

    def request(self, request: V3Request, size: int) -> None:
        """A decoded request (`size`: its payload's bytes) that is not a Java-shaped add."""
        operation = request.header.operation
        if operation == OperationType.AUTH:
            self._auth(request)
            return
        if operation == OperationType.START_TLS:
            self.connection.start_tls(request, size)
            return
        handler = self._handlers.get(operation)
        op = request.operation
        if handler is None or op is None or op.kind != wire_v3.request_kind(operation):
            log.info("bookie: %s: unsupported v3 request %s", self.connection.peer, request.header)
            self._refuse(request, _S.EBADREQ)
            return
        if request.header.version != wire_v3.VERSION_THREE:
            self._reply(
                request, _S.EBADVERSION, _echo_ids(op, response_kind=wire_v3.response_kind(operation))
            )
            return
        handler(request, op)

    def _refuse(self, request: V3Request, status: int) -> None:
        self.connection.factory.metrics.bad_requests += 1
        self.connection.queue(framed(wire_v3.encode_status_response(request, status)))

    def _reply(self, request: V3Request, status: int, op: Operation | None) -> None:
        """Queue a response with the request's operation and txn id (sent at the end of this read)."""
        self.connection.queue(framed(self._response(request, status, op)))

    @staticmethod
    def _response(request: V3Request, status: int, op: Operation | None) -> bytes:
        return wire_v3.encode_response(request.header.operation, request.header.txn_id, status, op)

    @property
    def replies_owed(self) -> bool:
        """Whether replies will go out after this read: long polls waiting, availability scans running."""
        return bool(self._polls) or self._scans > 0

    def _send_now(self, payload: bytes) -> None:
        """A reply made outside the connection's read (a long poll woken, an index scan finished)."""
        connection = self.connection
        if connection.connected:
            connection.send([framed(payload)])

    # --- adds -----------------------------------------------------------------------------------

    def _add_request(self, request: V3Request, op: Operation) -> None:
        """An add of another shape than Java's (the general decoder): the same answer as in `frame`."""
        if op.ledger_id is None or op.entry_id is None or op.body is None:
            self._refuse(request, _S.EBADREQ)
            return
        encode = wire_v3.framed_add_response
        txn_id, body = request.header.txn_id, op.body
        if len(body) < _ENTRY_IDS.size:
            self.connection.queue(encode(txn_id, _S.EBADREQ, op.ledger_id, op.entry_id))
            return
        ledger_id, entry_id = _ENTRY_IDS.unpack_from(body)
        connection = self.connection
        reply = encode(txn_id, _EOK, op.ledger_id, op.entry_id)
        recovery = op.flag == wire_v3.ADD_FLAG_RECOVERY_ADD
        rc = self.storage.add(ledger_id, entry_id, op.master_key or b"", body, recovery, (connection, reply))
        if rc == _EOK:
            connection.pending += 1
        else:
            connection.queue(encode(txn_id, status_of(rc), op.ledger_id, op.entry_id))

    # --- reads ----------------------------------------------------------------------------------

    def _read(self, request: V3Request, op: Operation) -> None:
        if op.ledger_id is None or op.entry_id is None:
            self._refuse(request, _S.EBADREQ)
            return
        if op.flag == wire_v3.READ_FLAG_FENCE_LEDGER:
            self._fence(request, op.ledger_id, op.entry_id, op.master_key)
        elif op.previous_lac is not None:
            self._long_poll(request, op, op.previous_lac)
        else:
            self.connection.queue(framed(self._read_response(request, op.ledger_id, op.entry_id)))

    def _read_response(self, request: V3Request, ledger_id: int, entry_id: int) -> bytes:
        """A plain read's answer: the entry and the bookie's LAC of the ledger (maxLAC), as Java's."""
        rc, entry = timed_read(self.storage, self.connection.factory.metrics, ledger_id, entry_id)
        op = Operation("readResponse", ledger_id=ledger_id, entry_id=entry_id)
        if rc == _EOK:
            lac = self.storage.last_add_confirmed(ledger_id)[1]
            op = Operation("readResponse", ledger_id=ledger_id, entry_id=entry_id, body=entry, max_lac=lac)
        return self._response(request, status_of(rc), _with_status(op, status_of(rc)))

    def _fence(self, request: V3Request, ledger_id: int, entry_id: int, master_key: bytes | None) -> None:
        refused = Operation("readResponse", ledger_id=ledger_id, entry_id=entry_id)
        if master_key is None:
            self._reply(request, _S.EUA, _with_status(refused, _S.EUA))
            return
        connection = self.connection
        late = LateReply(lambda: framed(self._fenced_read_response(request, ledger_id, entry_id)))
        rc = self.storage.fence(ledger_id, master_key, (connection, late))
        if rc == _EOK:
            connection.pending += 1
        else:
            self._reply(request, status_of(rc), _with_status(refused, status_of(rc)))

    def _fenced_read_response(self, request: V3Request, ledger_id: int, entry_id: int) -> bytes:
        """A fencing read's answer, once the fence is durable: the entry, no maxLAC (as Java's)."""
        rc, entry = self.storage.read(ledger_id, entry_id)
        status = status_of(rc)
        body = entry if rc == _EOK else None
        op = Operation("readResponse", status=status, ledger_id=ledger_id, entry_id=entry_id, body=body)
        return self._response(request, status, op)

    def _long_poll(self, request: V3Request, op: Operation, previous_lac: int) -> None:
        """A read with previousLAC (readLastAddConfirmedAndEntry): with a timeout it waits until the
        ledger's LAC passes previousLAC, it is fenced, or the timeout ends; then answers as Java does."""
        ledger_id, txn_id = op.ledger_id, request.header.txn_id
        assert ledger_id is not None
        if op.timeout_ms is not None and txn_id not in self._polls:
            reactor = self.connection.factory.reactor
            # Woken inside another request's add: answered on the next tick, outside that call.
            woken = partial(reactor.callLater, 0, self._poll_ended, request, op, previous_lac, True)
            if self.storage.watch_lac(ledger_id, previous_lac, woken):
                timeout_s = max(0, op.timeout_ms) / 1000
                expiry = reactor.callLater(timeout_s, self._poll_expired, request, op, woken)
                self._polls[txn_id] = (expiry, woken, ledger_id)
                return
        self.connection.queue(framed(self._long_poll_response(request, op, previous_lac, None)))

    def _poll_expired(self, request: V3Request, op: Operation, woken: Callable[[], None]) -> None:
        assert op.ledger_id is not None and op.previous_lac is not None
        self.storage.unwatch_lac(op.ledger_id, woken)
        self._poll_ended(request, op, op.previous_lac, False)

    def _poll_ended(self, request: V3Request, op: Operation, previous_lac: int, woken: bool) -> None:
        poll = self._polls.pop(request.header.txn_id, None)
        if poll is None:
            return  # answered already (timed out, or the connection closed)
        if woken and poll[0].active():
            poll[0].cancel()
        timestamp = int(time.time() * 1000) if woken else None
        self._send_now(self._long_poll_response(request, op, previous_lac, timestamp))

    def _long_poll_response(
        self, request: V3Request, op: Operation, previous_lac: int, lac_time_ms: int | None
    ) -> bytes:
        ledger_id, entry_id = op.ledger_id, op.entry_id
        assert ledger_id is not None and entry_id is not None
        if op.flag != wire_v3.READ_FLAG_ENTRY_PIGGYBACK:
            return self._read_response(request, ledger_id, entry_id)
        if entry_id != _LAST_ENTRY:
            # Java: entry piggyback only goes with previousLAC and entry -1.
            return self._response(request, _S.EBADREQ, _read_status(ledger_id, entry_id, _S.EBADREQ))
        rc, lac = self.storage.last_add_confirmed(ledger_id)
        if rc != _EOK:
            return self._response(request, status_of(rc), _read_status(ledger_id, entry_id, status_of(rc)))
        if lac <= previous_lac:
            return self._response(request, _S.EOK, _read_status(ledger_id, entry_id, _S.EOK, lac))
        rc, entry = self.storage.read(ledger_id, previous_lac + 1)
        if rc == _ENOENTRY:
            rc = _EOK  # the LAC alone, as Java answers when the entry is not here
        status = status_of(rc)
        if rc != _EOK or not entry:
            return self._response(
                request, status, _read_status(ledger_id, entry_id, status, lac, lac_time_ms)
            )
        answer = Operation(
            "readResponse",
            status=status,
            ledger_id=ledger_id,
            entry_id=previous_lac + 1,
            body=entry,
            max_lac=lac,
            lac_update_timestamp=lac_time_ms,
        )
        return self._response(request, status, answer)

    def close(self) -> None:
        """The connection is gone: its long polls stop waiting."""
        polls, self._polls = self._polls, {}
        for call, woken, ledger_id in polls.values():
            if call.active():
                call.cancel()
            self.storage.unwatch_lac(ledger_id, woken)

    # --- LAC, force, bookie info, entries of a ledger --------------------------------------------

    def _read_lac(self, request: V3Request, op: Operation) -> None:
        """READ_LAC: the explicit LAC body and the last entry; ENOENTRY when neither is here (Java)."""
        ledger_id = op.ledger_id if op.ledger_id is not None else 0
        lac = self.storage.explicit_lac(ledger_id)
        rc, last = self.storage.read(ledger_id, _LAST_ENTRY)
        status = status_of(rc)
        if lac is None and rc != _EOK:
            status = _S.ENOENTRY
        body = last if rc == _EOK else None
        answer = Operation(
            "readLacResponse", status=status, ledger_id=ledger_id, body=lac, last_entry_body=body
        )
        self._reply(request, status, answer)

    def _write_lac(self, request: V3Request, op: Operation) -> None:
        ledger_id = op.ledger_id if op.ledger_id is not None else 0
        journal = partial(self.storage.write_lac, ledger_id, op.master_key or b"", op.body or b"")
        self._when_durable(request, "writeLacResponse", ledger_id, journal)

    def _force_ledger(self, request: V3Request, op: Operation) -> None:
        ledger_id = op.ledger_id if op.ledger_id is not None else 0
        self._when_durable(
            request, "forceLedgerResponse", ledger_id, partial(self.storage.force_ledger, ledger_id)
        )

    def _when_durable(
        self, request: V3Request, kind: str, ledger_id: int, journal: Callable[[object], int]
    ) -> None:
        """A storage call that answers EOK through the journal (`journal(token)`), or its error now."""
        done = self._response(request, _S.EOK, Operation(kind, status=_EOK, ledger_id=ledger_id))
        rc = journal((self.connection, framed(done)))
        if rc == _EOK:
            self.connection.pending += 1
        else:
            status = status_of(rc)
            self._reply(request, status, Operation(kind, status=status, ledger_id=ledger_id))

    def _bookie_info(self, request: V3Request, op: Operation) -> None:
        requested = op.requested or 0
        try:
            total, free = self.storage.disk_space()
        except OSError as exc:
            log.error("bookie info: %s", exc)
            self._reply(request, _S.EIO, Operation("getBookieInfoResponse", status=_S.EIO))
            return
        answer = Operation(
            "getBookieInfoResponse",
            status=_EOK,
            total_disk_capacity=total if requested & wire_v3.BOOKIE_INFO_TOTAL_DISK_CAPACITY else None,
            free_disk_space=free if requested & wire_v3.BOOKIE_INFO_FREE_DISK_SPACE else None,
        )
        self._reply(request, _S.EOK, answer)

    def _entries_of_ledger(self, request: V3Request, op: Operation) -> None:
        """The auditor's replicas check (Java's GetListOfEntriesOfLedgerProcessorV3; `audit --online`)."""
        ledger_id, txn_id = op.ledger_id if op.ledger_id is not None else 0, request.header.txn_id
        self._scans += 1
        answer = self.storage.entry_availability(ledger_id)
        answer.addCallback(self._send_availability, txn_id, ledger_id)

    def _send_availability(self, answer: tuple[int, bytes], txn_id: int, ledger_id: int) -> None:
        self._scans -= 1
        rc, body = answer
        self._send_now(wire_v3.encode_entries_of_ledger_response(txn_id, status_of(rc), ledger_id, body))

    # --- AUTH -----------------------------------------------------------------------------------

    def _auth(self, request: V3Request) -> None:
        """No authentication: Java's bookie with the default provider answers every AUTH with EOK, the
        request's header and an AuthDisabledPlugin message with an empty payload."""
        answer = Operation("authResponse", plugin_name=wire_v3.AUTH_DISABLED_PLUGIN, body=b"")
        self.connection.queue(framed(wire_v3.encode_status_response(request, _S.EOK, answer)))


def _with_status(op: Operation, status: int) -> Operation:
    return Operation(
        op.kind, status=status, ledger_id=op.ledger_id, entry_id=op.entry_id, body=op.body, max_lac=op.max_lac
    )


def _read_status(
    ledger_id: int, entry_id: int, status: int, max_lac: int | None = None, lac_time_ms: int | None = None
) -> Operation:
    return Operation(
        "readResponse",
        status=status,
        ledger_id=ledger_id,
        entry_id=entry_id,
        max_lac=max_lac,
        lac_update_timestamp=lac_time_ms,
    )


def _echo_ids(op: Operation, response_kind: str) -> Operation:
    """An EBADVERSION answer's operation message: the status and the request's ids."""
    return Operation(response_kind, status=_S.EBADVERSION, ledger_id=op.ledger_id, entry_id=op.entry_id)
