"""Autorecovery after a kill -9 (docs/commands/autorecovery.md): time to healed, with nothing typed.

BOOKIES bookie processes, each with its autorecovery daemon (`bkctl bookie start --autorecovery`,
SQLite metadata or, with `--metadata zk`, a ZooKeeper of its own with tickTime 1 s; session timeout
10 s as Java's), write LEDGERS closed ledgers (E=3, Qw=2, Qa=2); a spare bookie (with its daemon)
starts; lostBookieRecoveryDelay is 0; one of them is killed -9. Measured from this process, polling the
under-replication tree's root every 50 ms (one request): kill -> first mark -> healed (no mark left,
then no ensemble naming the dead bookie). With ZooKeeper, its requests from the kill to healed (its
`srvr` count, less this process's own polls) per ledger that named the dead bookie. `--stack java`:
the same with Java BookKeeper 4.14.8 bookies (autoRecoveryDaemonEnabled; $BKJAVA, default /tmp/bkjava),
the same ledgers written by bkctl's client.

    python benchmarks/autorecovery.py                        # 64 KiB and 1 KiB entries, 20 ledgers
    python benchmarks/autorecovery.py --metadata zk          # the same on ZooKeeper
    python benchmarks/autorecovery.py --metadata zk --entry-size 1024 --ledgers 2000 --entries 30
    python benchmarks/autorecovery.py --metadata zk --entry-size 1024 --ledgers 2000 --entries 30 --stack java
    python benchmarks/autorecovery.py --metadata zk --entry-size 65536 --ledgers 40 --entries 100 --rate 5M
    python benchmarks/autorecovery.py --metadata zk --entry-size 1024 --ledgers 10000 --entries 20 \
        --bookies 4 --stack java --limit 600    # gives up 600 s after the kill: the rate reached

`--limit S` stops waiting S seconds after the kill (default 900); the run then reports the ledgers
still naming the dead bookie, and the rate over those healed.
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.cluster_write import cpu_s  # noqa: E402
from benchmarks.recover import (  # noqa: E402
    START_S,
    Shape,
    bkctl,
    main_of,
    metadata_uri,
    start_bookies,
    write_ledgers,
    zk_requests,
)
from bkctl.commands.autorecovery import parse_rate  # noqa: E402
from bkctl.commands.sandbox_procs import BookieChild, stop_children  # noqa: E402
from bkctl.metadata.layout import Layout  # noqa: E402
from bkctl.metadata.stores import open_store  # noqa: E402

DAEMON = ("--autorecovery",)
LIMIT_S = 900.0
POLL_S = 0.05
JAVA_KEYS = {"autoRecoveryDaemonEnabled": "true", "lostBookieRecoveryDelay": "0", "zkTimeout": "10000"}


def naming(layout: Layout, dead: str) -> int:
    """Ledgers whose ensembles name the dead bookie."""
    return sum(
        1
        for _, md in layout.read_ledgers(layout.ledger_ids())
        if any(dead in segment.ensemble for segment in md.segments)
    )


class Observer:
    """Polls the under-replication tree's root (the levels are pruned as marks go): one request a poll,
    counted so that the ZooKeeper figure leaves them out."""

    def __init__(self, layout: Layout, zk: Any) -> None:
        self.layout, self.zk, self.requests = layout, zk, 0

    def marked(self) -> bool:
        self.requests += 1
        return bool(self.layout._children_or_none(self.layout.ur_path("ledgers")))

    def healed(self, dead: str) -> bool:
        before = zk_requests(self.zk)
        named = naming(self.layout, dead)
        self.requests += zk_requests(self.zk) - before
        return named == 0


class BkctlStack:
    def __init__(self, root: Path, uri: str, bookies: int) -> None:
        self.root, self.uri = root, uri
        with open_store(uri) as store:
            Layout(store).init_cluster()
            Layout(store).set_lost_bookie_recovery_delay(0)
        self.children, self.ids = start_bookies(root, uri, bookies, DAEMON)

    def add_spare(self) -> None:
        spare = BookieChild(self.root / "bookie-spare", 0, self.uri, DAEMON)
        self.children.append(spare)
        spare.wait_serving(time.monotonic() + START_S)

    def kill_first(self) -> None:
        self.children[0].proc.send_signal(signal.SIGKILL)

    def pids(self) -> list[int]:
        """The processes that go on after the kill (bookies with their daemons)."""
        return [child.proc.pid for child in self.children[1:]]

    def copied(self) -> float | None:
        time.sleep(2.5)  # the daemons publish their status every 2 s
        status = json.loads(bkctl(self.uri, "autorecovery", "status", "-o", "json").stdout)
        return sum(d.get("bytes_copied", 0) for d in status["daemons"]) / 1e6

    def stop(self) -> None:
        stop_children(self.children)


class JavaStack:
    def __init__(self, root: Path, uri: str, bookies: int) -> None:
        from benchmarks.java_cluster import JavaBookie, metaformat

        self.root, self.uri, self._bookie = root, uri, JavaBookie
        metaformat(root, uri)
        self.children = [JavaBookie(root / f"java-{n}", uri, JAVA_KEYS) for n in range(bookies)]
        self.ids = [child.wait_registered(uri) for child in self.children]
        with open_store(uri) as store:
            Layout(store).set_lost_bookie_recovery_delay(0)

    def add_spare(self) -> None:
        spare = self._bookie(self.root / "java-spare", self.uri, JAVA_KEYS)
        self.children.append(spare)
        spare.wait_registered(self.uri)

    def kill_first(self) -> None:
        self.children[0].proc.send_signal(signal.SIGKILL)

    def pids(self) -> list[int]:
        return [child.proc.pid for child in self.children[1:]]

    def copied(self) -> float | None:
        return None  # Java's daemons publish no status

    def stop(self) -> None:
        for child in self.children:
            child.stop()


def run(
    shape: Shape, stack_name: str = "bkctl", rate: int | None = None, limit_s: float = LIMIT_S
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(dir="/tmp", prefix="bkctl-autorecovery-") as tmp,
        metadata_uri(shape.metadata, Path(tmp)) as (uri, zk),
    ):
        root = Path(tmp)
        stack = (JavaStack if stack_name == "java" else BkctlStack)(root, uri, shape.bookies)
        try:
            written = write_ledgers(uri, shape)
            stack.add_spare()
            with open_store(uri) as store:
                if rate is not None:  # `bkctl autorecovery set-rate`: the daemons' budget together
                    Layout(store).set_replication_rate(rate)
                observer = Observer(Layout(store), zk)
                to_heal = naming(observer.layout, stack.ids[0])
                pids, zk_pids = stack.pids(), [zk.pid] if zk is not None and zk.pid else []
                each_at_kill = [cpu_s(pid) for pid in pids]
                cpu_at_kill = [sum(each_at_kill), sum(cpu_s(pid) for pid in zk_pids)]
                killed, requests_at_kill = time.monotonic(), zk_requests(zk)
                stack.kill_first()
                first_mark = requests_at_mark = None
                while time.monotonic() - killed < limit_s:
                    if observer.marked():
                        if first_mark is None:
                            first_mark, requests_at_mark = time.monotonic(), zk_requests(zk)
                            requests_at_mark -= observer.requests
                    elif first_mark is not None and observer.healed(stack.ids[0]):
                        break
                    time.sleep(POLL_S)
                healed, requests = time.monotonic(), zk_requests(zk) - requests_at_kill - observer.requests
                each = [cpu_s(pid) - at for pid, at in zip(pids, each_at_kill, strict=True)]
                cpu = [
                    sum(cpu_s(pid) for pid in g) - at
                    for g, at in zip((pids, zk_pids), cpu_at_kill, strict=True)
                ]
                after_mark = zk_requests(zk) - observer.requests - (requests_at_mark or 0)
                left = naming(observer.layout, stack.ids[0])  # 0 unless the limit came first
            copied = stack.copied()
        finally:
            stack.stop()
    mark_to_healed = healed - (first_mark or healed)
    done = to_heal - left
    return {
        "stack": stack_name,
        "metadata": shape.metadata,
        "entry_size": shape.entry_size,
        "ledgers": shape.ledgers,
        "entries_per_ledger": shape.entries,
        "bookies": shape.bookies,
        "ledgers_to_heal": to_heal,
        "ledgers_left": left,
        "write_s": written.get("seconds"),
        "mb_copied": None if copied is None else round(copied, 1),
        "kill_to_healed_s": round(healed - killed, 2),
        "mark_to_healed_s": round(mark_to_healed, 2),
        "ledgers_per_s_after_mark": round(done / mark_to_healed, 1) if mark_to_healed > 0 else None,
        "rate_set_mb_s": None if rate is None else rate / 1e6,
        "mb_per_s_after_mark": round(copied / mark_to_healed, 2) if copied and mark_to_healed > 0 else None,
        # CPU seconds from the kill to healed: the surviving bookies with their daemons, and ZooKeeper
        "bookies_cpu_s": round(cpu[0], 1),
        "zk_cpu_s": round(cpu[1], 1) if zk else None,
        "cpu_s_each": [round(c, 1) for c in each],  # the surviving bookies in order, the spare last
        "zk_requests_per_ledger": round(requests / max(1, done), 1) if zk else None,
        "zk_requests_per_ledger_after_mark": round(after_mark / max(1, done), 1) if zk else None,
    }


def main() -> None:
    # --stack is ours; the rest is the command line shared with benchmarks/recover.py.
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--stack", choices=("bkctl", "java"), default="bkctl")
    parser.add_argument("--rate", help="the cluster's copy budget (autorecovery set-rate), e.g. 5M")
    parser.add_argument("--limit", type=float, default=LIMIT_S, help="seconds from the kill to give up")
    known, sys.argv[1:] = parser.parse_known_args()
    rate = None if known.rate is None else parse_rate(known.rate)
    main_of(lambda shape: run(shape, known.stack, rate, known.limit), __doc__ or "")


if __name__ == "__main__":
    main()
