"""Bookie journal files (`<hex id>.txn`), their records, and the `lastMark` checkpoint file.

Layout (big-endian, docs/formats/storage.md):
  header   V1: none; V2-V4: "BKLG" + int32 version (8 bytes); V5+: the same, zero-padded to 512 bytes.
  record   int32 length N + N bytes; N == 0 ends the valid data (preallocated zeros);
           N == PADDING_MASK (V5+): int32 P then P padding bytes; any other N < 0 is corrupt.
  bodies   a packaged entry (entry id >= 0), or ledger id + a special entry id: master key (-0x1000,
           int32 key length + key), fence (-0x2000, nothing more), explicit LAC (-0x8000, int32 length
           + LAC body).
  lastMark 16 bytes: int64 journal id + int64 offset in that journal (where replay starts).

Scanning is sans-I/O and resumable: `scan_records` walks a buffer and says whether it reached the end
of the journal, needs more bytes (the caller reads on and calls again from `stop.position`), or met
corrupt bytes (and where).
"""

from __future__ import annotations

import struct
from collections.abc import Generator
from enum import StrEnum
from typing import Final

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.model import (
    METAENTRY_ID_FENCE_KEY,
    METAENTRY_ID_LEDGER_EXPLICITLAC,
    METAENTRY_ID_LEDGER_KEY,
)
from bkctl.protocol.scanning import ScanStop, StopStatus

MAGIC: Final = b"BKLG"
VERSION_MIN: Final = 1
VERSION_MAX: Final = 6  # format fact
V_HEADER: Final = 2  # first version with the "BKLG" header
V_MASTER_KEY: Final = 3
V_FENCE: Final = 4
V_PADDING: Final = 5  # header padded to a sector; padding records
V_EXPLICIT_LAC: Final = 6
SECTOR_SIZE: Final = 512
DEFAULT_ALIGNMENT: Final = 512
PADDING_MASK: Final = -0x100
# A padding record is its length word (PADDING_MASK) plus the int32 pad length.
PADDING_HEADER_SIZE: Final = 8
# ledger id + entry id: every record body starts with them.
RECORD_KEY_SIZE: Final = 16
LAST_MARK_SIZE: Final = 16
JOURNAL_SUFFIX: Final = ".txn"

_INT32: Final = struct.Struct(">i")
_LONG: Final = struct.Struct(">q")
_KEY: Final = struct.Struct(">qq")
_KEY_LEN: Final = struct.Struct(">qqi")
_LAST_MARK: Final = struct.Struct(">qq")
_HEADER: Final = struct.Struct(">4si")


class RecordKind(StrEnum):
    DATA = "DATA"
    MASTER_KEY = "MASTER_KEY"
    FENCE = "FENCE"
    EXPLICIT_LAC = "EXPLICIT_LAC"
    PADDING = "PADDING"
    UNKNOWN = "UNKNOWN"  # a negative entry id we do not know; Java's replay skips these too


# --- header ------------------------------------------------------------------------------------------


def data_start(version: int) -> int:
    """Offset of the first record: 512 for V5+, 8 for V2-V4, 0 for V1."""
    if version >= V_PADDING:
        return SECTOR_SIZE
    return _HEADER.size if version >= V_HEADER else 0


def decode_header(data: bytes | memoryview) -> int:
    """The journal's format version; V1 (no header) when the magic is absent, as BookKeeper assumes."""
    if len(data) < _HEADER.size or bytes(data[:4]) != MAGIC:
        return VERSION_MIN
    _, version = _HEADER.unpack_from(data)
    if not VERSION_MIN < version <= VERSION_MAX:
        raise ProtocolError(f"unsupported journal version {version} (supported {V_HEADER}..{VERSION_MAX})")
    return int(version)


def encode_header(version: int) -> bytes:
    """The header a new journal of `version` starts with (empty for V1, sector-padded for V5+)."""
    if not VERSION_MIN <= version <= VERSION_MAX:
        raise ProtocolError(f"unsupported journal version {version}")
    if version == VERSION_MIN:
        return b""
    return _HEADER.pack(MAGIC, version).ljust(data_start(version), b"\0")


# --- records: encoding -------------------------------------------------------------------------------


def encode_record(body: bytes) -> bytes:
    """Frame one record body with its int32 length."""
    if not 0 < len(body) <= limits.JOURNAL_RECORD_SIZE_MAX:
        raise ProtocolError(f"journal record of {len(body)} bytes is empty or over the limit")
    return _INT32.pack(len(body)) + body


def encode_master_key(ledger_id: int, key: bytes) -> bytes:
    """Body of the record a bookie writes when it first sees a ledger (V3+)."""
    if len(key) > limits.MASTER_KEY_SIZE_MAX:
        raise ProtocolError(f"master key of {len(key)} bytes exceeds {limits.MASTER_KEY_SIZE_MAX}")
    return _KEY_LEN.pack(ledger_id, METAENTRY_ID_LEDGER_KEY, len(key)) + key


def encode_fence(ledger_id: int) -> bytes:
    """Body of a fence record (V4+)."""
    return _KEY.pack(ledger_id, METAENTRY_ID_FENCE_KEY)


def encode_explicit_lac(ledger_id: int, lac_body: bytes) -> bytes:
    """Body of an explicit-LAC record (V6+); `lac_body` comes from entry.encode_lac_body."""
    if len(lac_body) > limits.EXPLICIT_LAC_SIZE_MAX:
        raise ProtocolError(f"explicit LAC of {len(lac_body)} bytes exceeds {limits.EXPLICIT_LAC_SIZE_MAX}")
    return _KEY_LEN.pack(ledger_id, METAENTRY_ID_LEDGER_EXPLICITLAC, len(lac_body)) + lac_body


def padding_size(position: int, alignment: int = DEFAULT_ALIGNMENT) -> int | None:
    """Pad length P of the padding record written at `position`, or None when already aligned.

    The whole record (8-byte header + P bytes) ends on the next alignment boundary, or the one after
    when fewer than 8 bytes are left; this is BookKeeper's rule, so our journals align like Java's.
    """
    if alignment < 2 * PADDING_HEADER_SIZE:
        raise ProtocolError(f"journal alignment {alignment} is too small")
    if position % alignment == 0:
        return None
    pad = alignment - position % alignment
    return alignment - (PADDING_HEADER_SIZE - pad) if pad < PADDING_HEADER_SIZE else pad - PADDING_HEADER_SIZE


def encode_padding(position: int, alignment: int = DEFAULT_ALIGNMENT) -> bytes:
    """The padding record to write at `position` before a flush (b"" when already aligned)."""
    pad = padding_size(position, alignment)
    if pad is None:
        return b""
    return _INT32.pack(PADDING_MASK) + _INT32.pack(pad) + bytes(pad)


# --- records: decoding -------------------------------------------------------------------------------


def classify(body: bytes | memoryview) -> RecordKind:
    """Kind of a record body from its entry id (the body must hold at least 16 bytes)."""
    entry_id = _KEY.unpack_from(body)[1]
    if entry_id >= 0:
        return RecordKind.DATA
    return _SPECIAL_KINDS.get(entry_id, RecordKind.UNKNOWN)


_SPECIAL_KINDS: Final = {
    METAENTRY_ID_LEDGER_KEY: RecordKind.MASTER_KEY,
    METAENTRY_ID_FENCE_KEY: RecordKind.FENCE,
    METAENTRY_ID_LEDGER_EXPLICITLAC: RecordKind.EXPLICIT_LAC,
}


def record_key(body: bytes | memoryview) -> tuple[int, int]:
    """(ledger id, entry id) every record body starts with."""
    if len(body) < RECORD_KEY_SIZE:
        raise ProtocolError(f"journal record of {len(body)} bytes is shorter than {RECORD_KEY_SIZE}")
    ledger_id, entry_id = _KEY.unpack_from(body)
    return int(ledger_id), int(entry_id)


def _length_prefixed_tail(body: bytes | memoryview, bound: int, what: str) -> bytes:
    if len(body) < _KEY_LEN.size:
        raise ProtocolError(f"{what} record of {len(body)} bytes is shorter than {_KEY_LEN.size}")
    length = _KEY_LEN.unpack_from(body)[2]
    if not 0 <= length <= min(bound, len(body) - _KEY_LEN.size):
        raise ProtocolError(f"{what} length {length} is negative, over {bound} or past the record end")
    return bytes(body[_KEY_LEN.size : _KEY_LEN.size + length])


def decode_master_key(body: bytes | memoryview) -> tuple[int, bytes]:
    """(ledger id, master key) of a MASTER_KEY record body."""
    return record_key(body)[0], _length_prefixed_tail(body, limits.MASTER_KEY_SIZE_MAX, "master key")


def decode_explicit_lac(body: bytes | memoryview) -> tuple[int, bytes]:
    """(ledger id, LAC body) of an EXPLICIT_LAC record body; entry.decode_lac_body reads the LAC."""
    return record_key(body)[0], _length_prefixed_tail(body, limits.EXPLICIT_LAC_SIZE_MAX, "explicit LAC")


def _special_error(kind: RecordKind, body: memoryview) -> str | None:
    """Why a special record body is malformed, or None when it is well formed."""
    try:
        if kind is RecordKind.MASTER_KEY:
            decode_master_key(body)
        elif kind is RecordKind.EXPLICIT_LAC:
            decode_explicit_lac(body)
    except ProtocolError as exc:
        return str(exc)
    return None


ScanItem = tuple[int, RecordKind, memoryview]


def scan_records(
    buf: bytes | bytearray | memoryview,
    start: int,
    base_offset: int,
    version: int,
    at_eof: bool,
) -> Generator[ScanItem, None, ScanStop]:
    """Yield (offset, kind, body) for each record in `buf` from `start`, then return a ScanStop.

    `buf[0]` is at file offset `base_offset`; offsets are those of the record's 4-byte length prefix
    (Java's ByteOffset). For PADDING the body is the pad bytes. `at_eof` says no bytes follow `buf`:
    a record cut short is then corrupt (truncated) rather than "need more". The memoryviews point into
    `buf`: copy what you keep.
    """
    view = memoryview(buf)
    end = len(view)
    pos = start
    padding_allowed = version >= V_PADDING
    unpack_int = _INT32.unpack_from
    unpack_long = _LONG.unpack_from
    while True:
        if end - pos < 4:
            if pos == end and at_eof:
                return ScanStop(StopStatus.END, base_offset + pos)
            return _short(pos, base_offset, at_eof, "length prefix")
        size = unpack_int(view, pos)[0]
        if size > 0:
            if size > limits.JOURNAL_RECORD_SIZE_MAX:
                limit = limits.JOURNAL_RECORD_SIZE_MAX
                return _error(pos, base_offset, f"record length {size} exceeds the {limit}-byte limit")
            if end - pos - 4 < size:
                return _short(pos, base_offset, at_eof, f"record of {size} bytes")
            if size < RECORD_KEY_SIZE:
                return _error(
                    pos, base_offset, f"record of {size} bytes is shorter than ledger id + entry id"
                )
            body = view[pos + 4 : pos + 4 + size]
            entry_id = unpack_long(view, pos + 12)[0]
            if entry_id >= 0:
                kind = RecordKind.DATA
            else:
                kind = _SPECIAL_KINDS.get(entry_id, RecordKind.UNKNOWN)
                problem = _special_error(kind, body)
                if problem is not None:
                    return _error(pos, base_offset, problem)
            yield base_offset + pos, kind, body
            pos += 4 + size
        elif size == 0:
            return ScanStop(StopStatus.END, base_offset + pos)
        elif size == PADDING_MASK and padding_allowed:
            if end - pos < PADDING_HEADER_SIZE:
                return _short(pos, base_offset, at_eof, "padding record")
            pad = unpack_int(view, pos + 4)[0]
            if not 0 <= pad <= limits.JOURNAL_RECORD_SIZE_MAX:
                return _error(pos, base_offset, f"bad padding length {pad}")
            if end - pos - PADDING_HEADER_SIZE < pad:
                return _short(pos, base_offset, at_eof, f"padding of {pad} bytes")
            yield base_offset + pos, RecordKind.PADDING, view[pos + 8 : pos + 8 + pad]
            pos += PADDING_HEADER_SIZE + pad
        else:
            return _error(pos, base_offset, f"invalid record with negative length {size} (version {version})")


def _short(pos: int, base_offset: int, at_eof: bool, what: str) -> ScanStop:
    if at_eof:
        return ScanStop(
            StopStatus.ERROR, base_offset + pos, f"truncated {what} at end of file", truncated=True
        )
    return ScanStop(StopStatus.NEED_MORE, base_offset + pos)


def _error(pos: int, base_offset: int, reason: str) -> ScanStop:
    return ScanStop(StopStatus.ERROR, base_offset + pos, reason)


# --- lastMark and file names -------------------------------------------------------------------------


def encode_last_mark(journal_id: int, offset: int) -> bytes:
    """The 16-byte `lastMark` file: journal id, offset in it."""
    return _LAST_MARK.pack(journal_id, offset)


def decode_last_mark(data: bytes | memoryview) -> tuple[int, int]:
    """(journal id, offset) of a `lastMark` file; exactly 16 bytes."""
    if len(data) != LAST_MARK_SIZE:
        raise ProtocolError(f"lastMark of {len(data)} bytes, expected {LAST_MARK_SIZE}")
    journal_id, offset = _LAST_MARK.unpack_from(data)
    return int(journal_id), int(offset)


def journal_file_name(journal_id: int) -> str:
    """`Long.toHexString(id) + ".txn"` (two's complement for negative ids, like Java)."""
    return f"{journal_id & 0xFFFF_FFFF_FFFF_FFFF:x}{JOURNAL_SUFFIX}"


def parse_journal_file_name(name: str) -> int | None:
    """The journal id of a `<hex>.txn` name, or None when the name is not a journal file."""
    return _parse_hex_name(name, JOURNAL_SUFFIX)


def _parse_hex_name(name: str, suffix: str) -> int | None:
    stem = name.removesuffix(suffix)
    if stem == name or not 0 < len(stem) <= 16 or any(c not in "0123456789abcdefABCDEF" for c in stem):
        return None
    value = int(stem, 16)
    return value - (1 << 64) if value >= 1 << 63 else value
