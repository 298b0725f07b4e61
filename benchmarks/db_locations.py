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
from collections.abc import Callable
from pathlib import Path

import rocksdict as rd

from bkctl.server import rocksdb_store as rs

Pairs = list[tuple[bytes, bytes]]


def _pairs(first: int, count: int, ledgers: int = 8) -> Pairs:
    """`count` locations over `ledgers` ledgers, entries from `first` on, in key order."""
    per = count // ledgers
    ids = struct.pack(f">{per}q", *range(first, first + per))
    slots = [ids[at : at + 8] for at in range(0, len(ids), 8)]
    return [(struct.pack(">q", ledger) + slot, slot) for ledger in range(ledgers) for slot in slots]


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def _build(db: rs.KeyValueDb, pairs: Pairs, at: int, where: Path) -> None:
    for start in range(0, len(pairs), rs.WRITE_SLICE):
        batch = rd.WriteBatch(raw_mode=True)
        for key, value in pairs[start : start + rs.WRITE_SLICE]:
            batch.put(key, value)


def _wal(db: rs.KeyValueDb, pairs: Pairs, at: int, where: Path) -> None:
    db.write_pairs(pairs)


def _memtable(db: rs.KeyValueDb, pairs: Pairs, at: int, where: Path) -> None:
    db.write_pairs(pairs, wal=False)


def _sst(db: rs.KeyValueDb, pairs: Pairs, at: int, where: Path) -> None:
    writer = rd.SstFileWriter(rs._options(True))
    path = str(where / f"ingest-{at}.sst")
    writer.open(path)
    for key, value in pairs:
        writer[key] = value
    writer.finish()
    options = rd.IngestExternalFileOptions()
    options.set_move_files(True)
    db._db.ingest_external_file([path], options)


WAYS: dict[str, Callable[[rs.KeyValueDb, Pairs, int, Path], None]] = {
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
        checkpoints = [_pairs(at * count, count) for at in range(rounds)]
        cpu, wall = _cpu(), time.perf_counter()
        for at, pairs in enumerate(checkpoints):
            way(db, pairs, at, base)
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
        ids = struct.pack(">200000q", *range(part, 1_600_000, 8))
        db.write_pairs(
            [(struct.pack(">q", 1) + ids[at : at + 8], ids[at : at + 8]) for at in range(0, len(ids), 8)]
        )
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
