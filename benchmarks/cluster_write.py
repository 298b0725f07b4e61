"""`bkctl bench write` against 3 bookie processes, as an operator would run it, with CPU accounting.

Starts 3 `bkctl bookie start` processes (the sandbox's `--processes` layout and the bookie's default
configuration, SQLite metadata, journals and ledgers in a temporary directory on the local disk, fsync
on), then runs `bkctl bench write -E 3 -Qw 2 -Qa 2 --entry-size S --outstanding D -o json` in its own
process, ROUNDS times per depth, interleaved, each once the bookies are idle again (the checkpoint
of the previous run done). For each run: adds/s, p50/p99, and CPU microseconds per acknowledged add of
the client process and of the three bookies together (from /proc). Prints one JSON line per run, then
a markdown table of medians. With --single, `benchmarks/bookie_add.py` runs after it in the same
session for the single-bookie figures of the same sizes and depths.

    python benchmarks/cluster_write.py                       # 512 and 64 in flight, 3 rounds, 10 s
    python benchmarks/cluster_write.py --depths 512 --rounds 1 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bkctl.commands.sandbox_procs import start_children, stop_children  # noqa: E402
from bkctl.metadata.layout import Layout  # noqa: E402
from bkctl.metadata.stores import open_store  # noqa: E402

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def settle(bookie_pids: list[int], limit_s: float = 30.0) -> None:
    """Wait (bounded) until the bookies are idle: a checkpoint left by the previous run (hundreds of MB
    of entry logs to write and fsync) would otherwise be measured as part of the next run."""
    deadline = time.monotonic() + limit_s
    used = sum(cpu_s(pid) for pid in bookie_pids)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = sum(cpu_s(pid) for pid in bookie_pids)
        if now - used < 0.05:
            return
        used = now


@contextmanager
def cluster(tree: Path = REPO) -> Iterator[tuple[str, list[int]]]:
    """3 bookie processes running `tree`'s code (SQLite metadata, data on the local disk): (uri, pids).

    `python -m bkctl` puts its cwd first on sys.path, so the children start from `tree` as their cwd.
    """
    data = REPO / "benchmarks" / "data"  # on the local disk, like the other benchmarks (not tmpfs)
    data.mkdir(exist_ok=True)
    cwd, pythonpath = os.getcwd(), os.environ.get("PYTHONPATH")
    with tempfile.TemporaryDirectory(prefix="bkctl-cluster-write-", dir=data) as tmp:
        root = Path(tmp)
        uri = f"sqlite://{root / 'metadata.db'}"
        with open_store(uri) as store:
            Layout(store).init_cluster()
        os.chdir(tree)
        os.environ["PYTHONPATH"] = str(tree)
        try:
            children, _ = start_children(root, uri, 3, 0)
        finally:
            os.chdir(cwd)
            if pythonpath is None:
                os.environ.pop("PYTHONPATH")
            else:
                os.environ["PYTHONPATH"] = pythonpath
        try:
            yield uri, [child.proc.pid for child in children]
        finally:
            stop_children(children)


def bench_write(
    uri: str, depth: int, size: int, seconds: float, bookie_pids: list[int], tree: Path = REPO
) -> dict[str, Any]:
    command = [sys.executable, "-m", "bkctl", "bench", "write", "-o", "json", "-E", "3", "-Qw", "2"]
    command += ["-Qa", "2", "--entry-size", str(size), "-D", str(depth), "--duration", str(seconds)]
    before = sum(cpu_s(pid) for pid in bookie_pids)
    children_before = os.times()
    env = {**os.environ, "BKCTL_METADATA": uri, "PYTHONPATH": str(tree)}
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=True)
    children_after = os.times()
    bookies_s = sum(cpu_s(pid) for pid in bookie_pids) - before
    client_s = (children_after.children_user - children_before.children_user) + (
        children_after.children_system - children_before.children_system
    )
    result = json.loads(done.stdout)
    # Every add of the run, warm-up included, costs CPU: count them all from the measured rate.
    adds = result["ops_per_s"] * seconds
    return {
        "outstanding": depth,
        "adds_per_s": result["ops_per_s"],
        "p50_ms": result["latency_ms"]["p50"],
        "p99_ms": result["latency_ms"]["p99"],
        "client_us_per_add": round(client_s / adds * 1e6, 1),
        "bookies_us_per_add": round(bookies_s / adds * 1e6, 1),
        "errors": result["errors"],
    }


def table(runs: list[dict[str, Any]], depths: list[int]) -> str:
    lines = [
        "| in flight | adds/s (runs) | median adds/s | median p50 / p99 ms "
        "| CPU us per add: client / 3 bookies |",
        "|---|---|---:|---|---|",
    ]
    for depth in depths:
        mine = [r for r in runs if r["outstanding"] == depth]
        rates = " / ".join(f"{r['adds_per_s']:,.0f}" for r in mine)

        def m(key: str, rows: list[dict[str, Any]] = mine) -> float:
            return float(statistics.median(r[key] for r in rows))

        lines.append(
            f"| {depth} | {rates} | **{m('adds_per_s'):,.0f}** | {m('p50_ms'):.1f} / {m('p99_ms'):.1f} | "
            f"{m('client_us_per_add'):.1f} / {m('bookies_us_per_add'):.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--depths", default="512,64")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--single", action="store_true", help="then run bookie_add.py for one bookie")
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    runs: list[dict[str, Any]] = []
    with cluster() as (uri, pids):
        for _ in range(args.rounds):
            for depth in depths:
                settle(pids)
                run = bench_write(uri, depth, args.size, args.seconds, pids)
                print(json.dumps(run), flush=True)
                runs.append(run)
    print(table(runs, depths))
    if args.single:
        single = [sys.executable, str(REPO / "benchmarks" / "bookie_add.py"), "--seconds", "5"]
        single += ["--depths", args.depths, "--sizes", str(args.size)]
        subprocess.run(single, cwd=REPO, check=True)


if __name__ == "__main__":
    main()
