"""BookKeeper layout operations on both store backends: ledger create (id + metadata) and listing.

    python benchmarks/layout_ops.py                   # both backends, 100,000 ledgers listed
    python benchmarks/layout_ops.py --markdown        # also print rows for benchmarks/RESULTS.md
    python benchmarks/layout_ops.py --backend zookeeper --ledgers 20000

"create" is `Layout.create_ledger` as a client does it: an id from the ephemeral-sequential
`idgen/ID-` node (create + delete), then the v3 metadata node; one thread, then 16 threads sharing one
store (kazoo pipelines their requests on one connection; SQLite serializes them). "list" fills the
store to `--ledgers` ledgers (multi of 1000 creates of real metadata), then walks them with
`Layout.ledger_ids()`, reads and decodes every ledger's metadata with `Layout.read_ledgers()` (what
`ledger list --bookie` does: `store.get_many` batches, multiRead on ZooKeeper; the bare
`store.get_many` of every path is timed too), and runs `bkctl ledger list -o plain` end to end in a
subprocess (interpreter start-up included). ZooKeeper: a throwaway Debian ZooKeeper
(bkctl.metadata.zk_server, forceSync off); SQLite: a fresh file (WAL, synchronous=NORMAL).
Every loop is bounded by its count.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from bkctl.metadata.store import CreateOp, MetadataStore
from bkctl.metadata.zk_server import ZooKeeperServer
from bkctl.metadata.zookeeper import ZooKeeperStore
from bkctl.model import DigestType, LedgerMetadata, Segment
from bkctl.protocol.metadata_format import encode_ledger_metadata

BATCH = 1000
THREADS = 16
METADATA = LedgerMetadata(
    ensemble_size=3,
    write_quorum=2,
    ack_quorum=2,
    segments=(Segment(0, ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")),),
    digest=DigestType.CRC32C,
    password=b"secret",
    c_token=1,
)


def timed(func: Callable[[], object]) -> float:
    started = time.perf_counter()
    func()
    return time.perf_counter() - started


def bench_create(layout: Layout, count: int, threads: int) -> float:
    def run() -> None:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda _: layout.create_ledger(METADATA), range(count)))

    return timed(run)


def fill(layout: Layout, first_id: int, total: int) -> None:
    data = encode_ledger_metadata(METADATA)
    for start in range(first_id, total, BATCH):
        ids = range(start, min(start + BATCH, total))
        parents = {layout.ledger_path(i).rsplit("/", 1)[0] for i in ids}
        for parent in sorted(parents):
            layout.store.ensure_path(parent)
        layout.store.multi([CreateOp(layout.ledger_path(i), data) for i in ids])


def bench_cli_list(uri: str, expected: int) -> float:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "bkctl", "ledger", "list", "-o", "plain", "--metadata", uri],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    elapsed = time.perf_counter() - started
    assert result.stdout.count("\n") == expected, "bkctl ledger list missed ledgers"
    return elapsed


@contextmanager
def backend(name: str) -> Iterator[tuple[MetadataStore, str]]:
    if name == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "metadata.db"
            with SqliteStore(path) as store:
                yield store, f"sqlite://{path}"
        return
    with ZooKeeperServer(heap_mb=1024) as server, ZooKeeperStore(server.hosts) as store:
        yield store, server.hosts


def run(name: str, creates: int, ledgers: int) -> list[tuple[str, str, str, str]]:
    rows = []
    with backend(name) as (store, uri):
        layout = Layout(store)
        layout.init_cluster()
        for threads in (1, THREADS):
            elapsed = bench_create(layout, creates, threads)
            what = f"ledger create (id + metadata), {creates:,}, {threads} thread{'s' * (threads > 1)}"
            rows.append((name, what, f"{creates / elapsed:,.0f}/s", f"{elapsed:.2f} s"))
        made = 2 * creates
        fill(layout, made, ledgers)
        ids: list[int] = []
        elapsed = timed(lambda: ids.extend(layout.ledger_ids()))
        assert len(ids) == ledgers, f"walk found {len(ids)} of {ledgers}"
        rows.append(
            (
                name,
                f"Layout.ledger_ids(), {ledgers:,} ledgers",
                f"{ledgers / elapsed:,.0f}/s",
                f"{elapsed:.2f} s",
            )
        )
        paths = [layout.ledger_path(i) for i in ids]
        nodes: list[object] = []
        elapsed = timed(lambda: nodes.extend(store.get_many(paths)))
        assert len(nodes) == ledgers and None not in nodes
        rate = f"{ledgers / elapsed:,.0f}/s"
        rows.append((name, f"store.get_many() (bytes only), {ledgers:,}", rate, f"{elapsed:.2f} s"))
        found: list[object] = []
        elapsed = timed(lambda: found.extend(layout.read_ledgers(ids)))
        assert len(found) == ledgers
        rate = f"{ledgers / elapsed:,.0f}/s"
        rows.append((name, f"Layout.read_ledgers() (all metadata), {ledgers:,}", rate, f"{elapsed:.2f} s"))
        elapsed = bench_cli_list(uri, ledgers)
        rows.append(
            (
                name,
                f"`bkctl ledger list`, {ledgers:,} ledgers",
                f"{ledgers / elapsed:,.0f}/s",
                f"{elapsed:.2f} s",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=("sqlite", "zookeeper", "both"), default="both")
    parser.add_argument("--creates", type=int, default=2000)
    parser.add_argument("--ledgers", type=int, default=100_000)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    names = ("sqlite", "zookeeper") if args.backend == "both" else (args.backend,)
    rows = [row for name in names for row in run(name, args.creates, max(args.ledgers, 2 * args.creates))]
    for row in rows:
        print("  ".join(row))
    if args.markdown:
        print("\n| backend | operation | rate | time |\n|---|---|---:|---:|")
        for row in rows:
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
