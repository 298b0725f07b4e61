"""Autorecovery after a kill -9 (docs/commands/autorecovery.md): time to healed, with nothing typed.

3 bookie processes, each with its autorecovery daemon (`bkctl bookie start --autorecovery`, SQLite
metadata or, with `--metadata zk`, a ZooKeeper of its own with tickTime 1 s; session timeout 10 s as
Java's), write LEDGERS closed ledgers (E=3, Qw=2, Qa=2); a spare fourth
bookie (with its daemon) starts; lostBookieRecoveryDelay is 0; one of the three is killed -9. Measured
from this process, polling the metadata every 50 ms: kill -> first under-replication mark -> healed (no
mark left and no ensemble naming the dead bookie).

    python benchmarks/autorecovery.py                        # 64 KiB and 1 KiB entries, 20 ledgers
    python benchmarks/autorecovery.py --metadata zk          # the same on ZooKeeper
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.recover import bkctl, main_of, write_ledgers  # noqa: E402
from bkctl.commands.sandbox_procs import BookieChild, start_children, stop_children  # noqa: E402
from bkctl.metadata.layout import Layout  # noqa: E402
from bkctl.metadata.stores import open_store  # noqa: E402
from bkctl.metadata.zk_server import ZooKeeperServer  # noqa: E402

DAEMON = ("--autorecovery",)
LIMIT_S = 600.0


def state(layout: Layout, dead: str) -> tuple[int, int]:
    """(marks, ledgers whose ensembles name the dead bookie)."""
    marks = sum(1 for _ in layout.underreplicated_ids())
    named = sum(
        1
        for _, md in layout.read_ledgers(layout.ledger_ids())
        if any(dead in segment.ensemble for segment in md.segments)
    )
    return marks, named


ZK_TICK_MS = 1000  # sessions of 2-20 s: the bookies' 10 s is granted as asked


@contextmanager
def metadata_uri(kind: str, root: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite://{root / 'metadata.db'}"
        return
    with ZooKeeperServer(tick_ms=ZK_TICK_MS) as server:
        yield server.hosts


def run(size: int, ledgers: int, total_mb: float, metadata: str = "sqlite") -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(dir=REPO / "benchmarks") as tmp,
        metadata_uri(metadata, Path(tmp)) as uri,
    ):
        root = Path(tmp)
        with open_store(uri) as store:
            Layout(store).init_cluster()
            Layout(store).set_lost_bookie_recovery_delay(0)
        children, ids = start_children(root, uri, 3, 0, DAEMON)
        try:
            write_ledgers(uri, ledgers, size, total_mb)
            spare = BookieChild(root / "bookie-spare", 0, uri, DAEMON)
            children.append(spare)
            spare.wait_serving(time.monotonic() + 30)
            with open_store(uri) as store:
                layout = Layout(store)
                killed = time.monotonic()
                children[0].proc.send_signal(signal.SIGKILL)
                first_mark = None
                while time.monotonic() - killed < LIMIT_S:
                    marks, named = state(layout, ids[0])
                    if marks and first_mark is None:
                        first_mark = time.monotonic()
                    if not marks and not named:
                        break
                    time.sleep(0.05)
                healed = time.monotonic()
            time.sleep(2.5)  # the daemons publish their status every 2 s
            status = json.loads(bkctl(uri, "autorecovery", "status", "-o", "json").stdout)
        finally:
            stop_children(children)
    copied = sum(d.get("bytes_copied", 0) for d in status["daemons"])
    mark_to_healed = healed - (first_mark or healed)
    return {
        "metadata": metadata,
        "entry_size": size,
        "ledgers": ledgers,
        "mb_copied": round(copied / 1e6, 1),
        "kill_to_healed_s": round(healed - killed, 2),
        "mark_to_healed_s": round(mark_to_healed, 2),
        "mb_per_s_after_mark": round(copied / 1e6 / mark_to_healed, 1) if mark_to_healed > 0 else None,
    }


def main() -> None:
    # --metadata is ours; the rest is the command line shared with benchmarks/recover.py.
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--metadata", choices=("sqlite", "zk"), default="sqlite")
    known, sys.argv[1:] = parser.parse_known_args()
    main_of(lambda size, ledgers, total_mb: run(size, ledgers, total_mb, known.metadata), __doc__ or "")


if __name__ == "__main__":
    main()
