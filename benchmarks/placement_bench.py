"""The cost of placement per ledger recovered: 10,000 ledgers on 100 bookies in 10 racks (a rack map
of 10 bookies each), the rack-aware policy (minNumRacksPerWriteQuorum=2 and 3) against the random one.

Pure Python, no cluster: the chooser and the judge are what is timed. A bookie of every ledger's
ensemble "fails" and is replaced (what `bkctl recover` and the workers ask per segment), and every
ledger is judged (what the placement check, `ledger check` and `doctor` ask). The rack source is a dict
lookup, as the Pulsar rack map's cache is after its first read.

    .venv/bin/python benchmarks/placement_bench.py [--ledgers 10000] [--bookies 100] [--racks 10]
"""

from __future__ import annotations

import argparse
import random
import time

from bkctl.client.placement import RACKAWARE, Placement, settings_from_properties

SHAPES = ((3, 2), (3, 3), (5, 3))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledgers", type=int, default=10_000)
    parser.add_argument("--bookies", type=int, default=100)
    parser.add_argument("--racks", type=int, default=10)
    args = parser.parse_args()
    bookies = [f"10.{i // 250}.{i % 250}.1:3181" for i in range(args.bookies)]
    racks = {b: f"/rack{i % args.racks}" for i, b in enumerate(bookies)}

    def locate(names: list[str]) -> dict[str, str | None]:
        return {n: racks.get(n) for n in names}

    print(f"{args.ledgers} ledgers, {args.bookies} bookies in {args.racks} racks")
    print(f"{'policy':<26} {'E/Qw':>5} {'new us':>8} {'replace us':>11} {'judge us':>9} {'adhering':>9}")
    for name, keys in (
        ("random", {}),
        ("rack-aware, 2 racks", {"ensemblePlacementPolicy": RACKAWARE}),
        ("rack-aware, 3 racks", {"ensemblePlacementPolicy": RACKAWARE, "minNumRacksPerWriteQuorum": "3"}),
    ):
        for size, quorum in SHAPES:
            policy = Placement(settings_from_properties(keys), locate, random.Random(1))
            judge = Placement(
                settings_from_properties({"ensemblePlacementPolicy": RACKAWARE, **keys}), locate
            )
            started = time.perf_counter()
            ensembles = [policy.new_ensemble(bookies, size, quorum).bookies for _ in range(args.ledgers)]
            new_s = time.perf_counter() - started
            rng = random.Random(2)
            started = time.perf_counter()
            replaced = []
            for ensemble in ensembles:
                index = rng.randrange(size)
                alive = [b for b in bookies if b != ensemble[index]]
                replaced.append(policy.replace(ensemble, [index], alive, quorum, {ensemble[index]}).bookies)
            replace_s = time.perf_counter() - started
            started = time.perf_counter()
            good = sum(1 for ensemble in replaced if not judge.violations(ensemble, quorum))
            judge_s = time.perf_counter() - started
            per = 1e6 / args.ledgers
            print(
                f"{name:<26} {size}/{quorum:>3} {new_s * per:>8.0f} {replace_s * per:>11.0f} "
                f"{judge_s * per:>9.0f} {good:>9}"
            )


if __name__ == "__main__":
    main()
