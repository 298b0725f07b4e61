"""Packaged entries: the bytes a client sends and a bookie stores for one ledger entry.

Layout (big-endian): int64 ledger id, int64 entry id, int64 last add confirmed, int64 length (the
ledger's cumulative length including this entry), digest, payload. The digest covers the 32 header
bytes then the payload. Digest sizes: CRC32 8 (the 32-bit value as an int64), CRC32C 4, MAC 20
(HMAC-SHA1 keyed with SHA-1("mac" + password)), DUMMY 0.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib
from dataclasses import dataclass

from crc32c import crc32c

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.model import DigestType

HEADER = struct.Struct(">qqqq")
HEADER_SIZE = HEADER.size  # 32, BookKeeper's METADATA_LENGTH
LAC_BODY = struct.Struct(">qq")
_CRC32 = struct.Struct(">q")
_CRC32C = struct.Struct(">I")
# Digest types tried, in order, when inferring which one an entry carries.
_INFER_ORDER = (DigestType.CRC32C, DigestType.CRC32, DigestType.MAC)


def master_key(password: bytes) -> bytes:
    """The 20-byte key sent with adds and kept in the index header: SHA-1("ledger" + password)."""
    return hashlib.sha1(b"ledger" + password).digest()


def mac_key(password: bytes) -> bytes:
    """The HMAC-SHA1 key of MAC digests: SHA-1("mac" + password)."""
    return hashlib.sha1(b"mac" + password).digest()


def compute_digest(
    digest: DigestType, header: bytes | memoryview, payload: bytes | memoryview, key: bytes | None = None
) -> bytes:
    """The digest of `header` followed by `payload`; MAC needs `key` (from `mac_key`)."""
    if digest is DigestType.CRC32C:
        return _CRC32C.pack(crc32c(payload, crc32c(header)))
    if digest is DigestType.CRC32:
        return _CRC32.pack(zlib.crc32(payload, zlib.crc32(header)))
    if digest is DigestType.MAC:
        if key is None:
            raise ProtocolError("a MAC digest needs the ledger password")
        mac = hmac.new(key, header, hashlib.sha1)
        mac.update(payload)
        return mac.digest()
    return b""


@dataclass(frozen=True)
class PackagedEntry:
    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    length: int
    digest: bytes
    payload: bytes


def package_entry(
    digest: DigestType,
    ledger_id: int,
    entry_id: int,
    last_add_confirmed: int,
    length: int,
    payload: bytes,
    key: bytes | None = None,
) -> bytes:
    """Encode one entry as a client sends it (header, digest, payload)."""
    return entry_head(digest, ledger_id, entry_id, last_add_confirmed, length, payload, key) + payload


def entry_head(
    digest: DigestType,
    ledger_id: int,
    entry_id: int,
    last_add_confirmed: int,
    length: int,
    payload: bytes,
    key: bytes | None = None,
) -> bytes:
    """A packaged entry without its payload: header and digest (of header and payload)."""
    if len(payload) > limits.ENTRY_SIZE_MAX:
        raise ProtocolError(f"entry of {len(payload)} bytes exceeds the {limits.ENTRY_SIZE_MAX}-byte limit")
    header = _pack(HEADER, ledger_id, entry_id, last_add_confirmed, length)
    return header + compute_digest(digest, header, payload, key)


def parse_entry(data: bytes | memoryview, digest: DigestType) -> PackagedEntry:
    """Split a packaged entry into its fields without checking the digest."""
    size = HEADER_SIZE + digest.digest_size
    if len(data) < size:
        raise ProtocolError(f"packaged entry of {len(data)} bytes is shorter than its {size}-byte header")
    ledger_id, entry_id, lac, length = HEADER.unpack_from(data)
    return PackagedEntry(ledger_id, entry_id, lac, length, bytes(data[HEADER_SIZE:size]), bytes(data[size:]))


def digest_matches(data: bytes | memoryview, digest: DigestType, key: bytes | None = None) -> bool:
    """Whether the packaged entry's stored digest is right for `digest` (False when too short)."""
    size = HEADER_SIZE + digest.digest_size
    if len(data) < size or (digest is DigestType.MAC and key is None):
        return False
    view = memoryview(data)
    expected = compute_digest(digest, view[:HEADER_SIZE], view[size:], key)
    return hmac.compare_digest(expected, view[HEADER_SIZE:size])


def infer_digest(data: bytes | memoryview, key: bytes | None = None) -> DigestType | None:
    """The digest type whose checksum matches (CRC32C, CRC32, then MAC when `key` is given), else None.

    DUMMY cannot be told from a corrupt entry, so it is never inferred.
    """
    for digest in _INFER_ORDER:
        if digest_matches(data, digest, key):
            return digest
    return None


def verify_entry(
    data: bytes | memoryview, digest: DigestType, ledger_id: int, entry_id: int, key: bytes | None = None
) -> PackagedEntry:
    """Parse an entry read back from a bookie and check digest, ledger id and entry id, as readers do."""
    entry = parse_entry(data, digest)
    if digest is not DigestType.DUMMY and not digest_matches(data, digest, key):
        raise ProtocolError(f"digest mismatch on ledger {ledger_id} entry {entry_id}")
    if (entry.ledger_id, entry.entry_id) != (ledger_id, entry_id):
        raise ProtocolError(
            f"asked for ledger {ledger_id} entry {entry_id}, "
            f"got ledger {entry.ledger_id} entry {entry.entry_id}"
        )
    return entry


def encode_lac_body(digest: DigestType, ledger_id: int, lac: int, key: bytes | None = None) -> bytes:
    """An explicit-LAC body: int64 ledger id, int64 LAC, digest over those 16 bytes."""
    body = _pack(LAC_BODY, ledger_id, lac)
    return body + compute_digest(digest, body, b"", key)


def decode_lac_body(data: bytes | memoryview) -> tuple[int, int]:
    """(ledger id, LAC) of an explicit-LAC body; the digest that follows is not checked here."""
    if len(data) < LAC_BODY.size:
        raise ProtocolError(f"explicit LAC body of {len(data)} bytes is shorter than 16")
    ledger_id, lac = LAC_BODY.unpack_from(data)
    return int(ledger_id), int(lac)


def _pack(layout: struct.Struct, *values: int) -> bytes:
    """Pack int64 fields; an id outside int64 is a ProtocolError, the only error codecs raise."""
    try:
        return layout.pack(*values)
    except struct.error as e:
        raise ProtocolError(f"entry field out of the int64 range: {e}") from None
