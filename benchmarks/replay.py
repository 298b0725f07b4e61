"""Benchmark: bookie restart after kill -9 (journal replay), and in-process add throughput.

1. Writes ~1 GiB of V6 journal (1 KiB CRC32C entries over 16 ledgers, master key records first, a
   padding record every 512 KiB as group commits leave them) into a fresh bookie dir whose lastMark
   points at the journal's start, i.e. everything is "since the last checkpoint". Then times
   `Storage.start()`: replay into the write cache, entry log + index writes, fsyncs, new lastMark.
2. Adds 1 KiB entries in-process with journal_sync_data on, keeping --in-flight adds outstanding,
   for --seconds: adds/s, entries per fsync, fsync p50 from the histogram.

    python benchmarks/replay.py                 # 1 GiB (the figures in benchmarks/RESULTS.md)
    python benchmarks/replay.py --size-mb 64    # quick run
    python benchmarks/replay.py --replay-only   # restart only
    python benchmarks/replay.py --replay-only --storage db --dirs 2   # two ledger dirs
    python benchmarks/replay.py --replay-only --ledgers 2000          # a real cluster's shape
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bkctl.model import DigestType
from bkctl.protocol import entry, journal_format
from bkctl.server.storage import Storage, StorageConfig

PAYLOAD_SIZE = 1024
LEDGERS = 16
COMMIT_BYTES = 512 * 1024
KEY = entry.master_key(b"bench")


def write_journal(directory: Path, size_bytes: int, ledgers: int = LEDGERS) -> int:
    """A V6 journal in `directory`/journal/current, entries round-robin over `ledgers` ledgers; returns
    the number of entries."""
    current = directory / "journal" / "current"
    current.mkdir(parents=True)
    (directory / "ledgers" / "current").mkdir(parents=True)
    journal_id = 1
    payload = os.urandom(PAYLOAD_SIZE)
    entries = 0
    with open(current / journal_format.journal_file_name(journal_id), "wb") as out:
        chunk = bytearray(journal_format.encode_header(journal_format.VERSION_MAX))
        for ledger_id in range(ledgers):
            chunk += journal_format.encode_record(journal_format.encode_master_key(ledger_id, KEY))
        position = since_commit = 0
        while position + len(chunk) < size_bytes:
            ledger_id, entry_id = entries % ledgers, entries // ledgers
            body = entry.package_entry(DigestType.CRC32C, ledger_id, entry_id, entry_id - 1, 0, payload)
            record = journal_format.encode_record(body)
            chunk += record
            since_commit += len(record)
            entries += 1
            if since_commit >= COMMIT_BYTES:
                chunk += journal_format.encode_padding(position + len(chunk))
                since_commit = 0
                out.write(chunk)
                position += len(chunk)
                chunk = bytearray()
        out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    last_mark = journal_format.encode_last_mark(journal_id, journal_format.SECTOR_SIZE)
    (directory / "ledgers" / "current" / "lastMark").write_bytes(last_mark)
    return entries


def bench_replay(
    size_mb: int, base: Path, engine: str = "interleaved", dirs: int = 1, ledgers: int = LEDGERS
) -> dict[str, Any]:
    directory = base / "replay"
    started = time.perf_counter()
    entries = write_journal(directory, size_mb * 1024 * 1024, ledgers)
    for extra in _ledger_dirs(directory, dirs)[1:]:
        (extra / "current").mkdir(parents=True)
    written_s = time.perf_counter() - started
    config = _config(directory, sync=True, engine=engine, dirs=dirs)
    storage = Storage(config, lambda tokens: None, _NoReactor())
    started, cpu_started = time.perf_counter(), time.process_time()
    report = storage.start()
    start_s = time.perf_counter() - started
    # The process's CPU time (every thread): on a loaded machine it moves far less than the wall clock.
    cpu_s = time.process_time() - cpu_started
    # What the checkpoint a bookie starts as it listens then does: the db engine's held locations into
    # RocksDB and flushed, and lastMark (already written by start() on the interleaved engine).
    started = time.perf_counter()
    storage._write_last_marks(storage._marks())
    first_checkpoint_s = time.perf_counter() - started
    storage._close_files(None)
    return {
        "journal_mb": report.bytes / 1e6,
        "entries": report.entries,
        "expected_entries": entries,
        "write_journal_s": written_s,
        "scan_s": report.seconds,
        "start_s": start_s,
        "start_mb_per_s": report.bytes / 1e6 / start_s,
        "cpu_s": cpu_s,
        "first_checkpoint_s": first_checkpoint_s,
        "mb_per_cpu_s": report.bytes / 1e6 / cpu_s,
    }


def bench_adds(base: Path, seconds: float, in_flight: int) -> dict[str, Any]:
    from twisted.internet import reactor as default_reactor

    reactor: Any = default_reactor
    payload = os.urandom(PAYLOAD_SIZE)
    state = {"outstanding": 0, "acked": 0, "next": 0}

    def on_durable(tokens: list[object]) -> None:
        state["outstanding"] -= len(tokens)
        state["acked"] += len(tokens)
        pump()

    storage = Storage(_config(base / "adds", sync=True), on_durable, reactor)
    storage.start()

    def pump() -> None:
        while state["outstanding"] < in_flight:
            entry_id = state["next"]
            state["next"] += 1
            data = entry.package_entry(DigestType.CRC32C, 1, entry_id, entry_id - 1, 0, payload)
            storage.add(1, entry_id, KEY, data, False, entry_id)
            state["outstanding"] += 1

    result: dict[str, Any] = {}

    def finish(started: float) -> None:
        elapsed = time.perf_counter() - started
        metrics = storage.metrics
        result.update(
            adds_per_s=state["acked"] / elapsed,
            fsyncs=metrics.fsyncs,
            entries_per_fsync=metrics.entries_per_fsync / max(1, metrics.fsyncs),
            fsync_mean_ms=metrics.fsync_latency_sum_ms / max(1, metrics.fsyncs),
        )
        storage.stop().addBoth(lambda _: reactor.stop())

    def begin() -> None:
        pump()
        reactor.callLater(seconds, finish, time.perf_counter())

    reactor.callWhenRunning(begin)
    reactor.run()
    return result


def _ledger_dirs(directory: Path, count: int) -> tuple[Path, ...]:
    """`ledgers` (lastMark's), then `ledgers1`, `ledgers2`, ...: the db engine keeps ledger L in the
    (L mod count)-th, so the journal's round-robin ledgers alternate directories record by record."""
    return (directory / "ledgers", *(directory / f"ledgers{i}" for i in range(1, count)))


def _config(directory: Path, sync: bool, engine: str = "interleaved", dirs: int = 1) -> StorageConfig:
    return StorageConfig(
        journal_dirs=(directory / "journal",),
        ledger_dirs=_ledger_dirs(directory, dirs),
        journal_sync_data=sync,
        flush_interval_ms=60_000,
        engine=engine,
    )


def drop_page_cache(directory: Path) -> int:
    """Every file under `directory` out of the OS page cache (posix_fadvise DONTNEED, these files only:
    the machine's other work keeps its cache); the bytes they hold."""
    size = 0
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                size += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return size


def bench_cold_reads(
    base: Path, engine: str, count: int, drop: bool = False, dirs: int = 1, ledgers: int = LEDGERS
) -> dict[str, Any]:
    """Reads of `count` random entries through a freshly started storage on the replayed dir: nothing in
    the bookie's caches (index pages / RocksDB blocks); the OS page cache as the replay left it, or with
    `drop` the bookie's files out of it once the storage has started (every read goes to the disk)."""
    import random

    config = _config(base / "replay", sync=True, engine=engine, dirs=dirs)
    storage = Storage(config, lambda tokens: None, _NoReactor())
    storage.start()
    last = {ledger_id: storage.read(ledger_id, -1)[1] for ledger_id in range(ledgers)}
    last_ids = {ledger_id: int.from_bytes(data[8:16], "big") for ledger_id, data in last.items()}
    picks_rng = random.Random(count)  # the same picks for every engine and run
    picks = [
        (ledger_id, picks_rng.randint(0, last_ids[ledger_id]))
        for ledger_id in picks_rng.choices(range(ledgers), k=count)
    ]
    if drop:
        drop_page_cache(base / "replay")
    before, cpu, started = read_io(), time.process_time(), time.perf_counter()
    failed = sum(1 for ledger_id, entry_id in picks if storage.read(ledger_id, entry_id)[0] != 0)
    seconds, cpu, after = time.perf_counter() - started, time.process_time() - cpu, read_io()
    storage._close_files(None)
    return {
        "reads": count,
        "failed": failed,
        "reads_per_s": count / seconds,
        "page_cache_dropped": drop,
        "cpu_us": cpu / count * 1e6,  # the process's, every thread (RocksDB's too)
        "read_calls": (after["syscr"] - before["syscr"]) / count,
        "kib": (after["rchar"] - before["rchar"]) / count / 1024,
    }


def read_io() -> dict[str, int]:
    """The process's read counters: `syscr` (read system calls), `rchar` (bytes they returned), ..."""
    with open("/proc/self/io") as stats:
        return {name: int(value) for name, value in (line.split(":") for line in stats)}


class _NoReactor:
    """start() needs no reactor until the bookie runs; the periodic checkpoint is never fired here."""

    def callLater(self, delay: float, f: Any, *args: Any) -> Any:
        return None

    def callFromThread(self, f: Any, *args: Any) -> None:
        f(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="journal size to replay (MiB)")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of the add run")
    parser.add_argument("--in-flight", type=int, default=512, help="adds outstanding in the add run")
    parser.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    parser.add_argument("--replay-only", action="store_true", help="skip the add run")
    parser.add_argument("--storage", default="interleaved", help="interleaved or db (DbLedgerStorage)")
    parser.add_argument("--dirs", type=int, default=1, help="ledger dirs (the db engine: one store each)")
    parser.add_argument("--ledgers", type=int, default=LEDGERS, help="ledgers the entries rotate over")
    parser.add_argument(
        "--cold-reads",
        type=int,
        default=0,
        help="then time this many random reads: page cache as the replay left it, then dropped",
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bkctl-replay-", dir=args.dir))
    try:
        replay = bench_replay(args.size_mb, base, args.storage, args.dirs, args.ledgers)
        print(
            f"replay: {replay['journal_mb']:.0f} MB, {replay['entries']} entries "
            f"(journal written in {replay['write_journal_s']:.1f} s); scan {replay['scan_s']:.2f} s; "
            f"start() {replay['start_s']:.2f} s = {replay['start_mb_per_s']:.0f} MB/s; "
            f"CPU {replay['cpu_s']:.2f} s = {replay['mb_per_cpu_s']:.0f} MB per CPU-second; "
            f"first checkpoint after it {replay['first_checkpoint_s']:.2f} s"
        )
        assert replay["entries"] == replay["expected_entries"], replay
        for drop in (False, True) if args.cold_reads else ():
            cold = bench_cold_reads(base, args.storage, args.cold_reads, drop, args.dirs, args.ledgers)
            where = "page cache dropped" if drop else "page cache as left"
            rate = (
                f"{cold['reads_per_s']:.0f} reads/s, {cold['failed']} failed; per read: "
                f"{cold['cpu_us']:.1f} us CPU, {cold['read_calls']:.2f} read calls, {cold['kib']:.2f} KiB"
            )
            print(f"cold reads ({args.storage}, {where}): {rate}")
        if args.replay_only:
            return
        adds = bench_adds(base, args.seconds, args.in_flight)
        print(
            f"adds: {adds['adds_per_s']:.0f} adds/s (1 KiB, {args.in_flight} in flight, fsync on), "
            f"{adds['entries_per_fsync']:.0f} entries per fsync, {adds['fsyncs']} fsyncs, "
            f"mean fsync {adds['fsync_mean_ms']:.2f} ms"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
