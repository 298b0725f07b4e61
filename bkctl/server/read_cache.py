"""DbLedgerStorage's read-ahead cache: on a read that misses every cache, the entries that follow it in
its entry log (same ledger, same log, up to `dbStorage_readAheadCacheBatchSize` of them and half the
cache's bytes) are read with it in one sequential pass and kept, so a reader going through a ledger
(a tailing or catching-up consumer, re-replication) costs one disk read per batch instead of per entry.

Java's SingleDirectoryDbLedgerStorage.fillReadAheadCache does the same walk; its ReadCache is a few
ring buffers, this one a byte-bounded LRU (entries are immutable: nothing is ever invalidated but a
deleted ledger's). One per ledger directory, each `dbStorage_readAheadCacheMaxSizeMb / dirs` big.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from bkctl import limits
from bkctl.protocol import entrylog_format as ef

_SIZE_PREFIX: Final = 4
# The first pread of a read-ahead takes this much (or less, per the bounds); more follow if needed.
READ_AHEAD_CHUNK: Final = 256 * 1024  # local bound


@dataclass
class ReadCacheMetrics:
    """Java's DbLedgerStorageStats counters (bookie scope): read-cache-hits/misses, readahead-batch-*."""

    hits: int = 0  # answered from a write cache or the read cache
    misses: int = 0  # read from the entry log
    batches: int = 0  # read-aheads done
    batch_entries: int = 0  # entries they read (sum)
    batch_bytes: int = 0  # bytes they read (sum)


class ReadCache:
    """Entries by (ledger id, entry id), at most `max_bytes` of them, least recently used first out."""

    def __init__(self, max_bytes: int, batch_size: int) -> None:
        self.max_bytes = max(0, max_bytes)
        self.batch_size = max(0, batch_size)
        # As Java: a read-ahead never takes more than half of the cache.
        self.read_ahead_bytes = self.max_bytes // 2
        self.size_bytes = 0
        self._entries: OrderedDict[tuple[int, int], bytes] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        data = self._entries.get((ledger_id, entry_id))
        if data is not None:
            self._entries.move_to_end((ledger_id, entry_id))
        return data

    def put(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        old = self._entries.pop((ledger_id, entry_id), None)
        if old is not None:
            self.size_bytes -= len(old)
        self._entries[(ledger_id, entry_id)] = data
        self.size_bytes += len(data)
        while self.size_bytes > self.max_bytes:
            self.size_bytes -= len(self._entries.popitem(last=False)[1])

    def forget_ledger(self, ledger_id: int) -> None:
        """Drop a deleted ledger's entries (its id may come back for another ledger)."""
        doomed = [key for key in self._entries if key[0] == ledger_id]
        for key in doomed:
            self.size_bytes -= len(self._entries.pop(key))

    def read_ahead(
        self, fd: int, ledger_id: int, location: int, data_size: int, end: int | None = None
    ) -> tuple[int, int]:
        """Cache the entries after the one of `data_size` bytes at `location` (fd: its entry log) while
        they are the same ledger's, in the same log, before `end` (the log being written: where its
        fsynced bytes end), within the batch and byte bounds; (entries, bytes).

        Records that do not parse end the walk quietly, as in Java: a read-ahead is a guess, the reads
        themselves check what they return.
        """
        offset = ef.split_location(location)[1]
        position = offset + data_size  # the next record's size prefix
        count = total = 0
        chunk = b""
        at = 0  # chunk[at] is the byte at `position`
        while count < self.batch_size and total < self.read_ahead_bytes:
            if len(chunk) - at < _SIZE_PREFIX + ef.RECORD_KEY_SIZE:
                want = min(READ_AHEAD_CHUNK, max(self.read_ahead_bytes - total, _SIZE_PREFIX))
                chunk, at = os.pread(fd, want + _SIZE_PREFIX + ef.RECORD_KEY_SIZE, position), 0
                if len(chunk) < _SIZE_PREFIX + ef.RECORD_KEY_SIZE:
                    break
            size = int.from_bytes(chunk[at : at + _SIZE_PREFIX], "big", signed=True)
            if not ef.RECORD_KEY_SIZE <= size <= limits.ENTRYLOG_RECORD_SIZE_MAX:
                break
            if end is not None and position + _SIZE_PREFIX + size > end:
                break
            start = at + _SIZE_PREFIX
            if len(chunk) < start + size:
                record = os.pread(fd, size, position + _SIZE_PREFIX)
                chunk, at, start = b"", 0, 0
                if len(record) < size:
                    break
            else:
                record = chunk[start : start + size]
                at = start + size
            found_ledger, entry_id = ef.record_key(record)
            if found_ledger != ledger_id:
                break
            self.put(ledger_id, entry_id, record)
            count += 1
            total += size
            position += _SIZE_PREFIX + size
            if position >= 1 << 32:  # past what a location's offset can name (Java: another log id)
                break
        return count, total
