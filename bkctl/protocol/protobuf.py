"""A minimal protobuf (proto2) wire codec: varints and tagged fields, nothing else.

BookKeeper stores ledger metadata, bookie service info and v3 frames as protobuf. We only need a few
messages, so instead of generated classes we decode to (field number, wire type, value) triples and
encode them back in the order given. Java writes the fields of the messages we re-encode (ledger metadata,
bookie service info, ctime values) in field-number order, so re-encoding what we decoded gives the same
bytes. (v3 frames are not like that: their extension fields follow the op message; we only decode those.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from bkctl import limits
from bkctl.errors import ProtocolError

VARINT = 0
FIXED64 = 1
LENGTH_DELIMITED = 2
FIXED32 = 5

_UINT64_MASK = (1 << 64) - 1


class Field(NamedTuple):
    """One decoded field: `value` is an int for varint/fixed types and bytes for length-delimited.

    A NamedTuple rather than a frozen dataclass: decoding 100k ledgers' metadata builds millions of them.
    """

    number: int
    wire_type: int
    value: int | bytes


def encode_varint(value: int) -> bytes:
    """Encode an int as a base-128 varint; negatives are two's complement over 64 bits, as protobuf does."""
    value &= _UINT64_MASK
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def decode_varint(data: bytes | memoryview, offset: int) -> tuple[int, int]:
    """Decode an unsigned varint at `offset`; return (value, offset after it)."""
    if offset < len(data) and data[offset] < 0x80:
        return data[offset], offset + 1  # one-byte varints are most of them: keys, small numbers
    result = 0
    for shift in range(0, 70, 7):
        if offset >= len(data):
            raise ProtocolError("protobuf: truncated varint")
        byte = data[offset]
        offset += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if result > _UINT64_MASK:
                raise ProtocolError("protobuf: varint longer than 64 bits")
            return result, offset
    raise ProtocolError("protobuf: varint longer than 10 bytes")


def as_signed64(value: int) -> int:
    """Reinterpret a decoded uint64 varint as int64 (protobuf int64 fields are sent as uint64)."""
    return value - (1 << 64) if value & (1 << 63) else value


def iter_fields(data: bytes | memoryview) -> Iterator[Field]:
    """Yield the fields of one message, in wire order; raise ProtocolError on malformed bytes."""
    offset = 0
    end = len(data)
    fields_max = limits.PROTOBUF_FIELDS_MAX
    count = 0
    while offset < end:
        count += 1
        if count > fields_max:
            raise ProtocolError("protobuf: too many fields")
        key, offset = decode_varint(data, offset)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise ProtocolError("protobuf: field number 0")
        value: int | bytes
        if wire_type == VARINT:
            value, offset = decode_varint(data, offset)
        elif wire_type == LENGTH_DELIMITED:
            size, offset = decode_varint(data, offset)
            if size > end - offset:
                raise ProtocolError(f"protobuf: field {number} length {size} runs past the message")
            value = bytes(data[offset : offset + size])
            offset += size
        elif wire_type in (FIXED64, FIXED32):
            width = 8 if wire_type == FIXED64 else 4
            if offset + width > end:
                raise ProtocolError(f"protobuf: truncated fixed field {number}")
            value = int.from_bytes(data[offset : offset + width], "little")
            offset += width
        else:
            raise ProtocolError(f"protobuf: unsupported wire type {wire_type} in field {number}")
        yield Field(number, wire_type, value)


def encode_fields(fields: Iterable[Field]) -> bytes:
    """Encode fields in the order given (the inverse of iter_fields)."""
    out = bytearray()
    for f in fields:
        out += encode_varint(f.number << 3 | f.wire_type)
        if f.wire_type == VARINT:
            out += encode_varint(_int(f))
        elif f.wire_type == LENGTH_DELIMITED:
            payload = _bytes(f)
            out += encode_varint(len(payload))
            out += payload
        elif f.wire_type in (FIXED64, FIXED32):
            out += (_int(f) & _UINT64_MASK).to_bytes(8 if f.wire_type == FIXED64 else 4, "little")
        else:
            raise ProtocolError(f"protobuf: unsupported wire type {f.wire_type}")
    return bytes(out)


def varint_field(number: int, value: int) -> Field:
    return Field(number, VARINT, value)


def bytes_field(number: int, value: bytes | str) -> Field:
    return Field(number, LENGTH_DELIMITED, value.encode() if isinstance(value, str) else value)


def _int(f: Field) -> int:
    if not isinstance(f.value, int):
        raise ProtocolError(f"protobuf: field {f.number} needs an int value")
    return f.value


def _bytes(f: Field) -> bytes:
    if not isinstance(f.value, bytes):
        raise ProtocolError(f"protobuf: field {f.number} needs a bytes value")
    return f.value


def expect_int(f: Field) -> int:
    """The value of a varint/fixed field, or ProtocolError naming the field when it is not one."""
    if f.wire_type == LENGTH_DELIMITED:
        raise ProtocolError(f"protobuf: field {f.number} should be a number")
    return _int(f)


def expect_bytes(f: Field) -> bytes:
    """The value of a length-delimited field, or ProtocolError naming the field when it is not one."""
    if f.wire_type != LENGTH_DELIMITED:
        raise ProtocolError(f"protobuf: field {f.number} should be length-delimited")
    return _bytes(f)


def expect_text(f: Field) -> str:
    """A string field as UTF-8 text."""
    try:
        return expect_bytes(f).decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"protobuf: field {f.number} is not UTF-8") from None
