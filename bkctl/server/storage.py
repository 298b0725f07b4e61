"""Ledger storage of the bookie: add / read / fence, checkpoints (lastMark) and replay on start.

Threads: the reactor thread validates adds, puts them in the write cache and appends journal records
(a ledger's records always to the same journal: ledger id mod the number of journal dirs); each
journal's sync thread fdatasyncs; a reactor pool thread runs each checkpoint (entry log, index
pages, lastMark, old journals) while adds go on into a fresh write cache. Reads look in the active
cache, then the cache being flushed, then index + entry log. See docs/bookie.md, "Storage engine".
"""

from __future__ import annotations

import bisect
import heapq
import logging
import os
import random
import shutil
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.internet.threads import deferToThreadPool
from twisted.python.failure import Failure

from bkctl import limits
from bkctl.errors import CorruptDataError, ProtocolError, UsageError
from bkctl.files.digests import DigestChecker
from bkctl.files.marks import LAST_MARK_NAME, read_last_mark
from bkctl.protocol import entry_availability
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import index_format as ixf
from bkctl.protocol import journal_format as jf
from bkctl.protocol.journal_format import RecordKind
from bkctl.protocol.wire import ReturnCode
from bkctl.server.db_ledger_index import DbLedgerIndex
from bkctl.server.entrylog import EntryLogReader, EntryLogWriter
from bkctl.server.faults import fault_point
from bkctl.server.fileio import write_durably
from bkctl.server.journal import JournalSettings, JournalWriter, Mark, list_journals, remove_old_journals
from bkctl.server.ledger_dirs import LedgerDirStore, ledger_dir_stores
from bkctl.server.ledger_storage import ENGINES, LedgerIndex
from bkctl.server.metrics import StorageMetrics
from bkctl.server.moves import Moved, write_moves
from bkctl.server.read_cache import ReadCacheMetrics
from bkctl.server.replay import ReplayProgress, ReplayReport, merge_reports, replay
from bkctl.server.replay_runs import take_runs
from bkctl.server.rocksdb_settings import DEFAULT as DEFAULT_ROCKSDB
from bkctl.server.rocksdb_settings import RocksDbSettings
from bkctl.server.start_checks import rebuild_hint
from bkctl.server.storage_kind import DB, INTERLEAVED, check_storage
from bkctl.server.write_cache import SIZE_PREFIX, LedgerBuffer, WriteCache, shifted_slots

log = logging.getLogger("bkctl.bookie")

MiB: Final = 1024 * 1024
_KEY: Final = struct.Struct(">qq")
_ENTRY_LAC: Final = struct.Struct(">q")  # a packaged entry's LAC, after its ledger and entry ids
_EOK: Final = int(ReturnCode.EOK)
_EBADREQ: Final = int(ReturnCode.EBADREQ)
_ENTRY_ID_MAX: Final = limits.ENTRY_ID_MAX
_EUA: Final = int(ReturnCode.EUA)
_EFENCED: Final = int(ReturnCode.EFENCED)
_EREADONLY: Final = int(ReturnCode.EREADONLY)
_EIO: Final = int(ReturnCode.EIO)
_ENOLEDGER: Final = int(ReturnCode.ENOLEDGER)
_ENOENTRY: Final = int(ReturnCode.ENOENTRY)
_LAST_ENTRY_ID: Final = -1
_ENTRY_SIZE_MIN: Final = _KEY.size  # a stored entry starts with its ledger and entry ids
_ENTRY_SIZE_MAX: Final = limits.PACKAGED_ENTRY_SIZE_MAX
_MASTER_KEY_SIZE_MAX: Final = limits.MASTER_KEY_SIZE_MAX
# Replay indexes what it wrote (checked after each run of records, so it may pass these by one read
# chunk's worth) once it holds REPLAY_SLOTS_MAX entries' slots, bounding the slot maps it keeps, or
# before: once it holds REPLAY_SLOTS_MIN and REPLAY_SLOTS_PER_LEDGER per ledger among them. Smaller
# rounds cost less CPU (smaller maps) and spread the entry log's fsyncs over the replay, but each round
# writes and fsyncs an index file per ledger on the interleaved engine. 1 GiB of 1 KiB entries
# (benchmarks/replay.py, 2026-11-29): 16 ledgers, 131,072 per round replayed in 3.6-4.0 s where
# 1,000,000 took 4.6 s (either engine); 2,000 ledgers, the interleaved engine took 14-16 s in rounds of
# 131,072 against 7.4-8.2 s in rounds of 1,000,000.
REPLAY_SLOTS_MIN: Final = 131_072  # local bound
REPLAY_SLOTS_PER_LEDGER: Final = 1024  # local bound: an index page's worth
REPLAY_SLOTS_MAX: Final = 1_000_000  # local bound
# A checkpoint starts once the write cache holds this share of write_cache_max_bytes (4 of the default
# 64 MiB). Each checkpoint's burst of entry-log writes and fsyncs slows the journal's fdatasync on a
# shared disk and was most of the add latency tail: with 3 bookie processes (1 KiB, 512 in flight) p99
# was 25 ms with no checkpoint in the run, 40-49 ms at 1/4, 29-38 at 1/8, 28-37 at 1/16; one bookie
# went from p99 18-20 to 10-12 ms for about 6% more CPU per add (more, smaller fsyncs).
CHECKPOINT_AT_FRACTION: Final = 1 / 16
# Each checkpoint's threshold is that share times a random factor in this range. The bookies of an
# ensemble get the same stream (E=3, Qw=2: 2 of every 3 entries each), so with one fixed threshold they
# checkpointed at the same moment and their entry-log bursts shared the disk (3 bookie processes: every
# 12-17 ms gap between add completions was three overlapping checkpoints).
CHECKPOINT_JITTER: Final = (0.5, 1.5)
# Compaction sends one batch per checkpoint, 20-40 checkpoints a second: those write lastMark (a file
# fsync, a rename and a directory fsync, each a disk cache flush a concurrent add's journal fdatasync
# waits behind) at most this often. A lagging lastMark only means a longer replay.
COMPACTION_MARK_INTERVAL_S: Final = 1.0  # local bound
# The db engine commits locations to RocksDB's memtable only (db_ledger_index.DbLedgerIndex.commit):
# lastMark may move past them only once a memtable flush made them durable, an SST file, its fsync and a
# MANIFEST fsync. A checkpoint the write cache's size started (10 a second at 40k adds/s) leaves lastMark
# behind until this long since the last one; any other checkpoint (periodic, explicit, the stop's)
# flushes and moves it. A kill -9 replays at most this much more journal.
UNPERSISTED_MARK_INTERVAL_S: Final = 1.0  # local bound

__all__ = ["Moved", "ReplayReport", "Storage", "StorageConfig"]


@dataclass(frozen=True)
class StorageConfig:
    """Bookie storage settings; the BookKeeper bk_server.conf name is in each comment."""

    journal_dirs: tuple[Path, ...]  # journalDirectories: ledger L's records go to journal L mod their count
    ledger_dirs: tuple[Path, ...]  # ledgerDirectories
    index_dirs: tuple[Path, ...] = ()  # indexDirectories; empty = the ledger dirs
    journal_max_group_wait_ms: float = 2.0  # journalMaxGroupWaitMSec
    journal_buffered_writes_threshold: int = 512 * 1024  # journalBufferedWritesThreshold
    journal_buffered_entries_threshold: int = 0  # journalBufferedEntriesThreshold (0 = off)
    journal_flush_when_queue_empty: bool = False  # journalFlushWhenQueueEmpty
    journal_prealloc_size: int = 16 * MiB  # journalPreAllocSizeMB
    journal_max_size: int = 2048 * MiB  # journalMaxSizeMB
    journal_alignment: int = 512  # journalAlignmentSize
    journal_max_backups: int = 5  # journalMaxBackups
    journal_sync_data: bool = True  # journalSyncData (False only for tests and benchmarks)
    log_size_limit: int = 1024 * MiB  # logSizeLimit
    flush_interval_ms: int = 60_000  # flushInterval (checkpoint period)
    ledger_cache_pages_max: int = 8192  # pageLimit: index pages (8 KiB each) kept in memory
    write_cache_max_bytes: int = 64 * MiB  # skipListSizeLimit: a bigger write cache starts a checkpoint
    disk_usage_threshold: float = 0.95  # diskUsageThreshold: above it the bookie turns read-only
    disk_usage_lwm_threshold: float = 0.90  # diskUsageLwmThreshold: below it, writable again
    read_only: bool = False  # readOnlyModeEnabled + forced read-only at start
    engine: str = INTERLEAVED  # ledgerStorageClass: where locations and ledger state live (ledger_storage.py)
    read_cache_max_bytes: int = 64 * MiB  # dbStorage_readAheadCacheMaxSizeMb (db engine; 0 = no read cache)
    read_ahead_batch: int = 100  # dbStorage_readAheadCacheBatchSize (db engine)
    rocksdb: RocksDbSettings = DEFAULT_ROCKSDB  # dbStorage_rocksDB_* (db engine)

    def __post_init__(self) -> None:
        if not 1 <= len(self.journal_dirs) <= limits.JOURNAL_DIRS_MAX:
            raise UsageError(
                f"1 to {limits.JOURNAL_DIRS_MAX} journal dirs are supported, got {len(self.journal_dirs)}"
            )
        if len(set(self.journal_dirs)) != len(self.journal_dirs):
            raise UsageError("a journal dir is listed twice")
        if not self.ledger_dirs:
            raise UsageError("at least one ledger dir is needed")
        if self.engine not in ENGINES:
            raise UsageError(f"storage engine {self.engine!r}: expected one of {', '.join(ENGINES)}")
        if len(set(self.ledger_dirs)) != len(self.ledger_dirs):
            raise UsageError("a ledger dir is listed twice")
        if not self.index_dirs or self.engine == DB:  # DbLedgerStorage 4.14 keeps its index in the ledger dir
            object.__setattr__(self, "index_dirs", self.ledger_dirs)
        if self.log_size_limit >= 1 << 31:  # entry offsets must fit the low 32 bits of index slots
            raise UsageError(f"log size limit {self.log_size_limit} must be below 2 GiB")
        if self.journal_alignment < 16 or self.journal_alignment % 16:
            raise UsageError(f"journal alignment {self.journal_alignment} must be a multiple of 16")

    def journal_settings(self, index: int = 0) -> JournalSettings:
        """Settings of journal `index` (its dir's `current/`); every journal shares the tuning."""
        return JournalSettings(
            directory=self.journal_dirs[index] / "current",
            group_wait_ms=self.journal_max_group_wait_ms,
            buffered_bytes_threshold=self.journal_buffered_writes_threshold,
            buffered_entries_threshold=self.journal_buffered_entries_threshold,
            flush_when_queue_empty=self.journal_flush_when_queue_empty,
            prealloc_size=self.journal_prealloc_size,
            max_size=self.journal_max_size,
            alignment=self.journal_alignment,
            max_backups=self.journal_max_backups,
            sync_data=self.journal_sync_data,
            index=index,
        )


@dataclass
class LedgerInfo:
    """What the bookie knows of one ledger beyond its entries; persisted in the index header."""

    master_key: bytes
    fenced: bool = False
    explicit_lac: bytes | None = None
    last_entry_id: int = -1  # highest entry id stored here (cache or disk)
    index_version: int = ixf.V1
    dirty: bool = True  # the index header must be written at the next checkpoint
    key_journaled: bool = False  # a master key record is in the journal (or the index has the key)
    # Journal position just past this ledger's fence record; once the journal is durable that far, a
    # fencing read is answered at once, as Java does. (-1, 0): fenced before this run (replay, index).
    fence_mark: Mark = (-1, 0)
    # The LAC carried by the entry `lac_of` (the last one, when it was asked for): see last_add_confirmed.
    lac: int = -1
    lac_of: int = -1

    def header(self) -> ixf.IndexHeader:
        version = ixf.V1 if self.explicit_lac is not None else self.index_version
        state = ixf.STATE_FENCED if self.fenced else 0
        return ixf.IndexHeader(version, self.master_key, state, self.explicit_lac)


@dataclass
class _Checkpoint:
    cache: WriteCache
    headers: dict[int, ixf.IndexHeader]
    marks: tuple[Mark, ...]  # one per journal, taken at the swap
    waiters: list[Deferred[None]] = field(default_factory=list)
    moves: list[Moved] = field(default_factory=list)  # compaction's records, copied after the cache's
    mark_wanted: bool = True  # False: started by the write cache's size, lastMark may wait


class Storage:
    """One bookie's ledger storage. Every method except `start` runs on the reactor thread."""

    def __init__(
        self,
        config: StorageConfig,
        on_durable: Callable[[list[object]], None],
        reactor: Any = None,
        on_lost: Callable[[list[object]], None] | None = None,
    ) -> None:
        """`on_lost` gets the tokens of adds a failed journal will never make durable (never acknowledged)."""
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.config = config
        self.metrics = StorageMetrics()
        self._reactor = reactor
        self._on_durable = on_durable
        self._on_lost = on_lost
        self._journal_currents = [d / "current" for d in config.journal_dirs]
        self._ledger_currents = [d / "current" for d in config.ledger_dirs]
        # Entry logs and index: one store per ledger dir on the db engine (ledger L in store L mod n,
        # as Java's DbLedgerStorage), one for all on the interleaved engine (ledger_dirs.py).
        self._stores = ledger_dir_stores(
            config.engine,
            config.ledger_dirs,
            config.index_dirs,
            config.log_size_limit,
            config.ledger_cache_pages_max,
            self._stored_sample,
            config.read_cache_max_bytes,
            config.read_ahead_batch,
            config.rocksdb,
        )
        self._replay_runs = [store.runs for store in self._stores]
        self.read_cache_metrics = ReadCacheMetrics()
        self._journals = [
            JournalWriter(config.journal_settings(i), reactor, on_durable, self.metrics, self._journal_failed)
            for i in range(len(config.journal_dirs))
        ]
        self._ledgers: dict[int, LedgerInfo] = {}
        self._active = WriteCache()
        self._flushing: WriteCache | None = None
        self._running: _Checkpoint | None = None
        self._waiters: list[Deferred[None]] = []
        self._idle_waiters: list[Deferred[None]] = []  # see when_idle
        self._moves: list[Moved] = []  # compaction batches for the next checkpoint
        self._mark_wanted = False  # a waiter of the next checkpoint wants lastMark moved
        self._manual_read_only = config.read_only
        self._disk_full = False
        self._journal_broken = False
        self._periodic: Any = None
        self._started = False
        self._stopping: Deferred[None] | None = None
        self._adds_refused = False  # any of the four states above: see _refusal
        self._refresh_refusal()
        self.last_marks_written: tuple[Mark, ...] = ((-1, 0),) * len(self._journals)
        self._marks_written_at = 0.0  # monotonic time of the last lastMark write
        self._replay_skipped = 0
        self._read_digests = DigestChecker()  # each ledger's digest type, inferred from its stored entries
        self._unverifiable: set[int] = set()  # ledgers whose entries match no CRC: MAC or DUMMY
        # Long-poll reads (v3) waiting for a ledger's LAC to pass a value: ledger id -> [(value, notify)].
        self._lac_watchers: dict[int, list[tuple[int, Callable[[], None]]]] = {}
        self._checkpoint_base_bytes = max(1, int(config.write_cache_max_bytes * CHECKPOINT_AT_FRACTION))
        self._checkpoint_at_bytes = self._next_checkpoint_at()

    # --- start: replay ----------------------------------------------------------------------------

    def start(self, progress: ReplayProgress | None = None) -> ReplayReport:
        """Blocking, before the bookie listens: replay each journal from its lastMark, checkpoint, open files.

        Journals are replayed one after the other: a ledger's records are all in one journal, so the
        order across journals does not matter. lastMark moves past the replayed records here, or, when
        the db engine holds their locations in memory, at the first checkpoint, started at once.
        """
        check_storage(self.config.engine, (*self.config.ledger_dirs, *self.config.index_dirs))
        for directory in (
            *self._journal_currents,
            *self._ledger_currents,
            *(d / "current" for d in self.config.index_dirs),
        ):
            directory.mkdir(parents=True, exist_ok=True)
        for store in self._stores:
            store.open()
        marks = self._read_last_marks()
        self.last_marks_written = tuple(mark for mark, _ in marks)
        report = merge_reports(
            [
                replay(directory, mark, self._replay_record, self._replay_take, written_ns, progress)
                for directory, (mark, written_ns) in zip(self._journal_currents, marks, strict=True)
            ]
        )
        report.skipped += self._replay_skipped
        self._write_replay_slots()
        for journal, directory in zip(self._journals, self._journal_currents, strict=True):
            journal.start(_next_journal_id(directory))
        self._started = True
        if self._index_unpersisted():
            # The db engine holds the replayed locations (db_ledger_index.REPLAY_HELD_MAX): the bookie
            # listens now, and the checkpoint started as the reactor runs writes them and lastMark.
            self._reactor.callLater(0, self._checkpoint_logged)
        else:
            self._write_last_marks(self._marks())
            self._remove_old_journals(self._marks())
        self._schedule_periodic()
        log.info(
            "replayed %d records (%d entries, %.1f MB) from %s in %.3f s (%.0f MB/s)",
            report.records,
            report.entries,
            report.bytes / 1e6,
            ", ".join(report.journals) or "no journal",
            report.seconds,
            report.mb_per_s,
        )
        return report

    def _last_mark_name(self, index: int) -> str:
        """`lastMark` with one journal, `lastMark.<i>` for journal i of several, as BookKeeper names them."""
        return LAST_MARK_NAME if len(self._journals) == 1 else f"{LAST_MARK_NAME}.{index}"

    def _read_last_marks(self) -> list[tuple[Mark, int | None]]:
        return [self._read_last_mark(self._last_mark_name(i)) for i in range(len(self._journals))]

    def _read_last_mark(self, name: str) -> tuple[Mark, int | None]:
        """The largest mark named `name` over the ledger dirs and when it was written (ns); ((-1, 0),
        None) (replay everything) if none."""
        marks: list[tuple[Mark, int | None]] = [((-1, 0), None)]
        for directory in self._ledger_currents:
            path = directory / name
            if path.is_file():
                try:
                    found = read_last_mark(path)
                    written_ns = path.stat().st_mtime_ns
                except (ProtocolError, OSError) as exc:
                    log.warning("%s: ignoring unreadable lastMark: %s", path, exc)
                    continue
                marks.append(((found.journal_id, found.offset), written_ns))
        return max(marks, key=lambda m: m[0])

    def _replay_take(self, buffer: bytearray, pos: int, end: int) -> tuple[int, int]:
        """The fast path: runs of DATA records of known ledgers straight to the entry log (of each
        record's ledger directory: with several, each directory's records in one write)."""
        stop, taken = take_runs(self._replay_runs, buffer, pos, end)
        if self._replay_round_full():
            self._write_replay_slots()
        return stop, taken

    def _replay_round_full(self) -> bool:
        """Whether replay should index what it holds now (see REPLAY_SLOTS_MIN)."""
        count = sum(store.runs.count for store in self._stores)
        if count >= REPLAY_SLOTS_MAX:
            return True
        ledgers = sum(store.runs.ledger_count for store in self._stores)
        return count >= REPLAY_SLOTS_MIN and count >= REPLAY_SLOTS_PER_LEDGER * ledgers

    def _replay_record(self, kind: RecordKind, body: memoryview) -> str | None:
        """Every record the fast path does not take (its ledger's first DATA record, special records, a
        DATA record whose digest failed there); returns why a record was rejected (replay logs it)."""
        if kind is RecordKind.DATA:
            ledger_id, entry_id = _KEY.unpack_from(body)
            info = self._ledgers.get(ledger_id) or self._replay_ledger(ledger_id)
            if info is None:
                self._replay_skipped += 1
                return None
            # Straight to the entry log in journal order: no copy into the write cache, no sort.
            rejected = self._store_of(ledger_id).runs.add(ledger_id, entry_id, body)
            if self._replay_round_full():
                self._write_replay_slots()
            return rejected
        elif kind is RecordKind.MASTER_KEY:
            ledger_id, key = jf.decode_master_key(body)
            info = self._replay_ledger(ledger_id)
            if info is None:
                self._ledgers[ledger_id] = LedgerInfo(key, key_journaled=True)
            elif info.master_key != key:
                info.master_key, info.dirty = key, True
        elif kind is RecordKind.FENCE or kind is RecordKind.EXPLICIT_LAC:
            self._replay_ledger_state(kind, body)
        elif kind is RecordKind.UNKNOWN:
            self._replay_skipped += 1
        return None

    def _stored_sample(self, ledger_id: int) -> bytes | None:
        """The ledger's last checkpointed entry (its digest type tells a corrupt journal record from a
        MAC or DUMMY one), or None."""
        info = self._ledgers.get(ledger_id)
        if info is None or info.last_entry_id < 0:
            return None
        rc, data = self._read_stored(ledger_id, info.last_entry_id, verify=False)
        return data if rc == _EOK else None

    def _write_replay_slots(self) -> None:
        """Index the entries replayed so far (their entry log bytes are fsynced before lastMark moves)."""
        slots: dict[int, dict[int, int]] = {}
        for store in self._stores:
            slots.update(store.runs.drain())
            store.writer.flush()
        for ledger_id, ledger_slots in slots.items():
            info = self._ledgers[ledger_id]
            info.last_entry_id = max(info.last_entry_id, max(ledger_slots))
        headers = self._dirty_headers()
        for ledger_id in sorted(slots.keys() | headers.keys()):
            self._store_of(ledger_id).index.write(ledger_id, headers.get(ledger_id), slots.get(ledger_id, {}))
        for store in self._stores:
            store.index.commit(replayed=True)

    def _store_of(self, ledger_id: int) -> LedgerDirStore:
        """The entry logs and index holding the ledger (db engine: its ledger dir, Java's rule)."""
        stores = self._stores
        return stores[ledger_id % len(stores)] if len(stores) > 1 else stores[0]

    def _replay_ledger_state(self, kind: RecordKind, body: memoryview) -> None:
        ledger_id = jf.record_key(body)[0]
        info = self._replay_ledger(ledger_id)
        if info is None:
            # As Java does: a ledger whose key we never saw was deleted; its records are skipped.
            self._replay_skipped += 1
            return
        if kind is RecordKind.FENCE:
            info.fenced = True
        else:
            info.explicit_lac = jf.decode_explicit_lac(body)[1]
        info.dirty = True

    def _replay_ledger(self, ledger_id: int) -> LedgerInfo | None:
        """Replay's view of a ledger: None only when it is known deleted (no index file and no master key
        record seen: Java's rule). An index that cannot be read stops the start: skipping the ledger's
        records there would lose them once the next checkpoint moves lastMark past them."""
        try:
            return self._ledger(ledger_id)
        except CorruptDataError as exc:
            raise CorruptDataError(
                f"journal replay: ledger {ledger_id}: {exc}: refusing to start, lastMark not moved; "
                + rebuild_hint(ledger_id, self.config.ledger_dirs, self.config.index_dirs)
            ) from None

    def _ledger_or_none(self, ledger_id: int) -> LedgerInfo | None:
        try:
            return self._ledger(ledger_id)
        except CorruptDataError as exc:
            log.error("ledger %d: %s", ledger_id, exc)
            return None

    # --- adds -----------------------------------------------------------------------------------

    def add(
        self,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        entry: bytes | bytearray,
        recovery: bool,
        token: object,
    ) -> int:
        """Accept an entry (EOK; `token` goes to on_durable once it is durable) or refuse it now.

        Like Java, a bookie made read-only by the operator still takes recovery adds while its disks have
        room, so fencing recovery and re-replication can finish; a full disk refuses them too.
        """
        if self._adds_refused:  # one test on the hot path for the four states that refuse adds
            refusal = self._refusal(recovery)
            if refusal != _EOK:
                return self.metrics.error(refusal)
        size = len(entry)
        if (
            size < _ENTRY_SIZE_MIN
            or size > _ENTRY_SIZE_MAX
            or not 0 <= entry_id <= _ENTRY_ID_MAX
            or len(master_key) > _MASTER_KEY_SIZE_MAX
            or _KEY.unpack_from(entry) != (ledger_id, entry_id)
        ):
            return self.metrics.error(_EBADREQ)
        info = self._ledgers.get(ledger_id)
        if info is None:
            try:
                info = self._ledger(ledger_id)
            except CorruptDataError as exc:
                log.error("add to ledger %d: %s", ledger_id, exc)
                return self.metrics.error(_EIO)
            if info is None:
                info = self._new_ledger(ledger_id, master_key)
        if info.master_key != master_key:
            return self.metrics.error(_EUA)
        if info.fenced and not recovery:
            return self.metrics.error(_EFENCED)
        self._active.put(ledger_id, entry_id, entry)
        if entry_id > info.last_entry_id:
            info.last_entry_id = entry_id
        journals = self._journals  # _journal_of, inline
        journals[ledger_id % len(journals)].append(entry, token)
        if self._lac_watchers and ledger_id in self._lac_watchers:
            self._lac_advanced(ledger_id, _ENTRY_LAC.unpack_from(entry, _KEY.size)[0])
        metrics = self.metrics
        metrics.adds += 1
        metrics.bytes_written += size
        if self._active.size_bytes >= self._checkpoint_at_bytes and self._running is None:
            self._reactor.callLater(0, self._checkpoint_logged, False)
        return _EOK

    def _refusal(self, recovery: bool) -> int:
        """EREADONLY, EIO, or EOK for an add while `_adds_refused` (see `add` for recovery adds)."""
        if self._disk_full or self._stopping is not None or (self._manual_read_only and not recovery):
            return _EREADONLY
        if self._journal_broken:
            return _EIO
        return _EOK

    def _refresh_refusal(self) -> None:
        """Call after any of the states `_refusal` reads changes."""
        self._adds_refused = self.read_only or self._stopping is not None

    def _new_ledger(self, ledger_id: int, master_key: bytes) -> LedgerInfo:
        """First sight of a ledger: its master key goes to the journal before any of its records."""
        info = LedgerInfo(master_key, key_journaled=True)
        self._ledgers[ledger_id] = info
        self._journal_of(ledger_id).append(jf.encode_master_key(ledger_id, master_key), None)
        return info

    def _journal_of(self, ledger_id: int) -> JournalWriter:
        """The ledger's journal: its records all go there, so replay keeps their order (Python's % is
        non-negative for a positive divisor, like BookKeeper's MathUtils.signSafeMod)."""
        return self._journals[ledger_id % len(self._journals)]

    def _marks(self) -> tuple[Mark, ...]:
        """Every journal's position after its last appended record."""
        return tuple(journal.mark for journal in self._journals)

    def _ledger(self, ledger_id: int) -> LedgerInfo | None:
        """The ledger's state, loaded from its index file on first use; None when the bookie lacks it."""
        info = self._ledgers.get(ledger_id)
        if info is not None:
            return info
        loaded = self._store_of(ledger_id).index.load(ledger_id)
        if loaded is None:
            return None
        header = loaded.header
        info = LedgerInfo(
            header.master_key,
            header.fenced,
            header.explicit_lac,
            loaded.last_entry_id,
            header.version,
            dirty=False,
            key_journaled=True,
        )
        self._ledgers[ledger_id] = info
        return info

    # --- fencing --------------------------------------------------------------------------------

    def fence(self, ledger_id: int, master_key: bytes, token: object) -> int:
        """Fence a ledger: EOK and `token` delivered once the fence record is durable; EUA/EIO now.

        Like Java, a ledger this bookie has not seen is created fenced (its master key and a fence
        record are journaled), so an old writer's adds that arrive later are refused too.
        """
        self.metrics.fences += 1
        if self._stopping is not None:
            return self.metrics.error(_EREADONLY)
        if self._journal_broken:
            return self.metrics.error(_EIO)
        if len(master_key) > limits.MASTER_KEY_SIZE_MAX:
            return self.metrics.error(_EBADREQ)
        info = self._keyed_ledger(ledger_id, master_key, "fence ledger")
        if type(info) is int:
            return info
        assert isinstance(info, LedgerInfo)
        journal = self._journal_of(ledger_id)
        if not info.fenced:
            info.fenced = info.dirty = True
            journal.append(jf.encode_fence(ledger_id), token)
            info.fence_mark = journal.mark
            self._lac_advanced(ledger_id, None)  # long polls end on a fence, as in Java
        elif journal.durable_mark >= info.fence_mark:
            self._on_durable([token])  # already fenced durably: recovery reads need not wait an fsync
        else:
            journal.append_token(token)  # the fence record's own fsync is still to come
        return _EOK

    def _keyed_ledger(self, ledger_id: int, master_key: bytes, what: str) -> LedgerInfo | int:
        """The ledger for a request that proves its key (a ledger not seen yet is made with it, as Java
        does), or the error code: EUA for another key, EIO for an unreadable index."""
        try:
            info = self._ledger(ledger_id)
        except CorruptDataError as exc:
            log.error("%s %d: %s", what, ledger_id, exc)
            return self.metrics.error(_EIO)
        if info is None:
            return self._new_ledger(ledger_id, master_key)
        if info.master_key != master_key:
            return self.metrics.error(_EUA)
        return info

    def explicit_lac(self, ledger_id: int) -> bytes | None:
        """The last explicit-LAC body journaled for the ledger (restored by replay), or None."""
        info = self._ledger_or_none(ledger_id)
        return None if info is None else info.explicit_lac

    def is_fenced(self, ledger_id: int) -> bool:
        info = self._ledger_or_none(ledger_id)
        return info is not None and info.fenced

    # --- LAC: explicit LAC, force, long polls (the v3 operations) ----------------------------------

    def write_lac(self, ledger_id: int, master_key: bytes, lac_body: bytes, token: object) -> int:
        """WRITE_LAC: journal the explicit LAC body (EOK; `token` goes to on_durable once it is durable)
        or refuse now: EREADONLY like Java's read-only bookie, EUA for another key, EIO."""
        if self._stopping is not None or self._manual_read_only or self._disk_full:
            return self.metrics.error(_EREADONLY)
        if self._journal_broken:
            return self.metrics.error(_EIO)
        # The body is the writer's (ledger id, LAC, digest): too short or of another ledger, the index
        # header could not hold it.
        size_ok = ixf.EXPLICIT_LAC_SIZE_MIN <= len(lac_body) <= limits.EXPLICIT_LAC_SIZE_MAX
        if (
            not size_ok
            or _KEY.unpack_from(lac_body)[0] != ledger_id
            or len(master_key) > _MASTER_KEY_SIZE_MAX
        ):
            return self.metrics.error(_EBADREQ)
        info = self._keyed_ledger(ledger_id, master_key, "write LAC of ledger")
        if type(info) is int:
            return info
        assert isinstance(info, LedgerInfo)
        info.explicit_lac, info.dirty = bytes(lac_body), True
        self._journal_of(ledger_id).append(jf.encode_explicit_lac(ledger_id, lac_body), token)
        # As Java's FileInfo.setExplicitLac: the value raises the bookie's LAC and wakes long polls.
        lac = _ENTRY_LAC.unpack_from(lac_body, _ENTRY_LAC.size)[0]
        info.lac = max(info.lac, lac)
        self._lac_advanced(ledger_id, lac)
        return _EOK

    def force_ledger(self, ledger_id: int, token: object) -> int:
        """FORCE_LEDGER: `token` goes to on_durable after the ledger's journal next fsyncs (EOK), or EIO."""
        if self._journal_broken:
            return self.metrics.error(_EIO)
        self._journal_of(ledger_id).append_token(token)
        return _EOK

    def last_add_confirmed(self, ledger_id: int) -> tuple[int, int]:
        """(EOK, LAC) as Java's readLastAddConfirmed: the LAC the ledger's last entry here carries (-1
        without entries); (ENOLEDGER | EIO, -1). Cached until a newer last entry arrives."""
        try:
            info = self._ledger(ledger_id)
        except CorruptDataError as exc:
            log.error("LAC of ledger %d: %s", ledger_id, exc)
            return self.metrics.error(_EIO), -1
        if info is None:
            return _ENOLEDGER, -1
        last = info.last_entry_id
        if last >= 0 and info.lac_of != last:
            rc, data = self.read(ledger_id, last)
            if rc != _EOK:
                return rc, -1
            info.lac, info.lac_of = max(info.lac, _ENTRY_LAC.unpack_from(data, _KEY.size)[0]), last
        return _EOK, info.lac

    def watch_lac(self, ledger_id: int, previous_lac: int, notify: Callable[[], None]) -> bool:
        """A long-poll read: False when the ledger's LAC is already past `previous_lac` or it is fenced
        (answer now); else True and `notify()` is called once, when an add carries a higher LAC or the
        ledger is fenced, unless `unwatch_lac` comes first."""
        rc, lac = self.last_add_confirmed(ledger_id)
        if rc != _EOK or lac > previous_lac or self.is_fenced(ledger_id):
            return False
        self._lac_watchers.setdefault(ledger_id, []).append((previous_lac, notify))
        return True

    def unwatch_lac(self, ledger_id: int, notify: Callable[[], None]) -> None:
        watchers = self._lac_watchers.get(ledger_id)
        if watchers is None:
            return
        watchers[:] = [w for w in watchers if w[1] is not notify]
        if not watchers:
            del self._lac_watchers[ledger_id]

    def _lac_advanced(self, ledger_id: int, lac: int | None) -> None:
        """An add carried `lac` (None: the ledger was fenced): wake the long polls it answers."""
        watchers = self._lac_watchers.get(ledger_id)
        if watchers is None:
            return
        woken = [w for w in watchers if lac is None or lac > w[0]]
        if not woken:
            return
        remaining = [w for w in watchers if w not in woken]
        if remaining:
            self._lac_watchers[ledger_id] = remaining
        else:
            del self._lac_watchers[ledger_id]
        for _, notify in woken:
            notify()

    def disk_space(self) -> tuple[int, int]:
        """(total, free) bytes of the ledger directories' file systems, each once (GET_BOOKIE_INFO)."""
        seen: set[int] = set()
        total = free = 0
        for directory in self._ledger_currents:
            device = os.stat(directory).st_dev
            if device in seen:
                continue
            seen.add(device)
            usage = shutil.disk_usage(directory)
            total, free = total + usage.total, free + usage.free
        return total, free

    # --- reads ----------------------------------------------------------------------------------

    def read(self, ledger_id: int, entry_id: int) -> tuple[int, bytes]:
        """(EOK, stored entry) or (ENOLEDGER | ENOENTRY | EIO, b""); entry id -1 = the last one here."""
        self.metrics.reads += 1
        try:
            info = self._ledger(ledger_id)
        except CorruptDataError as exc:
            log.error("read ledger %d entry %d: %s", ledger_id, entry_id, exc)
            return self.metrics.error(_EIO), b""
        if info is None:
            return self.metrics.error(_ENOLEDGER), b""
        if entry_id == _LAST_ENTRY_ID:
            entry_id = info.last_entry_id
        if entry_id < 0:
            return self.metrics.error(_ENOENTRY), b""
        data = self._active.get(ledger_id, entry_id)
        if data is None and self._flushing is not None:
            data = self._flushing.get(ledger_id, entry_id)
        if data is not None:
            self.read_cache_metrics.hits += 1
            return _EOK, data
        store = self._store_of(ledger_id)
        cache = store.read_cache
        if cache is not None and cache.size_bytes:  # empty under random reads: none is kept
            data = cache.get(ledger_id, entry_id)
            # A read-ahead does not check digests (as Java's): checked here, a bad one read again below.
            if data is not None and self._digest_ok(ledger_id, entry_id, data):
                self.read_cache_metrics.hits += 1
                return _EOK, data
        return self._read_stored(ledger_id, entry_id, read_ahead=cache is not None)

    def _read_stored(
        self, ledger_id: int, entry_id: int, verify: bool = True, read_ahead: bool = False
    ) -> tuple[int, bytes]:
        path, slot_offset = None, 0
        store = self._store_of(ledger_id)
        try:
            location, path, slot_offset = store.index.location(ledger_id, entry_id)
            if not location:
                return self.metrics.error(_ENOENTRY), b""
            data = store.reader.read(location, ledger_id, entry_id)
            if verify and not self._digest_ok(ledger_id, entry_id, data):
                log_id, offset = ef.split_location(location)
                raise CorruptDataError(
                    f"entry log {ef.log_file_name(log_id)} offset {offset}: digest mismatch "
                    f"({self._read_digests.by_ledger[ledger_id].name} ledger)"
                )
            if read_ahead:
                self._read_ahead(store, ledger_id, entry_id, location, data)
            return _EOK, data
        except (CorruptDataError, ProtocolError, OSError) as exc:
            log.error(
                "read ledger %d entry %d: index %s slot at offset %d: %s",
                ledger_id,
                entry_id,
                path,
                slot_offset,
                exc,
            )
            return self.metrics.error(_EIO), b""

    def _read_ahead(
        self, store: LedgerDirStore, ledger_id: int, entry_id: int, location: int, data: bytes
    ) -> None:
        """A read from the entry log (a read cache miss): when it follows the ledger's previous read
        (read_cache.py), cache it and the ledger's entries after it in that log (Java's
        fillReadAheadCache, which does so on every miss); a failure only ends the read-ahead. A random
        read's entry is not cached: it would only push out entries read ahead for readers in order."""
        cache = store.read_cache
        assert cache is not None
        metrics = self.read_cache_metrics
        metrics.misses += 1
        if not cache.follows(ledger_id, location, len(data)):
            metrics.skipped += 1
            return
        cache.put(ledger_id, entry_id, data)
        try:
            fd = store.reader.fd_of(location)
            log_id, durable_end = store.writer.durable  # the log being written: not past its fsync
            end = durable_end if log_id == ef.split_location(location)[0] else None
            count, size = cache.read_ahead(fd, ledger_id, location, len(data), end)
        except (CorruptDataError, ProtocolError, OSError) as exc:
            log.debug("read-ahead of ledger %d after entry %d: %s", ledger_id, entry_id, exc)
            return
        metrics.batches += 1
        metrics.batch_entries += count
        metrics.batch_bytes += size

    def _digest_ok(self, ledger_id: int, entry_id: int, data: bytes) -> bool:
        """Does a stored entry's digest verify? A disk's flipped bits are an EIO, never wrong bytes.

        The ledger's digest type is inferred (CRC32C or CRC32, as the journal tail replay does). An
        entry matching neither belongs to a MAC or DUMMY ledger (a bookie cannot check those: no
        password) unless another stored entry of its ledger matches a CRC: then it is corrupt.
        """
        _, matches = self._read_digests.check(ledger_id, data)
        if matches is not None:
            return matches
        if ledger_id in self._unverifiable:
            return True
        for other in (entry_id - 1, entry_id + 1):
            rc, neighbour = (
                self._read_stored(ledger_id, other, verify=False) if other >= 0 else (_ENOENTRY, b"")
            )
            if rc == _EOK:
                if self._read_digests.check(ledger_id, neighbour)[0] is not None:
                    return False
                self._unverifiable.add(ledger_id)
                return True
        return True  # no neighbour stored: nothing to tell a corrupt entry from a MAC one

    # --- what the bookie holds (GET_LIST_OF_ENTRIES_OF_LEDGER) -----------------------------------

    def entry_availability(self, ledger_id: int) -> Deferred[tuple[int, bytes]]:
        """(EOK, AvailabilityOfEntriesOfLedger bytes of every entry held) or (ENOLEDGER | EIO, b"").

        The write caches are read now, on the reactor thread, the index file in a pool thread: an entry a
        checkpoint moves from a cache to the index meanwhile is in the caches' snapshot already.
        """
        try:
            info = self._ledger(ledger_id)
        except CorruptDataError as exc:
            log.error("entries of ledger %d: %s", ledger_id, exc)
            return succeed((self.metrics.error(_EIO), b""))
        if info is None:
            return succeed((_ENOLEDGER, b""))
        cached: set[int] = set()
        for cache in (self._active, self._flushing):
            buffer = cache.ledgers.get(ledger_id) if cache is not None else None
            if buffer is not None:
                cached.update(entry_id for entry_id, _ in buffer.numbered())
        pool = self._reactor.getThreadPool()
        indexed = self._store_of(ledger_id).index.entry_ids(ledger_id)
        done = deferToThreadPool(self._reactor, pool, _availability, indexed, sorted(cached))
        failed = self._availability_failed
        return done.addCallbacks(lambda body: (_EOK, body), failed, errbackArgs=(ledger_id,))

    def _availability_failed(self, failure: Failure, ledger_id: int) -> tuple[int, bytes]:
        log.error("entries of ledger %d: %s", ledger_id, failure.getErrorMessage())
        return self.metrics.error(_EIO), b""

    # --- read-only mode -------------------------------------------------------------------------

    def set_read_only(self, read_only: bool) -> None:
        self._manual_read_only = read_only
        self._refresh_refusal()
        log.warning("bookie storage is now %s", "read-only" if read_only else "writable")

    @property
    def read_only(self) -> bool:
        return self._manual_read_only or self._disk_full or self._journal_broken

    @property
    def manual_read_only(self) -> bool:
        """Read-only by the operator's choice (forceReadOnlyBookie, the admin switch)."""
        return self._manual_read_only

    def check_disk_usage(self) -> None:
        """Turn read-only above diskUsageThreshold, writable again under diskUsageLwmThreshold (the
        service calls it every diskCheckInterval, the checkpoint timer every flushInterval)."""
        usage = max(_disk_usage(d) for d in (*self._journal_currents, *self._ledger_currents))
        if not self._disk_full and usage > self.config.disk_usage_threshold:
            self._disk_full = True
            self._refresh_refusal()
            log.error("disk usage %.1f%% is above the threshold: read-only", usage * 100)
        elif self._disk_full and usage < self.config.disk_usage_lwm_threshold:
            self._disk_full = False
            self._refresh_refusal()
            log.warning("disk usage %.1f%% is below the low-water mark: writable again", usage * 100)
            if self._active and self._stopping is None:
                # Entries a failed checkpoint left in the write cache go to the entry log now.
                self._checkpoint_logged()
        if self._journal_broken:
            self._reopen_journals()

    def _reopen_journals(self) -> None:
        """Journals that failed for lack of space go on in new files once their disk is under the
        low-water mark, and adds are taken again (Java's bookie shuts down instead). Any other error (EIO:
        a failing disk) keeps the bookie read-only until an operator restarts it."""
        lwm = self.config.disk_usage_lwm_threshold
        for journal, directory in zip(self._journals, self._journal_currents, strict=True):
            if journal.failed is not None and _disk_usage(directory) < lwm:
                journal.reopen()
        if all(journal.failed is None for journal in self._journals):
            self._journal_broken = False
            self._refresh_refusal()
            log.warning("every journal is writable again: adds are accepted")

    def _journal_failed(self, exc: OSError, lost: list[object]) -> None:
        """A journal write or fdatasync failed: refuse adds (EIO) and drop the connections whose adds
        will never be acknowledged, so their clients fail them at once rather than time out."""
        self._journal_broken = True
        self._refresh_refusal()
        if lost and self._on_lost is not None:
            self._on_lost(lost)

    def _checkpoint_failed(self, exc: BaseException | None) -> None:
        """A checkpoint could not write the entry log, index or lastMark: read-only like a full disk
        (Java marks the ledger dir full); writable again once usage is under the low-water mark."""
        if isinstance(exc, OSError) and not self._disk_full:
            self._disk_full = True
            self._refresh_refusal()
            log.error(
                "checkpoint could not write (%s): read-only until disk usage is under %.0f%%",
                exc,
                self.config.disk_usage_lwm_threshold * 100,
            )

    # --- checkpoint -----------------------------------------------------------------------------

    def checkpoint(self, mark: bool = True) -> Deferred[None]:
        """Flush the write cache to the entry log and index (off the reactor thread), then lastMark;
        `mark=False`: lastMark may wait for a later checkpoint (see UNPERSISTED_MARK_INTERVAL_S)."""
        done: Deferred[None] = Deferred()
        self._waiters.append(done)
        self._mark_wanted = self._mark_wanted or mark
        if self._running is None:
            self._start_checkpoint()
        return done

    def _next_checkpoint_at(self) -> int:
        return max(1, int(self._checkpoint_base_bytes * random.uniform(*CHECKPOINT_JITTER)))

    def _start_checkpoint(self) -> None:
        self._checkpoint_at_bytes = self._next_checkpoint_at()
        run = _Checkpoint(
            self._active, self._dirty_headers(), self._marks(), self._waiters, self._moves, self._mark_wanted
        )
        self._waiters, self._moves, self._mark_wanted = [], [], False
        self._active, self._flushing, self._running = WriteCache(), run.cache, run
        pool = self._reactor.getThreadPool()
        deferred = deferToThreadPool(self._reactor, pool, self._checkpoint_in_thread, run)
        deferred.addBoth(self._checkpoint_done, run)

    def _dirty_headers(self) -> dict[int, ixf.IndexHeader]:
        headers = {}
        for ledger_id, info in self._ledgers.items():
            if info.dirty:
                headers[ledger_id] = info.header()
                info.dirty = False
        return headers

    def _checkpoint_in_thread(self, run: _Checkpoint) -> None:
        if not run.cache and not run.headers and not run.moves and run.marks == self.last_marks_written:
            return
        try:
            self._write_out(run.cache, run.headers, run.moves)
        except OSError:
            # No lastMark is written: replay still covers every entry of this run, and they stay in
            # the write cache (see _checkpoint_done). The unflushed entry log bytes go.
            for store in self._stores:
                store.writer.discard_unflushed()
            raise
        since = time.monotonic() - self._marks_written_at
        if run.moves and since < COMPACTION_MARK_INTERVAL_S:
            return  # lastMark may lag (replay covers more); see COMPACTION_MARK_INTERVAL_S
        if not run.mark_wanted and since < UNPERSISTED_MARK_INTERVAL_S and self._index_unpersisted():
            fault_point("checkpoint-unpersisted")  # locations in the memtable only, lastMark behind them
            return  # the same, to flush the db engine's memtable less often
        self._write_last_marks(run.marks)
        self._remove_old_journals(run.marks)

    def _remove_old_journals(self, marks: tuple[Mark, ...]) -> None:
        for directory, mark in zip(self._journal_currents, marks, strict=True):
            remove_old_journals(directory, mark, self.config.journal_max_backups)

    def _checkpoint_done(self, result: object, run: _Checkpoint) -> None:
        self._running = None
        self._flushing = None
        if isinstance(result, Failure):
            log.error("checkpoint failed: %s", result.getErrorMessage())
            self._checkpoint_failed(result.value)
            # A fresh cache, not run.cache resized: views of its buffers may still be alive in the traceback.
            merged = WriteCache()
            merged.merge_under(run.cache)
            merged.merge_under(self._active)
            self._active = merged
            for ledger_id in run.headers:
                if ledger_id in self._ledgers:
                    self._ledgers[ledger_id].dirty = True
            for waiter in run.waiters:
                waiter.errback(result)
        else:
            self.metrics.checkpoints += 1
            for waiter in run.waiters:
                waiter.callback(None)
        while self._idle_waiters and self._running is None:
            self._idle_waiters.pop(0).callback(None)
        if self._waiters and self._running is None:
            self._start_checkpoint()

    def _write_out(self, cache: WriteCache, headers: dict[int, ixf.IndexHeader], moves: list[Moved]) -> None:
        """Each ledger's records to the entry log in one write, fsync; then index headers and slots.

        Per ledger, not per entry: the write and the slot arithmetic are C-level calls over whole
        buffers, so this thread holds the GIL for microseconds between system calls and the reactor
        thread is not starved while a checkpoint runs.
        """
        slots: dict[int, bytes] = {}
        for ledger_id in sorted(cache.ledgers):
            writer = self._store_of(ledger_id).writer
            slots[ledger_id] = _write_ledger(writer, ledger_id, cache.ledgers[ledger_id])
        relocated = [write_moves(store.writer, self._moves_of(store, moves)) for store in self._stores]
        for store in self._stores:
            store.writer.flush()
        if any(relocated):
            fault_point("compaction-copied")  # the copies are durable, the index still names the old log
        for ledger_id in sorted(slots.keys() | headers.keys()):
            header = headers.get(ledger_id)
            ledger = cache.ledgers.get(ledger_id)
            index = self._store_of(ledger_id).index
            if ledger is None:
                index.write(ledger_id, header, {})
            elif ledger.dense:
                index.write_run(ledger_id, header, ledger.first_id, slots[ledger_id])
            else:
                index.write(ledger_id, header, ledger.locations(slots[ledger_id]))
        for store in self._stores:
            store.index.commit()
        # After the cache's slots: an entry rewritten since compaction read it keeps its newer slot.
        for store, store_relocated in zip(self._stores, relocated, strict=True):
            for ledger_id, ledger_moves in sorted(store_relocated.items()):
                store.index.relocate(ledger_id, ledger_moves)

    def _moves_of(self, store: LedgerDirStore, moves: list[Moved]) -> list[Moved]:
        """Compaction's batches from the store's own entry logs (one log's ledgers all live in the
        directory the log is in, so a batch's first ledger says which)."""
        if len(self._stores) == 1:
            return moves
        return [m for m in moves if len(m) and self._store_of(m.ledgers[0]) is store]

    def _index_unpersisted(self) -> bool:
        return any(store.index.unpersisted for store in self._stores)

    def persist_indexes(self) -> None:
        """Every committed location durable (blocking: call off the reactor thread). Compaction's scan
        reads the db engine's locations through a RocksDB secondary, which sees no memtable."""
        for store in self._stores:
            store.index.persist()

    def _write_last_marks(self, marks: tuple[Mark, ...]) -> None:
        """Every journal's mark to every ledger dir, once the entry log and index are durable."""
        self.persist_indexes()
        for directory in self._ledger_currents:
            for index, mark in enumerate(marks):
                write_durably(directory / self._last_mark_name(index), jf.encode_last_mark(*mark))
        self.last_marks_written = marks
        self._marks_written_at = time.monotonic()

    @property
    def last_mark_written(self) -> Mark:
        """Journal 0's last checkpoint mark (the only one with a single journal dir)."""
        return self.last_marks_written[0]

    def _schedule_periodic(self) -> None:
        self._periodic = self._reactor.callLater(self.config.flush_interval_ms / 1000.0, self._on_periodic)

    def _on_periodic(self) -> None:
        self._schedule_periodic()
        try:
            self.check_disk_usage()
        except OSError as exc:
            log.error("disk usage check failed: %s", exc)
        if self._running is None:
            self._checkpoint_logged()
        else:
            # Checkpoints the write cache starts back to back leave no gap for this one: the next of them
            # moves lastMark, so it lags at most a flushInterval behind (see UNPERSISTED_MARK_INTERVAL_S).
            self._mark_wanted = True

    def _checkpoint_logged(self, mark: bool = True) -> None:
        if self._running is None and self._stopping is None:
            self.checkpoint(mark).addErrback(lambda failure: None)

    # --- garbage collection and compaction (bkctl/server/gc.py drives them) ------------------------

    def when_idle(self) -> Deferred[None]:
        """Fires on the reactor thread while no checkpoint runs: what the caller then does synchronously
        (delete a ledger, remove an entry log) cannot race a checkpoint's entry log or index writes."""
        if self._running is None:
            return succeed(None)
        waiter: Deferred[None] = Deferred()
        self._idle_waiters.append(waiter)
        return waiter

    def ledger_ids(self) -> Deferred[set[int]]:
        """Every ledger the bookie holds: in memory now, and every index file (walked in a pool thread)."""
        known = set(self._ledgers)
        walk = deferToThreadPool(self._reactor, self._reactor.getThreadPool(), self._indexed_ledger_ids)
        return walk.addCallback(lambda indexed: indexed | known)

    def _indexed_ledger_ids(self) -> set[int]:
        return set().union(*(store.index.ledger_ids() for store in self._stores))

    def held_elsewhere(self, ledger_id: int) -> bool:
        """Whether another part of the bookie keeps the ledger (never: gc_dirs.DirStorage, one directory
        of a db bookie, answers for the others)."""
        return False

    def holds_ledger(self, ledger_id: int) -> bool:
        return ledger_id in self._ledgers or self.index_path(ledger_id) is not None

    def index_path(self, ledger_id: int) -> Path | None:
        return self._store_of(ledger_id).index.find(ledger_id)

    def unflushed_ledgers(self) -> set[int]:
        """Ledgers with entries in the write caches (not yet in their index files)."""
        flushing = self._flushing.ledgers.keys() if self._flushing is not None else set()
        return set(self._active.ledgers) | set(flushing)

    def delete_ledger(self, ledger_id: int) -> bool:
        """Forget a ledger the metadata store no longer has: state, cached entries, index file. Only
        while idle (`when_idle`); its entries in entry logs become garbage. True if the bookie held it."""
        if self._running is not None:
            raise RuntimeError("delete_ledger while a checkpoint runs")
        held = self._ledgers.pop(ledger_id, None) is not None
        buffer = self._active.ledgers.pop(ledger_id, None)
        if buffer is not None:
            self._active.size_bytes -= len(buffer.records)
        self._read_digests.by_ledger.pop(ledger_id, None)
        self._unverifiable.discard(ledger_id)
        store = self._store_of(ledger_id)
        store.forget_ledger(ledger_id)
        return store.index.delete(ledger_id) is not None or held

    @property
    def disk_full(self) -> bool:
        """Read-only for lack of space (usage above the threshold, or a checkpoint that could not write)."""
        return self._disk_full

    @property
    def stopping(self) -> bool:
        return self._stopping is not None

    @property
    def current_log_id(self) -> int:
        """The entry log the checkpoints write to (never collected); the first store's with several
        (each store's: `store(i).writer.log_id`)."""
        return self._stores[0].writer.log_id

    def entry_logs(self) -> dict[int, Path]:
        """Every entry log file by id (a directory listing: call off the reactor); the first store's
        with several (log ids are per directory there: see `store`)."""
        return self._stores[0].entry_logs()

    @property
    def store_count(self) -> int:
        """1 on the interleaved engine, the number of ledger dirs on the db engine (ledger_dirs.py)."""
        return len(self._stores)

    def store(self, index: int) -> LedgerDirStore:
        return self._stores[index]

    # The first (with one ledger dir or the interleaved engine: the only) store's parts.
    @property
    def _index(self) -> LedgerIndex:
        return self._stores[0].index

    @property
    def _writer(self) -> EntryLogWriter:
        return self._stores[0].writer

    @property
    def _reader(self) -> EntryLogReader:
        return self._stores[0].reader

    def relocate(self, moved: Moved) -> Deferred[None]:
        """Copy compaction's live records to the current entry log with the next checkpoint, which
        fsyncs them before pointing the index at them (only slots still at the old location move; the
        index files are fsynced by `sync_relocated`)."""
        self._moves.append(moved)
        return self.checkpoint()

    def sync_relocated(self) -> int:
        """Fsync the index files compaction's relocations changed (blocking: call off the reactor)."""
        return sum(store.index.sync_relocated() for store in self._stores)

    def _db_indexes(self) -> list[DbLedgerIndex]:
        return [store.index for store in self._stores if isinstance(store.index, DbLedgerIndex)]

    def compact_entry_locations(self, store: int | None = None) -> Deferred[bool] | None:
        """Compact the db engine's locations dbs (one per ledger dir, one after the other; or the
        `store`th dir's alone) in a pool thread (True when done); None on the interleaved engine, which
        has no such db. A compaction already running is not started again."""
        indexes = self._db_indexes()
        if store is not None:
            indexes = [index for index in indexes if index is self._stores[store].index]
        if not indexes:
            return None
        if any(index.compacting for index in indexes):
            return succeed(False)
        pool = self._reactor.getThreadPool()
        return deferToThreadPool(self._reactor, pool, _compact_all, indexes).addCallback(lambda _: True)

    def entry_locations_compacting(self) -> dict[str, bool]:
        return {str(index.current.parent): index.compacting for index in self._db_indexes()}

    def retire_entry_log(self, log_id: int, store: int = 0) -> None:
        """Close the reader's file of an entry log no index slot names any more, before its removal (the
        unlink itself goes to a pool thread: a big file's takes ~20 ms). Never the current log."""
        owner = self._stores[store]
        if log_id == owner.writer.log_id:
            raise RuntimeError(f"entry log {log_id} is being written")
        owner.reader.forget(log_id)

    # --- stop, info -----------------------------------------------------------------------------

    def stop(self) -> Deferred[None]:
        """Drain the journal, run a final checkpoint, close every file."""
        if self._stopping is not None:
            return self._stopping
        if self._periodic is not None and self._periodic.active():
            self._periodic.cancel()
        drained: Deferred[Any] = Deferred()
        if self._started:
            drained = gatherResults([journal.stop() for journal in self._journals], consumeErrors=True)
        else:
            drained.callback(None)
        drained.addCallback(lambda _: self.checkpoint())
        drained.addBoth(self._close_files)
        self._stopping = drained
        self._refresh_refusal()
        return drained

    def _close_files(self, result: object) -> object:
        for store in self._stores:
            store.close()
        return result

    def info(self) -> dict[str, object]:
        first = self._journals[0]  # the single-journal fields describe journal 0 (usually the only one)
        return {
            "ledgers": len(self._ledgers),
            "journal_file": str(first.path) if first.journal_id >= 0 else None,
            "journal_position": first.mark[1],
            "journal_durable_mark": list(first.durable_mark),
            "last_mark": list(self.last_mark_written),
            "journal_files": [str(j.path) if j.journal_id >= 0 else None for j in self._journals],
            "last_marks": [list(mark) for mark in self.last_marks_written],
            "entry_log_id": self._stores[0].writer.log_id,
            "entry_log_position": self._stores[0].writer.position,
            "entry_log_ids": [store.writer.log_id for store in self._stores],
            "write_cache_bytes": self._active.size_bytes,
            "read_only": self.read_only,
            "journal_dirs": [str(d) for d in self.config.journal_dirs],
            "ledger_dirs": [str(d) for d in self.config.ledger_dirs],
            "index_dirs": [str(d) for d in self.config.index_dirs],
            "storage": self.config.engine,
        }


def _write_ledger(writer: EntryLogWriter, ledger_id: int, ledger: LedgerBuffer) -> bytes:
    """Write a ledger's records (split only where the entry log rotates); its slots in record order."""
    offsets = ledger.offsets
    total = len(offsets)
    parts = []
    done = 0
    with memoryview(ledger.records) as records:
        while done < total:
            begin = offsets[done] - SIZE_PREFIX
            room = writer.log_size_limit - writer.position
            stop = total
            if ledger.record_end(total - 1) - begin > room:
                # Records [done, stop) end where record `stop` starts: at or before begin + room.
                stop = bisect.bisect_right(offsets, begin + room + SIZE_PREFIX, done) - 1
                if stop <= done:
                    if not writer.fresh:
                        writer.rotate()
                        continue
                    stop = done + 1  # a fresh log takes one record, however big
            end = ledger.record_end(stop - 1)
            position = writer.write_records(ledger_id, records[begin:end])
            # location = log id << 32 | offset in the log; the record at `begin` is at `position`.
            parts.append(shifted_slots(offsets, done, stop, (writer.log_id << 32) + position - begin))
            done = stop
    return b"".join(parts)


def _compact_all(indexes: list[DbLedgerIndex]) -> None:
    for index in indexes:
        index.compact_locations()


def _availability(indexed: Iterator[int], cached: list[int]) -> bytes:
    """Availability bytes of the indexed entries merged with the cached ids (pool thread)."""
    return entry_availability.encode(_unique(heapq.merge(indexed, cached)))


def _unique(ids: Iterable[int]) -> Iterator[int]:
    previous = None
    for entry_id in ids:
        if entry_id != previous:
            yield entry_id
            previous = entry_id


def _next_journal_id(directory: Path) -> int:
    """A new journal's id: the time in ms (as BookKeeper), above every journal already in `directory`."""
    newest = max((journal_id for journal_id, _ in list_journals(directory)), default=0)
    return max(int(time.time() * 1000), newest + 1)


def _disk_usage(directory: Path) -> float:
    usage = shutil.disk_usage(directory)
    return usage.used / usage.total if usage.total else 0.0
