"""Benchmark: what the db engine's locations db costs per checkpoint, and whether its compaction stops
other Python threads (rocksdict holds the GIL through some calls and not others).

Writes: ROUNDS checkpoints of N locations (8 ledgers, consecutive entries) into a fresh locations db
(rocksdb_store's options), one way per line, CPU (process, all threads) and wall time per location,
a memtable flush at the end included:
  wal      WriteBatch slices, WAL fdatasynced once per checkpoint (bkctl before 2026-11-29)
  memtable WriteBatch slices without the WAL (bkctl since)
  sst      one SstFileWriter file per checkpoint, ingested (no WAL, no memtable)
  build    the WriteBatch puts alone (the Python side)
Compaction: a thread compacts a db of 1.6M locations in 8 level-0 files while the main thread counts
in a pure-Python loop, then sleeps as long; a compaction holding the GIL would stop the count.

    python benchmarks/db_locations.py --dir /tmp/dbloc             # 4000 locations x 50 (a checkpoint
                                                                  # at ~35k adds/s holds ~4000)
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import starmap
from pathlib import Path

import rocksdict as rd

from bkctl.protocol import db_format as dbf
from bkctl.server import rocksdb_store as rs

RECORD = dbf.LOCATION_RECORD


def _records(first: int, count: int, ledgers: int = 8) -> bytes:
    """`count` locations over `ledgers` ledgers, entries from `first` on, in key order, packed as
    (key, value) records (dbf.LOCATION_RECORD)."""
    per = count // ledgers
    return b"".join(
        dbf.location_key(ledger, entry_id) + struct.pack(">q", entry_id)
        for ledger in range(ledgers)
        for entry_id in range(first, first + per)
    )


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def _build(db: rs.KeyValueDb, records: bytes, at: int, where: Path) -> None:
    step = rs.WRITE_SLICE * RECORD.size
    for start in range(0, len(records), step):
        batch = rd.WriteBatch(raw_mode=True)
        deque(starmap(batch.put, RECORD.iter_unpack(records[start : start + step])), maxlen=0)


def _wal(db: rs.KeyValueDb, records: bytes, at: int, where: Path) -> None:
    db.write_records([records], RECORD)


def _memtable(db: rs.KeyValueDb, records: bytes, at: int, where: Path) -> None:
    db.write_records([records], RECORD, wal=False)


def _sst(db: rs.KeyValueDb, records: bytes, at: int, where: Path) -> None:
    writer = rd.SstFileWriter(rs._options(True, rs.DEFAULT_SETTINGS, "locations"))
    path = str(where / f"ingest-{at}.sst")
    writer.open(path)
    for key, value in RECORD.iter_unpack(records):
        writer[key] = value
    writer.finish()
    options = rd.IngestExternalFileOptions()
    options.set_move_files(True)
    db._db.ingest_external_file([path], options)


WAYS: dict[str, Callable[[rs.KeyValueDb, bytes, int, Path], None]] = {
    "build": _build,
    "wal": _wal,
    "memtable": _memtable,
    "sst": _sst,
}


def writes(base: Path, count: int, rounds: int) -> None:
    for name, way in WAYS.items():
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        db = rs.KeyValueDb(base / "locations", huge=True)
        checkpoints = [_records(at * count, count) for at in range(rounds)]
        cpu, wall = _cpu(), time.perf_counter()
        for at, records in enumerate(checkpoints):
            way(db, records, at, base)
        db.flush()  # every way's memtable into SST files, as it is sooner or later
        cpu, wall = _cpu() - cpu, time.perf_counter() - wall
        total = count * rounds
        print(
            f"{name:9} CPU {1e6 * cpu / total:5.2f} us/location, wall {1e6 * wall / total:5.2f} us/location"
        )
        db.close()


def _count_while(work: Callable[[], object]) -> tuple[float, float]:
    """Loop iterations per second of this thread while `work` runs in another, and the longest gap."""
    done = threading.Event()
    thread = threading.Thread(target=lambda: (work(), done.set()))
    thread.start()
    count, worst, last = 0, 0.0, time.perf_counter()
    began = last
    while not done.is_set():
        count += 1
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    thread.join()
    return count / (last - began), worst


def compaction(base: Path) -> None:
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    db = rs.KeyValueDb(base / "locations", huge=True)
    for part in range(8):
        ids = range(part, 1_600_000, 8)
        db.write_records([b"".join(dbf.location_key(1, e) + struct.pack(">q", e) for e in ids)], RECORD)
        db.flush()
    took = time.perf_counter()
    rate, worst = _count_while(db.compact)
    took = time.perf_counter() - took
    print(
        f"compaction {took:.2f} s: main thread {rate / 1e6:.2f} M loops/s, longest gap {worst * 1000:.0f} ms"
    )
    rate, worst = _count_while(lambda: time.sleep(took))
    print(
        f"sleep      {took:.2f} s: main thread {rate / 1e6:.2f} M loops/s, longest gap {worst * 1000:.0f} ms"
    )
    db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="scratch directory (removed and rewritten)")
    parser.add_argument("--count", type=int, default=4000, help="locations per checkpoint")
    parser.add_argument("--rounds", type=int, default=50, help="checkpoints")
    args = parser.parse_args()
    writes(args.dir / "writes", args.count, args.rounds)
    compaction(args.dir / "compaction")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
