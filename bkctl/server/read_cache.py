"""DbLedgerStorage's read-ahead cache: when a read that misses every cache follows the ledger's previous
read from its entry log (a reader going through the ledger in order), the entries that follow it in
that log (same ledger, same log, up to `dbStorage_readAheadCacheBatchSize` of them and half the
cache's bytes) are read with it in one sequential pass and kept, so a tailing or catching-up consumer,
re-replication or the audit costs one disk read per batch instead of per entry.

Java's SingleDirectoryDbLedgerStorage.fillReadAheadCache does the same walk, but on every miss: a
random read then reads (and here, copies) up to a batch of entries nobody asked for, or when the
ledger's entries are not contiguous in the log (a replayed journal's tail interleaves all ledgers)
a chunk that holds none of them. Reading ahead only for a read that starts where the ledger's last
one ended (or a record or two after: a striped ensemble leaves a bookie entries a reader asks other
bookies for) keeps the batch for readers in order and costs a random reader nothing; a random read's
entry is not kept either (it would push out what was read ahead). A read-ahead first reads one record
(the next one may be another ledger's), then the rest of the batch sized by the entry just read, not
a fixed 256 KiB.

Java's ReadCache is a few ring buffers, this one a byte-bounded LRU (entries are immutable: nothing
is ever invalidated but a deleted ledger's). One per ledger directory, each
`dbStorage_readAheadCacheMaxSizeMb / dirs` big.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from bkctl import limits
from bkctl.protocol import entrylog_format as ef

_SIZE_PREFIX: Final = 4
# The first pread of a read-ahead takes at most this much (less per the bounds); more follow if needed.
READ_AHEAD_CHUNK: Final = 256 * 1024  # local bound
# Where the last reads of a ledger ended (several readers of one ledger each keep their read-ahead).
STREAMS_PER_LEDGER: Final = 4  # local bound
STREAMS_LEDGERS_MAX: Final = 4096  # local bound: ledgers whose read positions are kept
# A read follows a previous one when it starts at most this many records (of its own size) after it
# ended: 0 for a reader of every entry, 1-2 where a striped ensemble left entries read elsewhere.
FOLLOW_GAP_RECORDS: Final = 2


@dataclass
class ReadCacheMetrics:
    """Java's DbLedgerStorageStats counters (bookie scope): read-cache-hits/misses, readahead-batch-*."""

    hits: int = 0  # answered from a write cache or the read cache
    misses: int = 0  # read from the entry log
    batches: int = 0  # read-aheads done
    batch_entries: int = 0  # entries they read (sum)
    batch_bytes: int = 0  # bytes they read (sum)
    skipped: int = 0  # misses not read ahead: not following the ledger's previous read (random reads)


class ReadCache:
    """Entries by (ledger id, entry id), at most `max_bytes` of them, least recently used first out."""

    def __init__(self, max_bytes: int, batch_size: int) -> None:
        self.max_bytes = max(0, max_bytes)
        self.batch_size = max(0, batch_size)
        # As Java: a read-ahead never takes more than half of the cache.
        self.read_ahead_bytes = self.max_bytes // 2
        self.size_bytes = 0
        self._entries: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        # ledger id -> locations where its last reads or read-aheads ended, most recent last.
        self._ends: dict[int, list[int]] = {}

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
        self._ends.pop(ledger_id, None)

    def follows(self, ledger_id: int, location: int, data_size: int) -> bool:
        """A miss read `data_size` bytes at `location`: True when it starts where one of the ledger's
        recent reads from the entry log (or its read-ahead) ended, give or take FOLLOW_GAP_RECORDS
        records: a reader going through the ledger in order, worth reading ahead for. Remembers where
        this one ended either way (last in the ledger's list, where `_walked` moves it on)."""
        # Ends are kept as locations (log id << 32 | offset): one subtraction compares log and offset,
        # as a gap within one log is small and one across logs is at least 2^32 minus a log's size.
        end = location + data_size
        ends = self._ends.get(ledger_id)
        if ends is None:
            if len(self._ends) >= STREAMS_LEDGERS_MAX:
                self._ends.clear()  # forgotten streams cost one read without read-ahead each
            self._ends[ledger_id] = [end]
            return False
        start = location - _SIZE_PREFIX  # of the record read
        earliest = start - FOLLOW_GAP_RECORDS * (_SIZE_PREFIX + data_size)
        for previous in ends:
            if earliest <= previous <= start:
                ends.remove(previous)
                ends.append(end)
                return True
        if len(ends) >= STREAMS_PER_LEDGER:
            del ends[0]
        ends.append(end)
        return False

    def _walked(self, ledger_id: int, end: int) -> None:
        """The read-ahead of the stream `follows` just recorded for the ledger ended at `end` (a
        location: where the next record's size prefix is)."""
        ends = self._ends.get(ledger_id)
        if ends:
            ends[-1] = end

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
                # First one record (the next may be another ledger's: logs a replay wrote interleave
                # ledgers), then the rest of the batch as if its entries were the size of this one.
                records = self.batch_size - count if count else 1
                want = min(
                    READ_AHEAD_CHUNK,
                    records * (_SIZE_PREFIX + data_size),
                    max(self.read_ahead_bytes - total, _SIZE_PREFIX),
                )
                chunk, at = os.pread(fd, want + _SIZE_PREFIX + ef.RECORD_KEY_SIZE, position), 0
                if len(chunk) < _SIZE_PREFIX + ef.RECORD_KEY_SIZE:
                    break
            size = int.from_bytes(chunk[at : at + _SIZE_PREFIX], "big", signed=True)
            if not ef.RECORD_KEY_SIZE <= size <= limits.ENTRYLOG_RECORD_SIZE_MAX:
                break
            if end is not None and position + _SIZE_PREFIX + size > end:
                break
            start = at + _SIZE_PREFIX
            if len(chunk) < start + size and at:
                chunk, at = b"", 0  # the record runs past the chunk: the next chunk starts with it
                continue
            if len(chunk) < start + size:  # bigger than a whole chunk: read alone
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
        self._walked(ledger_id, location - offset + position)
        return count, total
