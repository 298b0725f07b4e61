"""DbLedgerStorage's RocksDB keys and values, as BookKeeper 4.14's `ldb` package writes them.

Per ledger directory `current/ledgers/` (LedgerMetadataIndex) maps the ledger id (8 bytes, big-endian)
to a `DbLedgerStorageDataFormats.LedgerData` protobuf {1: exists, 2: fenced, 3: masterKey, 4: explicitLac,
5: limbo (4.16+)}; `current/locations/` (EntryLocationIndex) maps ledger id ‖ entry id (16 bytes,
big-endian) to the entry's location (8 bytes, big-endian) `entry log id << 32 | offset`, the offset of
the entry itself in the log (past its 4-byte size), the same number an `.idx` slot holds.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from bkctl.errors import ProtocolError
from bkctl.protocol import protobuf as pb

LEDGERS_DB: Final = "ledgers"
LOCATIONS_DB: Final = "locations"
STORAGE_CLASS: Final = "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage"

_LEDGER_KEY: Final = struct.Struct(">q")
_LOCATION_KEY: Final = struct.Struct(">qq")
_LOCATION: Final = struct.Struct(">q")
LOCATION_KEY_SIZE: Final = _LOCATION_KEY.size
LEDGER_KEY_SIZE: Final = _LEDGER_KEY.size
LOCATION_KEY: Final = _LOCATION_KEY  # packs (ledger id, entry id) into a locations key
# A locations key and its value one after the other: how bkctl hands locations to RocksDB in bulk
# (rocksdb_store.KeyValueDb.write_records), not a format of Java's.
LOCATION_RECORD: Final = struct.Struct(f"{_LOCATION_KEY.size}s{_LOCATION.size}s")


@dataclass(frozen=True)
class LedgerData:
    """One ledger's state in the ledgers db."""

    master_key: bytes
    fenced: bool = False
    explicit_lac: bytes | None = None
    exists: bool = True
    limbo: bool = False


def ledger_key(ledger_id: int) -> bytes:
    return _LEDGER_KEY.pack(ledger_id)


def decode_ledger_key(key: bytes) -> int:
    if len(key) != _LEDGER_KEY.size:
        raise ProtocolError(f"ledgers db: key of {len(key)} bytes, expected 8")
    return int(_LEDGER_KEY.unpack(key)[0])


def location_key(ledger_id: int, entry_id: int) -> bytes:
    return _LOCATION_KEY.pack(ledger_id, entry_id)


def decode_location_key(key: bytes) -> tuple[int, int]:
    if len(key) != _LOCATION_KEY.size:
        raise ProtocolError(f"locations db: key of {len(key)} bytes, expected 16")
    ledger_id, entry_id = _LOCATION_KEY.unpack(key)
    return ledger_id, entry_id


def encode_location(location: int) -> bytes:
    return _LOCATION.pack(location)


def decode_location(value: bytes) -> int:
    if len(value) != _LOCATION.size:
        raise ProtocolError(f"locations db: value of {len(value)} bytes, expected 8")
    return int(_LOCATION.unpack(value)[0])


def encode_ledger_data(data: LedgerData) -> bytes:
    """Fields in number order, as protobuf-java writes them; limbo only when set (4.14 has no field 5)."""
    fields = [
        pb.varint_field(1, int(data.exists)),
        pb.varint_field(2, int(data.fenced)),
        pb.bytes_field(3, data.master_key),
    ]
    if data.explicit_lac is not None:
        fields.append(pb.bytes_field(4, data.explicit_lac))
    if data.limbo:
        fields.append(pb.varint_field(5, 1))
    return pb.encode_fields(fields)


def decode_ledger_data(value: bytes) -> LedgerData:
    exists = fenced = limbo = False
    master_key: bytes | None = None
    explicit_lac: bytes | None = None
    for f in pb.iter_fields(value):
        if f.number == 1:
            exists = bool(pb.expect_int(f))
        elif f.number == 2:
            fenced = bool(pb.expect_int(f))
        elif f.number == 3:
            master_key = pb.expect_bytes(f)
        elif f.number == 4:
            explicit_lac = pb.expect_bytes(f)
        elif f.number == 5:
            limbo = bool(pb.expect_int(f))
    if master_key is None:
        raise ProtocolError("ledgers db: LedgerData without its required masterKey")
    return LedgerData(master_key, fenced, explicit_lac, exists, limbo)
