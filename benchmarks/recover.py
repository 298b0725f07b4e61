"""`bkctl recover` after a kill -9 (docs/commands/recover.md), with the CPU of every process involved.

3 bookie processes (SQLite metadata, data in a temporary directory) write LEDGERS closed ledgers
(E=3, Qw=2, Qa=2) with `bkctl ledger write`; a spare fourth bookie starts; one of the three is killed -9;
once its registration is gone, `bkctl recover <metadata> <dead> -o json` runs in its own process. Wall
time is from the command's start to its exit. CPU seconds: the recover process, and the surviving
bookies together, over the same interval.

    python benchmarks/recover.py                          # 64 KiB and 1 KiB entries, 20 ledgers
    python benchmarks/recover.py --sizes 1024 --ledgers 200 --mb 130
    python benchmarks/recover.py --entry-size 1024 --ledgers 10000 --entries 20 --bookies 4 \
        --metadata zk --parallel 32
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.cluster_write import cpu_s  # noqa: E402
from bkctl.commands.sandbox_procs import BookieChild, stop_children  # noqa: E402
from bkctl.metadata.layout import Layout  # noqa: E402
from bkctl.metadata.stores import open_store  # noqa: E402
from bkctl.metadata.zk_server import ZooKeeperServer, four_letter_word  # noqa: E402

BKCTL = [sys.executable, "-m", "bkctl"]


def bkctl(uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BKCTL_METADATA": uri}
    return subprocess.run([*BKCTL, *args], capture_output=True, text=True, env=env, cwd=REPO, check=False)


@dataclass(frozen=True)
class Shape:
    """What a run writes: `ledgers` closed ledgers (E3/Qw2/Qa2) of `entry_size`-byte entries, either
    `entries` each (written many at once by ledger_fill.py) or `total_mb` MB in all (one `bkctl ledger
    write` per ledger, as the first runs); on `bookies` bookies, one of which is killed."""

    entry_size: int
    ledgers: int
    total_mb: float
    entries: int | None = None
    bookies: int = 3
    metadata: str = "sqlite"  # or "zk"


def write_ledgers(uri: str, shape: Shape) -> dict[str, Any]:
    """Writes the shape's ledgers; ledger_fill.py's report (with its seconds) when it wrote them."""
    if shape.entries is not None:
        fill = [sys.executable, str(REPO / "benchmarks" / "ledger_fill.py"), uri]
        sizes = ["--ledgers", str(shape.ledgers), "--entries", str(shape.entries)]
        sizes += ["--entry-size", str(shape.entry_size)]
        done = subprocess.run([*fill, *sizes], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        return report
    entries = max(1, int(shape.total_mb * 1e6 / shape.entry_size / shape.ledgers))
    for _ in range(shape.ledgers):
        size = str(shape.entry_size)
        done = bkctl(uri, "ledger", "write", "--entries", str(entries), "--size", size, "-o", "json")
        assert done.returncode == 0, done.stderr
    return {}


START_S = 180.0  # a bookie starting on a machine at load 40 (sandbox_procs' 30 s is short)


def start_bookies(
    root: Path, uri: str, count: int, extra: tuple[str, ...] = ()
) -> tuple[list[BookieChild], list[str]]:
    children = [BookieChild(root / f"bookie-{n}", 0, uri, extra) for n in range(1, count + 1)]
    try:
        return children, [child.wait_serving(time.monotonic() + START_S) for child in children]
    except BaseException:
        stop_children(children)
        raise


def registered(uri: str) -> list[str]:
    with open_store(uri) as store:
        return Layout(store).bookies()


ZK_TICK_MS = 1000  # sessions of 2-20 s: the bookies' 10 s is granted as asked


@contextmanager
def metadata_uri(kind: str, root: Path) -> Iterator[tuple[str, ZooKeeperServer | None]]:
    """The run's metadata store: a SQLite file, or a ZooKeeper of its own (its requests counted)."""
    if kind == "sqlite":
        yield f"sqlite://{root / 'metadata.db'}", None
        return
    with ZooKeeperServer(tick_ms=ZK_TICK_MS) as server:
        yield server.hosts, server


def zk_requests(server: ZooKeeperServer | None) -> int:
    """Requests ZooKeeper received so far (`srvr`'s Received: pings included, a few per session per
    10 s); 0 without one."""
    if server is None:
        return 0
    found = re.search(r"Received: (\d+)", four_letter_word(server.port, "srvr"))
    return int(found.group(1)) if found else 0


def run(shape: Shape, parallel: int = 4) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(dir="/tmp", prefix="bkctl-recover-") as tmp,
        metadata_uri(shape.metadata, Path(tmp)) as (uri, zk),
    ):
        root = Path(tmp)
        with open_store(uri) as store:
            Layout(store).init_cluster()
        children, ids = start_bookies(root, uri, shape.bookies)
        try:
            written = write_ledgers(uri, shape)
            spare = BookieChild(root / "bookie-spare", 0, uri)
            children.append(spare)
            spare.wait_serving(time.monotonic() + START_S)
            dead = children[0]
            dead.proc.send_signal(signal.SIGKILL)
            dead.proc.wait()
            while ids[0] in registered(uri):  # its session expires (10 s)
                time.sleep(0.2)
            survivors = [c.proc.pid for c in children[1:]]
            before = sum(cpu_s(pid) for pid in survivors)
            started, requests = time.monotonic(), zk_requests(zk)
            proc = subprocess.Popen(
                [*BKCTL, "recover", uri, ids[0], "--parallel", str(parallel), "-o", "json"],
                stdout=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            usage = os.wait4(proc.pid, 0)[2]
            seconds = time.monotonic() - started
            assert proc.stdout is not None
            report = json.loads(proc.stdout.read())
            bookies_cpu = sum(cpu_s(pid) for pid in survivors) - before
            requests = zk_requests(zk) - requests
        finally:
            stop_children(children)
    copied = report["bytes_copied"]
    return {
        "entry_size": shape.entry_size,
        "ledgers": shape.ledgers,
        "bookies": shape.bookies,
        "write_s": written.get("seconds"),
        "entries_copied": report["entries_copied"],
        "mb_copied": round(copied / 1e6, 1),
        "seconds": round(seconds, 2),
        "mb_per_s": round(copied / 1e6 / seconds, 1),
        "entries_per_s": round(report["entries_copied"] / seconds),
        "recover_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "bookies_cpu_s": round(bookies_cpu, 2),
        "unrecoverable": len(report["ledgers_unrecoverable"]),
        "metadata": shape.metadata,
        "zk_requests_per_ledger": round(requests / max(1, report["ledgers_total"]), 1) if zk else None,
    }


def main_of(run_one: Callable[[Shape], dict[str, Any]], doc: str) -> None:
    """The command line of this benchmark and of autorecovery.py: one JSON line per entry size."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default="65536,1024", help="entry sizes, comma-separated")
    parser.add_argument("--entry-size", type=int, help="one entry size (instead of --sizes)")
    parser.add_argument("--ledgers", type=int, default=20)
    parser.add_argument("--entries", type=int, help="entries per ledger (else from --mb)")
    parser.add_argument("--bookies", type=int, default=3, help="bookies holding the data (a spare joins)")
    parser.add_argument("--mb", type=float, default=0, help="MB written in all (default: as Java's run)")
    parser.add_argument("--metadata", choices=("sqlite", "zk"), default="sqlite")
    args = parser.parse_args()
    sizes = [args.entry_size] if args.entry_size else [int(s) for s in args.sizes.split(",")]
    for size in sizes:
        # Java's run: 716 MB copied at 64 KiB, 133 MB at 1 KiB; written = copied * 3 / 2 (Qw 2 of E 3).
        total = args.mb or (1074 if size >= 65536 else 200)
        shape = Shape(size, args.ledgers, total, args.entries, args.bookies, args.metadata)
        result = run_one(shape) | {"load": os.getloadavg()[0]}
        print(json.dumps(result), flush=True)


def main() -> None:
    # --parallel is ours (recover's); the rest is the command line shared with autorecovery.py.
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--parallel", type=int, default=4, help="recover --parallel")
    known, sys.argv[1:] = parser.parse_known_args()
    main_of(lambda shape: run(shape, known.parallel) | {"parallel": known.parallel}, __doc__ or "")


if __name__ == "__main__":
    main()
