"""Ledger index files (`.idx`): the header (master key, fenced bit, explicit LAC) and entry slots.

Layout (big-endian, docs/formats/storage.md): a 1024-byte header region holding "BKLE", int32 version
(0; 1 adds the explicit LAC), int32 master key length + key, int32 state bits (0x1 = fenced) and, in
version 1, int32 explicit LAC length (0 = none, else >= 16) + LAC body; zeros to 1024. Then one int64
slot per entry: the slot of entry e is at 1024 + 8e and holds `(entry log id << 32) | offset`, 0 when
the bookie does not have the entry. Pages of 8192 bytes (1024 slots) are written whole.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from bkctl import limits
from bkctl.errors import ProtocolError

MAGIC: Final = b"BKLE"
HEADER_SIZE: Final = 1024
V0: Final = 0
V1: Final = 1
PAGE_SIZE: Final = 8192
SLOT_SIZE: Final = 8
SLOTS_PER_PAGE: Final = PAGE_SIZE // SLOT_SIZE
STATE_FENCED: Final = 0x1
# ledger id + LAC: the shortest explicit LAC body BookKeeper accepts.
EXPLICIT_LAC_SIZE_MIN: Final = 16
INDEX_SUFFIX: Final = ".idx"

_INT32: Final = struct.Struct(">i")
_SIGNATURE: Final = struct.Struct(">4si")
_SLOT: Final = struct.Struct(">q")


@dataclass(frozen=True)
class IndexHeader:
    version: int
    master_key: bytes
    state_bits: int = 0
    explicit_lac: bytes | None = None  # the LAC body (entry.decode_lac_body), or None when not set

    @property
    def fenced(self) -> bool:
        return bool(self.state_bits & STATE_FENCED)


class _Reader:
    """Bounds-checked big-endian reads inside the header region."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)[:HEADER_SIZE]
        self.pos = 0

    def take(self, size: int, what: str) -> memoryview:
        if size < 0 or self.pos + size > len(self.data):
            raise ProtocolError(f"index header: {what} of {size} bytes at {self.pos} runs past the header")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def int32(self, what: str) -> int:
        return int(_INT32.unpack(self.take(4, what))[0])


def decode_header(data: bytes | memoryview) -> IndexHeader:
    """Decode the header region (pass at least its first bytes; it never reads past 1024)."""
    reader = _Reader(data)
    magic = bytes(reader.take(4, "magic"))
    if magic != MAGIC:
        raise ProtocolError(f"bad index magic {magic!r}, expected {MAGIC!r}")
    version = reader.int32("version")
    if version not in (V0, V1):
        raise ProtocolError(f"unsupported index version {version}")
    key_size = reader.int32("master key length")
    if not 0 <= key_size <= limits.MASTER_KEY_SIZE_MAX:
        raise ProtocolError(f"index master key length {key_size} out of range")
    key = bytes(reader.take(key_size, "master key"))
    state_bits = reader.int32("state bits")
    explicit_lac = None
    if version >= V1:
        lac_size = reader.int32("explicit LAC length")
        if lac_size != 0 and not EXPLICIT_LAC_SIZE_MIN <= lac_size <= limits.EXPLICIT_LAC_SIZE_MAX:
            raise ProtocolError(f"index explicit LAC length {lac_size} out of range")
        explicit_lac = bytes(reader.take(lac_size, "explicit LAC")) if lac_size else None
    return IndexHeader(version, key, state_bits, explicit_lac)


def encode_header(header: IndexHeader) -> bytes:
    """The 1024-byte header region."""
    if header.version not in (V0, V1):
        raise ProtocolError(f"unsupported index version {header.version}")
    if header.explicit_lac is not None and header.version < V1:
        raise ProtocolError("an explicit LAC needs index version 1")
    out = _SIGNATURE.pack(MAGIC, header.version) + _INT32.pack(len(header.master_key)) + header.master_key
    out += _INT32.pack(header.state_bits)
    if header.version >= V1:
        lac = header.explicit_lac or b""
        if lac and not EXPLICIT_LAC_SIZE_MIN <= len(lac) <= limits.EXPLICIT_LAC_SIZE_MAX:
            raise ProtocolError(f"explicit LAC of {len(lac)} bytes out of range")
        out += _INT32.pack(len(lac)) + lac
    if len(out) > HEADER_SIZE:
        raise ProtocolError(f"index header of {len(out)} bytes does not fit in {HEADER_SIZE}")
    return out.ljust(HEADER_SIZE, b"\0")


def slot_offset(entry_id: int) -> int:
    """File offset of the slot of `entry_id`."""
    if entry_id < 0:
        raise ProtocolError(f"negative entry id {entry_id} has no index slot")
    return HEADER_SIZE + SLOT_SIZE * entry_id


def decode_slots(data: bytes | memoryview, first_entry_id: int = 0) -> Iterator[tuple[int, int]]:
    """(entry id, location) of every non-zero slot in `data` (whole slots; a trailing part is ignored).

    `data[0]` is the slot of `first_entry_id`; split a location with entrylog_format.split_location.
    """
    view = memoryview(data)
    whole = len(view) - len(view) % SLOT_SIZE
    for index, (location,) in enumerate(_SLOT.iter_unpack(view[:whole])):
        if location:
            yield first_entry_id + index, int(location)


def encode_slots(locations: Mapping[int, int], page_aligned: bool = True) -> bytes:
    """The slot region for {entry id: location}, zero-filled holes, padded to whole pages by default."""
    if not locations:
        return b""
    if min(locations) < 0:
        raise ProtocolError("negative entry id in index slots")
    count = max(locations) + 1
    if page_aligned:
        count = -(-count // SLOTS_PER_PAGE) * SLOTS_PER_PAGE
    out = bytearray(count * SLOT_SIZE)
    for entry_id, location in locations.items():
        _SLOT.pack_into(out, entry_id * SLOT_SIZE, location)
    return bytes(out)


def index_path(ledger_id: int) -> str:
    """Path of a ledger's index below `<index dir>/current/`.

    `<hex((id >> 8) & 0xff)>/<hex(id & 0xff)>/<hex(id)>.idx`: ledger 1 -> `0/1/1.idx`.
    """
    if ledger_id < 0:
        raise ProtocolError(f"negative ledger id {ledger_id}")
    return f"{(ledger_id >> 8) & 0xFF:x}/{ledger_id & 0xFF:x}/{ledger_id:x}{INDEX_SUFFIX}"


def parse_index_file_name(name: str) -> int | None:
    """The ledger id of a `<hex>.idx` name, or None."""
    stem = name.removesuffix(INDEX_SUFFIX)
    if stem == name or not 0 < len(stem) <= 16 or any(c not in "0123456789abcdefABCDEF" for c in stem):
        return None
    return int(stem, 16)
