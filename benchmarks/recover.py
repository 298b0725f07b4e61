"""`bkctl recover` after a kill -9 (docs/commands/recover.md), with the CPU of every process involved.

3 bookie processes (SQLite metadata, data in a temporary directory) write LEDGERS closed ledgers
(E=3, Qw=2, Qa=2) with `bkctl ledger write`; a spare fourth bookie starts; one of the three is killed -9;
once its registration is gone, `bkctl recover <metadata> <dead> -o json` runs in its own process. Wall
time is from the command's start to its exit. CPU seconds: the recover process, and the surviving
bookies together, over the same interval.

    python benchmarks/recover.py                          # 64 KiB and 1 KiB entries, 20 ledgers
    python benchmarks/recover.py --sizes 1024 --ledgers 200 --mb 130
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.cluster_write import cpu_s  # noqa: E402
from bkctl.commands.sandbox_procs import BookieChild, start_children, stop_children  # noqa: E402
from bkctl.metadata.layout import Layout  # noqa: E402
from bkctl.metadata.stores import open_store  # noqa: E402

BKCTL = [sys.executable, "-m", "bkctl"]


def bkctl(uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BKCTL_METADATA": uri}
    return subprocess.run([*BKCTL, *args], capture_output=True, text=True, env=env, cwd=REPO, check=False)


def write_ledgers(uri: str, ledgers: int, size: int, total_mb: float) -> None:
    """`ledgers` closed ledgers (E3/Qw2/Qa2) of `size`-byte entries, `total_mb` MB in all."""
    entries = max(1, int(total_mb * 1e6 / size / ledgers))
    for _ in range(ledgers):
        done = bkctl(uri, "ledger", "write", "--entries", str(entries), "--size", str(size), "-o", "json")
        assert done.returncode == 0, done.stderr


def registered(uri: str) -> list[str]:
    with open_store(uri) as store:
        return Layout(store).bookies()


def run(size: int, ledgers: int, total_mb: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=REPO / "benchmarks") as tmp:
        root = Path(tmp)
        uri = f"sqlite://{root / 'metadata.db'}"
        with open_store(uri) as store:
            Layout(store).init_cluster()
        children, ids = start_children(root, uri, 3, 0)
        try:
            write_ledgers(uri, ledgers, size, total_mb)
            spare = BookieChild(root / "bookie-spare", 0, uri)
            children.append(spare)
            spare.wait_serving(time.monotonic() + 30)
            dead = children[0]
            dead.proc.send_signal(signal.SIGKILL)
            dead.proc.wait()
            while ids[0] in registered(uri):  # its session expires (10 s)
                time.sleep(0.2)
            survivors = [c.proc.pid for c in children[1:]]
            before = sum(cpu_s(pid) for pid in survivors)
            started = time.monotonic()
            proc = subprocess.Popen(
                [*BKCTL, "recover", uri, ids[0], "-o", "json"], stdout=subprocess.PIPE, text=True, cwd=REPO
            )
            usage = os.wait4(proc.pid, 0)[2]
            seconds = time.monotonic() - started
            assert proc.stdout is not None
            report = json.loads(proc.stdout.read())
            bookies_cpu = sum(cpu_s(pid) for pid in survivors) - before
        finally:
            stop_children(children)
    copied = report["bytes_copied"]
    return {
        "entry_size": size,
        "ledgers": ledgers,
        "entries_copied": report["entries_copied"],
        "mb_copied": round(copied / 1e6, 1),
        "seconds": round(seconds, 2),
        "mb_per_s": round(copied / 1e6 / seconds, 1),
        "entries_per_s": round(report["entries_copied"] / seconds),
        "recover_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "bookies_cpu_s": round(bookies_cpu, 2),
        "unrecoverable": len(report["ledgers_unrecoverable"]),
    }


def main_of(run_one: Callable[[int, int, float], dict[str, Any]], doc: str) -> None:
    """The command line of this benchmark and of autorecovery.py: one JSON line per entry size."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default="65536,1024", help="entry sizes, comma-separated")
    parser.add_argument("--ledgers", type=int, default=20)
    parser.add_argument("--mb", type=float, default=0, help="MB written in all (default: as Java's run)")
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        # Java's run: 716 MB copied at 64 KiB, 133 MB at 1 KiB; written = copied * 3 / 2 (Qw 2 of E 3).
        total = args.mb or (1074 if size >= 65536 else 200)
        print(json.dumps(run_one(size, args.ledgers, total)), flush=True)


def main() -> None:
    main_of(run, __doc__ or "")


if __name__ == "__main__":
    main()
