"""The db engine's RocksDB tuning: Java's `dbStorage_rocksDB_*` keys (BookKeeper 4.14's
`KeyValueStorageRocksDB`), their defaults and their checks. rocksdb_store builds RocksDB's options from
them; this module imports no RocksDB binding, so reading a conf does not load one.

Java applies them to the `locations` db ("Huge"), the log path to both dbs. Every open of a database
takes them, as Java passes its options on every open. `dbStorage_rocksDB_logLevel` is not among them:
the binding cannot set RocksDB's info log level (it logs at info), so `bookie start` lists the key with
the others it ignores.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from bkctl.errors import UsageError
from bkctl.protocol.properties import bool_key, int_key

MIB: Final = 1024 * 1024


@dataclass(frozen=True)
class RocksDbSettings:
    # dbStorage_rocksDB_blockCacheSize, bytes. Java: max direct memory / ledger dirs / 10 (hundreds of
    # MB on a usual bookie). The cache has 64 shards; at 32 MiB a million locations' 64 KiB blocks
    # (24 MB) overflowed some of them and were read and decompressed again (RESULTS.md,
    # "DbLedgerStorage"). 64 MiB: the interleaved engine's index page budget.
    block_cache_size: int = 64 * MIB
    write_buffer_size: int = 64 * MIB  # dbStorage_rocksDB_writeBufferSizeMB
    sst_size: int = 64 * MIB  # dbStorage_rocksDB_sstSizeInMB: target size of an SST file
    block_size: int = 64 * 1024  # dbStorage_rocksDB_blockSize
    bloom_bits_per_key: int = 10  # dbStorage_rocksDB_bloomFilterBitsPerKey; 0: no bloom filter
    num_levels: int = -1  # dbStorage_rocksDB_numLevels; -1: RocksDB's (7)
    level0_files: int = 4  # dbStorage_rocksDB_numFilesInLevel0: level-0 files that start a compaction
    level1_max_size: int = 256 * MIB  # dbStorage_rocksDB_maxSizeInLevel1MB
    lz4: bool = True  # dbStorage_rocksDB_lz4CompressionEnabled; False: no compression
    log_path: Path | None = None  # dbStorage_rocksDB_logPath: RocksDB's LOG files under <path>/<db name>


DEFAULT: Final = RocksDbSettings()


def _mib(key: str, value: str) -> int:
    return int_key(key, value, 1, 1 << 20) * MIB


def _log_path(key: str, value: str) -> Path | None:
    return Path(value.strip()) if value.strip() else None


def _num_levels(key: str, value: str) -> int:
    levels = int_key(key, value, -1, 64)
    if levels == 1:  # RocksDB would refuse to open the db: say so before the bookie starts
        raise UsageError(f"config key {key}: 1 level is too few for level compaction (2 or more, or -1)")
    return -1 if levels <= 0 else levels  # Java sets the option only when above 0


# Java key -> (field, parser of the value).
KEYS: Final[Mapping[str, tuple[str, Callable[[str, str], Any]]]] = {
    "dbStorage_rocksDB_blockCacheSize": ("block_cache_size", lambda k, v: int_key(k, v, MIB, 1 << 40)),
    "dbStorage_rocksDB_writeBufferSizeMB": ("write_buffer_size", _mib),
    "dbStorage_rocksDB_sstSizeInMB": ("sst_size", _mib),
    "dbStorage_rocksDB_blockSize": ("block_size", lambda k, v: int_key(k, v, 1024, 64 * MIB)),
    "dbStorage_rocksDB_bloomFilterBitsPerKey": ("bloom_bits_per_key", lambda k, v: int_key(k, v, 0, 64)),
    "dbStorage_rocksDB_numLevels": ("num_levels", _num_levels),
    "dbStorage_rocksDB_numFilesInLevel0": ("level0_files", lambda k, v: int_key(k, v, 1, 1000)),
    "dbStorage_rocksDB_maxSizeInLevel1MB": ("level1_max_size", _mib),
    "dbStorage_rocksDB_lz4CompressionEnabled": ("lz4", bool_key),
    "dbStorage_rocksDB_logPath": ("log_path", _log_path),
}


def rocksdb_settings(given: Mapping[str, str]) -> RocksDbSettings:
    """The settings of these `dbStorage_rocksDB_*` keys (UsageError naming a bad one); Java's defaults
    for the others."""
    changes = {}
    for key, value in given.items():
        name, parse = KEYS[key]
        changes[name] = parse(key, value)
    return replace(DEFAULT, **changes)
