"""BookKeeper v3 (protobuf) frames: every request and response of the 4.14 protocol, decoded and encoded.

The bookie answers v3 (server/protocol_v3.py) and the client speaks it with `--protocol v3`. Encoding
writes fields in field-number order, as Java's generated code does, so what we send is byte-for-byte what
a Java bookie or client sends for the same values (tests/test_wire_v3.py checks this on a capture).

A v3 payload is a `Request` or `Response` message of BookkeeperProtocol.proto: a BKPacketHeader
(version, operation, txnId, priority), for responses a status, and one operation message in the field
named after it (readRequest = 100, addRequest = 101, ...). Field numbers are in docs/formats/wire.md.

Telling v2 from v3: the Java bookie tries v3 first and falls back to v2 for the rest of the connection.
A v2 payload starts with its version byte (0, 1 or 2) and a protobuf message can never start with a
byte below 8 (that would be field number 0), so the first byte decides without trying a parse.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from enum import IntEnum, unique
from typing import Any, Final

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.protocol.protobuf import (
    Field,
    as_signed64,
    bytes_field,
    encode_fields,
    encode_varint,
    expect_bytes,
    expect_int,
    expect_text,
    iter_fields,
    varint_field,
)
from bkctl.protocol.wire import PROTOCOL_VERSION_MAX, ReturnCode

# The smallest first byte a protobuf message can start with: tag (field 1 << 3 | wire type 0).
_FIRST_PROTOBUF_TAG: Final = 1 << 3


@unique
class OperationType(IntEnum):
    READ_ENTRY = 1
    ADD_ENTRY = 2
    RANGE_READ_ENTRY = 3
    RANGE_ADD_ENTRY = 4
    AUTH = 5
    WRITE_LAC = 6
    READ_LAC = 7
    GET_BOOKIE_INFO = 8
    START_TLS = 9
    FORCE_LEDGER = 10
    GET_LIST_OF_ENTRIES_OF_LEDGER = 11
    BATCH_READ_ENTRY = 12


@unique
class StatusCode(IntEnum):
    """v3 StatusCode; `to_return_code` maps it to the v2 code with the same meaning."""

    EOK = 0
    ENOLEDGER = 402
    ENOENTRY = 403
    EBADREQ = 404
    EIO = 501
    EUA = 502
    EBADVERSION = 503
    EFENCED = 504
    EREADONLY = 505
    ETOOMANYREQUESTS = 506
    EUNKNOWNLEDGERSTATE = 507

    def to_return_code(self) -> ReturnCode:
        return ReturnCode[self.name]


# ReadRequest.Flag, AddRequest.Flag and GetBookieInfoRequest.Flags values.
READ_FLAG_FENCE_LEDGER: Final = 1
READ_FLAG_ENTRY_PIGGYBACK: Final = 2
ADD_FLAG_RECOVERY_ADD: Final = 1
WRITE_FLAG_DEFERRED_SYNC: Final = 1  # AddRequest.writeFlags: ack before the journal's fsync
HIGH_PRIORITY: Final = 100  # BKPacketHeader.priority of Java's recovery reads and adds
AUTH_DISABLED_PLUGIN: Final = "AuthDisabledPlugin"
BOOKIE_INFO_TOTAL_DISK_CAPACITY: Final = 0x1
BOOKIE_INFO_FREE_DISK_SPACE: Final = 0x2

_HEADER_FIELD = 1
_STATUS_FIELD = 2
VERSION_THREE: Final = 3  # ProtocolVersion of every v3 header
_ENTRIES_OF_LEDGER_FIELD: Final = 108
_REQUEST_CONTEXT_FIELD = 200


@dataclass(frozen=True)
class PacketHeader:
    version: int
    operation: int
    txn_id: int
    priority: int = 0


@dataclass(frozen=True)
class Operation:
    """The operation message of a frame; fields it does not have stay None.

    `kind` is the Request/Response field name (`readRequest`, `addResponse`, ...). `body` holds the
    entry (add request, read response), the LAC body (write LAC, read LAC response), the auth payload or
    the entry-availability bitmap; `last_entry_body` the read LAC response's last entry.
    """

    kind: str
    status: int | None = None
    ledger_id: int | None = None
    entry_id: int | None = None
    flag: int | None = None
    master_key: bytes | None = None
    body: bytes | None = None
    last_entry_body: bytes | None = None
    write_flags: int | None = None
    previous_lac: int | None = None
    timeout_ms: int | None = None
    max_lac: int | None = None
    lac_update_timestamp: int | None = None
    lac: int | None = None
    requested: int | None = None
    total_disk_capacity: int | None = None
    free_disk_space: int | None = None
    plugin_name: str | None = None

    def describe(self) -> dict[str, object]:
        """The fields present, for display: keys as hex, bodies as their length."""
        out: dict[str, object] = {"kind": self.kind}
        for f in fields(self)[1:]:
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name == "master_key":
                out[f.name] = value.hex()
            elif f.name.endswith("body"):
                out[f"{f.name}_size"] = len(value)
            else:
                out[f.name] = value
        return out


@dataclass(frozen=True)
class V3Request:
    header: PacketHeader
    operation: Operation | None
    context: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class V3Response:
    header: PacketHeader
    status: int
    operation: Operation | None


# How to read one field into an Operation attribute.
_Reader = Callable[[Field], object]


def _int64(f: Field) -> int:
    return as_signed64(expect_int(f))


def _enum(f: Field) -> int:
    # proto2 enums are int32 sent as (sign-extended) varints.
    return as_signed64(expect_int(f))


_READ_REQUEST: Final[Mapping[int, tuple[str, _Reader]]] = {
    100: ("flag", _enum),
    1: ("ledger_id", _int64),
    2: ("entry_id", _int64),
    3: ("master_key", expect_bytes),
    4: ("previous_lac", _int64),
    5: ("timeout_ms", _int64),
}
_ADD_REQUEST: Final[Mapping[int, tuple[str, _Reader]]] = {
    100: ("flag", _enum),
    1: ("ledger_id", _int64),
    2: ("entry_id", _int64),
    3: ("master_key", expect_bytes),
    4: ("body", expect_bytes),
    5: ("write_flags", _int64),
}
_AUTH_MESSAGE: Final[Mapping[int, tuple[str, _Reader]]] = {
    1: ("plugin_name", expect_text),
    2: ("body", expect_bytes),
}
_WRITE_LAC_REQUEST: Final[Mapping[int, tuple[str, _Reader]]] = {
    1: ("ledger_id", _int64),
    2: ("lac", _int64),
    3: ("master_key", expect_bytes),
    4: ("body", expect_bytes),
}
_LEDGER_ONLY: Final[Mapping[int, tuple[str, _Reader]]] = {1: ("ledger_id", _int64)}
_GET_BOOKIE_INFO_REQUEST: Final[Mapping[int, tuple[str, _Reader]]] = {1: ("requested", _int64)}
_EMPTY: Final[Mapping[int, tuple[str, _Reader]]] = {}

_READ_RESPONSE: Final[Mapping[int, tuple[str, _Reader]]] = {
    1: ("status", _enum),
    2: ("ledger_id", _int64),
    3: ("entry_id", _int64),
    4: ("body", expect_bytes),
    5: ("max_lac", _int64),
    6: ("lac_update_timestamp", _int64),
}
_ADD_RESPONSE: Final[Mapping[int, tuple[str, _Reader]]] = {
    1: ("status", _enum),
    2: ("ledger_id", _int64),
    3: ("entry_id", _int64),
}
_LEDGER_STATUS_RESPONSE: Final[Mapping[int, tuple[str, _Reader]]] = {
    1: ("status", _enum),
    2: ("ledger_id", _int64),
}
_READ_LAC_RESPONSE: Final[Mapping[int, tuple[str, _Reader]]] = {
    1: ("status", _enum),
    2: ("ledger_id", _int64),
    3: ("body", expect_bytes),
    4: ("last_entry_body", expect_bytes),
}
_GET_BOOKIE_INFO_RESPONSE: Final[Mapping[int, tuple[str, _Reader]]] = {
    1: ("status", _enum),
    2: ("total_disk_capacity", _int64),
    3: ("free_disk_space", _int64),
}
_ENTRIES_OF_LEDGER_RESPONSE: Final[Mapping[int, tuple[str, _Reader]]] = {
    1: ("status", _enum),
    2: ("ledger_id", _int64),
    3: ("body", expect_bytes),
}

# Request / Response field number -> (field name, schema of the operation message).
_REQUEST_OPS: Final[Mapping[int, tuple[str, Mapping[int, tuple[str, _Reader]]]]] = {
    100: ("readRequest", _READ_REQUEST),
    101: ("addRequest", _ADD_REQUEST),
    102: ("authRequest", _AUTH_MESSAGE),
    103: ("writeLacRequest", _WRITE_LAC_REQUEST),
    104: ("readLacRequest", _LEDGER_ONLY),
    105: ("getBookieInfoRequest", _GET_BOOKIE_INFO_REQUEST),
    106: ("startTLSRequest", _EMPTY),
    107: ("forceLedgerRequest", _LEDGER_ONLY),
    108: ("getListOfEntriesOfLedgerRequest", _LEDGER_ONLY),
}
_RESPONSE_OPS: Final[Mapping[int, tuple[str, Mapping[int, tuple[str, _Reader]]]]] = {
    100: ("readResponse", _READ_RESPONSE),
    101: ("addResponse", _ADD_RESPONSE),
    102: ("authResponse", _AUTH_MESSAGE),
    103: ("writeLacResponse", _LEDGER_STATUS_RESPONSE),
    104: ("readLacResponse", _READ_LAC_RESPONSE),
    105: ("getBookieInfoResponse", _GET_BOOKIE_INFO_RESPONSE),
    106: ("startTLSResponse", _EMPTY),
    107: ("forceLedgerResponse", _LEDGER_STATUS_RESPONSE),
    108: ("getListOfEntriesOfLedgerResponse", _ENTRIES_OF_LEDGER_RESPONSE),
}


def is_v2_frame(payload: bytes | bytearray | memoryview) -> bool:
    """Whether a frame payload is v2 (its first byte is a v2 version) rather than v3 protobuf."""
    return len(payload) > 0 and payload[0] <= PROTOCOL_VERSION_MAX


def protocol_version(payload: bytes | bytearray | memoryview) -> int:
    """2 or 3: which codec a payload is for. A first byte of 3..7 is neither and raises ProtocolError."""
    if is_v2_frame(payload):
        return 2
    if len(payload) == 0 or payload[0] < _FIRST_PROTOBUF_TAG:
        raise ProtocolError(f"frame starts with byte {payload[0] if payload else None!r}: neither v2 nor v3")
    return 3


def decode_v3_request(payload: bytes | bytearray | memoryview) -> V3Request:
    """Decode a v3 Request payload (no length prefix); ProtocolError when it is not one."""
    header: PacketHeader | None = None
    operation: Operation | None = None
    context: list[tuple[str, str]] = []
    _check_frame_size(payload)
    for f in iter_fields(memoryview(payload)):
        if f.number == _HEADER_FIELD:
            header = _decode_header(expect_bytes(f))
        elif f.number in _REQUEST_OPS:
            operation = _decode_operation(f, *_REQUEST_OPS[f.number])
        elif f.number == _REQUEST_CONTEXT_FIELD:
            context.append(_decode_context(expect_bytes(f)))
    if header is None:
        raise ProtocolError("v3 request without a header")
    return V3Request(header, operation, tuple(context))


def decode_v3_response(payload: bytes | bytearray | memoryview) -> V3Response:
    """Decode a v3 Response payload (no length prefix); ProtocolError when it is not one."""
    header: PacketHeader | None = None
    status: int | None = None
    operation: Operation | None = None
    _check_frame_size(payload)
    for f in iter_fields(memoryview(payload)):
        if f.number == _HEADER_FIELD:
            header = _decode_header(expect_bytes(f))
        elif f.number == _STATUS_FIELD:
            status = _enum(f)
        elif f.number in _RESPONSE_OPS:
            operation = _decode_operation(f, *_RESPONSE_OPS[f.number])
    if header is None or status is None:
        raise ProtocolError("v3 response without a header or status")
    return V3Response(header, status, operation)


def status_name(status: int) -> str:
    try:
        return StatusCode(status).name
    except ValueError:
        return f"status {status}"


def operation_name(operation: int) -> str:
    try:
        return OperationType(operation).name
    except ValueError:
        return f"operation {operation}"


def _decode_header(data: bytes) -> PacketHeader:
    values: dict[int, int] = {}
    for f in iter_fields(data):
        if f.number in (1, 2, 3, 4):
            values[f.number] = expect_int(f)
    if not {1, 2, 3} <= values.keys():
        raise ProtocolError("v3 packet header lacks version, operation or txnId")
    return PacketHeader(as_signed64(values[1]), as_signed64(values[2]), values[3], values.get(4, 0))


def _decode_operation(field: Field, kind: str, schema: Mapping[int, tuple[str, _Reader]]) -> Operation:
    values: dict[str, Any] = {}
    for f in iter_fields(expect_bytes(field)):
        if f.number in schema:
            name, read = schema[f.number]
            values[name] = read(f)
    return Operation(kind, **values)


def _decode_context(data: bytes) -> tuple[str, str]:
    key = value = ""
    for f in iter_fields(data):
        if f.number == 1:
            key = expect_text(f)
        elif f.number == 2:
            value = expect_text(f)
    return key, value


def _check_frame_size(payload: bytes | bytearray | memoryview) -> None:
    if len(payload) > limits.FRAME_SIZE_MAX:
        raise ProtocolError(
            f"v3 frame of {len(payload)} bytes exceeds the {limits.FRAME_SIZE_MAX}-byte limit"
        )


# --- encoding -----------------------------------------------------------------------------------------

# OperationType -> (request field number, response field number, request kind, response kind).
_OPS_BY_TYPE: Final[Mapping[int, tuple[int, str, str]]] = {
    OperationType.READ_ENTRY: (100, "readRequest", "readResponse"),
    OperationType.ADD_ENTRY: (101, "addRequest", "addResponse"),
    OperationType.AUTH: (102, "authRequest", "authResponse"),
    OperationType.WRITE_LAC: (103, "writeLacRequest", "writeLacResponse"),
    OperationType.READ_LAC: (104, "readLacRequest", "readLacResponse"),
    OperationType.GET_BOOKIE_INFO: (105, "getBookieInfoRequest", "getBookieInfoResponse"),
    OperationType.START_TLS: (106, "startTLSRequest", "startTLSResponse"),
    OperationType.FORCE_LEDGER: (107, "forceLedgerRequest", "forceLedgerResponse"),
    OperationType.GET_LIST_OF_ENTRIES_OF_LEDGER: (
        108,
        "getListOfEntriesOfLedgerRequest",
        "getListOfEntriesOfLedgerResponse",
    ),
}


_REQUEST_FIELD_BY_KIND: Final = {kind: number for number, (kind, _) in _REQUEST_OPS.items()}


def _in_number_order(schema: Mapping[int, tuple[str, _Reader]]) -> tuple[tuple[int, str], ...]:
    return tuple((number, schema[number][0]) for number in sorted(schema))


# kind -> its fields as (field number, Operation attribute), in the order Java writes them.
_LAYOUTS: Final[Mapping[str, tuple[tuple[int, str], ...]]] = {
    kind: _in_number_order(schema) for kind, schema in (*_REQUEST_OPS.values(), *_RESPONSE_OPS.values())
}


def _header(operation: int, txn_id: int, version: int = VERSION_THREE, priority: int = 0) -> Field:
    """A BKPacketHeader; priority only when set, as Java's client sets it only on high-priority requests."""
    parts = [varint_field(1, version), varint_field(2, operation), varint_field(3, txn_id)]
    if priority:
        parts.append(varint_field(4, priority))
    return bytes_field(_HEADER_FIELD, encode_fields(parts))


def encode_operation(op: Operation) -> bytes:
    """The operation message alone: the fields of `op` that are not None, in field-number order."""
    parts: list[Field] = []
    for number, name in _LAYOUTS[op.kind]:
        value = getattr(op, name)
        if value is None:
            continue
        parts.append(varint_field(number, value) if isinstance(value, int) else bytes_field(number, value))
    return encode_fields(parts)


def encode_request(operation: int, txn_id: int, op: Operation, priority: int = 0) -> bytes:
    """A v3 Request payload (no length prefix): header and the operation message `op`, in the field its
    kind names (so a test can send a header that disagrees with its message)."""
    number = _REQUEST_FIELD_BY_KIND[op.kind]
    return encode_fields(
        [_header(operation, txn_id, priority=priority), bytes_field(number, encode_operation(op))]
    )


def encode_add_request(
    txn_id: int,
    ledger_id: int,
    entry_id: int,
    master_key: bytes,
    body: bytes,
    recovery: bool = False,
    high_priority: bool = False,
) -> bytes:
    """An ADD_ENTRY request as Java's client sends it (RECOVERY_ADD flag, priority 100 if high)."""
    op = Operation(
        "addRequest",
        ledger_id=ledger_id,
        entry_id=entry_id,
        master_key=master_key,
        body=body,
        flag=ADD_FLAG_RECOVERY_ADD if recovery else None,
    )
    return encode_request(OperationType.ADD_ENTRY, txn_id, op, HIGH_PRIORITY if high_priority else 0)


def encode_read_request(
    txn_id: int,
    ledger_id: int,
    entry_id: int,
    fence_key: bytes | None = None,
    high_priority: bool = False,
) -> bytes:
    """A READ_ENTRY request as Java's client sends it; with `fence_key` a fencing read (FENCE_LEDGER
    and the master key)."""
    op = Operation(
        "readRequest",
        ledger_id=ledger_id,
        entry_id=entry_id,
        master_key=fence_key,
        flag=READ_FLAG_FENCE_LEDGER if fence_key is not None else None,
    )
    return encode_request(OperationType.READ_ENTRY, txn_id, op, HIGH_PRIORITY if high_priority else 0)


def encode_response(operation: int, txn_id: int, status: int, op: Operation | None) -> bytes:
    """A v3 Response payload: header (version, operation, txnId, as every Java processor builds it), the
    frame's status and, unless None, the operation message (whose own status Java sets to the same)."""
    parts = [_header(operation, txn_id), varint_field(_STATUS_FIELD, status)]
    if op is not None:
        parts.append(bytes_field(_OPS_BY_TYPE[operation][0], encode_operation(op)))
    return encode_fields(parts)


def request_kind(operation: int) -> str | None:
    """The Request field name of an operation type (None: not a 4.14 operation)."""
    entry = _OPS_BY_TYPE.get(operation)
    return None if entry is None else entry[1]


def response_kind(operation: int) -> str:
    return _OPS_BY_TYPE[operation][2]


def encode_entries_of_ledger_request(txn_id: int, ledger_id: int) -> bytes:
    """A GET_LIST_OF_ENTRIES_OF_LEDGER request payload (no length prefix)."""
    op = Operation("getListOfEntriesOfLedgerRequest", ledger_id=ledger_id)
    return encode_request(OperationType.GET_LIST_OF_ENTRIES_OF_LEDGER, txn_id, op)


def encode_bookie_info_request(txn_id: int) -> bytes:
    """A GET_BOOKIE_INFO request asking for both disk figures, as Java's BookieInfoReader does."""
    requested = BOOKIE_INFO_TOTAL_DISK_CAPACITY | BOOKIE_INFO_FREE_DISK_SPACE
    return encode_request(
        OperationType.GET_BOOKIE_INFO, txn_id, Operation("getBookieInfoRequest", requested=requested)
    )


# A GET_BOOKIE_INFO answer as the body a client's callback gets (its response has no body field).
BOOKIE_INFO_BODY: Final = struct.Struct(">qq")  # total disk capacity, free disk space


def bookie_info_body(op: Operation) -> bytes:
    return BOOKIE_INFO_BODY.pack(op.total_disk_capacity or 0, op.free_disk_space or 0)


def encode_entries_of_ledger_response(txn_id: int, status: int, ledger_id: int, availability: bytes) -> bytes:
    """Its response: the status twice (frame and operation, as Java sets both) and, when EOK, the
    AvailabilityOfEntriesOfLedger bytes (protocol/entry_availability.py)."""
    body = availability if status == StatusCode.EOK else None
    op = Operation("getListOfEntriesOfLedgerResponse", status=status, ledger_id=ledger_id, body=body)
    return encode_response(OperationType.GET_LIST_OF_ENTRIES_OF_LEDGER, txn_id, status, op)


def encode_status_response(request: V3Request, status: int, op: Operation | None = None) -> bytes:
    """A response echoing the request's header (priority included, as Java's `setHeader(r.getHeader())`
    does for AUTH and unknown operations) with a status and an optional operation message."""
    header = request.header
    parts = [
        _header(header.operation, header.txn_id, header.version, header.priority),
        varint_field(_STATUS_FIELD, status),
    ]
    if op is not None:
        parts.append(bytes_field(_OPS_BY_TYPE[header.operation][0], encode_operation(op)))
    return encode_fields(parts)


# --- START_TLS (bkctl/tls.py): the v3 request that turns a fresh connection into a TLS one ------------

_START_TLS_FIELD: Final = 106  # startTLSRequest / startTLSResponse: empty messages


def encode_start_tls_request(txn_id: int) -> bytes:
    """A START_TLS request payload (no length prefix), as Java's client sends first on a connection."""
    header = _header(OperationType.START_TLS, txn_id)
    return encode_fields([header, bytes_field(_START_TLS_FIELD, b"")])


def encode_start_tls_response(txn_id: int, status: int) -> bytes:
    """Its response: EOK with an empty startTLSResponse (then both sides start the TLS handshake), or a
    refusal with the status alone (EBADREQ: TLS is not configured on the bookie), as Java answers."""
    parts = [_header(OperationType.START_TLS, txn_id), varint_field(_STATUS_FIELD, status)]
    if status == StatusCode.EOK:
        parts.append(bytes_field(_START_TLS_FIELD, b""))
    return encode_fields(parts)


# --- the add fast path ----------------------------------------------------------------------------------
#
# Most frames a bookie sees are adds. Java's client writes an add request as: header (version 3, ADD_ENTRY,
# txnId, maybe priority), then addRequest (ledgerId, entryId, masterKey of 20 bytes, body, maybe
# writeFlags, maybe flag). `match_add` recognises exactly that shape with one regular expression (one C
# call) and hands back the raw varint bytes of txnId, ledgerId and entryId: the EOK reply is made of them
# (`add_reply`), nothing is decoded or encoded but the lengths. The ids the bookie stores under are the
# entry's own (its first 16 bytes), as in Java's Bookie.addEntry. Anything else is None and takes the
# general decoder, with the same answer. `v3_add_reference` is all the bookie needs of an add in one call;
# the C module `_fastadd.c` (optional, built by setup.py) computes the same in one tenth of the time, and
# `v3_add` is that when it was built. These Python definitions stay the reference the tests compare it to.

_V: Final = rb"[\x80-\xff]{0,9}[\x00-\x7f]"  # one varint
_ADD_SHAPE: Final = re.compile(
    rb"\x0a([\x00-\x7f])\x08\x03\x10\x02\x18(" + _V + rb")(?:\x20" + _V + rb")?"
    rb"\xaa\x06(" + _V + rb")\x08(" + _V + rb")\x10(" + _V + rb")\x1a\x14(.{20})\x22(" + _V + rb")",
    re.DOTALL,
)
# What may follow the body: writeFlags (5), then flag (100).
_ADD_TAIL: Final = re.compile(rb"(?:\x28" + _V + rb")?(?:\xa0\x06(" + _V + rb"))?")
_ADD_PREFIX: Final = struct.Struct(">i")
_EOK_RAW: Final = b"\x00"  # status EOK as a varint (compared by identity: the default argument)


# (txn id, ledger id, entry id as raw varints; master key; body start, body end; RECOVERY_ADD flag set)
AddMatch = tuple[bytes, bytes, bytes, bytes, int, int, bool]


def _small_varint(raw: bytes) -> int:
    size = len(raw)
    if size == 1:
        return raw[0]
    if size == 2:  # a 1 KiB body's length
        return raw[0] & 0x7F | raw[1] << 7
    value = 0
    for shift, byte in enumerate(raw):
        value |= (byte & 0x7F) << (7 * shift)
    return value


def match_add(payload: bytes | bytearray, start: int, end: int) -> AddMatch | None:
    """A Java-shaped v3 add request in payload[start:end] (see above), or None."""
    m = _ADD_SHAPE.match(payload, start, end)
    if m is None:
        return None  # not an add, or an add of another shape
    header_size, txn_raw, op_size, ledger_raw, entry_raw, master_key, body_size = m.groups()
    body_start = m.end()
    # The two lengths, inline for the usual 1-2 byte varints (this runs once per add).
    if len(body_size) == 2:
        body_end = body_start + (body_size[0] & 0x7F | body_size[1] << 7)
    else:
        body_end = body_start + _small_varint(body_size)
    op_end = m.end(3) + (op_size[0] & 0x7F | op_size[1] << 7 if len(op_size) == 2 else _small_varint(op_size))
    if (
        op_end != end  # the addRequest runs to the frame's end
        or header_size[0] != m.start(3) - 4 - start  # the header's length covers its fields
        or body_end > end
        or body_end - body_start < 16  # shorter than an entry's ids: the general path refuses it
    ):
        return None
    if body_end == end:
        return txn_raw, ledger_raw, entry_raw, master_key, body_start, body_end, False
    tail = _ADD_TAIL.match(payload, body_end, end)
    if tail is None or tail.end() != end:
        return None
    return txn_raw, ledger_raw, entry_raw, master_key, body_start, body_end, tail.group(1) == b"\x01"


def _reply_head(txn_size: int, ids_size: int, status_size: int = 1) -> bytes:
    """An add response up to its txn id: length prefix, header tag, size and its fixed fields."""
    size = 11 + txn_size + status_size + 3 + status_size + ids_size  # header, status, operation message
    return _ADD_PREFIX.pack(size) + b"\x0a%c\x08\x03\x10\x02\x18" % (5 + txn_size)


# The EOK reply's fixed parts by varint sizes (txn id: 1-10 bytes, ledger + entry ids: 2-20 bytes).
_EOK_HEADS: Final = {(t, n): _reply_head(t, n) for t in range(1, 11) for n in range(2, 21)}
_EOK_MIDDLES: Final = {n: b"\x10\x00\xaa\x06%c\x08\x00\x10" % (4 + n) for n in range(2, 21)}


def add_reply(txn_raw: bytes, ledger_raw: bytes, entry_raw: bytes, status_raw: bytes = _EOK_RAW) -> bytes:
    """A length-prefixed ADD_ENTRY response from the request's raw varints: byte-for-byte what a Java
    bookie sends (the tests check it against `encode_response`). EOK, the hot path, from tables."""
    ids_size = len(ledger_raw) + len(entry_raw)
    if status_raw is _EOK_RAW:
        head, middle = _EOK_HEADS[len(txn_raw), ids_size], _EOK_MIDDLES[ids_size]
    else:
        head = _reply_head(len(txn_raw), ids_size, len(status_raw))
        middle = b"\x10%b\xaa\x06%c\x08%b\x10" % (status_raw, 3 + len(status_raw) + ids_size, status_raw)
    return b"".join((head, txn_raw, middle, ledger_raw, b"\x18", entry_raw))


# The whole fast path in one call: the entry's own ids (its first 16 bytes, what the bookie stores under),
# master key, body start and end, RECOVERY_ADD flag set, and the EOK reply.
V3Add = tuple[int, int, bytes, int, int, bool, bytes]
ENTRY_IDS: Final = struct.Struct(">qq")  # a packaged entry starts with its ledger and entry ids


def v3_add_reference(payload: bytes | bytearray, start: int, end: int) -> V3Add | None:
    """A Java-shaped add in payload[start:end] as the bookie takes it, or None: `match_add` and its EOK
    `add_reply` in one. The C module `_fastadd.v3_add` (`v3_add` when built) mirrors this definition;
    both raise ValueError unless 0 <= start <= end <= len(payload)."""
    if not 0 <= start <= end <= len(payload):
        raise ValueError(f"v3_add: [{start}, {end}) is not inside a buffer of {len(payload)} bytes")
    add = match_add(payload, start, end)
    if add is None:
        return None
    txn_raw, ledger_raw, entry_raw, master_key, body_start, body_end, recovery = add
    ledger_id, entry_id = ENTRY_IDS.unpack_from(payload, body_start)
    reply = add_reply(txn_raw, ledger_raw, entry_raw)
    return ledger_id, entry_id, master_key, body_start, body_end, recovery, reply


def _compiled_v3_add() -> Callable[[bytes | bytearray, int, int], V3Add | None] | None:
    """The C definition when it was built (setup.py: optional, needs a C compiler), else None."""
    try:
        from bkctl.protocol import _fastadd
    except ImportError:
        return None
    return _fastadd.v3_add


compiled_v3_add: Final = _compiled_v3_add()
# What the bookie calls per v3 add: C where it was built, the reference elsewhere.
v3_add: Final = compiled_v3_add or v3_add_reference


def refused_add_reply(payload: bytes | bytearray, start: int, end: int, status: int) -> bytes:
    """The reply to an add `v3_add` matched that the storage refused (rare: made again, in Python)."""
    add = match_add(payload, start, end)
    if add is None:
        raise ValueError("refused_add_reply: not an add v3_add matches")
    return add_reply(add[0], add[1], add[2], encode_varint(status))


def framed_add_response(txn_id: int, status: int, ledger_id: int, entry_id: int) -> bytes:
    """`add_reply` from values (the general path's adds and every refusal)."""
    return add_reply(
        encode_varint(txn_id), encode_varint(ledger_id), encode_varint(entry_id), encode_varint(status)
    )
