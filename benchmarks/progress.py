"""Benchmark: what a progress bar costs the scan it follows (output for people).

`journal inspect --summary` of one generated journal (benchmarks/scan.py's generator, under
benchmarks/data/), run as an operator runs it, alternately with stderr a pipe (no bar: the scan is not
even wrapped) and with stderr a pseudo-terminal (the rich bar, the scan wrapped by progress.tracked),
back to back; the median CPU time of each (user + system of the child, rich's drawing thread included:
less swayed by a loaded machine than wall time), its wall time, and the load average before and after.

    python benchmarks/progress.py               # 256 MiB journal, 5 rounds
    python benchmarks/progress.py --size-mb 64 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import pty
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.scan import DATA_DIR, generate_journal  # noqa: E402


def timed(journal: Path, on_terminal: bool) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one `bkctl journal inspect --summary -o json`, stdout to /dev/null."""
    primary, replica = pty.openpty() if on_terminal else (None, None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "bkctl", "journal", "inspect", str(journal), "--summary", "-o", "json"],
        stdout=subprocess.DEVNULL,
        stderr=replica if on_terminal else subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if replica is not None and primary is not None:
        os.close(replica)
        while True:  # drain the terminal, as a terminal would, until the child closes it
            try:
                if not os.read(primary, 65536):
                    break
            except OSError:
                break
        os.close(primary)
    else:
        assert child.stderr is not None
        child.stderr.read()
    assert child.wait(timeout=600) == 0
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    DATA_DIR.mkdir(exist_ok=True)
    journal = DATA_DIR / f"progress-{args.size_mb}mb.txn"
    if not journal.exists():
        generate_journal(journal, args.size_mb * 1024 * 1024)
    print(f"load before: {os.getloadavg()[0]:.2f}")
    piped, terminal = [], []
    for _ in range(args.rounds):
        piped.append(timed(journal, on_terminal=False))
        terminal.append(timed(journal, on_terminal=True))
    size_mb = journal.stat().st_size / 1e6
    for name, runs in (("stderr a pipe (no bar)", piped), ("stderr a terminal (bar)", terminal)):
        cpu, wall = (statistics.median(t[i] for t in runs) for i in (0, 1))
        print(f"{name}: CPU {cpu:.2f} s ({size_mb / cpu:.0f} MB/s of CPU), wall {wall:.2f} s")
    cost = statistics.median(t[0] for t in terminal) / statistics.median(t[0] for t in piped) - 1
    print(f"bar cost: {cost:+.1%} of the CPU time")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
