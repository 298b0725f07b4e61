"""Metadata operations per second on both store backends: ledger creates, CAS updates, listing ledgers.

    python benchmarks/metadata_ops.py                 # both backends, default sizes
    python benchmarks/metadata_ops.py --markdown      # also print a section for benchmarks/RESULTS.md
    python benchmarks/metadata_ops.py --backend sqlite --ledgers 10000

ZooKeeper is a throwaway Debian ZooKeeper 3.8 started for the run (bkctl.metadata.zk_server, forceSync
off as in the tests); SQLite is a fresh file in a temporary directory (WAL, synchronous=NORMAL).
Every loop is bounded by its count; the whole run takes well under a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bkctl.metadata.sqlite import SqliteStore
from bkctl.metadata.store import CreateOp, MetadataStore
from bkctl.metadata.zk_server import ZOOKEEPER_JAR, ZooKeeperServer
from bkctl.metadata.zookeeper import ZooKeeperStore

# About the size of a v3 ledger metadata value for a 3-bookie ensemble with one segment.
LEDGER_VALUE = b"BookieMetadataFormatVersion\t3\n" + bytes(range(200))
BATCH = 1000  # creates per multi when filling the store for the listing


def hierarchical_path(ledger_id: int) -> str:
    """BookKeeper's hierarchical layout: %010d split 2-4-4 (bkctl.metadata.layout will own this)."""
    digits = f"{ledger_id:010d}"
    return f"/ledgers/{digits[:2]}/{digits[2:6]}/L{digits[6:]}"


def rate(count: int, func: Callable[[], None]) -> tuple[float, float]:
    started = time.perf_counter()
    func()
    elapsed = time.perf_counter() - started
    return count / elapsed, elapsed


def bench_creates(store: MetadataStore, count: int) -> tuple[float, float]:
    def run() -> None:
        for ledger_id in range(1, count + 1):
            store.create(hierarchical_path(ledger_id), LEDGER_VALUE, make_parents=True)

    return rate(count, run)


def bench_cas(store: MetadataStore, count: int) -> tuple[float, float]:
    store.create("/cas", b"0")

    def run() -> None:
        version = 0
        for i in range(count):
            # A writer keeps the version of its last write, as BookKeeper's client does.
            version = store.set("/cas", LEDGER_VALUE + i.to_bytes(4, "big"), version).version

    return rate(count, run)


def fill(store: MetadataStore, first_id: int, count: int) -> tuple[float, float]:
    """Create `count` ledgers under the hierarchical layout in multis of BATCH creates."""
    parents = sorted({hierarchical_path(i).rsplit("/", 1)[0] for i in range(first_id, first_id + count)})
    for parent in parents:
        store.ensure_path(parent)

    def run() -> None:
        for start in range(first_id, first_id + count, BATCH):
            end = min(start + BATCH, first_id + count)
            store.multi([CreateOp(hierarchical_path(i), LEDGER_VALUE) for i in range(start, end)])

    return rate(count, run)


def list_ledgers(store: MetadataStore, root: str = "/ledgers") -> Iterator[int]:
    """Every ledger id under a hierarchical root: the walk `bkctl ledger list` will do."""
    for top in store.children(root):
        for middle in store.children(f"{root}/{top}"):
            for leaf in store.children(f"{root}/{top}/{middle}"):
                if leaf.startswith("L"):
                    yield int(top + middle + leaf[1:])


def bench_list(store: MetadataStore, expected: int) -> tuple[float, float]:
    found: list[int] = []
    result = rate(expected, lambda: found.extend(list_ledgers(store)))
    if len(found) != expected:
        raise SystemExit(f"listed {len(found)} ledgers, expected {expected}")
    return result


def bench_flat_list(store: MetadataStore, count: int) -> tuple[float, float] | str:
    """All `count` ledgers as children of one node (the flat layout): one children() call."""
    store.create("/flat")
    for start in range(0, count, BATCH):
        store.multi([CreateOp(f"/flat/L{i:010d}") for i in range(start, min(start + BATCH, count))])
    try:
        names: list[str] = []
        result = rate(count, lambda: names.extend(store.children("/flat")))
    except Exception as exc:  # report, do not hide: ZooKeeper may refuse a reply this large
        return f"failed: {type(exc).__name__}: {exc}"
    return result if len(names) == count else f"failed: {len(names)} names"


def run_backend(name: str, store: MetadataStore, args: argparse.Namespace) -> list[tuple[str, str, str]]:
    rows = []
    per_s, secs = bench_creates(store, args.creates)
    rows.append((f"ledger create (sync, make_parents), {args.creates:,}", f"{per_s:,.0f}/s", f"{secs:.2f} s"))
    per_s, secs = bench_cas(store, args.cas)
    rows.append((f"CAS update (set with version), {args.cas:,}", f"{per_s:,.0f}/s", f"{secs:.2f} s"))
    remaining = args.ledgers - args.creates
    per_s, secs = fill(store, args.creates + 1, remaining)
    rows.append((f"bulk ledger create (multi of {BATCH}), {remaining:,}", f"{per_s:,.0f}/s", f"{secs:.2f} s"))
    per_s, secs = bench_list(store, args.ledgers)
    rows.append((f"list {args.ledgers:,} ledgers (hierarchical walk)", f"{per_s:,.0f}/s", f"{secs:.2f} s"))
    flat = bench_flat_list(store, args.ledgers)
    if isinstance(flat, str):
        rows.append((f"list {args.ledgers:,} children of one node", flat, "-"))
    else:
        rows.append((f"list {args.ledgers:,} children of one node", f"{flat[0]:,.0f}/s", f"{flat[1]:.2f} s"))
    for row in rows:
        print(f"{name:10} {row[0]:48} {row[1]:>14} {row[2]:>9}", file=sys.stderr)
    return [(name, *row) for row in rows]


@contextmanager
def zookeeper_store() -> Iterator[MetadataStore]:
    with ZooKeeperServer(heap_mb=1024) as server, ZooKeeperStore(server.hosts) as store:
        yield store


@contextmanager
def sqlite_store() -> Iterator[MetadataStore]:
    with (
        tempfile.TemporaryDirectory(prefix="bkctl-bench-") as directory,
        SqliteStore(Path(directory) / "metadata.db") as store,
    ):
        yield store


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # Debian links zookeeper-<version>.jar to zookeeper.jar: the version is in the link's name.
    versions = sorted(
        p.name[len("zookeeper-") : -len(".jar")] for p in ZOOKEEPER_JAR.parent.glob("zookeeper-[0-9]*.jar")
    )
    zk = versions[-1] if versions else "unknown"
    return (
        f"{os.cpu_count()} cores ({cpu}), load average {os.getloadavg()[0]:.1f} at start, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, ZooKeeper {zk}"
    )


def markdown(rows: list[tuple[str, str, str, str]], args: argparse.Namespace, info: str) -> str:
    lines = [
        "## Metadata store operations (benchmarks/metadata_ops.py)",
        "",
        f"Command: `python benchmarks/metadata_ops.py --creates {args.creates} --cas {args.cas} "
        f"--ledgers {args.ledgers} --markdown`  ",
        f"Date: {datetime.date.today().isoformat()}  ",
        f"Machine: {info}",
        "",
        "| backend | operation | rate | time |",
        "|---|---|---:|---:|",
        *[f"| {b} | {op} | {r} | {t} |" for b, op, r, t in rows],
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=["sqlite", "zookeeper", "both"], default="both")
    parser.add_argument("--creates", type=int, default=2000, help="ledgers created one by one")
    parser.add_argument("--cas", type=int, default=5000, help="CAS updates")
    parser.add_argument("--ledgers", type=int, default=100_000, help="ledgers in the store for the listing")
    parser.add_argument("--markdown", action="store_true", help="print a RESULTS.md section on stdout")
    args = parser.parse_args()
    if not 0 < args.creates <= args.ledgers <= 1_000_000 or not 0 < args.cas <= 1_000_000:
        parser.error("need 0 < creates <= ledgers <= 1,000,000 and 0 < cas <= 1,000,000")
    info = machine()
    print(info, file=sys.stderr)
    rows: list[tuple[str, str, str, str]] = []
    backends = ["sqlite", "zookeeper"] if args.backend == "both" else [args.backend]
    for name in backends:
        with sqlite_store() if name == "sqlite" else zookeeper_store() as store:
            rows.extend(run_backend(name, store, args))
    if args.markdown:
        print(markdown(rows, args, info))


if __name__ == "__main__":
    main()
