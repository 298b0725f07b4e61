"""A journal's fdatasync beside a big copy on the same file system: does reserving the copy's blocks help?

The file-system half of "a concurrent writer during compaction", without the bookie: one thread
appends 1 KiB records to a journal-like file (blocks reserved ahead with fallocate KEEP_SIZE, as
bkctl's journal does, so its size grows with every write) and fdatasyncs each, pausing 2 ms between
them, as the benchmark's writer adds one entry at a time; another thread copies a 512 MiB file into
new ones, one after another, in 128 KiB steps written out with sync_file_range and an fsync per 4 MiB
(as compaction's checkpoints write its batches), reading the source without read-ahead. Modes, alternated:

- alone: the journal loop only;
- copy: the copy allocates its blocks as it writes (delayed allocation at write-out);
- reserved: the copy's file has its blocks reserved up front (fallocate KEEP_SIZE), so the copy's own
  block allocations stay out of the file system transactions the journal's fdatasync commits.

On a quiet machine (benchmarks/RESULTS.md, 2026-11-25) the copy moved the loop's p99 by nothing measurable
either way: the disk is not what a concurrent writer waits for during compaction here.

Prints one line per run: the journal loop's fdatasync p50 / p99 / max and the copy's MB/s.

    python benchmarks/journal_beside_copy.py --dir /var/tmp/jbc --seconds 8 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bkctl.server.fileio import reserve, write_out  # noqa: E402

SOURCE_SIZE = 512 * 1024 * 1024
STEP = 128 * 1024
READ_SIZE = 256 * 1024
BATCH = 4 * 1024 * 1024  # compaction's batch


def make_source(path: Path) -> None:
    if path.exists() and path.stat().st_size == SOURCE_SIZE:
        return
    with path.open("wb") as out:
        for _ in range(SOURCE_SIZE // (1 << 20)):
            out.write(os.urandom(1 << 20))
        os.fsync(out.fileno())


def journal_loop(directory: Path, seconds: float, stop: threading.Event) -> list[float]:
    fd = os.open(directory / "journal", os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    reserve(fd, 0, 64 * 1024 * 1024)
    record, offset, latencies = os.urandom(1024), 0, []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            os.pwrite(fd, record, offset)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - started)
            offset += len(record)
            time.sleep(0.002)
    finally:
        stop.set()
        os.close(fd)
    return latencies


def copy(directory: Path, source: Path, reserved: bool, stop: threading.Event, copied: list[int]) -> None:
    """Copy `source` into fresh files, one after another, until `stop`; the copies are removed after."""
    source_fd = os.open(source, os.O_RDONLY)
    os.posix_fadvise(source_fd, 0, 0, os.POSIX_FADV_RANDOM)
    targets = []
    try:
        while not stop.is_set():
            os.posix_fadvise(source_fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read from the disk each pass
            targets.append(directory / f"copy-{len(targets)}.log")
            copy_once(source_fd, targets[-1], reserved, stop, copied)
    finally:
        os.close(source_fd)
        for target in targets:
            target.unlink()


def copy_once(source_fd: int, target: Path, reserved: bool, stop: threading.Event, copied: list[int]) -> None:
    target_fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    if reserved:
        reserve(target_fd, 0, SOURCE_SIZE)
    offset = 0
    try:
        while not stop.is_set() and offset < SOURCE_SIZE:
            data = os.pread(source_fd, READ_SIZE, offset)
            for start in range(0, len(data), STEP):
                os.pwrite(target_fd, data[start : start + STEP], offset + start)
                write_out(target_fd, offset + start, offset + start + STEP)
            offset += len(data)
            copied[0] += len(data)
            if offset % BATCH == 0:
                os.fsync(target_fd)  # each compaction batch's checkpoint fsyncs the entry log
    finally:
        os.close(target_fd)


def run(directory: Path, mode: str, seconds: float) -> str:
    stop, copied = threading.Event(), [0]
    copier = None
    if mode != "alone":
        args = (directory, directory / "source", mode == "reserved", stop, copied)
        copier = threading.Thread(target=copy, args=args)
        copier.start()
    started = time.monotonic()
    latencies = sorted(journal_loop(directory, seconds, stop))
    elapsed = time.monotonic() - started
    if copier is not None:
        copier.join()
    os.sync()  # the copies' removal reaches the disk before the next run

    def ms(share: float) -> float:
        return latencies[min(len(latencies) - 1, int(share * len(latencies)))] * 1000

    return (
        f"{mode:9s} fdatasync p50 {ms(0.5):.2f} / p99 {ms(0.99):.2f} / max {latencies[-1] * 1000:.2f} ms"
        f"  copy {copied[0] / elapsed / 1e6:.0f} MB/s  (n={len(latencies)})"
    )


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp/bkctl-journal-beside-copy"))
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    make_source(args.dir / "source")
    for _ in range(args.rounds):
        for mode in ("alone", "copy", "reserved"):
            print(run(args.dir, mode, args.seconds), f"| load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
