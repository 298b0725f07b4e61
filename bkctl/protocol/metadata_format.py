"""The values BookKeeper keeps in its metadata store, as bytes (see docs/formats/metadata.md).

- ledger metadata: `BookieMetadataFormatVersion\\t<v>\\n` then v3 (varint-length-delimited binary
  LedgerMetadataFormat, what Java 4.9+ writes and what we write), v2 (the same message in protobuf
  text format) or v1 (plain lines). Decoders read all three.
- under-replication: marks, locks, auditor votes and the layout are protobuf text; the three
  "last check" ctime nodes are binary protobuf with one int64; lostBookieRecoveryDelay is decimal text.
- cookies (`VERSION` files and `/ledgers/cookies/<bookie>`): a layout-version line, then CookieFormat text.
- bookie service info (`/ledgers/available/<bookie>`): binary BookieServiceInfoFormat.
- `/ledgers/LAYOUT` and `/ledgers/INSTANCEID`: plain text.

Every encoder writes the bytes Java writes for the same value, so a value we decode re-encodes byte
for byte; every decoder raises only ProtocolError.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.model import INVALID_ENTRY_ID, DigestType, LedgerMetadata, LedgerState, Segment
from bkctl.protocol import protobuf
from bkctl.protocol import text_format as tf
from bkctl.protocol.protobuf import Field
from bkctl.protocol.text_format import FieldSpec, Kind, MessageSpec

_E = TypeVar("_E", LedgerState, DigestType)

# ===================================================================================== message specs
# Field numbers and names from bookkeeper-proto/src/main/proto/DataFormats.proto.

_SEGMENT = MessageSpec(
    "Segment",
    (FieldSpec(1, "ensembleMember", Kind.STRING), FieldSpec(2, "firstEntryId", Kind.INT64)),
)
_CUSTOM_ENTRY = MessageSpec(
    "cMetadataMapEntry",
    (FieldSpec(1, "key", Kind.STRING), FieldSpec(2, "value", Kind.BYTES)),
)
_STATES = tuple((state.name, state.value) for state in LedgerState)
# Java's proto calls the MAC digest HMAC; the numbers are those of DigestType.
_DIGESTS = (("CRC32", 1), ("HMAC", 2), ("CRC32C", 3), ("DUMMY", 4))
LEDGER_METADATA_SPEC = MessageSpec(
    "LedgerMetadataFormat",
    (
        FieldSpec(1, "quorumSize", Kind.INT32),
        FieldSpec(2, "ensembleSize", Kind.INT32),
        FieldSpec(3, "length", Kind.INT64),
        FieldSpec(4, "lastEntryId", Kind.INT64),
        FieldSpec(5, "state", Kind.ENUM, enum=_STATES),
        FieldSpec(6, "segment", Kind.MESSAGE, message=_SEGMENT),
        FieldSpec(7, "digestType", Kind.ENUM, enum=_DIGESTS),
        FieldSpec(8, "password", Kind.BYTES),
        FieldSpec(9, "ackQuorumSize", Kind.INT32),
        FieldSpec(10, "ctime", Kind.INT64),
        FieldSpec(11, "customMetadata", Kind.MESSAGE, message=_CUSTOM_ENTRY),
        FieldSpec(12, "cToken", Kind.INT64),
    ),
)
_LAYOUT_SPEC = MessageSpec(
    "LedgerRereplicationLayoutFormat",
    (FieldSpec(1, "type", Kind.STRING), FieldSpec(2, "version", Kind.INT32)),
)
_UNDERREPLICATED_SPEC = MessageSpec(
    "UnderreplicatedLedgerFormat", (FieldSpec(1, "replica", Kind.STRING), FieldSpec(2, "ctime", Kind.INT64))
)
_COOKIE_SPEC = MessageSpec(
    "CookieFormat",
    (
        FieldSpec(1, "bookieHost", Kind.STRING),
        FieldSpec(2, "journalDir", Kind.STRING),
        FieldSpec(3, "ledgerDirs", Kind.STRING),
        FieldSpec(4, "instanceId", Kind.STRING),
        FieldSpec(5, "indexDirs", Kind.STRING),
    ),
)
# LockDataFormat and AuditorVoteFormat have the same single field.
_BOOKIE_ID_SPEC = MessageSpec("LockDataFormat", (FieldSpec(1, "bookieId", Kind.STRING),))

# Text values other than ledger metadata are small; ZooKeeper's own znode limit is 1 MiB.
_TEXT_VALUE_SIZE_MAX = limits.METADATA_VALUE_SIZE_MAX


# ============================================================================================ helpers


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not UTF-8 text") from None


def _check_size(data: bytes, size_max: int, what: str) -> None:
    if len(data) > size_max:
        raise ProtocolError(f"{what} is {len(data)} bytes, more than {size_max}")


def _java_int(text: str, what: str, bits: int = 32) -> int:
    """Parse a decimal like Java's Integer.parseInt / Long.parseLong (optional sign, ASCII digits)."""
    digits = text[1:] if text[:1] in ("-", "+") else text
    if not digits or not digits.isascii() or not digits.isdigit() or len(digits) > 20:
        raise ProtocolError(f"{what}: {text!r} is not a number")
    value = int(text)
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise ProtocolError(f"{what}: {text} does not fit in {bits} bits")
    return value


def _java_lines(text: str) -> list[str]:
    """Lines as Java's BufferedReader.readLine returns them (LF, CR or CR LF end a line)."""
    lines = re.split(r"\r\n|\r|\n", text)
    return lines[:-1] if lines and not lines[-1] else lines


def _only(fields: Iterable[Field], spec: MessageSpec) -> dict[int, list[Field]]:
    """Group fields by number; numbers the spec does not know are skipped, as Java keeps them aside."""
    groups: dict[int, list[Field]] = {}
    for f in fields:
        if spec.by_number(f.number) is not None:
            groups.setdefault(f.number, []).append(f)
    return groups


def _last_int(groups: dict[int, list[Field]], number: int) -> int | None:
    found = groups.get(number)
    return None if not found else protobuf.expect_int(found[-1])


def _last_text(groups: dict[int, list[Field]], number: int) -> str | None:
    found = groups.get(number)
    return None if not found else protobuf.expect_text(found[-1])


def _missing(spec: MessageSpec, number: int) -> ProtocolError:
    field = spec.by_number(number)
    return ProtocolError(f"{spec.name} lacks required field {field.name if field else number}")


def _required_int(groups: dict[int, list[Field]], spec: MessageSpec, number: int) -> int:
    value = _last_int(groups, number)
    if value is None:
        raise _missing(spec, number)
    return value


def _required_text(groups: dict[int, list[Field]], spec: MessageSpec, number: int) -> str:
    value = _last_text(groups, number)
    if value is None:
        raise _missing(spec, number)
    return value


def _text_field(number: int, value: str) -> Field:
    return protobuf.bytes_field(number, value.encode("utf-8"))


def _parse_text(data: bytes, spec: MessageSpec, size_max: int) -> dict[int, list[Field]]:
    _check_size(data, size_max, spec.name)
    return _only(tf.parse_message(data, spec), spec)


# ==================================================================================== ledger metadata

LEDGER_METADATA_HEADER = b"BookieMetadataFormatVersion\t"
LEDGER_METADATA_FORMAT_VERSION = 3
_VERSION_DIGITS_MAX = 10  # format fact: as Java's reader
_V1_CLOSED = "CLOSED"
_V1_IN_RECOVERY_ENTRY_ID = -102


def ledger_metadata_format_version(data: bytes) -> int:
    """The format version (1, 2 or 3) in a ledger metadata value's header line."""
    return _split_header(data)[0]


def _split_header(data: bytes) -> tuple[int, bytes]:
    _check_size(data, limits.LEDGER_METADATA_SIZE_MAX, "ledger metadata")
    if not data.startswith(LEDGER_METADATA_HEADER):
        raise ProtocolError("ledger metadata does not start with BookieMetadataFormatVersion")
    start = len(LEDGER_METADATA_HEADER)
    end = data.find(b"\n", start, start + _VERSION_DIGITS_MAX + 1)
    if end < 0:
        raise ProtocolError("ledger metadata header has no end of line after the version")
    version = _java_int(_text(data[start:end], "ledger metadata version"), "ledger metadata version")
    if version not in (1, 2, 3):
        raise ProtocolError(f"ledger metadata format version {version} is not 1, 2 or 3")
    return version, data[end + 1 :]


def decode_ledger_metadata(data: bytes) -> LedgerMetadata:
    """Decode a ledger metadata value of format v1, v2 or v3."""
    version, body = _split_header(data)
    if version == 3:
        return _ledger_from_fields(protobuf.iter_fields(_delimited(body)))
    if version == 2:
        return _ledger_from_fields(tf.parse_message(body, LEDGER_METADATA_SPEC))
    return _decode_v1(body)


def _delimited(body: bytes) -> bytes:
    size, offset = protobuf.decode_varint(body, 0)
    if size > len(body) - offset:
        raise ProtocolError(f"ledger metadata: message length {size} runs past the value")
    if offset + size != len(body):
        raise ProtocolError(f"ledger metadata: {len(body) - offset - size} bytes after the message")
    return body[offset:]


def _ledger_from_fields(fields: Iterable[Field]) -> LedgerMetadata:
    spec = LEDGER_METADATA_SPEC
    groups = _only(fields, spec)
    write_quorum = tf.int32(_required_int(groups, spec, 1))
    ensemble_size = tf.int32(_required_int(groups, spec, 2))
    length = protobuf.as_signed64(_required_int(groups, spec, 3))
    state = _enum(LedgerState, _required_int(groups, spec, 5), "state")
    stored_last = _last_int(groups, 4)
    # An absent lastEntryId reads as the proto default 0 for a closed ledger, as Java reads it.
    default_last = 0 if state is LedgerState.CLOSED else INVALID_ENTRY_ID
    digest_number = _last_int(groups, 7)
    ack_quorum = _last_int(groups, 9)
    ctime = _last_int(groups, 10)
    c_token = _last_int(groups, 12)
    password = groups.get(8)
    return LedgerMetadata(
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=write_quorum if ack_quorum is None else tf.int32(ack_quorum),
        segments=_with_segments(tuple(_segment(protobuf.expect_bytes(f)) for f in groups.get(6, ()))),
        state=state,
        last_entry_id=default_last if stored_last is None else protobuf.as_signed64(stored_last),
        length=length,
        digest=None if digest_number is None else _enum(DigestType, digest_number, "digestType"),
        password=None if password is None else _password(protobuf.expect_bytes(password[-1])),
        ctime=None if ctime is None else protobuf.as_signed64(ctime),
        custom_metadata=_custom_metadata(groups.get(11, ())),
        c_token=None if c_token is None else protobuf.as_signed64(c_token),
        ack_quorum_stored=ack_quorum is not None,
    )


def _with_segments(segments: tuple[Segment, ...]) -> tuple[Segment, ...]:
    # Java refuses metadata without an ensemble; a reader could not place a single entry.
    if not segments:
        raise ProtocolError("ledger metadata has no segments")
    return segments


def _enum(enum: type[_E], number: int, what: str) -> _E:
    try:
        return enum(number)
    except ValueError:
        raise ProtocolError(f"ledger metadata: unknown {what} {number}") from None


def _password(value: bytes) -> bytes:
    if len(value) > limits.PASSWORD_SIZE_MAX:
        raise ProtocolError(f"ledger metadata: password of {len(value)} bytes")
    return value


def _segment(data: bytes) -> Segment:
    groups = _only(protobuf.iter_fields(data), _SEGMENT)
    first = protobuf.as_signed64(_required_int(groups, _SEGMENT, 2))
    members = groups.get(1, [])
    if len(members) > limits.ENSEMBLE_SIZE_MAX:
        raise ProtocolError(f"ledger metadata: segment of {len(members)} bookies")
    return Segment(first, tuple(protobuf.expect_text(f) for f in members))


def _custom_metadata(entries: Sequence[Field]) -> tuple[tuple[str, bytes], ...]:
    if len(entries) > limits.CUSTOM_METADATA_MAX:
        raise ProtocolError(f"ledger metadata: {len(entries)} custom metadata entries")
    pairs: list[tuple[str, bytes]] = []
    for entry in entries:
        groups = _only(protobuf.iter_fields(protobuf.expect_bytes(entry)), _CUSTOM_ENTRY)
        value = groups.get(2)
        pairs.append((_last_text(groups, 1) or "", b"" if not value else protobuf.expect_bytes(value[-1])))
    # Java collects them into a map and fails on a repeated key; so do we.
    if len({key for key, _ in pairs}) != len(pairs):
        raise ProtocolError("ledger metadata: a custom metadata key appears twice")
    return tuple(pairs)


def _decode_v1(body: bytes) -> LedgerMetadata:
    lines = _java_lines(_text(body, "ledger metadata v1"))
    if len(lines) < 3:
        raise ProtocolError("ledger metadata v1 needs quorum, ensemble size and length lines")
    if len(lines) > limits.SEGMENTS_MAX + 4:
        raise ProtocolError("ledger metadata v1 has too many lines")
    write_quorum = _java_int(lines[0], "v1 quorum size")
    ensemble_size = _java_int(lines[1], "v1 ensemble size")
    length = _java_int(lines[2], "v1 length", 64)
    segments: list[Segment] = []
    state, last_entry_id, closed_length = LedgerState.OPEN, INVALID_ENTRY_ID, 0
    for line in lines[3:]:
        parts = line.split("\t")
        if len(parts) < 2:
            raise ProtocolError(f"ledger metadata v1: bad line {line[:80]!r}")
        if parts[1] == _V1_CLOSED:
            last = _java_int(parts[0], "v1 last entry id", 64)
            if last == _V1_IN_RECOVERY_ENTRY_ID:
                state = LedgerState.IN_RECOVERY
            else:
                state, last_entry_id, closed_length = LedgerState.CLOSED, last, length
            break
        segments.append(Segment(_java_int(parts[0], "v1 first entry id", 64), tuple(parts[1:])))
    return LedgerMetadata(
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=write_quorum,
        segments=_with_segments(tuple(segments)),
        state=state,
        last_entry_id=last_entry_id,
        length=closed_length,
        digest=None,
        password=None,
    )


def encode_ledger_metadata(md: LedgerMetadata, format_version: int = LEDGER_METADATA_FORMAT_VERSION) -> bytes:
    """Encode as Java's LedgerMetadataSerDe does: v3 (the default and what bkctl writes), v2 or v1."""
    header = LEDGER_METADATA_HEADER + str(format_version).encode() + b"\n"
    if format_version == 3:
        body = protobuf.encode_fields(_ledger_fields(md, with_c_token=True))
        return header + protobuf.encode_varint(len(body)) + body
    if format_version == 2:
        return header + tf.print_message(_ledger_fields(md, with_c_token=False), LEDGER_METADATA_SPEC)
    if format_version == 1:
        return header + _encode_v1(md)
    raise ProtocolError(f"ledger metadata format version {format_version} is not 1, 2 or 3")


def _ledger_fields(md: LedgerMetadata, with_c_token: bool) -> list[Field]:
    """Fields in field-number order, the ones Java sets: a decoded value re-encodes byte for byte."""
    fields = [
        protobuf.varint_field(1, md.write_quorum),
        protobuf.varint_field(2, md.ensemble_size),
        protobuf.varint_field(3, md.length),
        protobuf.varint_field(4, md.last_entry_id),
        protobuf.varint_field(5, md.state.value),
    ]
    for segment in md.segments:
        members = [_text_field(1, bookie) for bookie in segment.ensemble]
        body = protobuf.encode_fields([*members, protobuf.varint_field(2, segment.first_entry_id)])
        fields.append(protobuf.bytes_field(6, body))
    if md.digest is not None:
        fields.append(protobuf.varint_field(7, md.digest.value))
    if md.password is not None:
        fields.append(protobuf.bytes_field(8, md.password))
    if md.ack_quorum_stored:
        fields.append(protobuf.varint_field(9, md.ack_quorum))
    if md.ctime is not None:
        fields.append(protobuf.varint_field(10, md.ctime))
    for key, value in md.custom_metadata:
        entry = protobuf.encode_fields([_text_field(1, key), protobuf.bytes_field(2, value)])
        fields.append(protobuf.bytes_field(11, entry))
    if with_c_token and md.c_token is not None:
        fields.append(protobuf.varint_field(12, md.c_token))
    return fields


def _encode_v1(md: LedgerMetadata) -> bytes:
    lines = [str(md.write_quorum), str(md.ensemble_size), str(md.length)]
    lines += ["\t".join([str(s.first_entry_id), *s.ensemble]) for s in md.segments]
    text = "\n".join(lines) + "\n"
    if md.state is LedgerState.IN_RECOVERY:
        text += f"{_V1_IN_RECOVERY_ENTRY_ID}\t{_V1_CLOSED}"
    elif md.state is LedgerState.CLOSED:
        text += f"{md.last_entry_id}\t{_V1_CLOSED}"
    return text.encode("utf-8")


def format_ledger_metadata_java(
    md: LedgerMetadata, format_version: int = LEDGER_METADATA_FORMAT_VERSION
) -> str:
    """Java's `LedgerMetadata.toString()` of this metadata (what `bookkeeper shell ledgermetadata` shows)."""
    parts = [
        f"formatVersion={format_version}",
        f"ensembleSize={md.ensemble_size}",
        f"writeQuorumSize={md.write_quorum}",
        f"ackQuorumSize={md.ack_quorum}",
        f"state={md.state.name}",
    ]
    if md.state is LedgerState.CLOSED:
        parts += [f"length={md.length}", f"lastEntryId={md.last_entry_id}"]
    if md.password is not None:
        # Java reads an absent digest type as the proto default, CRC32.
        parts.append(f"digestType={(md.digest or DigestType.CRC32).name}")
        parts.append(f"password=base64:{_base64(md.password)}")
    # Java keeps ensembles in a map sorted by first entry id (a repeated id keeps the last ensemble).
    ensembles = {s.first_entry_id: s.ensemble for s in md.segments}
    shown = ", ".join(f"{first}=[{', '.join(ensembles[first])}]" for first in sorted(ensembles))
    parts.append(f"ensembles={{{shown}}}")
    custom = ", ".join(
        f"{key}=base64:{_base64(value)}" for key, value in _java_hash_map_order(md.custom_metadata)
    )
    parts.append(f"customMetadata={{{custom}}}")
    return "LedgerMetadata{" + ", ".join(parts) + "}"


def _base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _java_hash_map_order(pairs: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The iteration order of a java.util.HashMap filled with these pairs in order.

    Java prints custom metadata from a HashMap: buckets in index order, insertion order within one.
    (Buckets of 8+ colliding keys become trees in Java; not modelled, it needs deliberate collisions.)
    """
    capacity = 16
    while len(pairs) > capacity * 3 // 4:
        capacity *= 2
    indexed = [(_java_spread(_java_string_hash(key)) & (capacity - 1), i) for i, (key, _) in enumerate(pairs)]
    return [pairs[i] for _, i in sorted(indexed)]


def _java_string_hash(text: str) -> int:
    value = 0
    units = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(units), 2):
        value = (value * 31 + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return value


def _java_spread(hash_code: int) -> int:
    return hash_code ^ (hash_code >> 16)


# =================================================================================== underreplication


@dataclass(frozen=True)
class UnderreplicatedLedger:
    """An under-replication mark: the bookies missing replicas, and when it was marked (ms) if stored."""

    replicas: tuple[str, ...]
    ctime: int | None = None


def encode_underreplicated_ledger(mark: UnderreplicatedLedger) -> bytes:
    fields = [_text_field(1, replica) for replica in mark.replicas]
    if mark.ctime is not None:
        fields.append(protobuf.varint_field(2, mark.ctime))
    return tf.print_message(fields, _UNDERREPLICATED_SPEC)


def decode_underreplicated_ledger(data: bytes) -> UnderreplicatedLedger:
    groups = _parse_text(data, _UNDERREPLICATED_SPEC, _TEXT_VALUE_SIZE_MAX)
    ctime = _last_int(groups, 2)
    return UnderreplicatedLedger(
        replicas=tuple(protobuf.expect_text(f) for f in groups.get(1, ())),
        ctime=None if ctime is None else protobuf.as_signed64(ctime),
    )


def encode_lock_data(bookie_id: str | None) -> bytes:
    """A replication lock's data: who holds it (Java writes the worker's host name; may be absent)."""
    return tf.print_message([] if bookie_id is None else [_text_field(1, bookie_id)], _BOOKIE_ID_SPEC)


def decode_lock_data(data: bytes) -> str | None:
    return _last_text(_parse_text(data, _BOOKIE_ID_SPEC, _TEXT_VALUE_SIZE_MAX), 1)


def encode_auditor_vote(bookie_id: str | None) -> bytes:
    """An auditor election vote (`auditorelection/V_<seq>`, and the winner's copy in `auditorelection`)."""
    return encode_lock_data(bookie_id)


def decode_auditor_vote(data: bytes) -> str | None:
    return decode_lock_data(data)


@dataclass(frozen=True)
class UnderreplicationLayout:
    """`/ledgers/underreplication/LAYOUT`; Java only knows type BASIC, version 1."""

    type: str = "BASIC"
    version: int = 1


def encode_underreplication_layout(layout: UnderreplicationLayout = UnderreplicationLayout()) -> bytes:
    return tf.print_message(
        [_text_field(1, layout.type), protobuf.varint_field(2, layout.version)], _LAYOUT_SPEC
    )


def decode_underreplication_layout(data: bytes) -> UnderreplicationLayout:
    groups = _parse_text(data, _LAYOUT_SPEC, _TEXT_VALUE_SIZE_MAX)
    return UnderreplicationLayout(
        type=_required_text(groups, _LAYOUT_SPEC, 1),
        version=tf.int32(_required_int(groups, _LAYOUT_SPEC, 2)),
    )


def encode_check_ctime(ctime_ms: int | None) -> bytes:
    """`checkallledgersctime`, `placementpolicycheckctime`, `replicascheckctime`: one optional int64."""
    return b"" if ctime_ms is None else protobuf.encode_fields([protobuf.varint_field(1, ctime_ms)])


def decode_check_ctime(data: bytes) -> int | None:
    """The stored time in ms, or None when the field is absent (Java then reports -1)."""
    _check_size(data, _TEXT_VALUE_SIZE_MAX, "check ctime")
    value = None
    for f in protobuf.iter_fields(data):
        if f.number == 1:
            value = protobuf.as_signed64(protobuf.expect_int(f))
    return value


def encode_lost_bookie_recovery_delay(delay_s: int) -> bytes:
    """`lostBookieRecoveryDelay`: seconds as Java's Integer.toString."""
    if not -(1 << 31) <= delay_s < 1 << 31:
        raise ProtocolError(f"lostBookieRecoveryDelay {delay_s} does not fit in an int")
    return str(delay_s).encode("ascii")


def decode_lost_bookie_recovery_delay(data: bytes) -> int:
    _check_size(data, 32, "lostBookieRecoveryDelay")
    return _java_int(_text(data, "lostBookieRecoveryDelay"), "lostBookieRecoveryDelay")


# ============================================================================================ cookies

COOKIE_LAYOUT_VERSION = 5
# Layout 4 (BookKeeper <= 4.15) and 5 (adds indexDirs) are protobuf text; 3 was plain lines.
_COOKIE_TEXT_LAYOUT_MIN = 4
_DIRS_SEPARATOR = "\t"
_JOURNAL_DIRS_SEPARATOR = ","


@dataclass(frozen=True)
class Cookie:
    """A bookie's identity and directories, kept in every `current/VERSION` and in the metadata store."""

    layout_version: int
    bookie_id: str
    journal_dirs: tuple[str, ...]
    ledger_dirs: tuple[str, ...]
    instance_id: str | None = None
    index_dirs: tuple[str, ...] | None = None

    @classmethod
    def create(
        cls,
        bookie_id: str,
        journal_dirs: Sequence[str],
        ledger_dirs: Sequence[str],
        instance_id: str | None = None,
        index_dirs: Sequence[str] | None = None,
    ) -> Cookie:
        """A new cookie in the layout bkctl writes."""
        return cls(
            COOKIE_LAYOUT_VERSION,
            bookie_id,
            tuple(journal_dirs),
            tuple(ledger_dirs),
            instance_id,
            None if index_dirs is None else tuple(index_dirs),
        )


def encode_cookie(cookie: Cookie) -> bytes:
    """The cookie text as Java writes it, keeping the cookie's layout version (4 or 5 and up)."""
    if cookie.layout_version < _COOKIE_TEXT_LAYOUT_MIN:
        raise ProtocolError(f"cookie layout {cookie.layout_version} is read-only: write layout 4 or later")
    fields = [
        _text_field(1, cookie.bookie_id),
        _text_field(2, _join_journal_dirs(cookie.journal_dirs)),
        _text_field(3, _encode_dirs(cookie.ledger_dirs)),
    ]
    if cookie.instance_id is not None:
        fields.append(_text_field(4, cookie.instance_id))
    if cookie.index_dirs is not None:
        fields.append(_text_field(5, _encode_dirs(cookie.index_dirs)))
    return f"{cookie.layout_version}\n".encode() + tf.print_message(fields, _COOKIE_SPEC)


def _join_journal_dirs(dirs: tuple[str, ...]) -> str:
    if any(not d or _JOURNAL_DIRS_SEPARATOR in d for d in dirs):
        raise ProtocolError(f"cookie: a journal directory is empty or contains ',': {dirs}")
    return _JOURNAL_DIRS_SEPARATOR.join(dirs)


def _encode_dirs(dirs: tuple[str, ...]) -> str:
    """`<count>\\t<dir>\\t<dir>`: how cookies store ledger and index directories."""
    if any(not d or _DIRS_SEPARATOR in d for d in dirs):
        raise ProtocolError(f"cookie: a directory is empty or contains a tab: {dirs}")
    return _DIRS_SEPARATOR.join([str(len(dirs)), *dirs])


def _decode_dirs(text: str, what: str) -> tuple[str, ...]:
    count, *dirs = text.split(_DIRS_SEPARATOR)
    if _java_int(count, f"cookie {what} count") != len(dirs) or not all(dirs):
        raise ProtocolError(f"cookie {what} {text!r}: count does not match the directories")
    return tuple(dirs)


def _split_journal_dirs(text: str) -> tuple[str, ...]:
    return tuple(text.split(_JOURNAL_DIRS_SEPARATOR)) if text else ()


def decode_cookie(data: bytes) -> Cookie:
    """Decode a cookie: layout >= 4 as protobuf text; layout 3 as three plain lines; older as empty."""
    _check_size(data, _TEXT_VALUE_SIZE_MAX, "cookie")
    first, _, rest = data.partition(b"\n")
    layout = _java_int(_text(first, "cookie layout version").strip(), "cookie layout version")
    if layout < 1:
        raise ProtocolError(f"cookie layout version {layout} is not positive")
    if layout >= _COOKIE_TEXT_LAYOUT_MIN:
        return _decode_cookie_text(layout, rest)
    if layout == 3:
        lines = _java_lines(_text(rest, "cookie"))
        if len(lines) < 3:
            raise ProtocolError("cookie layout 3 needs bookie id, journal dirs and ledger dirs lines")
        return Cookie(3, lines[0], _split_journal_dirs(lines[1]), _decode_dirs(lines[2], "ledger dirs"))
    # Layouts 1 and 2 predate cookies: a layout 2 VERSION file held only the number (1 had none).
    return Cookie(layout, "", (), ())


def _decode_cookie_text(layout: int, text: bytes) -> Cookie:
    groups = _parse_text(text, _COOKIE_SPEC, _TEXT_VALUE_SIZE_MAX)
    # Java treats an empty instanceId or indexDirs as absent.
    instance_id = _last_text(groups, 4) or None
    index_dirs = _last_text(groups, 5) or None
    return Cookie(
        layout_version=layout,
        bookie_id=_required_text(groups, _COOKIE_SPEC, 1),
        journal_dirs=_split_journal_dirs(_required_text(groups, _COOKIE_SPEC, 2)),
        ledger_dirs=_decode_dirs(_required_text(groups, _COOKIE_SPEC, 3), "ledger dirs"),
        instance_id=instance_id,
        index_dirs=None if index_dirs is None else _decode_dirs(index_dirs, "index dirs"),
    )


def cookie_mismatch(expected: Cookie, found: Cookie) -> list[str]:
    """Every way `found` (a stored cookie) differs from `expected` (this bookie's), in an operator's words.

    Mirrors Java's check: the layout version only matters below 3; index directories default to the
    ledger directories when a cookie has none. An empty list means the cookies match.
    """
    if found.layout_version < 3 and found.layout_version != expected.layout_version:
        return [f"the stored cookie has layout version {found.layout_version}, too old to compare"]
    problems: list[str] = []

    def compare(what: str, mine: object, stored: object) -> None:
        if mine != stored:
            problems.append(
                f"{what} differ: this bookie has {_show(mine)}, the stored cookie has {_show(stored)}"
            )

    compare("bookie ids", expected.bookie_id, found.bookie_id)
    compare("journal directories", expected.journal_dirs, found.journal_dirs)
    compare("ledger directories", expected.ledger_dirs, found.ledger_dirs)
    compare(
        "index directories",
        expected.index_dirs or expected.ledger_dirs,
        found.index_dirs or found.ledger_dirs,
    )
    compare("cluster instance ids", expected.instance_id, found.instance_id)
    return problems


def _show(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ", ".join(value) if value else "none"
    return str(value)


# ============================================================================== bookie service info


@dataclass(frozen=True)
class BookieEndpoint:
    """One endpoint a bookie serves (BookieServiceInfoFormat.Endpoint), e.g. `bookie-rpc` or `http`."""

    id: str
    port: int
    host: str
    protocol: str
    auth: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()


@dataclass(frozen=True)
class BookieServiceInfo:
    """The data of `/ledgers/available/<bookie>`: endpoints and free-form properties, in stored order."""

    endpoints: tuple[BookieEndpoint, ...] = ()
    properties: tuple[tuple[str, str], ...] = ()


_ENDPOINT = MessageSpec(
    "Endpoint",
    (
        FieldSpec(1, "id", Kind.STRING),
        FieldSpec(2, "port", Kind.INT32),
        FieldSpec(3, "host", Kind.STRING),
        FieldSpec(4, "protocol", Kind.STRING),
        FieldSpec(5, "auth", Kind.STRING),
        FieldSpec(6, "extensions", Kind.STRING),
    ),
)
_PROPERTY = MessageSpec(
    "PropertiesEntry", (FieldSpec(1, "key", Kind.STRING), FieldSpec(2, "value", Kind.STRING))
)
_SERVICE_INFO = MessageSpec(
    "BookieServiceInfoFormat",
    (
        FieldSpec(6, "endpoints", Kind.MESSAGE, message=_ENDPOINT),
        FieldSpec(7, "properties", Kind.MESSAGE, message=_PROPERTY),
    ),
)


def encode_bookie_service_info(info: BookieServiceInfo) -> bytes:
    fields = [protobuf.bytes_field(6, _encode_endpoint(e)) for e in info.endpoints]
    for key, value in info.properties:
        entry = protobuf.encode_fields([_text_field(1, key), _text_field(2, value)])
        fields.append(protobuf.bytes_field(7, entry))
    return protobuf.encode_fields(fields)


def _encode_endpoint(endpoint: BookieEndpoint) -> bytes:
    fields = [
        _text_field(1, endpoint.id),
        protobuf.varint_field(2, endpoint.port),
        _text_field(3, endpoint.host),
        _text_field(4, endpoint.protocol),
        *(_text_field(5, a) for a in endpoint.auth),
        *(_text_field(6, x) for x in endpoint.extensions),
    ]
    return protobuf.encode_fields(fields)


def decode_bookie_service_info(data: bytes) -> BookieServiceInfo:
    """Decode service info; empty data (bookies before 4.12) decodes to no endpoints."""
    _check_size(data, _TEXT_VALUE_SIZE_MAX, "bookie service info")
    groups = _only(protobuf.iter_fields(data), _SERVICE_INFO)
    properties: list[tuple[str, str]] = []
    for entry in groups.get(7, ()):
        pair = _only(protobuf.iter_fields(protobuf.expect_bytes(entry)), _PROPERTY)
        properties.append((_last_text(pair, 1) or "", _last_text(pair, 2) or ""))
    endpoints = tuple(_decode_endpoint(protobuf.expect_bytes(f)) for f in groups.get(6, ()))
    return BookieServiceInfo(endpoints, tuple(properties))


def _decode_endpoint(data: bytes) -> BookieEndpoint:
    groups = _only(protobuf.iter_fields(data), _ENDPOINT)
    return BookieEndpoint(
        id=_required_text(groups, _ENDPOINT, 1),
        port=tf.int32(_required_int(groups, _ENDPOINT, 2)),
        host=_required_text(groups, _ENDPOINT, 3),
        protocol=_required_text(groups, _ENDPOINT, 4),
        auth=tuple(protobuf.expect_text(f) for f in groups.get(5, ())),
        extensions=tuple(protobuf.expect_text(f) for f in groups.get(6, ())),
    )


# ================================================================================ LAYOUT, INSTANCEID

HIERARCHICAL_LEDGER_MANAGER = "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory"


@dataclass(frozen=True)
class LedgerLayout:
    """`/ledgers/LAYOUT`: `<layout format version>\\n<ledger manager factory class>:<manager version>`."""

    manager_factory_class: str = HIERARCHICAL_LEDGER_MANAGER
    manager_version: int = 1
    layout_format_version: int = 2


def encode_ledger_layout(layout: LedgerLayout = LedgerLayout()) -> bytes:
    if ":" in layout.manager_factory_class or "\n" in layout.manager_factory_class:
        raise ProtocolError(f"ledger layout: bad factory class {layout.manager_factory_class!r}")
    text = f"{layout.layout_format_version}\n{layout.manager_factory_class}:{layout.manager_version}"
    return text.encode("utf-8")


def decode_ledger_layout(data: bytes) -> LedgerLayout:
    _check_size(data, _TEXT_VALUE_SIZE_MAX, "ledger layout")
    lines = _text(data, "ledger layout").split("\n")
    version = _java_int(lines[0], "ledger layout format version")
    if not 1 <= version <= 2:
        raise ProtocolError(f"ledger layout format version {version} is not 1 or 2")
    if len(lines) != 2:
        raise ProtocolError("ledger layout needs exactly two lines: version, then class:version")
    factory, sep, manager_version = lines[1].partition(":")
    if not sep or ":" in manager_version:
        raise ProtocolError(f"ledger layout: bad ledger manager {lines[1][:200]!r}")
    return LedgerLayout(factory, _java_int(manager_version, "ledger manager version"), version)


def encode_instance_id(instance_id: str) -> bytes:
    """`/ledgers/INSTANCEID`: the cluster's UUID as text, no newline."""
    return instance_id.encode("utf-8")


def decode_instance_id(data: bytes) -> str:
    _check_size(data, _TEXT_VALUE_SIZE_MAX, "instance id")
    return _text(data, "instance id")
