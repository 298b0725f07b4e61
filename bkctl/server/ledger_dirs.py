"""The entry logs and index a ledger is stored in: `LedgerDirStore`, one per ledger directory on the db
engine, one over every ledger directory on the interleaved engine.

Java's DbLedgerStorage is one SingleDirectoryDbLedgerStorage per ledger directory, each with its own
entry logs (log ids counted per directory: two directories both hold a `0.log`), its own `lastId` and
its own `current/ledgers` and `current/locations` RocksDB; ledger L lives in directory
`MathUtils.signSafeMod(L, dirs)` for its whole life. Its read cache is divided between the directories.
The journals, the write cache and the checkpoints stay the bookie's (storage.py); a checkpoint writes
each directory's ledgers to that directory's entry log and index.

The interleaved engine spreads one sequence of entry logs over all its ledger directories (entrylog.py)
and keeps one index over its index directories (index.py): one store for every ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bkctl.server.db_ledger_index import DbLedgerIndex
from bkctl.server.entrylog import EntryLogReader, EntryLogWriter, existing_log_ids, last_log_id
from bkctl.server.index import IndexStore
from bkctl.server.ledger_storage import LedgerIndex
from bkctl.server.read_cache import ReadCache
from bkctl.server.replay_runs import ReplayRuns
from bkctl.server.rocksdb_settings import DEFAULT as DEFAULT_ROCKSDB
from bkctl.server.rocksdb_settings import RocksDbSettings
from bkctl.server.storage_kind import DB


def dir_of(ledger_id: int, dirs: int) -> int:
    """Java's MathUtils.signSafeMod(ledgerId, dirs): Python's % is already non-negative for dirs > 0."""
    return ledger_id % dirs


class LedgerDirStore:
    """One directory's entry log writer and reader, index, replay runs and read cache (db engine), or
    the interleaved engine's over all its directories."""

    def __init__(
        self,
        ledger_dirs: tuple[Path, ...],
        index: LedgerIndex,
        log_size_limit: int,
        stored_sample: Callable[[int], bytes | None],
        read_cache: ReadCache | None = None,
    ) -> None:
        self.ledger_dirs = ledger_dirs
        self.index = index
        self.writer = EntryLogWriter(ledger_dirs, log_size_limit)
        self.reader = EntryLogReader(ledger_dirs)
        self.runs = ReplayRuns(self.writer, stored_sample)
        self.read_cache = read_cache if read_cache is not None and read_cache.enabled else None

    def open(self) -> None:
        """Open the index and a fresh entry log after every log id this store's directories hold."""
        self.index.open()
        self.writer.open_next(last_log_id(self.ledger_dirs))

    def entry_logs(self) -> dict[int, Path]:
        """Every entry log of this store by id (a directory listing: call off the reactor)."""
        return existing_log_ids(self.ledger_dirs)

    def forget_ledger(self, ledger_id: int) -> None:
        if self.read_cache is not None:
            self.read_cache.forget_ledger(ledger_id)

    def close(self) -> None:
        self.writer.close()
        self.reader.close()
        self.index.close()


def ledger_dir_stores(
    engine: str,
    ledger_dirs: tuple[Path, ...],
    index_dirs: tuple[Path, ...],
    log_size_limit: int,
    pages_max: int,
    stored_sample: Callable[[int], bytes | None],
    read_cache_bytes: int = 0,
    read_ahead_batch: int = 0,
    rocksdb: RocksDbSettings = DEFAULT_ROCKSDB,
) -> list[LedgerDirStore]:
    """The stores of a bookie: one per ledger directory on the db engine (each with its share of the
    read cache, as Java divides dbStorage_readAheadCacheMaxSizeMb), one for all on the interleaved one."""
    if engine != DB:
        return [LedgerDirStore(ledger_dirs, IndexStore(index_dirs, pages_max), log_size_limit, stored_sample)]
    share = read_cache_bytes // len(ledger_dirs)
    return [
        LedgerDirStore(
            (directory,),
            DbLedgerIndex(directory / "current", rocksdb),
            log_size_limit,
            stored_sample,
            ReadCache(share, read_ahead_batch),
        )
        for directory in ledger_dirs
    ]
