"""Entry log files (`<hex id>.log`), their records, the ledgers map, entry locations and `lastId`.

Layout (big-endian, docs/formats/storage.md):
  header  1024 bytes: "BKLO", int32 header version (0, or 1 = may carry a ledgers map), int64
          ledgersMapOffset at 8, int32 ledgersCount at 16, zeros.
  record  int32 size S (excluding itself) + S bytes of stored entry (starts with ledger id, entry id).
          S <= 0 is padding: scanners advance one byte, as BookKeeper's does.
  map     appended when a log is rotated, at ledgersMapOffset: batches of at most 10,000 ledgers, each a
          record of size 20 + 16n: int64 -1, int64 -2, int32 n, n x (int64 ledger id, int64 bytes).
The index locates an entry by `(log id << 32) | offset`, the offset of the first byte after its size.
"""

from __future__ import annotations

import struct
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.protocol.scanning import ScanStop, StopStatus

MAGIC: Final = b"BKLO"
HEADER_SIZE: Final = 1024
HEADER_V0: Final = 0
HEADER_V1: Final = 1
INVALID_LEDGER_ID: Final = -1
LEDGERS_MAP_ENTRY_ID: Final = -2
# int64 -1, int64 -2, int32 count: the start of every ledgers-map batch.
LEDGERS_MAP_HEADER_SIZE: Final = 20
LEDGERS_MAP_ITEM_SIZE: Final = 16
RECORD_KEY_SIZE: Final = 16
LOG_SUFFIX: Final = ".log"
LAST_ID_SIZE_MAX: Final = 32  # format fact

_HEADER: Final = struct.Struct(">4siqi")
_INT32: Final = struct.Struct(">i")
_KEY: Final = struct.Struct(">qq")
_MAP_HEADER: Final = struct.Struct(">qqi")
_MAP_ITEM: Final = struct.Struct(">qq")


class RecordKind(StrEnum):
    DATA = "DATA"  # a stored entry (entry id >= 0)
    LEDGERS_MAP = "LEDGERS_MAP"  # one batch of the ledgers map
    PADDING = "PADDING"  # a run of bytes where the size word is <= 0
    UNKNOWN = "UNKNOWN"  # another negative entry id


@dataclass(frozen=True)
class EntryLogHeader:
    version: int
    ledgers_map_offset: int = 0
    ledgers_count: int = 0


# --- header ------------------------------------------------------------------------------------------


def decode_header(data: bytes | memoryview) -> EntryLogHeader:
    """The 1024-byte header (only its first 20 bytes carry fields)."""
    if len(data) < _HEADER.size:
        raise ProtocolError(f"entry log header of {len(data)} bytes is shorter than {_HEADER.size}")
    magic, version, map_offset, count = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad entry log magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version not in (HEADER_V0, HEADER_V1):
        raise ProtocolError(f"unsupported entry log header version {version}")
    if (map_offset != 0 and map_offset < HEADER_SIZE) or count < 0:
        raise ProtocolError(f"bad ledgers map offset {map_offset} or ledger count {count}")
    return EntryLogHeader(int(version), int(map_offset), int(count))


def encode_header(header: EntryLogHeader) -> bytes:
    """The 1024-byte header; a log being written has offset and count 0 until it is rotated."""
    if header.version not in (HEADER_V0, HEADER_V1):
        raise ProtocolError(f"unsupported entry log header version {header.version}")
    packed = _HEADER.pack(MAGIC, header.version, header.ledgers_map_offset, header.ledgers_count)
    return packed.ljust(HEADER_SIZE, b"\0")


# --- records -----------------------------------------------------------------------------------------


def encode_record(stored_entry: bytes) -> bytes:
    """Frame one stored entry with its int32 size."""
    if not RECORD_KEY_SIZE <= len(stored_entry) <= limits.ENTRYLOG_RECORD_SIZE_MAX:
        raise ProtocolError(f"entry log record of {len(stored_entry)} bytes is too short or over the limit")
    return _INT32.pack(len(stored_entry)) + stored_entry


def encode_record_size(size: int) -> bytes:
    """The int32 size prefix of a record holding `size` bytes of stored entry (encode_record without
    copying the entry: writers that place the entry in their own buffer use this)."""
    if not RECORD_KEY_SIZE <= size <= limits.ENTRYLOG_RECORD_SIZE_MAX:
        raise ProtocolError(f"entry log record of {size} bytes is too short or over the limit")
    return _INT32.pack(size)


def record_key(body: bytes | memoryview) -> tuple[int, int]:
    """(ledger id, entry id) a stored entry starts with."""
    if len(body) < RECORD_KEY_SIZE:
        raise ProtocolError(f"entry log record of {len(body)} bytes is shorter than {RECORD_KEY_SIZE}")
    ledger_id, entry_id = _KEY.unpack_from(body)
    return int(ledger_id), int(entry_id)


def classify(ledger_id: int, entry_id: int) -> RecordKind:
    if entry_id >= 0:
        return RecordKind.DATA
    if ledger_id == INVALID_LEDGER_ID and entry_id == LEDGERS_MAP_ENTRY_ID:
        return RecordKind.LEDGERS_MAP
    return RecordKind.UNKNOWN


ScanItem = tuple[int, RecordKind, memoryview]


def scan_records(
    buf: bytes | bytearray | memoryview, start: int, base_offset: int, at_eof: bool
) -> Generator[ScanItem, None, ScanStop]:
    """Yield (offset, kind, body) for each record in `buf` from `start`, then return a ScanStop.

    Offsets are those of the 4-byte size prefix (Java's ByteOffset); `buf[0]` is at `base_offset`.
    A run of padding positions is reported once, as PADDING with the run as its body. The memoryviews
    point into `buf`: copy what you keep.
    """
    view = memoryview(buf)
    end = len(view)
    pos = start
    unpack_int = _INT32.unpack_from
    unpack_key = _KEY.unpack_from
    while True:
        if end - pos < 4:
            return _tail(view, pos, base_offset, at_eof)
        size = unpack_int(view, pos)[0]
        if size <= 0:
            run_end = _padding_run_end(view, pos)
            if run_end > end - 4 and not at_eof:
                if run_end > pos + 1:
                    yield base_offset + pos, RecordKind.PADDING, view[pos : run_end - 3]
                    pos = run_end - 3
                return ScanStop(StopStatus.NEED_MORE, base_offset + pos)
            yield base_offset + pos, RecordKind.PADDING, view[pos:run_end]
            pos = run_end
            continue
        if size > limits.ENTRYLOG_RECORD_SIZE_MAX:
            limit = limits.ENTRYLOG_RECORD_SIZE_MAX
            return _stop_error(pos, base_offset, f"record size {size} exceeds the {limit}-byte limit")
        if size < RECORD_KEY_SIZE:
            return _stop_error(
                pos, base_offset, f"record of {size} bytes is shorter than ledger id + entry id"
            )
        if end - pos - 4 < size:
            return _short(pos, base_offset, at_eof, f"record of {size} bytes")
        ledger_id, entry_id = unpack_key(view, pos + 4)
        yield base_offset + pos, classify(ledger_id, entry_id), view[pos + 4 : pos + 4 + size]
        pos += 4 + size


def _padding_run_end(view: memoryview, pos: int) -> int:
    """First position after `pos` whose 4-byte size word is > 0 (or where fewer than 4 bytes remain)."""
    end = len(view)
    nonzero = pos
    # Zeros are the common padding: jump over them in C, then step byte by byte over the rest.
    while nonzero < end:
        block = bytes(view[nonzero : min(end, nonzero + 65536)])
        stripped = len(block) - len(block.lstrip(b"\0"))
        nonzero += stripped
        if stripped < len(block):
            break
    step = max(pos + 1, nonzero - 3)
    while step <= end - 4 and _INT32.unpack_from(view, step)[0] <= 0:
        step += 1
    return step if step <= end - 4 else end


def _tail(view: memoryview, pos: int, base_offset: int, at_eof: bool) -> ScanStop:
    if not at_eof:
        return ScanStop(StopStatus.NEED_MORE, base_offset + pos)
    if not any(view[pos:]):
        # Nothing or zeros too short for a size word: BookKeeper's scanner stops here quietly.
        return ScanStop(StopStatus.END, base_offset + len(view))
    return ScanStop(StopStatus.ERROR, base_offset + pos, "truncated size prefix at end of file", True)


def _short(pos: int, base_offset: int, at_eof: bool, what: str) -> ScanStop:
    if at_eof:
        return ScanStop(StopStatus.ERROR, base_offset + pos, f"truncated {what} at end of file", True)
    return ScanStop(StopStatus.NEED_MORE, base_offset + pos)


def _stop_error(pos: int, base_offset: int, reason: str) -> ScanStop:
    return ScanStop(StopStatus.ERROR, base_offset + pos, reason)


# --- ledgers map -------------------------------------------------------------------------------------


def decode_ledgers_map_batch(body: bytes | memoryview) -> list[tuple[int, int]]:
    """(ledger id, bytes) pairs of one batch body (the record after its size prefix)."""
    if len(body) < LEDGERS_MAP_HEADER_SIZE:
        raise ProtocolError(
            f"ledgers map batch of {len(body)} bytes is shorter than {LEDGERS_MAP_HEADER_SIZE}"
        )
    ledger_id, entry_id, count = _MAP_HEADER.unpack_from(body)
    if (ledger_id, entry_id) != (INVALID_LEDGER_ID, LEDGERS_MAP_ENTRY_ID):
        raise ProtocolError(f"ledgers map batch starts with ({ledger_id}, {entry_id}), expected (-1, -2)")
    if not 0 <= count <= limits.ENTRYLOG_LEDGERS_MAP_BATCH_MAX:
        raise ProtocolError(
            f"ledgers map batch of {count} ledgers (at most {limits.ENTRYLOG_LEDGERS_MAP_BATCH_MAX})"
        )
    if len(body) != LEDGERS_MAP_HEADER_SIZE + LEDGERS_MAP_ITEM_SIZE * count:
        raise ProtocolError(f"ledgers map batch of {count} ledgers has {len(body)} bytes")
    return [
        (int(lid), int(size))
        for lid, size in _MAP_ITEM.iter_unpack(body[LEDGERS_MAP_HEADER_SIZE : len(body)])
    ]


def encode_ledgers_map(ledgers: Iterable[tuple[int, int]]) -> bytes:
    """The map appended at rotation: framed batches of at most 10,000 (ledger id, bytes) pairs."""
    items = list(ledgers)
    batch_max = limits.ENTRYLOG_LEDGERS_MAP_BATCH_MAX
    out = bytearray()
    for first in range(0, len(items), batch_max):
        batch = items[first : first + batch_max]
        out += _INT32.pack(LEDGERS_MAP_HEADER_SIZE + LEDGERS_MAP_ITEM_SIZE * len(batch))
        out += _MAP_HEADER.pack(INVALID_LEDGER_ID, LEDGERS_MAP_ENTRY_ID, len(batch))
        for ledger_id, size in batch:
            out += _MAP_ITEM.pack(ledger_id, size)
    return bytes(out)


# --- locations, lastId, names ------------------------------------------------------------------------


def entry_location(log_id: int, offset: int) -> int:
    """The index slot value of an entry: log id in the high 32 bits, offset after the size prefix low."""
    if not 0 <= log_id < 1 << 31 or not 0 <= offset < 1 << 32:
        raise ProtocolError(f"entry location out of range: log {log_id}, offset {offset}")
    return log_id << 32 | offset


def split_location(location: int) -> tuple[int, int]:
    """(log id, offset) of an index slot value."""
    return location >> 32, location & 0xFFFF_FFFF


def encode_last_id(log_id: int) -> bytes:
    """The `lastId` file: the id of the newest entry log in hex, newline-terminated."""
    if log_id < 0:
        raise ProtocolError(f"negative entry log id {log_id}")
    return f"{log_id:x}\n".encode()


def decode_last_id(data: bytes | memoryview) -> int:
    if len(data) > LAST_ID_SIZE_MAX:
        raise ProtocolError(f"lastId file of {len(data)} bytes (at most {LAST_ID_SIZE_MAX})")
    text = bytes(data).strip()
    if not text or any(c not in b"0123456789abcdefABCDEF" for c in text):
        raise ProtocolError(f"lastId {bytes(data)!r} is not a hex number")
    return int(text, 16)


def log_file_name(log_id: int) -> str:
    if log_id < 0:
        raise ProtocolError(f"negative entry log id {log_id}")
    return f"{log_id:x}{LOG_SUFFIX}"


def parse_log_file_name(name: str) -> int | None:
    """The log id of a `<hex>.log` name, or None when the name is not an entry log."""
    stem = name.removesuffix(LOG_SUFFIX)
    if stem == name or not 0 < len(stem) <= 16 or any(c not in "0123456789abcdefABCDEF" for c in stem):
        return None
    return int(stem, 16)
