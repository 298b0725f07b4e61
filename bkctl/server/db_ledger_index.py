"""DbLedgerStorage's index: ledger state and entry locations in RocksDB, file-compatible with Java's.

`<ledger dir>/current/ledgers/` holds each ledger's LedgerData (master key, fenced, explicit LAC) and
`<ledger dir>/current/locations/` each entry's location (protocol/db_format.py). The entry logs, the
write cache and the checkpoint are the interleaved engine's; only where the index lives differs, so
this class answers the same calls as index.IndexStore (server/ledger_storage.py's LedgerIndex).

As in Java, every ledger's state is read into memory at open; a checkpoint writes its locations after
the entry log is fsynced (in slices, into the memtable without the WAL: rocksdb_store.KeyValueDb.
write_records), then the ledgers' state in a synced batch; the locations become durable when the bookie
flushes the memtable (`persist`), before lastMark moves past them. A replay's locations are held in
memory (replayed_locations.py) for the first checkpoint after the start to write, up to REPLAY_HELD_MAX;
beyond that they go through the WAL, synced by the same `persist`.
"""

from __future__ import annotations

import logging
import sys
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Final, NamedTuple

from bkctl.errors import CorruptDataError, ProtocolError
from bkctl.protocol import db_format as dbf
from bkctl.protocol import index_format as ixf
from bkctl.server.index import LoadedIndex
from bkctl.server.replayed_locations import ReplayedLocations
from bkctl.server.rocksdb_settings import DEFAULT as DEFAULT_SETTINGS
from bkctl.server.rocksdb_settings import RocksDbSettings
from bkctl.server.rocksdb_store import KeyValueDb

log = logging.getLogger("bkctl.bookie")

_pack_location_key: Final = dbf.LOCATION_KEY.pack
_RECORD: Final = dbf.LOCATION_RECORD
_NATIVE_IS_BIG: Final = sys.byteorder == "big"
# Replayed locations held in memory for the first checkpoint (16 bytes each: 64 MB); a longer replay
# writes them all to RocksDB as it goes, as a replay did before they were held.
REPLAY_HELD_MAX: Final = 4_000_000  # local bound


class _Locations(NamedTuple):
    """A ledger's locations queued for the next commit, at the same index in both arrays."""

    ledger_id: int
    entry_ids: array[int]
    locations: array[int]


def _big_endian(numbers: array[int]) -> array[int]:
    """The array's 8-byte numbers byte-swapped to big-endian in place (or back: it is its inverse)."""
    if not _NATIVE_IS_BIG:
        numbers.byteswap()
    return numbers


def _numbers(packed: bytes) -> array[int]:
    """Packed 8-byte big-endian numbers (an `.idx` slot, a locations value) as native ones."""
    numbers = array("q")
    numbers.frombytes(packed[: len(packed) - len(packed) % ixf.SLOT_SIZE])
    return _big_endian(numbers)


def _records(ledger_id: int, entry_ids: array[int], locations: array[int]) -> bytes:
    """The locations db's records (_RECORD) of a ledger's entries, built by whole-array operations
    (a replay hands over 131,072 entries at a time): the ids and locations interleaved with the
    ledger id, all byte-swapped to big-endian at once. Unset locations (0, holes) are left out."""
    if 0 in locations:  # a run with holes (rare)
        kept = [at for at, location in enumerate(locations) if location]
        entry_ids = array("q", [entry_ids[at] for at in kept])
        locations = array("q", [locations[at] for at in kept])
    records = array("q", (ledger_id, 0, 0)) * len(entry_ids)
    records[1::3] = entry_ids
    records[2::3] = locations
    return _big_endian(records).tobytes()


def header_of(data: dbf.LedgerData) -> ixf.IndexHeader:
    version = ixf.V1 if data.explicit_lac is not None else ixf.V0
    return ixf.IndexHeader(
        version, data.master_key, ixf.STATE_FENCED if data.fenced else 0, data.explicit_lac
    )


def data_of(header: ixf.IndexHeader) -> dbf.LedgerData:
    return dbf.LedgerData(header.master_key, header.fenced, header.explicit_lac)


def open_ledgers(
    directory: Path, read_only: bool = False, settings: RocksDbSettings = DEFAULT_SETTINGS
) -> KeyValueDb:
    return KeyValueDb(directory / dbf.LEDGERS_DB, huge=False, read_only=read_only, settings=settings)


def open_locations(
    directory: Path, read_only: bool = False, settings: RocksDbSettings = DEFAULT_SETTINGS
) -> KeyValueDb:
    return KeyValueDb(directory / dbf.LOCATIONS_DB, huge=True, read_only=read_only, settings=settings)


def read_ledgers(db: KeyValueDb) -> dict[int, dbf.LedgerData]:
    """Every ledger of a ledgers db; CorruptDataError naming the key of a value that does not decode."""
    ledgers = {}
    for key, value in db.items():
        try:
            ledgers[dbf.decode_ledger_key(key)] = dbf.decode_ledger_data(value)
        except ProtocolError as exc:
            raise CorruptDataError(f"{db.path}: key {key.hex()}: {exc}") from None
    return ledgers


class DbLedgerIndex:
    """The RocksDB index of one ledger directory (`current/`)."""

    def __init__(self, current: Path, settings: RocksDbSettings = DEFAULT_SETTINGS) -> None:
        self.current = current
        self._settings = settings
        self._locations_path = current / dbf.LOCATIONS_DB
        self.page_misses = 0  # no page cache: RocksDB's block cache does that work
        self.compacting = False
        self._lock = threading.Lock()
        self._ledgers_db: KeyValueDb | None = None
        self._locations_db: KeyValueDb | None = None
        self._get_location: Callable[[bytes], bytes | None] | None = None  # the locations db's get
        self._ledgers: dict[int, dbf.LedgerData] = {}
        # In write order: a WriteBatch applies them in order, so a later one wins.
        self._pending_locations: list[_Locations] = []
        self._pending_ledgers: dict[bytes, bytes] = {}
        # A replay's locations not in RocksDB yet (`commit`); replaced, not emptied, once written, so a
        # reader on another thread sees them either here or in RocksDB.
        self._held = ReplayedLocations()
        self._held_lock = threading.Lock()

    def open(self) -> None:
        self.current.mkdir(parents=True, exist_ok=True)
        self._ledgers_db = open_ledgers(self.current, settings=self._settings)
        self._locations_db = open_locations(self.current, settings=self._settings)
        self._ledgers = read_ledgers(self._ledgers_db)
        log.info("%s: %d ledgers in the ledgers db", self.current, len(self._ledgers))

    @property
    def _locations(self) -> KeyValueDb:
        if self._locations_db is None:
            self.open()
        assert self._locations_db is not None
        return self._locations_db

    @property
    def _ledgers_store(self) -> KeyValueDb:
        if self._ledgers_db is None:
            self.open()
        assert self._ledgers_db is not None
        return self._ledgers_db

    # --- lookups ------------------------------------------------------------------------------------

    def find(self, ledger_id: int) -> Path | None:
        """The ledgers db's path when it holds the ledger (what an index file's path is elsewhere)."""
        self._ledgers_store  # noqa: B018 - opens the dbs on first use
        return self.current / dbf.LEDGERS_DB if ledger_id in self._ledgers else None

    def load(self, ledger_id: int) -> LoadedIndex | None:
        path = self.find(ledger_id)
        if path is None:
            return None
        return LoadedIndex(path, header_of(self._ledgers[ledger_id]), self.last_entry_id(ledger_id))

    def last_entry_id(self, ledger_id: int) -> int:
        held = self._held.last_entry_id(ledger_id)
        found = self._locations.last_before(dbf.location_key(ledger_id + 1, 0))
        if found is None:
            return held
        found_ledger, entry_id = dbf.decode_location_key(found[0])
        return max(held, entry_id) if found_ledger == ledger_id else held

    def location(self, ledger_id: int, entry_id: int) -> tuple[int, Path | None, int]:
        # Every read from the entry logs asks: the binding's get and the key's packer, no wrappers.
        path = self._locations_path
        held = self._held
        if held.count:  # a replayed location is the entry's latest
            location = held.location(ledger_id, entry_id)
            if location:
                return location, path, 0
        get = self._get_location
        if get is None:
            get = self._get_location = self._locations.getter()
        value = get(_pack_location_key(ledger_id, entry_id))
        if value is None:
            return 0, path, 0
        try:
            return dbf.decode_location(value), path, 0
        except ProtocolError as exc:
            raise CorruptDataError(f"{path}: ledger {ledger_id} entry {entry_id}: {exc}") from None

    def entry_ids(self, ledger_id: int) -> Iterator[int]:
        """The ledger's entry ids in the locations db and held, ascending."""
        held = self._held.entry_ids(ledger_id)
        stored = (
            dbf.decode_location_key(key)[1]
            for key, _ in self._locations.items(
                dbf.location_key(ledger_id, 0), dbf.location_key(ledger_id + 1, 0)
            )
        )
        if held:
            yield from sorted(held.union(stored))
        else:
            yield from stored

    def ledger_ids(self) -> set[int]:
        self._ledgers_store  # noqa: B018
        return set(self._ledgers)

    # --- checkpoint thread: writes ------------------------------------------------------------------

    def write(self, ledger_id: int, header: ixf.IndexHeader | None, locations: Mapping[int, int]) -> None:
        """Queue a ledger's state (when given) and locations for `commit`."""
        if header is None and ledger_id not in self._ledgers and locations:
            raise CorruptDataError(f"ledger {ledger_id} has entries but no ledger state to create")
        if locations:
            if min(locations) < 0:
                raise CorruptDataError("negative entry id in index slots")
            self._pending_locations.append(
                _Locations(ledger_id, array("q", locations.keys()), array("q", locations.values()))
            )
        if header is not None:
            data = data_of(header)
            self._ledgers[ledger_id] = data
            self._pending_ledgers[dbf.ledger_key(ledger_id)] = dbf.encode_ledger_data(data)

    def write_run(
        self, ledger_id: int, header: ixf.IndexHeader | None, first_entry_id: int, slots: bytes
    ) -> None:
        """As `write`, for entries first_entry_id, first_entry_id + 1, ... with big-endian locations."""
        if first_entry_id < 0:
            raise CorruptDataError("negative entry id in index slots")
        locations = _numbers(slots)
        entry_ids = array("q", range(first_entry_id, first_entry_id + len(locations)))
        self._pending_locations.append(_Locations(ledger_id, entry_ids, locations))
        self.write(ledger_id, header, {})

    def commit(self, replayed: bool = False) -> None:
        """The queued locations into the memtable (the held replayed ones first: older), then the
        ledgers' state in a synced batch.

        A checkpoint's locations skip RocksDB's WAL: no record per entry, no fdatasync per checkpoint
        (each one a disk cache flush the journal's fdatasync waits behind). They are durable once
        `persist` has flushed them, which the bookie does before lastMark moves past their entries (a
        kill -9 before that replays them from the journal) and before compaction's scan reads the
        database. A replay's (`replayed`) are held in memory (`_held`) while they number at most
        REPLAY_HELD_MAX; past that they all go through the WAL, unsynced: `persist` then syncs the WAL
        once instead of waiting for a memtable flush at the end of the replay (a flush of each batch
        would leave a small SST file each, compacted again after the restart)."""
        with self._lock:
            locations, self._pending_locations = self._pending_locations, []
            ledgers, self._pending_ledgers = self._pending_ledgers, {}
        count = sum(len(queued.entry_ids) for queued in locations)
        if replayed and self._held.count + count <= REPLAY_HELD_MAX:
            with self._held_lock:
                for queued in locations:
                    self._held.add(*queued)
        else:
            self._write_held(wal=replayed)
            self._put(locations, wal=replayed)
        if ledgers:
            self._ledgers_store.write(ledgers)

    def _write_held(self, wal: bool) -> None:
        """The held replayed locations into RocksDB (see `commit`), once: a later location of the same
        entry (a checkpoint's, compaction's) must never be overwritten by one of these."""
        with self._held_lock:
            held = self._held
            if held.count:
                self._put(held.chunks(), wal)
                self._held = ReplayedLocations()
                log.info("%s: %d replayed locations written", self._locations_path, held.count)

    def _put(self, queued: Iterable[tuple[int, array[int], array[int]]], wal: bool) -> None:
        """Ledgers' (ledger id, entry ids, locations) into RocksDB as packed records, unsynced; nothing
        written (and no sync or flush owed) when there are none."""
        records = [_records(*locations) for locations in queued]
        if records:
            self._locations.write_records(records, _RECORD, sync=False, wal=wal)

    @property
    def unpersisted(self) -> bool:
        """Whether committed locations may not be durable yet (see `persist`): held, or in RocksDB's
        memtable or unsynced WAL."""
        if self._held.count:
            return True
        return self._locations_db is not None and self._locations_db.unpersisted

    def persist(self) -> None:
        """Every committed location durable: the held ones written, the WAL synced, the memtable
        flushed into SST files (both with the GIL released), as needed."""
        self._write_held(wal=False)
        if self._locations_db is not None:
            self._locations_db.persist()

    def relocate(self, ledger_id: int, moves: list[tuple[array[int], bytes, bytes]]) -> int:
        """Compaction (Java's updateEntriesLocations, after the new entry log is fsynced): each entry
        still at its old location takes the new one, in one batch synced by `sync_relocated` before the
        old log goes. An entry whose location changed since the scan (written again) keeps it; a ledger
        deleted since (or deleted and created again, whose entries name other places) is left alone."""
        if ledger_id not in self._ledgers:
            return 0
        records = [self._still_at(ledger_id, entries, olds, news) for entries, olds, news in moves]
        self._locations.write_records(records, _RECORD, sync=False)
        return sum(map(len, records)) // _RECORD.size

    def _still_at(self, ledger_id: int, entries: array[int], olds: bytes, news: bytes) -> bytes:
        """The records (_RECORD) of the new locations of the entries whose location is still the old one."""
        count = len(entries)
        if not count:
            return b""
        first, last = entries[0], entries[-1]
        if last - first + 1 == count and entries == array("q", range(first, last + 1)):
            # The usual batch: a run of consecutive entries. One range read compares them all at once.
            now = self._locations.values(
                _pack_location_key(ledger_id, first), _pack_location_key(ledger_id, last + 1)
            )
            if len(now) == count and b"".join(now) == olds:
                return _records(ledger_id, entries, _numbers(news))
        get, size = self._locations.get, ixf.SLOT_SIZE
        kept = [
            at
            for at, entry_id in enumerate(entries)
            if get(_pack_location_key(ledger_id, entry_id)) == olds[at * size : (at + 1) * size]
        ]
        new_locations = _numbers(news)
        return _records(
            ledger_id,
            array("q", [entries[at] for at in kept]),
            array("q", [new_locations[at] for at in kept]),
        )

    def sync_relocated(self) -> int:
        """Sync the locations db's WAL (Java's sync(): an empty batch written with sync)."""
        self._locations.write({})
        return 1

    def delete(self, ledger_id: int) -> Path | None:
        """Remove a ledger's state and locations (garbage collection); the ledgers db's path, or None."""
        if self._ledgers.pop(ledger_id, None) is None:
            return None
        with self._held_lock:
            self._held.drop(ledger_id)
        self._locations.delete_range(dbf.location_key(ledger_id, 0), dbf.location_key(ledger_id + 1, 0))
        self._ledgers_store.write({}, [dbf.ledger_key(ledger_id)])
        return self.current / dbf.LEDGERS_DB

    def forget_pages(self) -> None:
        pass

    def compact_locations(self) -> None:
        """Compact the locations db (entry location compaction; blocking: call off the reactor)."""
        self.compacting = True
        try:
            self._locations.compact()
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status text
            log.error("%s: entry location compaction failed: %s", self._locations.path, exc)
            raise
        finally:
            self.compacting = False
        log.info("%s: entry location compaction done", self._locations.path)

    def close(self) -> None:
        for db in (self._locations_db, self._ledgers_db):
            if db is not None:
                db.close()
        self._locations_db = self._ledgers_db = None
        self._get_location = None
