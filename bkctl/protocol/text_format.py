"""Protobuf TEXT format (the subset BookKeeper writes), converted to and from binary protobuf fields.

BookKeeper keeps cookies, under-replication marks, locks, auditor votes and v2 ledger metadata as the
text that Java's `TextFormat` prints (`name: value` lines, nested `name {` ... `}` blocks indented two
spaces). Rather than a second model of each message, a `MessageSpec` maps field names to numbers and
kinds, so text parses into the same `protobuf.Field` list the binary decoder reads, and a Field list
prints as the text Java would write. One decoder per message then serves both encodings.

Parsing is bounded: the input size is checked by the caller against a limit, nesting against
`limits.PROTOBUF_DEPTH_MAX`, the field count against `limits.PROTOBUF_FIELDS_MAX`; anything else
raises ProtocolError.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.protocol import protobuf
from bkctl.protocol.protobuf import Field

_UINT64_MASK = (1 << 64) - 1


class Kind(Enum):
    INT32 = "int32"
    INT64 = "int64"
    ENUM = "enum"
    STRING = "string"
    BYTES = "bytes"
    MESSAGE = "message"


@dataclass(frozen=True)
class FieldSpec:
    """One field of a message: `enum` maps value names to numbers, `message` describes nested fields."""

    number: int
    name: str
    kind: Kind
    enum: tuple[tuple[str, int], ...] = ()
    message: MessageSpec | None = None


@dataclass(frozen=True)
class MessageSpec:
    name: str
    fields: tuple[FieldSpec, ...]
    _by_name: dict[str, FieldSpec] = field(init=False, repr=False, compare=False)
    _by_number: dict[int, FieldSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {f.name: f for f in self.fields})
        object.__setattr__(self, "_by_number", {f.number: f for f in self.fields})

    def by_name(self, name: str) -> FieldSpec:
        spec = self._by_name.get(name)
        if spec is None:
            raise ProtocolError(f"text format: {self.name} has no field {name!r}")
        return spec

    def by_number(self, number: int) -> FieldSpec | None:
        return self._by_number.get(number)


# ---------------------------------------------------------------------------------------------- printing


def escape_bytes(data: bytes) -> str:
    """Escape as Java's TextFormat does: C escapes for control/quote characters, octal for the rest."""
    out: list[str] = []
    for byte in data:
        named = _ESCAPES_OUT.get(byte)
        if named is not None:
            out.append(named)
        elif 0x20 <= byte <= 0x7E:
            out.append(chr(byte))
        else:
            out.append(f"\\{byte:03o}")
    return "".join(out)


_ESCAPES_OUT = {
    0x07: "\\a",
    0x08: "\\b",
    0x0C: "\\f",
    0x0A: "\\n",
    0x0D: "\\r",
    0x09: "\\t",
    0x0B: "\\v",
    0x5C: "\\\\",
    0x27: "\\'",
    0x22: '\\"',
}


def print_message(fields: Iterable[Field], spec: MessageSpec) -> bytes:
    """The text Java's `Message.toString()` prints for these fields (given in the order to print)."""
    lines: list[str] = []
    _print_into(lines, fields, spec, "", 0)
    return "".join(lines).encode("ascii")


def _print_into(
    lines: list[str], fields: Iterable[Field], spec: MessageSpec, indent: str, depth: int
) -> None:
    if depth > limits.PROTOBUF_DEPTH_MAX:
        raise ProtocolError("text format: message nested too deeply")
    for f in fields:
        fspec = spec.by_number(f.number)
        if fspec is None:
            raise ProtocolError(f"text format: {spec.name} has no field number {f.number}")
        if fspec.kind is Kind.MESSAGE:
            assert fspec.message is not None
            lines.append(f"{indent}{fspec.name} {{\n")
            nested = protobuf.iter_fields(protobuf.expect_bytes(f))
            _print_into(lines, nested, fspec.message, indent + "  ", depth + 1)
            lines.append(f"{indent}}}\n")
        else:
            lines.append(f"{indent}{fspec.name}: {_scalar_text(f, fspec)}\n")


def _scalar_text(f: Field, spec: FieldSpec) -> str:
    if spec.kind in (Kind.STRING, Kind.BYTES):
        return '"' + escape_bytes(protobuf.expect_bytes(f)) + '"'
    value = protobuf.expect_int(f)
    if spec.kind is Kind.INT64:
        # Encoders hand over Python ints, decoders uint64 varints: both print as int64.
        return str(protobuf.as_signed64(value & _UINT64_MASK))
    if spec.kind is Kind.INT32:
        return str(int32(value))
    for name, number in spec.enum:
        if number == value:
            return name
    raise ProtocolError(f"text format: {value} is not a value of enum field {spec.name}")


def int32(value: int) -> int:
    """A varint read as int32, as Java does: the low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & (1 << 31) else value


# ---------------------------------------------------------------------------------------------- parsing

_TOKEN = re.compile(
    r"""
    (?P<space>(?:\s|\#[^\n]*)+)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<number>-?[0-9][A-Za-z0-9_.+-]*)
    | (?P<string>"(?:[^"\n\\]|\\.)*"|'(?:[^'\n\\]|\\.)*')
    | (?P<symbol>[:{}<>;,])
    """,
    re.VERBOSE,
)
_CLOSERS = {"{": "}", "<": ">"}


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    offset: int


def _tokens(text: str) -> Iterator[_Token]:
    offset = 0
    while offset < len(text):
        match = _TOKEN.match(text, offset)
        if match is None:
            raise ProtocolError(f"text format: unexpected character {text[offset]!r} at offset {offset}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            yield _Token(kind, match.group(), offset)
        offset = match.end()


@dataclass
class _Frame:
    spec: MessageSpec
    fields: list[Field]
    name: FieldSpec | None  # the field this frame fills in its parent; None for the top message
    closer: str


def parse_message(data: bytes, spec: MessageSpec) -> list[Field]:
    """Parse text format into binary fields (in text order); nested messages come back encoded."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("text format: not UTF-8") from None
    tokens = _Lookahead(_tokens(text))
    stack = [_Frame(spec, [], None, "")]
    while True:
        token = tokens.next()
        frame = stack[-1]
        if token is None or token.text == frame.closer:
            if token is None and frame.closer:
                raise ProtocolError(f"text format: {frame.spec.name} is not closed")
            if token is None:
                return frame.fields
            stack.pop()
            assert frame.name is not None
            stack[-1].fields.append(
                protobuf.bytes_field(frame.name.number, protobuf.encode_fields(frame.fields))
            )
            _skip_separator(tokens)
            continue
        if token.kind != "ident":
            raise ProtocolError(f"text format: expected a field name at offset {token.offset}")
        _count_field(stack)
        fspec = frame.spec.by_name(token.text)
        if fspec.kind is Kind.MESSAGE:
            stack.append(_open_message(tokens, fspec, len(stack)))
            continue
        _expect(tokens, ":")
        frame.fields.append(_scalar_field(tokens, fspec))
        _skip_separator(tokens)


class _Lookahead:
    def __init__(self, tokens: Iterator[_Token]) -> None:
        self._tokens = tokens
        self._peeked: _Token | None = None

    def peek(self) -> _Token | None:
        if self._peeked is None:
            self._peeked = next(self._tokens, None)
        return self._peeked

    def next(self) -> _Token | None:
        token = self.peek()
        self._peeked = None
        return token


def _count_field(stack: list[_Frame]) -> None:
    if sum(len(frame.fields) for frame in stack) >= limits.PROTOBUF_FIELDS_MAX:
        raise ProtocolError("text format: too many fields")


def _open_message(tokens: _Lookahead, fspec: FieldSpec, depth: int) -> _Frame:
    if depth >= limits.PROTOBUF_DEPTH_MAX:
        raise ProtocolError("text format: message nested too deeply")
    token = tokens.next()
    if token is not None and token.text == ":":
        token = tokens.next()
    if token is None or token.text not in _CLOSERS:
        raise ProtocolError(f"text format: expected '{{' after {fspec.name}")
    assert fspec.message is not None
    return _Frame(fspec.message, [], fspec, _CLOSERS[token.text])


def _expect(tokens: _Lookahead, symbol: str) -> None:
    token = tokens.next()
    if token is None or token.text != symbol:
        where = "the end" if token is None else f"offset {token.offset}"
        raise ProtocolError(f"text format: expected {symbol!r} at {where}")


def _skip_separator(tokens: _Lookahead) -> None:
    token = tokens.peek()
    if token is not None and token.text in (";", ","):
        tokens.next()


def _scalar_field(tokens: _Lookahead, spec: FieldSpec) -> Field:
    token = tokens.next()
    if token is None:
        raise ProtocolError(f"text format: {spec.name} has no value")
    if spec.kind in (Kind.STRING, Kind.BYTES):
        if token.kind != "string":
            raise ProtocolError(f"text format: {spec.name} needs a quoted string")
        value = unescape(token.text[1:-1])
        # Adjacent string literals are one value, as in C.
        while (following := tokens.peek()) is not None and following.kind == "string":
            tokens.next()
            value += unescape(following.text[1:-1])
        return protobuf.bytes_field(spec.number, value)
    if spec.kind is Kind.ENUM and token.kind == "ident":
        for name, number in spec.enum:
            if name == token.text:
                return protobuf.varint_field(spec.number, number)
        raise ProtocolError(f"text format: {token.text!r} is not a value of {spec.name}")
    if token.kind != "number":
        raise ProtocolError(f"text format: {spec.name} needs a number")
    # Masked to uint64 so the field is exactly what the binary decoder would yield.
    return protobuf.varint_field(spec.number, _checked_number(token.text, spec) & _UINT64_MASK)


def _checked_number(text: str, spec: FieldSpec) -> int:
    value = parse_integer(text)
    if spec.kind is Kind.ENUM:
        if value not in {number for _, number in spec.enum}:
            raise ProtocolError(f"text format: {value} is not a value of {spec.name}")
        return value
    bits = 32 if spec.kind is Kind.INT32 else 64
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise ProtocolError(f"text format: {spec.name} value {text} does not fit in int{bits}")
    return value


_INTEGER = re.compile(r"(-?)(?:0[xX]([0-9A-Fa-f]+)|(0[0-7]*)|([1-9][0-9]*))")
_INTEGER_DIGITS_MAX = 40  # format fact


def parse_integer(text: str) -> int:
    """A decimal, 0x hex or leading-0 octal integer, optionally negative, as protobuf's text format has."""
    match = _INTEGER.fullmatch(text)
    if match is None or len(text) > _INTEGER_DIGITS_MAX:
        raise ProtocolError(f"text format: bad integer {text!r}")
    sign, hex_digits, octal_digits, decimal_digits = match.groups()
    if hex_digits is not None:
        value = int(hex_digits, 16)
    elif octal_digits is not None:
        value = int(octal_digits, 8)
    else:
        value = int(decimal_digits)
    return -value if sign else value


_SIMPLE_ESCAPES = {
    "a": 0x07,
    "b": 0x08,
    "f": 0x0C,
    "n": 0x0A,
    "r": 0x0D,
    "t": 0x09,
    "v": 0x0B,
    "\\": 0x5C,
    "?": 0x3F,
    "'": 0x27,
    '"': 0x22,
}
_ESCAPE = re.compile(
    r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|(.))", re.DOTALL
)


def unescape(body: str) -> bytes:
    """The bytes of a quoted string's body: literal characters as UTF-8, escapes as text format has them."""
    out = bytearray()
    offset = 0
    for match in _ESCAPE.finditer(body):
        out += body[offset : match.start()].encode("utf-8")
        out += _escape_value(match)
        offset = match.end()
    rest = body[offset:]
    if "\\" in rest:
        raise ProtocolError("text format: string ends with a lone backslash")
    out += rest.encode("utf-8")
    return bytes(out)


def _escape_value(match: re.Match[str]) -> bytes:
    octal, hex_byte, short_unicode, long_unicode, simple = match.groups()
    if octal is not None:
        return bytes([int(octal, 8) & 0xFF])
    if hex_byte is not None:
        return bytes([int(hex_byte, 16)])
    code = short_unicode or long_unicode
    if code is not None:
        try:
            return chr(int(code, 16)).encode("utf-8")
        except (ValueError, UnicodeEncodeError):
            raise ProtocolError(f"text format: bad unicode escape \\u{code}") from None
    byte = _SIMPLE_ESCAPES.get(simple)
    if byte is None:
        raise ProtocolError(f"text format: bad escape \\{simple}")
    return bytes([byte])
