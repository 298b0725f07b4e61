"""Compaction's records on their way to a new entry log: the batches (`Moved`) and their writing by the
checkpoint thread (`write_moves`), which returns the index changes as whole runs of slots.

A batch grouped by ledger (as the scan process sends them) that fits in the current log is written with
one pwrite and its new locations computed per ledger with no Python loop per entry (`shifted_slots`);
any other batch is written record range by record range, split where the log rotates.
"""

from __future__ import annotations

import bisect
import sys
from array import array
from dataclasses import dataclass, field

from bkctl.protocol import entrylog_format as ef
from bkctl.server.entrylog import EntryLogWriter
from bkctl.server.write_cache import SIZE_PREFIX, shifted_slots

# Per ledger: (entry ids, their old locations, their new locations), locations as big-endian int64 bytes
# (the index file's own slot format, so a run of slots is compared and replaced as one slice).
Relocation = tuple["array[int]", bytes, bytes]


@dataclass
class Moved:
    """Compaction's live records of an old entry log, back to back as in any entry log (size prefix +
    stored entry), with each record's start in `records`, its key and its old index location. `runs`,
    when set, says the columns are grouped by ledger: (ledger id, first, count, record bytes). The scan
    process leaves `records` empty and says where they are instead: `spans`, (offset, length) in the old
    log, read back to back (gc_scan.py)."""

    records: bytearray = field(default_factory=bytearray)
    starts: array[int] = field(default_factory=lambda: array("q"))
    ledgers: array[int] = field(default_factory=lambda: array("q"))
    entries: array[int] = field(default_factory=lambda: array("q"))
    old: array[int] = field(default_factory=lambda: array("q"))
    runs: list[tuple[int, int, int, int]] | None = None
    spans: list[tuple[int, int]] | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def grouped(self) -> Moved:
        """The same records with the columns grouped by ledger (log order within a ledger)."""
        count = len(self)
        sizes = [
            (self.starts[k + 1] if k + 1 < count else len(self.records)) - self.starts[k]
            for k in range(count)
        ]
        order = sorted(range(count), key=self.ledgers.__getitem__)  # stable: log order per ledger
        runs: list[tuple[int, int, int, int]] = []
        out = Moved(self.records, runs=runs)
        for k in order:
            ledger_id = self.ledgers[k]
            out.starts.append(self.starts[k])
            out.ledgers.append(ledger_id)
            out.entries.append(self.entries[k])
            out.old.append(self.old[k])
            if runs and runs[-1][0] == ledger_id:
                _, first, n, size = runs[-1]
                runs[-1] = (ledger_id, first, n + 1, size + sizes[k])
            else:
                runs.append((ledger_id, len(out.starts) - 1, 1, sizes[k]))
        return out

    def in_log_order(self) -> Moved:
        """Columns in record order again (the record-by-record path needs them so)."""
        if self.runs is None:
            return self
        order = sorted(range(len(self)), key=self.starts.__getitem__)
        out = Moved(self.records)
        for k in order:
            out.starts.append(self.starts[k])
            out.ledgers.append(self.ledgers[k])
            out.entries.append(self.entries[k])
            out.old.append(self.old[k])
        return out


def write_moves(writer: EntryLogWriter, moves: list[Moved]) -> dict[int, list[Relocation]]:
    """Append compaction's records to the current entry log (not fsynced here); the index changes."""
    relocated: dict[int, list[Relocation]] = {}
    for batch in moves:
        if not len(batch):
            continue
        if batch.runs is not None and _fits(writer, len(batch.records)):
            _write_grouped(writer, batch, relocated)
        else:
            _write_in_ranges(writer, batch.in_log_order(), relocated)
    return relocated


def _fits(writer: EntryLogWriter, size: int) -> bool:
    """Room for `size` bytes in the current log, after a rotation if that makes it (never past the limit)."""
    if writer.position + size <= writer.log_size_limit:
        return True
    if size > writer.log_size_limit - ef.HEADER_SIZE:
        return False
    if not writer.fresh:
        writer.rotate()
    return True


def _write_grouped(writer: EntryLogWriter, batch: Moved, relocated: dict[int, list[Relocation]]) -> None:
    assert batch.runs is not None
    sizes = {ledger_id: size for ledger_id, _, _, size in batch.runs}
    with memoryview(batch.records) as records:
        position = writer.write_block(records, sizes)
    base = (writer.log_id << 32) + position + SIZE_PREFIX  # record k's entry is at base + starts[k]
    for ledger_id, first, count, _ in batch.runs:
        stop = first + count
        news = shifted_slots(batch.starts, first, stop, base)
        olds = _big_endian(batch.old[first:stop])
        relocated.setdefault(ledger_id, []).append((batch.entries[first:stop], olds, news))


def _write_in_ranges(writer: EntryLogWriter, batch: Moved, relocated: dict[int, list[Relocation]]) -> None:
    """Record ranges that fit the current log, rotating between them."""
    starts, total, done = batch.starts, len(batch), 0
    per_ledger: dict[int, tuple[array[int], array[int], array[int]]] = {}
    with memoryview(batch.records) as records:
        while done < total:
            begin = starts[done]
            stop = _fitting(starts, done, len(records), writer.log_size_limit - writer.position)
            if stop <= done:
                if not writer.fresh:
                    writer.rotate()
                    continue
                stop = done + 1  # a fresh log takes one record, however big
            end = starts[stop] if stop < total else len(records)
            position = writer.write_block(records[begin:end], {})
            base = (writer.log_id << 32) + position - begin + SIZE_PREFIX
            sizes: dict[int, int] = {}
            for k in range(done, stop):
                ledger_id = batch.ledgers[k]
                record_end = starts[k + 1] if k + 1 < stop else end
                sizes[ledger_id] = sizes.get(ledger_id, 0) + record_end - starts[k]
                columns = per_ledger.setdefault(ledger_id, (array("q"), array("q"), array("q")))
                columns[0].append(batch.entries[k])
                columns[1].append(batch.old[k])
                columns[2].append(base + starts[k])
            writer.count_ledger_bytes(sizes)
            done = stop
    for ledger_id, (entries, olds, news) in per_ledger.items():
        relocated.setdefault(ledger_id, []).append((entries, _big_endian(olds), _big_endian(news)))


def _fitting(starts: array[int], done: int, length: int, room: int) -> int:
    """How many records from `done` on fit in `room` bytes: records [done, result) (record k spans
    starts[k] to starts[k + 1], the last one to `length`)."""
    begin = starts[done]
    after = bisect.bisect_right(starts, begin + room, done)  # the first record starting past the room
    if after == len(starts) and length - begin <= room:
        return after
    return after - 1


def _big_endian(values: array[int]) -> bytes:
    if sys.byteorder == "little":
        values = array("q", values)
        values.byteswap()
    return values.tobytes()
