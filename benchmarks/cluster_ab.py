"""Paired A/B of two source trees (e.g. two git worktrees) on `bkctl bench write` with 3 bookies.

The machine's speed drifts by ±20% within an hour here, so two versions are only compared in pairs of
runs close in time: per pair each tree gets a fresh 3-bookie cluster running its own code (bookies and
client), order alternating between pairs. Prints each run, the medians per tree and the paired medians
of CPU per add (tree A / tree B) for client + bookies and for the bookies alone.

    git worktree add /tmp/before <rev>
    python benchmarks/cluster_ab.py . /tmp/before --depths 512,64 --pairs 4 --seconds 6
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_write import bench_write, cluster, settle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("tree_a", type=Path)
    parser.add_argument("tree_b", type=Path)
    parser.add_argument("--depths", default="512")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()
    trees = {"A": args.tree_a.resolve(), "B": args.tree_b.resolve()}
    depths = [int(d) for d in args.depths.split(",")]
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for pair in range(args.pairs):
        for name in ("A", "B") if pair % 2 == 0 else ("B", "A"):
            with cluster(trees[name]) as (uri, pids):
                for depth in depths:
                    settle(pids)
                    run = bench_write(uri, depth, args.size, args.seconds, pids, trees[name])
                    runs.setdefault((depth, name), []).append(run)
                    print(name, run, flush=True)
    for depth in depths:
        a, b = runs[(depth, "A")], runs[(depth, "B")]
        for name, rows in (("A", a), ("B", b)):
            print(f"{depth} in flight, {name} ({trees[name]}): {summary(rows)}")
        total = [cpu_per_add(x) / cpu_per_add(y) for x, y in zip(a, b, strict=True)]
        bookies = [x["bookies_us_per_add"] / y["bookies_us_per_add"] for x, y in zip(a, b, strict=True)]
        print(
            f"{depth} in flight: CPU per add A/B, paired median: total {statistics.median(total):.3f}, "
            f"bookies {statistics.median(bookies):.3f}"
        )


def cpu_per_add(run: dict[str, Any]) -> float:
    return float(run["client_us_per_add"] + run["bookies_us_per_add"])


def summary(rows: list[dict[str, Any]]) -> str:
    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in rows))

    return (
        f"{med('adds_per_s'):,.0f} adds/s, p99 {med('p99_ms'):.1f} ms, CPU us per add client "
        f"{med('client_us_per_add'):.1f} / bookies {med('bookies_us_per_add'):.1f}"
    )


if __name__ == "__main__":
    main()
