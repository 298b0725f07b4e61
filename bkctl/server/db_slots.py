"""Compaction's view of the db engine's entry locations, for the scan process (gc_scan.py): which
records of an old entry log the locations db still names (live_records.py then reads only those).

The bookie keeps writing the database meanwhile, so the scan process opens it as a RocksDB secondary
instance (rocksdb_store.py), which sees everything the bookie wrote before the scan started (the GC
waits for the checkpoints naming the log first), WAL included. A location only ever moves away from an
old log, so one read here as naming a record does, or did a moment ago: the bookie moves only the
locations still naming the old place (db_ledger_index.DbLedgerIndex.relocate). Imports numpy: the scan
process's only, never the bookie's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from bkctl.errors import CorruptDataError
from bkctl.protocol import db_format as dbf
from bkctl.protocol import index_format as ixf
from bkctl.server.rocksdb_store import KeyValueDb

Column = npt.NDArray[np.int64]

_SIZE_PREFIX: Final = 4
_OFFSET_MASK: Final = 0xFFFFFFFF
CHUNK_ENTRIES: Final = 65_536  # local bound: locations held at once while looking for a log's


class DbSlots:
    """The locations of the ledgers given, from each one's locations db (`<dir>/current/locations`,
    beside the ledgers db `find` named)."""

    def __init__(self, ledgers_dbs: dict[int, Path]) -> None:
        self._dbs: dict[Path, KeyValueDb] = {}
        self._of: dict[int, KeyValueDb] = {}
        try:
            for ledger_id, ledgers_db in ledgers_dbs.items():
                path = ledgers_db.parent / dbf.LOCATIONS_DB
                db = self._dbs.get(path)
                if db is None:
                    db = self._dbs[path] = KeyValueDb(path, huge=True, secondary=True)
                self._of[ledger_id] = db
        except BaseException:
            self.close()
            raise

    def __contains__(self, ledger_id: int) -> bool:
        return ledger_id in self._of

    def naming(self, log_id: int) -> Iterator[tuple[int, Column, Column]]:
        """(ledger id, record starts, entry ids) of the locations naming `log_id`, a chunk at a time;
        OSError for a key or value of the wrong size (the log is then kept)."""
        for ledger_id, db in self._of.items():
            first, end = dbf.location_key(ledger_id, 0), dbf.location_key(ledger_id + 1, 0)
            try:
                for packed in db.packed_chunks(
                    dbf.LOCATION_KEY_SIZE, ixf.SLOT_SIZE, CHUNK_ENTRIES, first, end
                ):
                    yield from _naming(ledger_id, log_id, packed)
            except CorruptDataError as exc:
                raise OSError(f"ledger {ledger_id}: {exc}") from None

    def slot(self, ledger_id: int, entry_id: int) -> int:
        """The location of one entry (0: none)."""
        value = self._of[ledger_id].get(dbf.location_key(ledger_id, entry_id)) if entry_id >= 0 else None
        return int.from_bytes(value, "big") if value is not None and len(value) == ixf.SLOT_SIZE else 0

    def close(self) -> None:
        for db in self._dbs.values():
            db.close()
        self._dbs.clear()
        self._of.clear()


def _naming(ledger_id: int, log_id: int, packed: bytes) -> Iterator[tuple[int, Column, Column]]:
    records = np.frombuffer(packed, ">i8").reshape(-1, 3)  # ledger id, entry id, location
    entries, slots = records[:, 1].astype(np.int64), records[:, 2].astype(np.int64)
    hits = np.flatnonzero((slots >> 32 == log_id) & (slots != 0))
    if len(hits):
        yield ledger_id, (slots[hits] & _OFFSET_MASK) - _SIZE_PREFIX, entries[hits]
