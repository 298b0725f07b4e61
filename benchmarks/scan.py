"""Benchmark: how fast bkctl scans a journal and an entry log, with CRC32C checks, in bounded memory.

Generates (once) a journal and an entry log of 1 KiB CRC32C entries under benchmarks/data/ with our own
encoders, then measures in one run: a plain sequential read of each file, the `journal inspect
--summary` scan and the entry-log summary scan (MB/s, records/s), and the peak RSS of the process.

    python benchmarks/scan.py               # 1 GiB files (the figures in benchmarks/RESULTS.md)
    python benchmarks/scan.py --size-mb 64  # quick run
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path

from bkctl import limits
from bkctl.files.digests import DigestChecker
from bkctl.files.entrylog import entry_log_records, open_entry_log
from bkctl.files.journal import journal_records, open_journal
from bkctl.files.summary import summarize
from bkctl.model import DigestType
from bkctl.protocol import entry, entrylog_format, journal_format

DATA_DIR = Path(__file__).resolve().parent / "data"
PAYLOAD_SIZE = 1024
LEDGERS = 16


def generate_journal(path: Path, size_bytes: int) -> None:
    """A V6 journal, entries round-robin over 16 ledgers, a padding record every 64 entries (a flush)."""
    payload = os.urandom(PAYLOAD_SIZE)
    with open(path, "wb") as out:
        out.write(journal_format.encode_header(journal_format.VERSION_MAX))
        position = journal_format.SECTOR_SIZE
        entry_id = 0
        while position < size_bytes:
            ledger_id = entry_id % LEDGERS
            packed = entry.package_entry(DigestType.CRC32C, ledger_id, entry_id, entry_id - 1, 0, payload)
            record = journal_format.encode_record(packed)
            if entry_id % 64 == 63:
                record += journal_format.encode_padding(position + len(record))
            out.write(record)
            position += len(record)
            entry_id += 1


def generate_entry_log(path: Path, size_bytes: int) -> None:
    payload = os.urandom(PAYLOAD_SIZE)
    with open(path, "wb") as out:
        out.write(entrylog_format.encode_header(entrylog_format.EntryLogHeader(entrylog_format.HEADER_V1)))
        position = entrylog_format.HEADER_SIZE
        entry_id = 0
        while position < size_bytes:
            ledger_id = entry_id % LEDGERS
            packed = entry.package_entry(DigestType.CRC32C, ledger_id, entry_id, entry_id - 1, 0, payload)
            record = entrylog_format.encode_record(packed)
            out.write(record)
            position += len(record)
            entry_id += 1


def plain_read(path: Path) -> int:
    total = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while chunk := os.read(fd, limits.FILE_READ_CHUNK):
            total += len(chunk)
    finally:
        os.close(fd)
    return total


def journal_summary(path: Path) -> int:
    scan = journal_records(open_journal(path))
    summary = summarize(scan, journal_format.RecordKind, DigestChecker())
    assert scan.stop is not None and not scan.stop.is_error, scan.stop
    assert summary.digest_failures == summary.digest_unverified == 0
    return summary.types["DATA"]


def entry_log_summary(path: Path) -> int:
    scan = entry_log_records(open_entry_log(path))
    summary = summarize(scan, entrylog_format.RecordKind, DigestChecker())
    assert scan.stop is not None and not scan.stop.is_error, scan.stop
    assert summary.digest_failures == summary.digest_unverified == 0
    return summary.types["DATA"]


def measure(name: str, path: Path, run: Callable[[Path], int], records: bool) -> None:
    size_mb = path.stat().st_size / 1e6
    best = float("inf")
    count = 0
    for _ in range(3):
        start = time.perf_counter()
        count = run(path)
        best = min(best, time.perf_counter() - start)
    rate = f"{count / best:>12,.0f} records/s" if records else ""
    print(f"{name:<28} {size_mb:>8.0f} MB {best:>7.2f} s {size_mb / best:>8.0f} MB/s {rate}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mb", type=int, default=1024, help="size of each generated file (MiB)")
    args = parser.parse_args()
    size_bytes = args.size_mb * 1024 * 1024
    DATA_DIR.mkdir(exist_ok=True)
    journal = DATA_DIR / f"bench-{args.size_mb}m.txn"
    log = DATA_DIR / f"bench-{args.size_mb}m.log"
    for path, generate in ((journal, generate_journal), (log, generate_entry_log)):
        if not path.exists() or path.stat().st_size < size_bytes:
            print(f"generating {path} ...", flush=True)
            tmp = path.with_suffix(".tmp")
            generate(tmp, size_bytes)
            tmp.rename(path)
    print(f"{'benchmark (best of 3)':<28} {'size':>11} {'time':>9} {'throughput':>13}")
    measure("plain read, journal", journal, plain_read, records=False)
    measure("journal --summary (CRC32C)", journal, journal_summary, records=True)
    measure("plain read, entry log", log, plain_read, records=False)
    measure("entry log summary (CRC32C)", log, entry_log_summary, records=True)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak_rss_mb:.0f} MB (chunk {limits.FILE_READ_CHUNK // 1024 // 1024} MiB)")


if __name__ == "__main__":
    main()
