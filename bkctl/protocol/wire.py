"""BookKeeper v2 wire frames: requests, responses and an incremental frame decoder (sans-I/O).

A frame on the socket is an int32 length (excluding itself) followed by that many payload bytes. A v2
payload starts with an int32 header `version<<24 | opcode<<16 | flags` (version 0, the pre-4.0 legacy
form, is the bare opcode). Everything is big-endian. The bookie and the client both run these codecs on
the reactor thread, so they use precompiled structs and allocate one small NamedTuple per frame.
See docs/formats/wire.md for the byte layouts.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from enum import IntEnum, unique
from typing import Final, NamedTuple

from crc32c import crc32c

from bkctl import limits
from bkctl.errors import (
    BkctlError,
    FencedError,
    NotFoundError,
    ProtocolError,
    ReadOnlyError,
    UnauthorizedError,
    UnavailableError,
)
from bkctl.model import DigestType
from bkctl.protocol.entry import HEADER as ENTRY_HEADER
from bkctl.protocol.entry import compute_digest
from bkctl.protocol.protobuf import bytes_field, encode_fields, expect_bytes, iter_fields


@unique
class OpCode(IntEnum):
    """v2 operation codes (the Java v2 codec only carries ADD_ENTRY, READ_ENTRY, AUTH, BATCH_READ_ENTRY)."""

    ADD_ENTRY = 1
    READ_ENTRY = 2
    AUTH = 3
    READ_LAC = 4
    WRITE_LAC = 5
    GET_BOOKIE_INFO = 6
    BATCH_READ_ENTRY = 7


@unique
class ReturnCode(IntEnum):
    """v2 response codes (int32 `rc` of every response)."""

    EOK = 0
    ENOLEDGER = 1
    ENOENTRY = 2
    EBADREQ = 100
    EIO = 101
    EUA = 102
    EBADVERSION = 103
    EFENCED = 104
    EREADONLY = 105
    ETOOMANYREQUESTS = 106
    EUNKNOWNLEDGERSTATE = 107


# Request flags (low 16 bits of the header); responses always carry 0.
FLAG_NONE: Final = 0x0
FLAG_DO_FENCING: Final = 0x1
FLAG_RECOVERY_ADD: Final = 0x2
FLAG_HIGH_PRIORITY: Final = 0x4

# What Java clients send; 0 and 1 are older clients. Higher bytes are not v2 (see wire_v3.is_v2_frame).
PROTOCOL_VERSION: Final = 2
PROTOCOL_VERSION_MAX: Final = 2  # format fact
# Read and batch-read requests carry a master key only from version 2 on, and only when fencing.
_KEYED_READ_VERSION: Final = 2

# Plain ints for the hot dispatch paths: comparing against IntEnum members costs an attribute lookup.
_ADD_ENTRY: Final = int(OpCode.ADD_ENTRY)
_READ_ENTRY: Final = int(OpCode.READ_ENTRY)
_AUTH: Final = int(OpCode.AUTH)
_BATCH_READ_ENTRY: Final = int(OpCode.BATCH_READ_ENTRY)

LENGTH_PREFIX_SIZE: Final = 4
HEADER_SIZE: Final = 4
# Every add/read/batch-read response starts with header, rc, ledger id, entry id.
RESPONSE_FIXED_SIZE: Final = 24
# The name a bookie without authentication answers AUTH requests with (and an empty payload).
AUTH_DISABLED_PLUGIN: Final = "AuthDisabledPlugin"
# A read of this entry id asks the bookie for the last entry it has.
LAST_ENTRY_ID: Final = -1
# Ids we answer with when a request could not tell us which ledger/entry it was about.
UNKNOWN_ID: Final = -1

FRAME_LENGTH: Final = struct.Struct(">i")  # the length prefix of every frame
_UINT32 = struct.Struct(">I")  # a CRC32C digest
_HEADER = struct.Struct(">I")
_ADD_HEAD = struct.Struct(f">I{limits.MASTER_KEY_SIZE}s")
_IDS = struct.Struct(">qq")
_READ = struct.Struct(">Iqq")
_READ_KEYED = struct.Struct(f">Iqq{limits.MASTER_KEY_SIZE}s")
_BATCH = struct.Struct(">Iqqqiq")
_BATCH_KEYED = struct.Struct(f">Iqqqiq{limits.MASTER_KEY_SIZE}s")
_RESPONSE = struct.Struct(">Iiqq")
_BATCH_RESPONSE = struct.Struct(">Iiqqq")
_ENTRY_LENGTH = struct.Struct(">i")

_AUTH_NAME_FIELD = 1
_AUTH_PAYLOAD_FIELD = 2

# Reply codes -> the bkctl error a client raises for them.
RC_ERRORS: Final[Mapping[int, type[BkctlError]]] = {
    ReturnCode.ENOLEDGER: NotFoundError,
    ReturnCode.ENOENTRY: NotFoundError,
    ReturnCode.EBADREQ: ProtocolError,
    ReturnCode.EIO: UnavailableError,
    ReturnCode.EUA: UnauthorizedError,
    ReturnCode.EBADVERSION: ProtocolError,
    ReturnCode.EFENCED: FencedError,
    ReturnCode.EREADONLY: ReadOnlyError,
    ReturnCode.ETOOMANYREQUESTS: UnavailableError,
    ReturnCode.EUNKNOWNLEDGERSTATE: UnavailableError,
}


# --- values -------------------------------------------------------------------------------------------


class AddRequest(NamedTuple):
    """ADD_ENTRY: `entry` is the packaged entry; the ids are its first 16 bytes, as the bookie reads them."""

    version: int
    flags: int
    master_key: bytes
    ledger_id: int
    entry_id: int
    entry: bytes


class ReadRequest(NamedTuple):
    """READ_ENTRY; `master_key` is present iff DO_FENCING is set and version >= 2."""

    version: int
    flags: int
    ledger_id: int
    entry_id: int
    master_key: bytes | None


class BatchReadRequest(NamedTuple):
    """BATCH_READ_ENTRY: up to `max_count` entries / `max_size` bytes from `entry_id` on."""

    version: int
    flags: int
    ledger_id: int
    entry_id: int
    request_id: int
    max_count: int
    max_size: int
    master_key: bytes | None


class AuthRequest(NamedTuple):
    """AUTH: an AuthMessage protobuf (plugin name, opaque payload)."""

    version: int
    flags: int
    plugin_name: str
    payload: bytes


class UnknownRequest(NamedTuple):
    """A well-framed request whose opcode v2 cannot carry (READ_LAC, WRITE_LAC, GET_BOOKIE_INFO, ...).

    The bookie answers it with EBADREQ (`encode_error_response`) instead of dropping the connection.
    """

    version: int
    opcode: int
    flags: int
    body: bytes


class AddResponse(NamedTuple):
    version: int
    rc: int
    ledger_id: int
    entry_id: int


class ReadResponse(NamedTuple):
    """`entry` is the stored packaged entry when rc is EOK, else normally empty."""

    version: int
    rc: int
    ledger_id: int
    entry_id: int
    entry: bytes


class BatchReadResponse(NamedTuple):
    version: int
    rc: int
    ledger_id: int
    entry_id: int
    request_id: int
    entries: tuple[bytes, ...]


class AuthResponse(NamedTuple):
    version: int
    plugin_name: str
    payload: bytes


class UnknownResponse(NamedTuple):
    """A response to an opcode v2 does not define; `body` is everything after the header."""

    version: int
    opcode: int
    body: bytes


Request = AddRequest | ReadRequest | BatchReadRequest | AuthRequest | UnknownRequest
Response = AddResponse | ReadResponse | BatchReadResponse | AuthResponse | UnknownResponse


# --- header -------------------------------------------------------------------------------------------


def pack_header(version: int, opcode: int, flags: int) -> int:
    """The header int; version 0 is the legacy form, the bare opcode without flags."""
    if not 0 <= version <= PROTOCOL_VERSION_MAX:
        raise ProtocolError(f"v2 protocol version {version} is not 0..{PROTOCOL_VERSION_MAX}")
    if not 0 <= opcode <= 0xFF or not 0 <= flags <= 0xFFFF:
        raise ProtocolError(f"v2 opcode {opcode} or flags {flags:#x} out of range")
    if version == 0:
        if flags:
            raise ProtocolError("legacy (version 0) frames cannot carry flags")
        return opcode
    return version << 24 | opcode << 16 | flags


def unpack_header(payload: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(version, opcode, flags) of a v2 payload."""
    if len(payload) < HEADER_SIZE:
        raise ProtocolError(f"v2 frame of {len(payload)} bytes has no 4-byte header")
    (header,) = _HEADER.unpack_from(payload)
    version = header >> 24
    if version == PROTOCOL_VERSION:
        return version, header >> 16 & 0xFF, header & 0xFFFF
    if version == 0:
        # Legacy frames carried only the opcode; anything in the middle bytes is not a frame we know.
        if header >> 8:
            raise ProtocolError(f"malformed legacy v2 header {header:#010x}")
        return 0, header, 0
    if version > PROTOCOL_VERSION_MAX:
        raise ProtocolError(f"v2 protocol version {version} is not 0..{PROTOCOL_VERSION_MAX}")
    return version, header >> 16 & 0xFF, header & 0xFFFF


def _keyed(version: int, flags: int) -> bool:
    return bool(flags & FLAG_DO_FENCING) and version >= _KEYED_READ_VERSION


# --- framing ------------------------------------------------------------------------------------------


def frame_prefix(payload_size: int) -> bytes:
    """The 4-byte length prefix for a payload, so callers can write prefix and payload without a copy."""
    if not 0 <= payload_size <= limits.FRAME_SIZE_MAX:
        raise ProtocolError(f"frame of {payload_size} bytes exceeds the {limits.FRAME_SIZE_MAX}-byte limit")
    return FRAME_LENGTH.pack(payload_size)


def frame(payload: bytes) -> bytes:
    """Length prefix + payload, ready for the socket."""
    return frame_prefix(len(payload)) + payload


def bad_frame_length(size: int, frame_size_max: int) -> str:
    """Why a length prefix outside HEADER_SIZE..frame_size_max is refused. After a bad length the
    stream cannot be resynchronised: the reader closes it."""
    if size < 0:
        return f"negative frame length {size}"
    if size < HEADER_SIZE:
        return f"frame length {size} is too small for a {HEADER_SIZE}-byte header"
    return f"frame length {size} exceeds the {frame_size_max}-byte limit"


class FrameDecoder:
    """Split a byte stream into frame payloads (length prefix removed).

    `feed` appends bytes; `frames` returns every complete payload buffered so far, an empty list when it
    needs more bytes, and raises ProtocolError for a malformed length (negative, too small for a header,
    above `frame_size_max`) as soon as the 4 prefix bytes have arrived (complete frames before the bad
    length are returned first, the next call raises). After an error the stream cannot be resynchronised,
    so every later call raises again. Between calls it holds at most one partial frame.
    """

    __slots__ = ("_buffer", "_error", "_frame_size_max")

    def __init__(self, frame_size_max: int = limits.FRAME_SIZE_MAX) -> None:
        if not HEADER_SIZE <= frame_size_max <= limits.FRAME_SIZE_MAX:
            raise ProtocolError(
                f"frame size limit {frame_size_max} is not {HEADER_SIZE}..{limits.FRAME_SIZE_MAX}"
            )
        self._frame_size_max = frame_size_max
        self._buffer = bytearray()
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held that are not yet part of a returned frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise self._error
        self._buffer += data

    def frames(self) -> list[bytes]:
        if self._error is not None:
            raise self._error
        buffer = self._buffer
        end = len(buffer)
        position = 0
        found: list[bytes] = []
        # One copy per frame (through the view); the view is released before the buffer is resized.
        with memoryview(buffer) as view:
            while end - position >= LENGTH_PREFIX_SIZE:
                (size,) = FRAME_LENGTH.unpack_from(view, position)
                if not HEADER_SIZE <= size <= self._frame_size_max:
                    self._error = ProtocolError(bad_frame_length(size, self._frame_size_max))
                    if not found:
                        raise self._error
                    break  # hand out the good frames before it; the next call raises
                start = position + LENGTH_PREFIX_SIZE
                if end - start < size:
                    break
                found.append(bytes(view[start : start + size]))
                position = start + size
        if position:
            # Deleting from the front of a bytearray only moves its start pointer: no copy of the rest.
            del buffer[:position]
        return found


# --- requests -----------------------------------------------------------------------------------------


def encode_add_request(
    entry: bytes, master_key: bytes, flags: int = FLAG_NONE, version: int = PROTOCOL_VERSION
) -> bytes:
    """An ADD_ENTRY payload: header, 20-byte master key, packaged entry (which starts with its ids)."""
    if len(entry) < _IDS.size:
        raise ProtocolError(f"packaged entry of {len(entry)} bytes has no ledger and entry id")
    if len(entry) > limits.FRAME_SIZE_MAX - _ADD_HEAD.size:
        raise ProtocolError(f"entry of {len(entry)} bytes does not fit in a frame")
    return add_request_head(master_key, flags, version) + entry


def add_request_head(master_key: bytes, flags: int = FLAG_NONE, version: int = PROTOCOL_VERSION) -> bytes:
    """What every ADD_ENTRY payload of one writer starts with: the header int and the master key."""
    _check_key(master_key)
    return _ADD_HEAD.pack(pack_header(version, OpCode.ADD_ENTRY, flags), master_key)


def frame_add_request(
    head: bytes,
    digest: DigestType,
    ledger_id: int,
    entry_id: int,
    last_add_confirmed: int,
    length: int,
    payload: bytes,
    key: bytes | None = None,
) -> bytes:
    """A framed ADD_ENTRY built with one copy: the length prefix, `head` (from `add_request_head`) and
    the packaged entry (`entry.package_entry`: header, digest, payload; MAC needs `key`). The writer's
    hot path, one call per entry: the default CRC32C digest is computed here as `entry.compute_digest`
    does, without the call."""
    try:
        header = ENTRY_HEADER.pack(ledger_id, entry_id, last_add_confirmed, length)
    except struct.error as e:
        raise ProtocolError(f"entry field out of the int64 range: {e}") from None
    if digest is DigestType.CRC32C:
        checksum = _UINT32.pack(crc32c(payload, crc32c(header)))
    else:
        checksum = compute_digest(digest, header, payload, key)
    size = len(head) + len(header) + len(checksum) + len(payload)
    if size > limits.FRAME_SIZE_MAX:
        raise ProtocolError(f"frame of {size} bytes exceeds the {limits.FRAME_SIZE_MAX}-byte limit")
    return b"".join((FRAME_LENGTH.pack(size), head, header, checksum, payload))


def encode_read_request(
    ledger_id: int,
    entry_id: int,
    flags: int = FLAG_NONE,
    master_key: bytes | None = None,
    version: int = PROTOCOL_VERSION,
) -> bytes:
    """A READ_ENTRY payload; fencing reads (DO_FENCING, version >= 2) must carry the master key."""
    header = pack_header(version, OpCode.READ_ENTRY, flags)
    try:
        if _keyed(version, flags):
            return _READ_KEYED.pack(header, ledger_id, entry_id, _required_key(master_key))
        _check_no_key(master_key)
        return _READ.pack(header, ledger_id, entry_id)
    except struct.error as e:
        raise ProtocolError(f"read request field out of range: {e}") from None


def encode_batch_read_request(
    ledger_id: int,
    entry_id: int,
    request_id: int,
    max_count: int,
    max_size: int,
    flags: int = FLAG_NONE,
    master_key: bytes | None = None,
    version: int = PROTOCOL_VERSION,
) -> bytes:
    """A BATCH_READ_ENTRY payload (master key as for reads)."""
    header = pack_header(version, OpCode.BATCH_READ_ENTRY, flags)
    try:
        if _keyed(version, flags):
            key = _required_key(master_key)
            return _BATCH_KEYED.pack(header, ledger_id, entry_id, request_id, max_count, max_size, key)
        _check_no_key(master_key)
        return _BATCH.pack(header, ledger_id, entry_id, request_id, max_count, max_size)
    except struct.error as e:
        raise ProtocolError(f"batch read request field out of range: {e}") from None


def encode_auth_request(
    plugin_name: str, payload: bytes, flags: int = FLAG_NONE, version: int = PROTOCOL_VERSION
) -> bytes:
    return _HEADER.pack(pack_header(version, OpCode.AUTH, flags)) + _encode_auth(plugin_name, payload)


def encode_unknown_request(version: int, opcode: int, flags: int, body: bytes) -> bytes:
    return _HEADER.pack(pack_header(version, opcode, flags)) + body


def encode_request(request: Request) -> bytes:
    """Encode any decoded request back to its payload (the inverse of `decode_request`)."""
    if isinstance(request, AddRequest):
        return encode_add_request(request.entry, request.master_key, request.flags, request.version)
    if isinstance(request, ReadRequest):
        return encode_read_request(
            request.ledger_id, request.entry_id, request.flags, request.master_key, request.version
        )
    if isinstance(request, BatchReadRequest):
        return encode_batch_read_request(
            request.ledger_id,
            request.entry_id,
            request.request_id,
            request.max_count,
            request.max_size,
            request.flags,
            request.master_key,
            request.version,
        )
    if isinstance(request, AuthRequest):
        return encode_auth_request(request.plugin_name, request.payload, request.flags, request.version)
    return encode_unknown_request(request.version, request.opcode, request.flags, request.body)


def decode_request(payload: bytes | bytearray | memoryview) -> Request:
    """Decode one request payload (no length prefix); raise ProtocolError when it is malformed."""
    version, opcode, flags = unpack_header(payload)
    if opcode == _ADD_ENTRY:
        return _decode_add(payload, version, flags)
    if opcode == _READ_ENTRY:
        return _decode_read(payload, version, flags)
    if opcode == _BATCH_READ_ENTRY:
        return _decode_batch_read(payload, version, flags)
    if opcode == _AUTH:
        return AuthRequest(version, flags, *_decode_auth(payload))
    return UnknownRequest(version, opcode, flags, bytes(payload[HEADER_SIZE:]))


def _decode_add(payload: bytes | bytearray | memoryview, version: int, flags: int) -> AddRequest:
    if len(payload) < _ADD_HEAD.size + _IDS.size:
        raise ProtocolError(f"add request of {len(payload)} bytes is too short for key and entry ids")
    master_key = bytes(payload[HEADER_SIZE : _ADD_HEAD.size])
    ledger_id, entry_id = _IDS.unpack_from(payload, _ADD_HEAD.size)
    return AddRequest(version, flags, master_key, ledger_id, entry_id, bytes(payload[_ADD_HEAD.size :]))


def _decode_read(payload: bytes | bytearray | memoryview, version: int, flags: int) -> ReadRequest:
    if _keyed(version, flags):
        _check_size(payload, _READ_KEYED.size, "fencing read request")
        _, ledger_id, entry_id, key = _READ_KEYED.unpack(payload)
        return ReadRequest(version, flags, ledger_id, entry_id, key)
    _check_size(payload, _READ.size, "read request")
    _, ledger_id, entry_id = _READ.unpack(payload)
    return ReadRequest(version, flags, ledger_id, entry_id, None)


def _decode_batch_read(payload: bytes | bytearray | memoryview, version: int, flags: int) -> BatchReadRequest:
    key: bytes | None = None
    if _keyed(version, flags):
        _check_size(payload, _BATCH_KEYED.size, "fencing batch read request")
        _, ledger_id, entry_id, request_id, max_count, max_size, key = _BATCH_KEYED.unpack(payload)
    else:
        _check_size(payload, _BATCH.size, "batch read request")
        _, ledger_id, entry_id, request_id, max_count, max_size = _BATCH.unpack(payload)
    return BatchReadRequest(version, flags, ledger_id, entry_id, request_id, max_count, max_size, key)


# --- responses ----------------------------------------------------------------------------------------


def encode_add_response(rc: int, ledger_id: int, entry_id: int, version: int = PROTOCOL_VERSION) -> bytes:
    return _pack_response(version, OpCode.ADD_ENTRY, rc, ledger_id, entry_id)


def encode_read_response(
    rc: int, ledger_id: int, entry_id: int, entry: bytes = b"", version: int = PROTOCOL_VERSION
) -> bytes:
    """A READ_ENTRY response; `entry` (the stored packaged entry) is sent only with EOK."""
    if len(entry) > limits.FRAME_SIZE_MAX - RESPONSE_FIXED_SIZE:
        raise ProtocolError(f"entry of {len(entry)} bytes does not fit in a frame")
    return _pack_response(version, OpCode.READ_ENTRY, rc, ledger_id, entry_id) + entry


def encode_batch_read_response(
    rc: int,
    ledger_id: int,
    entry_id: int,
    request_id: int,
    entries: tuple[bytes, ...] | list[bytes] = (),
    version: int = PROTOCOL_VERSION,
) -> bytes:
    """A BATCH_READ_ENTRY response: fixed part, request id, then (int32 length, bytes) per entry."""
    header = pack_header(version, OpCode.BATCH_READ_ENTRY, FLAG_NONE)
    try:
        parts = [_BATCH_RESPONSE.pack(header, rc, ledger_id, entry_id, request_id)]
    except struct.error as e:
        raise ProtocolError(f"batch read response field out of range: {e}") from None
    size = _BATCH_RESPONSE.size
    for entry in entries:
        size += _ENTRY_LENGTH.size + len(entry)
        if size > limits.FRAME_SIZE_MAX:
            raise ProtocolError(f"batch read response exceeds the {limits.FRAME_SIZE_MAX}-byte frame limit")
        parts.append(_ENTRY_LENGTH.pack(len(entry)))
        parts.append(entry)
    return b"".join(parts)


def encode_auth_response(
    plugin_name: str = AUTH_DISABLED_PLUGIN, payload: bytes = b"", version: int = PROTOCOL_VERSION
) -> bytes:
    """An AUTH response; the defaults are what a bookie without authentication answers."""
    return _HEADER.pack(pack_header(version, OpCode.AUTH, FLAG_NONE)) + _encode_auth(plugin_name, payload)


def encode_unknown_response(version: int, opcode: int, body: bytes) -> bytes:
    return _HEADER.pack(pack_header(version, opcode, FLAG_NONE)) + body


def encode_response(response: Response) -> bytes:
    """Encode any decoded response back to its payload (the inverse of `decode_response`)."""
    if isinstance(response, AddResponse):
        return encode_add_response(response.rc, response.ledger_id, response.entry_id, response.version)
    if isinstance(response, ReadResponse):
        return encode_read_response(
            response.rc, response.ledger_id, response.entry_id, response.entry, response.version
        )
    if isinstance(response, BatchReadResponse):
        return encode_batch_read_response(
            response.rc,
            response.ledger_id,
            response.entry_id,
            response.request_id,
            response.entries,
            response.version,
        )
    if isinstance(response, AuthResponse):
        return encode_auth_response(response.plugin_name, response.payload, response.version)
    return encode_unknown_response(response.version, response.opcode, response.body)


def encode_error_response(request: Request, rc: int) -> bytes:
    """The answer to `request` carrying only the error `rc` (ids echoed; -1 when the request had none).

    AUTH has no error form in v2; it gets the "authentication disabled" answer whatever `rc` is.
    """
    if isinstance(request, AddRequest):
        return encode_add_response(rc, request.ledger_id, request.entry_id, request.version)
    if isinstance(request, ReadRequest):
        return encode_read_response(rc, request.ledger_id, request.entry_id, b"", request.version)
    if isinstance(request, BatchReadRequest):
        return encode_batch_read_response(
            rc, request.ledger_id, request.entry_id, request.request_id, (), request.version
        )
    if isinstance(request, AuthRequest):
        # v2 has no error form of AUTH: like the Java bookie, say authentication is disabled.
        return encode_auth_response(version=request.version)
    return _pack_response(request.version, request.opcode, rc, UNKNOWN_ID, UNKNOWN_ID)


def decode_response(payload: bytes | bytearray | memoryview) -> Response:
    """Decode one response payload (no length prefix); raise ProtocolError when it is malformed."""
    version, opcode, _ = unpack_header(payload)
    if opcode == _ADD_ENTRY:
        _check_size(payload, RESPONSE_FIXED_SIZE, "add response")
        _, rc, ledger_id, entry_id = _RESPONSE.unpack(payload)
        return AddResponse(version, rc, ledger_id, entry_id)
    if opcode == _READ_ENTRY:
        _check_min_size(payload, RESPONSE_FIXED_SIZE, "read response")
        _, rc, ledger_id, entry_id = _RESPONSE.unpack_from(payload)
        return ReadResponse(version, rc, ledger_id, entry_id, bytes(payload[RESPONSE_FIXED_SIZE:]))
    if opcode == _BATCH_READ_ENTRY:
        return _decode_batch_read_response(payload, version)
    if opcode == _AUTH:
        return AuthResponse(version, *_decode_auth(payload))
    return UnknownResponse(version, opcode, bytes(payload[HEADER_SIZE:]))


def _decode_batch_read_response(payload: bytes | bytearray | memoryview, version: int) -> BatchReadResponse:
    _check_min_size(payload, _BATCH_RESPONSE.size, "batch read response")
    _, rc, ledger_id, entry_id, request_id = _BATCH_RESPONSE.unpack_from(payload)
    entries: list[bytes] = []
    position = _BATCH_RESPONSE.size
    end = len(payload)
    while position < end:
        if end - position < _ENTRY_LENGTH.size:
            raise ProtocolError(f"batch read response: truncated entry length at byte {position}")
        (size,) = _ENTRY_LENGTH.unpack_from(payload, position)
        position += _ENTRY_LENGTH.size
        if not 0 <= size <= end - position:
            raise ProtocolError(f"batch read response: entry length {size} at byte {position - 4} is bad")
        entries.append(bytes(payload[position : position + size]))
        position += size
    return BatchReadResponse(version, rc, ledger_id, entry_id, request_id, tuple(entries))


def _pack_response(version: int, opcode: int, rc: int, ledger_id: int, entry_id: int) -> bytes:
    try:
        return _RESPONSE.pack(pack_header(version, opcode, FLAG_NONE), rc, ledger_id, entry_id)
    except struct.error as e:
        raise ProtocolError(f"response field out of range: {e}") from None


# --- return codes -------------------------------------------------------------------------------------


def rc_name(rc: int) -> str:
    """`EFENCED` for 104; `rc 42` for codes this version does not know."""
    try:
        return ReturnCode(rc).name
    except ValueError:
        return f"rc {rc}"


def error_for_rc(rc: int, what: str) -> BkctlError:
    """The bkctl error for a non-EOK reply to `what` (e.g. "read of ledger 3 entry 7 from host:3181")."""
    error_class = RC_ERRORS.get(rc, ProtocolError)
    return error_class(f"{what}: {rc_name(rc)}")


# --- helpers ------------------------------------------------------------------------------------------


def _encode_auth(plugin_name: str, payload: bytes) -> bytes:
    try:
        name = plugin_name.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(f"auth plugin name {plugin_name!r} is not encodable as UTF-8") from None
    return encode_fields([bytes_field(_AUTH_NAME_FIELD, name), bytes_field(_AUTH_PAYLOAD_FIELD, payload)])


def _decode_auth(payload: bytes | bytearray | memoryview) -> tuple[str, bytes]:
    """(plugin name, payload) of the AuthMessage after the header; unknown fields are skipped."""
    name = b""
    data = b""
    for field in iter_fields(memoryview(payload)[HEADER_SIZE:]):
        if field.number == _AUTH_NAME_FIELD:
            name = expect_bytes(field)
        elif field.number == _AUTH_PAYLOAD_FIELD:
            data = expect_bytes(field)
    try:
        return name.decode("utf-8"), data
    except UnicodeDecodeError:
        raise ProtocolError("auth message plugin name is not UTF-8") from None


def _check_key(master_key: bytes) -> None:
    if len(master_key) != limits.MASTER_KEY_SIZE:
        raise ProtocolError(f"master key must be {limits.MASTER_KEY_SIZE} bytes, got {len(master_key)}")


def _required_key(master_key: bytes | None) -> bytes:
    if master_key is None:
        raise ProtocolError("a fencing read must carry the master key")
    _check_key(master_key)
    return master_key


def _check_no_key(master_key: bytes | None) -> None:
    if master_key is not None:
        raise ProtocolError("v2 sends a master key with reads only when fencing (version >= 2)")


def _check_size(payload: bytes | bytearray | memoryview, size: int, what: str) -> None:
    if len(payload) != size:
        raise ProtocolError(f"{what} of {len(payload)} bytes, expected {size}")


def _check_min_size(payload: bytes | bytearray | memoryview, size: int, what: str) -> None:
    if len(payload) < size:
        raise ProtocolError(f"{what} of {len(payload)} bytes is shorter than {size}")
