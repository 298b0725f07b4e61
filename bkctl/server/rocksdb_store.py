"""RocksDB databases of DbLedgerStorage, through rocksdict (PyPI; its wheels ship RocksDB itself).

The options are those of BookKeeper 4.14's `KeyValueStorageRocksDB` so that Java's bookies (rocksdbjni
6.29 in 4.14, 7.9 in 4.16) and Debian's `ldb` (7.8) open what we write: the locations db ("Huge") uses a
block-based table of format_version 2 with xxHash checksums, 64 KiB blocks, LZ4, a full bloom filter of
10 bits per key (index and filter blocks held with each open file, not in the block cache as Java
does: see `_options`); the ledgers db ("Small") takes the library's defaults, except the table format
version (5, the default of the versions Java ships). The newer
library writes options an older one does not know into `OPTIONS-*`: Java never reads that file (it
passes its options), `ldb` needs `--ignore_unknown_options`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import struct
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, islice, starmap
from operator import itemgetter
from pathlib import Path
from typing import Final, cast

import rocksdict as rd

from bkctl.errors import CorruptDataError, UsageError
from bkctl.server.fileio import CLOEXEC, fsync_directory
from bkctl.server.rocksdb_settings import DEFAULT as DEFAULT_SETTINGS
from bkctl.server.rocksdb_settings import RocksDbSettings

# Java asks for 32 background jobs; a bookie here has a few cores, and idle RocksDB threads are cheap
# but not free: 4 flush/compaction jobs keep up with one bookie's checkpoints.
BACKGROUND_JOBS: Final = 4
# Locations per native write (see KeyValueDb.write_records): ~1 ms of memtable insertion at a time.
WRITE_SLICE: Final = 1024  # local bound
DEFAULT_FAMILY: Final = "default"  # RocksDB's default column family (the only one used)
WAL_GLOB: Final = "*.log"  # RocksDB's write-ahead log files in the database's directory
# Scratch directories of read-only and secondary opens, under the temp dir; the owner holds an flock on
# the lock file in each for its life, so another open tells a dead owner's leftovers (kill -9 skips the
# cleanup) from a live one's.
SCRATCH_PREFIX: Final = "bkctl-rocksdb-"
OWNER_LOCK: Final = "bkctl-owner.lock"
SWEEP_MAX: Final = 64  # local bound: leftovers removed per open
# A scratch directory without a lock file (made before the lock existed) is a leftover once this old.
UNLOCKED_AGE_S: Final = 3600  # local bound


def _options(huge: bool, settings: RocksDbSettings, name: str) -> rd.Options:
    """Java's options of a "Huge" (locations) or "Small" (ledgers) db named `name`, as `settings` tune
    them (rocksdb_settings.py)."""
    options = rd.Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_keep_log_file_num(30)
    options.set_log_file_time_to_roll(24 * 3600)
    if settings.log_path is not None:
        options.set_db_log_dir(str(settings.log_path / name))
    if not huge:
        # Java sets nothing here, but this library's default table format (6) is unreadable to RocksDB
        # before 8.6 (Java's 6.29 and 7.9, Debian's 7.8); 5 is the default of those versions.
        table = rd.BlockBasedOptions()
        table.set_format_version(5)
        options.set_block_based_table_factory(table)
        return options
    if settings.lz4:
        options.set_compression_type(rd.DBCompressionType.lz4())
    options.set_write_buffer_size(settings.write_buffer_size)
    options.set_max_write_buffer_number(4)
    if settings.num_levels > 0:
        options.set_num_levels(settings.num_levels)
    options.set_level_zero_file_num_compaction_trigger(settings.level0_files)
    options.set_max_bytes_for_level_base(settings.level1_max_size)
    options.set_max_background_jobs(BACKGROUND_JOBS)
    options.set_max_total_wal_size(512 * 1024 * 1024)
    options.set_max_open_files(-1)
    options.set_target_file_size_base(settings.sst_size)
    options.set_delete_obsolete_files_period_micros(3600 * 1_000_000)
    options.set_level_compaction_dynamic_level_bytes(True)
    table = rd.BlockBasedOptions()
    table.set_block_size(settings.block_size)
    table.set_block_cache(rd.Cache(settings.block_cache_size))
    table.set_format_version(2)
    table.set_checksum_type(rd.ChecksumType.xxhash())
    if settings.bloom_bits_per_key > 0:
        table.set_bloom_filter(settings.bloom_bits_per_key, False)
    # Java puts index and filter blocks in the block cache; bkctl keeps them with each open SST file
    # (RocksDB's default; the files are the same). In the cache, a file's whole filter is one entry
    # (10 bits per location: 1.26 MB for a memtable's million), bigger than a shard of the cache
    # (1/64 of it): dropped after every lookup and read again, 1.2 MB per entry read (RESULTS.md,
    # "DbLedgerStorage"). Held with the file, it costs ~1.3 bytes of memory per location stored.
    table.set_cache_index_and_filter_blocks(False)
    options.set_block_based_table_factory(table)
    return options


def _make_log_dir(directory: Path) -> None:
    """A db's directory under dbStorage_rocksDB_logPath, made as Java makes it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"config key dbStorage_rocksDB_logPath: cannot create {directory}: {exc.strerror or exc}"
        ) from None


def _bounded(end: bytes) -> rd.ReadOptions:
    """Read options of an iteration that stops before `end`."""
    bound = rd.ReadOptions()
    bound.set_iterate_upper_bound(end)
    return bound


class KeyValueDb:
    """One RocksDB database with bytes keys and values; `read_only` opens never write a file.

    `secondary` opens a RocksDB secondary instance: the supported way for another process to read a
    database a live bookie writes (compaction's scan process, gc_scan.py). It sees what the primary
    had written, WAL included, when opened or caught up (`catch_up`); its own files go to a scratch
    directory (rocksdict still rewrites its `rocksdict-config.json` in the primary's directory with the
    same content, which RocksDB and Java never read)."""

    def __init__(
        self,
        path: Path,
        huge: bool,
        read_only: bool = False,
        secondary: bool = False,
        settings: RocksDbSettings = DEFAULT_SETTINGS,
    ) -> None:
        self.path = path
        if (read_only or secondary) and not (path / "CURRENT").is_file():
            raise CorruptDataError(f"{path}: no RocksDB database here (no CURRENT file)")
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._owner_fd = -1
        self._no_wal = rd.WriteOptions()
        # A property at run time (rocksdict's stub calls it a method; the WAL stays empty: checked).
        self._no_wal.disable_wal = True  # type: ignore[method-assign,assignment]
        # Counts of WAL-less writes made and known flushed, and of unsynced WAL writes made and known
        # synced (writes on one thread, persist and sync_wal on any).
        self._unpersisted = self._persisted = 0
        self._unsynced = self._synced = 0
        self._persist_lock = threading.Lock()
        where = path
        access = rd.AccessType.read_write()
        if secondary:
            self._scratch, self._owner_fd = _scratch_dir("secondary-")
            access = rd.AccessType.secondary(self._scratch.name)
        elif read_only:
            # rocksdict writes its own rocksdict-config.json into the directory it opens, even read-only:
            # open a scratch directory of symlinks to the database's files instead, so nothing changes.
            self._scratch, self._owner_fd = _scratch_dir("")
            where = Path(self._scratch.name)
            for item in path.iterdir():
                (where / item.name).symlink_to(item.absolute())
            access = rd.AccessType.read_only()
        if settings.log_path is not None:
            _make_log_dir(settings.log_path / path.name)
        try:
            options = _options(huge, settings, path.name)
            # The default column family's options named too: on an existing database rocksdict would
            # otherwise open that family with the options it loads from the OPTIONS file, which
            # cannot carry a block cache or a bloom filter (an 8 MiB cache and no filter, in the SST
            # files written after it too), whatever `options` says.
            self._db = rd.Rdict(str(where), options, {DEFAULT_FAMILY: options}, access_type=access)
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status text
            self._cleanup()
            raise CorruptDataError(f"{path}: cannot open RocksDB database: {exc}") from None
        if secondary:
            self.catch_up()

    def catch_up(self) -> None:
        """A secondary instance: read what the primary wrote since (MANIFEST and WAL)."""
        try:
            self._db.try_catch_up_with_primary()
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status text
            raise CorruptDataError(f"{self.path}: cannot follow the RocksDB database: {exc}") from None

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)  # raw mode: bytes or None

    def getter(self) -> Callable[[bytes], bytes | None]:
        """`get` without a wrapper call per key (the locations db answers one per entry read)."""
        return self._db.get

    def write(self, puts: dict[bytes, bytes], deletes: Sequence[bytes] = (), sync: bool = True) -> None:
        """One atomic batch; synced (WAL fsynced) unless `sync` is False, as Java's batches are."""
        batch = rd.WriteBatch(raw_mode=True)
        for key in deletes:
            batch.delete(key)
        for key, value in puts.items():
            batch.put(key, value)
        self._apply(batch, sync)

    def write_records(
        self, buffers: Sequence[bytes], record: struct.Struct, sync: bool = True, wal: bool = True
    ) -> None:
        """Puts in order (a later put of a key wins) of packed (key, value) records, `record` a layout
        of two fixed-size byte strings (e.g. "16s8s"): the keys and values are cut out by
        `struct.iter_unpack` and handed to the batch by `starmap`, with no Python code per record (a
        replay writes a million locations through here). WRITE_SLICE records per native write:
        rocksdict holds the GIL through a whole write, so one batch of a checkpoint's 100,000
        locations would stop the bookie's reactor for its whole memtable insertion. The slices are not
        atomic together, and need not be: the entries of a checkpoint killed half-way are replayed
        from the journal (lastMark comes after). Synced once at the end unless `sync` is False.

        `wal=False` writes to the memtable only (no WAL record, no sync): lost to a kill -9 until
        `persist` has flushed them into an SST file, so only for what the journal can give again.
        `sync=False` with the WAL: durable once `persist` (or `sync_wal`) has synced it."""
        options = None if wal else self._no_wal
        step = WRITE_SLICE * record.size
        view = memoryview(b"".join(buffers))  # many small ledgers' records in one native write
        for at in range(0, len(view), step):
            batch = rd.WriteBatch(raw_mode=True)
            deque(starmap(batch.put, record.iter_unpack(view[at : at + step])), maxlen=0)
            self._db.write(batch, options)
        # Counted after the write: a persist that sees the count made it durable.
        if not wal:
            self._unpersisted += 1
        elif sync:
            self.sync_wal()
        else:
            self._unsynced += 1

    @property
    def unpersisted(self) -> bool:
        """Whether writes made without the WAL may not be in an SST file yet, or unsynced ones to the WAL
        not on disk."""
        return self._persisted < self._unpersisted or self._synced < self._unsynced

    def persist(self) -> None:
        """Every write so far durable: the WAL synced if unsynced writes went to it, then, if writes
        went without it, RocksDB's flush (the memtables written out, the files and MANIFEST fsynced).
        Both with the GIL released."""
        if self._synced < self._unsynced:
            self.sync_wal()
        seen = self._unpersisted
        if self._persisted >= seen:
            return
        try:
            self.flush()
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status text
            # An OSError, as a failed entry log write: the checkpoint fails, the bookie goes read-only.
            raise OSError(f"{self.path}: RocksDB flush failed: {exc}") from None
        with self._persist_lock:
            self._persisted = max(self._persisted, seen)

    def delete_range(self, first: bytes, end: bytes) -> None:
        """Remove keys in [first, end), synced."""
        batch = rd.WriteBatch(raw_mode=True)
        batch.delete_range(first, end)
        self._apply(batch, sync=True)

    def _apply(self, batch: rd.WriteBatch, sync: bool) -> None:
        self._db.write(batch)  # the WAL written to the OS (RocksDB flushes it at every write)
        if sync:
            self.sync_wal()

    def sync_wal(self) -> None:
        """The WAL on disk, as a synced write would leave it, but with the GIL released: rocksdict holds
        it through a synced write's fdatasync, which would stop the bookie's reactor for as long. Each
        `*.log` file is fdatasynced (one RocksDB removes meanwhile was made obsolete by a flushed,
        synced SST file), then the directory (a WAL file RocksDB has just created)."""
        seen = self._unsynced
        for wal in self.path.glob(WAL_GLOB):
            try:
                fd = os.open(wal, os.O_RDONLY | CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        fsync_directory(self.path)
        with self._persist_lock:
            self._synced = max(self._synced, seen)

    def items(self, first: bytes = b"", end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [first, end) in order with their values."""
        it = self._db.iter()
        it.seek(first)
        while it.valid():
            key = bytes(it.key())
            if end is not None and key >= end:
                return
            yield key, bytes(it.value())
            it.next()

    def values(self, first: bytes, end: bytes) -> list[bytes]:
        """The values of the keys in [first, end), in key order (the bound and the walk in C: a third
        of a Python-level iterator's time per value)."""
        return list(self._db.values(from_key=first, read_opt=_bounded(end)))

    def packed_chunks(
        self, key_size: int, value_size: int, size: int, first: bytes = b"", end: bytes | None = None
    ) -> Iterator[bytes]:
        """The keys in [first, end) (to the last when `end` is None) with their values, `size` at a time,
        each chunk packed key, value, key, value... (write_records' layout): walked in C, joined in C,
        for numpy to read as fixed-size records. CorruptDataError naming a key or value of another
        size."""
        items = self._db.items(from_key=first, read_opt=None if end is None else _bounded(end))
        while chunk := cast(list[tuple[bytes, bytes]], list(islice(items, size))):
            packed = b"".join(chain.from_iterable(chunk))
            key_sizes = set(map(len, map(itemgetter(0), chunk)))
            if len(packed) != (key_size + value_size) * len(chunk) or key_sizes != {key_size}:
                key = next(k for k, v in chunk if (len(k), len(v)) != (key_size, value_size))
                raise CorruptDataError(
                    f"{self.path}: key {key.hex()}: not a {key_size}-byte key and {value_size}-byte value"
                )
            yield packed

    def last_before(self, end: bytes) -> tuple[bytes, bytes] | None:
        """The greatest key below `end` with its value (Java's getFloor), or None."""
        it = self._db.iter()
        it.seek_for_prev(end)
        if it.valid() and bytes(it.key()) == end:
            it.prev()
        if not it.valid():
            return None
        return bytes(it.key()), bytes(it.value())

    def property_int(self, name: str) -> int | None:
        """One of RocksDB's integer properties (`rocksdb.block-cache-capacity`, ...), or None."""
        value = self._db.property_int_value(name)
        return None if value is None else int(value)

    def compact(self) -> None:
        """Compact every level (Java's compact(): the whole key range), e.g. after many deletions.

        rocksdict releases the GIL for the whole compaction (measured with 0.3.29: a thread compacting
        1.6M keys for 2.4 s left another thread's pure-Python loop its full speed), so the reactor goes
        on; what it must not do is stop the bookie's writes. An exclusive manual compaction (RocksDB's
        default) holds back RocksDB's own compactions meanwhile, so the level-0 files of the memtable
        flushes made during a long one pile up into a write stall, and a stalled write holds the GIL:
        not exclusive here. The last level is rewritten too (RocksDB skips it by default): a compaction
        asked for after many deletions is meant to drop their tombstones wherever they are."""
        options = rd.CompactOptions()
        options.set_exclusive_manual_compaction(False)
        options.set_bottommost_level_compaction(rd.BottommostLevelCompaction.force_optimized())
        self._db.compact_range(None, None, options)

    def flush(self) -> None:
        """Memtables to SST files (so a copy of the directory holds the data without the WAL)."""
        self._db.flush(True)

    def close(self) -> None:
        self._db.close()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._scratch is not None:
            os.close(self._owner_fd)
            self._owner_fd = -1
            self._scratch.cleanup()
            self._scratch = None


def _scratch_dir(kind: str) -> tuple[tempfile.TemporaryDirectory[str], int]:
    """A scratch directory of this process's (dead owners' leftovers removed first) and the descriptor
    of its lock file, flocked until it is closed (or the process dies)."""
    sweep_scratch()
    scratch = tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX + kind)
    fresh = Path(scratch.name) / (OWNER_LOCK + ".new")
    fd = os.open(fresh, os.O_RDWR | os.O_CREAT | CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(fresh, fresh.with_name(OWNER_LOCK))  # a sweeper sees the lock file only once it is held
    return scratch, fd


def sweep_scratch() -> int:
    """Remove up to SWEEP_MAX scratch directories of dead owners from the temp dir (a scan process or
    an offline command killed -9 leaves its own); a live owner's stays. Returns how many were removed."""
    base = tempfile.gettempdir()
    try:
        with os.scandir(base) as entries:
            found = [e for e in entries if e.name.startswith(SCRATCH_PREFIX)]
    except OSError:
        return 0
    removed = 0
    uid = os.getuid()
    for entry in found:
        if removed >= SWEEP_MAX:
            break
        with contextlib.suppress(OSError):  # gone meanwhile (another sweeper), or not ours to read
            ours = entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == uid
            if ours and not _owner_alive(Path(entry.path)):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
    return removed


def _owner_alive(directory: Path) -> bool:
    """Whether a process holds the directory's lock (an flock dies with its process)."""
    try:
        fd = os.open(directory / OWNER_LOCK, os.O_RDWR | CLOEXEC)
    except FileNotFoundError:
        return time.time() - directory.stat().st_mtime < UNLOCKED_AGE_S
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the lock if it was taken: the directory is removed next
    return False
