"""Replay's fast path: runs of journal DATA records copied to the entry log whole, locations by arithmetic.

A journal DATA record (int32 length + stored entry) is byte for byte an entry log record (int32 size +
stored entry), so a run of consecutive DATA records goes to the entry log as one slice, and an entry's
index location is the run's entry log offset plus the record's offset in the run. Per record the only
Python work is one struct unpack, a few comparisons and one dict store.

With several stores (the db engine's ledger dirs: ledger L in dir L mod n) consecutive records go to
different entry logs: one pass notes every record's location in its store's log and the spans of the
buffer each store gets (runs of one store's records), and each store's writer then copies its spans
into its buffer (`take_runs`), instead of a run cut, and a call made, at every change of directory.

The fast path takes only what the journal codec would yield as DATA (length 16..JOURNAL_RECORD_SIZE_MAX,
entry id >= 0, the whole record in the buffer), and only for ledgers the bookie already admitted; it
stops before anything else, which replay then hands to the codec and the storage's record handler.

Digests: the replayed records are the journal's tail (after the last checkpoint), the only copy of
their entries on this bookie, so each DATA record's digest is checked before it is stored and a record
whose bytes were flipped is skipped (`add` says why; the other replicas hold the entry). The bookie does
not know a ledger's digest type: the first record of a ledger fixes it (CRC32C or CRC32, whichever
matches). A record that matches neither is told from a MAC or DUMMY ledger's (which a bookie cannot
check: no password) by the ledger's stored entries, else by its next record in the journal; a MAC or
DUMMY ledger's records are then taken unchecked. The fast path checks CRC32C inline (one call per record
over the header and one over the payload) and stops before any record that fails, for `add` to reject.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from typing import Final

from crc32c import crc32c

from bkctl import limits
from bkctl.model import DigestType
from bkctl.protocol import entry as entry_codec
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import journal_format as jf
from bkctl.server.entrylog import EntryLogWriter

log = logging.getLogger("bkctl.bookie")

_RECORD_HEAD: Final = struct.Struct(">iqq")  # length, ledger id, entry id
_SIZE_PREFIX: Final = 4
_RECORD_SIZE_MAX: Final = min(limits.JOURNAL_RECORD_SIZE_MAX, limits.ENTRYLOG_RECORD_SIZE_MAX)
_CRC32C_VALUE: Final = struct.Struct(">I")
_HEADER_END: Final = _SIZE_PREFIX + entry_codec.HEADER_SIZE  # record offset of the digest
_CRC32C_PAYLOAD: Final = _HEADER_END + 4  # record offset of a CRC32C entry's payload

# A ledger's digest check (`mode`): the fast path tests it once per record.
UNCHECKED: Final = 0  # MAC or DUMMY: a bookie cannot check them
CRC32C: Final = 1
OTHER_CRC: Final = 2  # CRC32: checked through the codec
PENDING: Final = 3  # undecided: its records go through `add` until its next record decides
_MODES: Final = {DigestType.CRC32C: CRC32C, DigestType.CRC32: OTHER_CRC}
_DIGESTS: Final = {CRC32C: DigestType.CRC32C, OTHER_CRC: DigestType.CRC32}

# The stored (checkpointed) entry of a ledger its digest type can be inferred from, or None.
StoredSample = Callable[[int], bytes | None]


class _Ledger:
    """One admitted ledger: its replayed slots since the last index write, and bytes not yet counted."""

    __slots__ = ("mode", "slots", "unsized")

    def __init__(self, mode: int) -> None:
        self.mode = mode
        self.slots: dict[int, int] = {}  # entry id -> index location
        self.unsized = 0  # entry log bytes written but not yet added to the writer's ledgers map


class ReplayRuns:
    """Writes replayed entries to the entry log and keeps their index locations until `drain`."""

    def __init__(self, writer: EntryLogWriter, stored_sample: StoredSample | None = None) -> None:
        self._writer = writer
        self._stored_sample = stored_sample
        self._ledgers: dict[int, _Ledger] = {}
        self._modes: dict[int, int] = {}  # every ledger's digest check, kept across `drain`
        self._pending: dict[int, list[int]] = {}  # PENDING ledger -> entries stored unchecked
        self.count = 0  # entries held in the slot maps

    @property
    def ledger_count(self) -> int:
        """Ledgers in the slot maps (admitted since the last `drain`)."""
        return len(self._ledgers)

    def add(self, ledger_id: int, entry_id: int, stored_entry: memoryview) -> str | None:
        """One entry from the codec path, stored unless its digest fails (then why, and it is not).

        Its ledger is admitted to the fast path from now on (unless its digest type is undecided).
        """
        mode = self._modes.get(ledger_id)
        if mode is None or mode == PENDING:
            mode = self._decide(ledger_id, entry_id, stored_entry, mode)
        elif mode != UNCHECKED and not entry_codec.digest_matches(stored_entry, _DIGESTS[mode]):
            return f"ledger {ledger_id} entry {entry_id}: {_DIGESTS[mode].name} digest mismatch"
        if mode < 0:
            stored = _DIGESTS[-mode].name
            return f"ledger {ledger_id} entry {entry_id}: matches no digest, its stored entries are {stored}"
        if _SIZE_PREFIX + len(stored_entry) > self._writer.room():
            # `append` rotates first: the full log's ledgers map must count the runs written to it.
            self._count_sizes()
        self._admit(ledger_id).slots[entry_id] = self._writer.append(ledger_id, stored_entry)
        self.count += 1
        return None

    def _decide(self, ledger_id: int, entry_id: int, stored_entry: memoryview, mode: int | None) -> int:
        """The ledger's digest check from this record (and its stored entries or its previous record);
        minus a CRC mode when this record is corrupt under it."""
        digest = entry_codec.infer_digest(stored_entry)
        if digest is not None:
            decided = _MODES[digest]
            self._modes[ledger_id] = decided
            self._drop_pending(ledger_id, digest)
            return decided
        if mode == PENDING:  # two records in a row match no CRC: a MAC or DUMMY ledger
            self._modes[ledger_id] = UNCHECKED
            self._pending.pop(ledger_id, None)
            return UNCHECKED
        sample = self._stored_sample(ledger_id) if self._stored_sample is not None else None
        stored = entry_codec.infer_digest(sample) if sample is not None else None
        if stored is not None:
            self._modes[ledger_id] = _MODES[stored]
            return -_MODES[stored]
        decided = UNCHECKED if sample is not None else PENDING
        self._modes[ledger_id] = decided
        if decided == PENDING:
            self._pending.setdefault(ledger_id, []).append(entry_id)
        return decided

    def _drop_pending(self, ledger_id: int, digest: DigestType) -> None:
        """A ledger's earlier records that matched no digest were corrupt: unindex them."""
        ledger = self._ledgers.get(ledger_id)
        for entry_id in self._pending.pop(ledger_id, []):
            if ledger is not None and ledger.slots.pop(entry_id, None) is not None:
                self.count -= 1
                log.warning(
                    "journal replay: ledger %d entry %d skipped: matches no digest, the ledger's next "
                    "record is %s",
                    ledger_id,
                    entry_id,
                    digest.name,
                )

    def drain(self) -> dict[int, dict[int, int]]:
        """The slot maps (ledger id -> entry id -> location) noted so far; the runs start afresh."""
        self._count_sizes()
        slots = {ledger_id: ledger.slots for ledger_id, ledger in self._ledgers.items() if ledger.slots}
        self._ledgers = {}
        self.count = 0
        return slots

    def _admit(self, ledger_id: int) -> _Ledger:
        ledger = self._ledgers.get(ledger_id)
        if ledger is None:
            ledger = self._ledgers[ledger_id] = _Ledger(self._modes.get(ledger_id, PENDING))
        else:
            ledger.mode = self._modes.get(ledger_id, PENDING)
        return ledger

    def _count_sizes(self) -> None:
        sizes = {}
        for ledger_id, ledger in self._ledgers.items():
            if ledger.unsized:
                sizes[ledger_id], ledger.unsized = ledger.unsized, 0
        self._writer.count_ledger_bytes(sizes)


def take_runs(runs: Sequence[ReplayRuns], buffer: bytearray, pos: int, end: int) -> tuple[int, int]:
    """Copy whole DATA records of admitted ledgers from buffer[pos:end], each to the entry log of its
    ledger's store (`runs[ledger id % len(runs)]`, the db engine's rule for several ledger dirs);
    (where it stopped, count).

    One pass over the records notes every location; then each store's writer copies its spans of the
    buffer (one span with one store, as always).
    """
    stop, taken, full = _take_fitting(runs, buffer, pos, end)
    if full >= 0:
        # The ledgers map of the full log must count every byte written to it. A fresh log has room
        # for any record, so one rotation is enough.
        runs[full]._count_sizes()
        runs[full]._writer.rotate()
        stop, more, _ = _take_fitting(runs, buffer, stop, end)
        taken += more
    return stop, taken


def _take_fitting(runs: Sequence[ReplayRuns], buffer: bytearray, pos: int, end: int) -> tuple[int, int, int]:
    """Take the records that fit in their stores' current entry logs; (stop, count, the store whose log
    had no room for the record at `stop`, else -1)."""
    spans: list[list[int]] = [[] for _ in runs]
    counts = [0] * len(runs)
    stop, full = _scan(runs, buffer, pos, end, spans, counts)
    with memoryview(buffer) as view:
        for store, store_spans in zip(runs, spans, strict=True):
            if store_spans:
                writer = store._writer
                writer.append_spans(view, store_spans)
                # The locations hold 32-bit offsets: the entry log must not have grown past them.
                ef.entry_location(writer.log_id, writer.position)
    for store, count in zip(runs, counts, strict=True):
        store.count += count
    return stop, sum(counts), full


def _scan(
    runs: Sequence[ReplayRuns],
    buffer: bytearray,
    pos: int,
    end: int,
    spans: list[list[int]],
    counts: list[int],
) -> tuple[int, int]:
    """Note the locations of the records from `pos` and each store's spans of the buffer (flat start,
    stop pairs); returns where it stopped and the store whose log had no room then (else -1).

    The locations assume each store's records go to its entry log at its writer's current position,
    in buffer order. The records are taken in runs of one store's (a store's run: one location base,
    one room limit), so with one store the work per record is what it always was.
    """
    n = len(runs)
    writers = [store._writer for store in runs]
    rooms = [writer.room() for writer in writers]
    bases = [(writer.log_id << 32) + writer.position + _SIZE_PREFIX for writer in writers]
    filled = [0] * n
    ledgers_of = [store._ledgers.get for store in runs]
    unpack = _RECORD_HEAD.unpack_from
    unpack_crc = _CRC32C_VALUE.unpack_from
    last_head = end - _RECORD_HEAD.size
    full = -1
    count = 0
    # The current run: its store, where it starts, the location of a record at p (base + p), the end
    # its store's room allows, and the records before it.
    store, start, base, limit, before = -1, pos, 0, 0, 0
    ledger_of = ledgers_of[0]
    view = memoryview(buffer)
    while pos <= last_head:
        size, ledger_id, entry_id = unpack(buffer, pos)
        after = pos + _SIZE_PREFIX + size
        if entry_id < 0 or size < jf.RECORD_KEY_SIZE or size > _RECORD_SIZE_MAX or after > end:
            break
        d = ledger_id % n
        if d != store:
            if pos > start:  # the run of another store ends here
                spans[store] += (start, pos)
                filled[store] += pos - start
                counts[store] += count - before
            store, start, before = d, pos, count
            base = bases[d] + filled[d] - pos
            limit = pos + rooms[d] - filled[d]
            ledger_of = ledgers_of[d]
        ledger = ledger_of(ledger_id)
        if ledger is None:
            break
        if after > limit:
            full = d
            break
        mode = ledger.mode
        if mode == CRC32C:
            if (
                after < pos + _CRC32C_PAYLOAD
                or crc32c(
                    view[pos + _CRC32C_PAYLOAD : after],
                    crc32c(view[pos + _SIZE_PREFIX : pos + _HEADER_END]),
                )
                != unpack_crc(buffer, pos + _HEADER_END)[0]
            ):
                break  # `add` rejects it
        elif mode != UNCHECKED and (mode == PENDING or not _crc32_matches(view[pos + _SIZE_PREFIX : after])):
            break
        ledger.slots[entry_id] = base + pos
        ledger.unsized += after - pos
        pos = after
        count += 1
    view.release()
    if pos > start:
        spans[store] += (start, pos)
        counts[store] += count - before
    return pos, full


def _crc32_matches(stored_entry: memoryview) -> bool:
    return entry_codec.digest_matches(stored_entry, DigestType.CRC32)
