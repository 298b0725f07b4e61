"""Benchmark: reads from the entry logs on the db engine beside the interleaved one, same picks.

Per engine, a bookie directory of --size-mb of 1 KiB entries over 16 ledgers, in one of two layouts:
- `replay`: a journal replayed at start (benchmarks/replay.py's), so the entry log holds the ledgers'
  entries interleaved one by one, as a restart after kill -9 leaves them;
- `adds`: the same entries added in turns to a running storage and checkpointed, so the log holds runs
  of each ledger's entries (what a bookie's checkpoints write).
Then, alternating the engines, each run on a freshly started storage (nothing in its caches; the OS
page cache as the build left it, or with --drop the bookie's files dropped from it):
- `random`: --reads random entries, the same picks for both engines;
- `sequential`: whole ledgers from entry 0, one after the other, --reads entries in all.
Per run: reads/s, the process's CPU per read (every thread: RocksDB's included), read syscalls and
KiB read per read (/proc/self/io), and the read cache's hits, misses and read-aheads (db engine).

    python benchmarks/db_reads.py --dir /tmp --size-mb 1024 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.replay import (  # noqa: E402
    KEY,
    LEDGERS,
    PAYLOAD_SIZE,
    _config,
    _NoReactor,
    bench_replay,
    drop_page_cache,
    read_io,
)
from bkctl.model import DigestType  # noqa: E402
from bkctl.protocol import entry  # noqa: E402
from bkctl.server.storage import Storage  # noqa: E402

ENGINES = ("interleaved", "db")
IN_FLIGHT = 512
RECORD_BYTES = PAYLOAD_SIZE + 60  # an entry log record of a 1 KiB CRC32C entry, about


def build_by_adds(base: Path, size_mb: int) -> None:
    """Both engines' `adds` directories, in one reactor run (it cannot be restarted)."""
    from twisted.internet import reactor as default_reactor

    reactor: Any = default_reactor
    total = size_mb * 1024 * 1024 // RECORD_BYTES
    payload = os.urandom(PAYLOAD_SIZE)
    pending = list(ENGINES)

    def next_engine(_: object = None) -> None:
        if not pending:
            reactor.stop()
            return
        engine = pending.pop(0)
        directory = base / engine / "adds"
        (directory / "ledgers").mkdir(parents=True)
        state = {"out": 0, "next": 0, "acked": 0}

        def durable(tokens: list[object]) -> None:
            state["out"] -= len(tokens)
            state["acked"] += len(tokens)
            if state["acked"] == total:
                storage.stop().addBoth(next_engine)
            else:
                pump()

        def pump() -> None:
            while state["out"] < IN_FLIGHT and state["next"] < total:
                number = state["next"]
                state["next"] += 1
                ledger_id, entry_id = number % LEDGERS, number // LEDGERS
                data = entry.package_entry(DigestType.CRC32C, ledger_id, entry_id, entry_id - 1, 0, payload)
                storage.add(ledger_id, entry_id, KEY, data, False, number)
                state["out"] += 1

        storage = Storage(_config(directory, sync=False, engine=engine), durable, reactor)
        storage.start()
        pump()

    reactor.callWhenRunning(next_engine)
    reactor.run()


def build_by_replay(base: Path, size_mb: int) -> None:
    for engine in ENGINES:
        bench_replay(size_mb, base / engine, engine)  # leaves base/engine/replay


def _picks(storage: Storage, pattern: str, count: int) -> list[tuple[int, int]]:
    last = {
        ledger_id: int.from_bytes(storage.read(ledger_id, -1)[1][8:16], "big") for ledger_id in range(LEDGERS)
    }
    rng = random.Random(count)  # the same picks for every engine and run
    if pattern == "random":
        return [(ledger, rng.randint(0, last[ledger])) for ledger in rng.choices(range(LEDGERS), k=count)]
    picks: list[tuple[int, int]] = []
    for ledger_id in rng.sample(range(LEDGERS), LEDGERS):
        picks += [(ledger_id, entry_id) for entry_id in range(last[ledger_id] + 1)]
        if len(picks) >= count:
            break
    return picks[:count]


def run(directory: Path, engine: str, pattern: str, count: int, drop: bool) -> dict[str, Any]:
    storage = Storage(_config(directory, sync=True, engine=engine), lambda tokens: None, _NoReactor())
    storage.start()
    picks = _picks(storage, pattern, count)
    if drop:
        drop_page_cache(directory)
    before, cpu, started = read_io(), time.process_time(), time.perf_counter()
    failed = sum(1 for ledger_id, entry_id in picks if storage.read(ledger_id, entry_id)[0] != 0)
    seconds, cpu, after = time.perf_counter() - started, time.process_time() - cpu, read_io()
    cache = storage.read_cache_metrics
    storage._close_files(None)
    reads = len(picks)
    return {
        "reads": reads,
        "failed": failed,
        "reads_per_s": reads / seconds,
        "cpu_us": cpu / reads * 1e6,
        "syscalls": (after["syscr"] - before["syscr"]) / reads,
        "kib": (after["rchar"] - before["rchar"]) / reads / 1024,
        "cache": f"{cache.hits}/{cache.misses}/{cache.batches}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256, help="entries per engine and layout (MiB)")
    parser.add_argument("--reads", type=int, default=20000, help="reads per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each engine, alternating")
    parser.add_argument("--layouts", default="replay,adds", help="replay and/or adds")
    parser.add_argument("--patterns", default="random,sequential", help="random and/or sequential")
    parser.add_argument("--drop", action="store_true", help="drop the bookie's files from the page cache")
    parser.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    parser.add_argument(
        "--keep", type=Path, default=None, help="build here unless built, keep it (to compare two trees)"
    )
    args = parser.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="bkctl-db-reads-", dir=args.dir))
    layouts = args.layouts.split(",")
    try:
        if "replay" in layouts and not (base / ENGINES[-1] / "replay").is_dir():
            build_by_replay(base, args.size_mb)
        if "adds" in layouts and not (base / ENGINES[-1] / "adds").is_dir():
            build_by_adds(base, args.size_mb)
        print("layout   pattern     engine       reads/s  CPU us/read  read calls/read  KiB/read", end="")
        print("  hits/misses/read-aheads  load")
        for _ in range(args.rounds):
            for layout in layouts:
                for pattern in args.patterns.split(","):
                    for engine in ENGINES:
                        _report(
                            layout,
                            pattern,
                            engine,
                            run(base / engine / layout, engine, pattern, args.reads, args.drop),
                        )
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)


def _report(layout: str, pattern: str, engine: str, result: dict[str, Any]) -> None:
    assert result["failed"] == 0, result
    print(
        f"{layout:8} {pattern:11} {engine:11} {result['reads_per_s']:8.0f} "
        f"{result['cpu_us']:12.1f} {result['syscalls']:16.2f} {result['kib']:9.2f}  "
        f"{result['cache']:>23}  {os.getloadavg()[0]:.1f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
