"""The chaos runner: starts the cluster, writers and daemons, injects seeded faults for a duration,
then stops the faults, brings every process back and runs the verifier (verify.py). Prints a summary
and exits 1 on any violation (or when the cluster did not heal within the bound).

    python -m benchmarks.chaos --seed 7 --duration 300
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos.history import HistoryLog
from benchmarks.chaos.process import free_base_port
from bkctl.commands.sandbox_procs import BookieChild, start_children, stop_children
from bkctl.metadata.stores import layout_at
from bkctl.metadata.zk_server import ZooKeeperServer

REPO = Path(__file__).resolve().parents[2]
BOOKIES = 5  # E=3 ensembles with two bookies down at once
DOWN_MAX = 2
ZK_PAUSE_S = 5.0  # past the 4 s session timeout a 200 ms tick allows: every session expires
STOP_WAIT_S = 30.0
# Fault kinds and their weights.
KINDS = {
    "kill_bookie": 3,
    "stop_bookie": 2,
    "fill_disk": 1,
    "pause_zookeeper": 1,
    "kill_writer": 1,
    "kill_autorecovery": 1,
    "kill_auditor": 1,
    "fence": 2,
}
# A writer killed before it could mark the copies its acknowledged adds missed leaves them to the
# auditor's check of every ledger: every minute here (Java's default is a week; operators shorten it).
AUTORECOVERY_CONF = "auditorPeriodicCheckInterval=60\n"
TMPFS_SIZE = "768m"  # the last bookie's journal and ledger dirs: room for a long run, filled on purpose


def python_m(module: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", module, *args], cwd=REPO, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )


@dataclass
class Cluster:
    root: Path
    uri: str
    zookeeper: ZooKeeperServer
    bookies: list[BookieChild] = field(default_factory=list)
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)
    writers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    writer_count: int = 0
    readers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    tmpfs: list[Path] = field(default_factory=list)  # the last bookie's journal and ledger dir mounts
    down: set[int] = field(default_factory=set)  # bookies killed or stopped
    stopped: set[int] = field(default_factory=set)  # bookies SIGSTOPped
    zk_paused: bool = False

    def start_writer(self, seed: int) -> None:
        self.writer_count += 1
        n = self.writer_count
        history = str(self.root / "history" / f"writer-{n}.jsonl")
        log = self.root / "logs" / f"writer-{n}.log"
        self.writers.append(
            python_m("benchmarks.chaos.writer", "--metadata", self.uri, "--history", history,
                     "--seed", str(seed * 1000 + n), log=log)
        )  # fmt: skip

    def start_reader(self, n: int, seed: int) -> None:
        history = self.root / "history"
        log = self.root / "logs" / f"reader-{n}.log"
        self.readers.append(
            python_m("benchmarks.chaos.reader", "--metadata", self.uri, "--dir", str(history),
                     "--history", str(history / f"reader-{n}.jsonl"), "--seed", str(seed), log=log)
        )  # fmt: skip

    def start_daemon(self, index: int) -> subprocess.Popen[bytes]:
        log = self.root / "logs" / f"autorecovery-{index}.log"
        conf = self.root / "autorecovery.conf"
        conf.write_text(AUTORECOVERY_CONF)
        args = ("autorecovery", "start", "--metadata", self.uri, "--conf", str(conf))
        return python_m("bkctl", *args, log=log)


@dataclass
class Schedule:
    """Actions due later (restarts, SIGCONTs), run by the fault loop."""

    due: list[tuple[float, str, Callable[[], None]]] = field(default_factory=list)

    def at(self, when: float, what: str, action: Callable[[], None]) -> None:
        self.due.append((when, what, action))

    def run_due(self, now: float) -> None:
        ready = [d for d in self.due if d[0] <= now]
        self.due = [d for d in self.due if d[0] > now]
        for _, _, action in ready:
            action()

    def run_all(self) -> None:
        for _, _, action in sorted(self.due, key=lambda d: d[0]):
            action()
        self.due = []


class Faults:
    def __init__(self, cluster: Cluster, rng: random.Random, log: HistoryLog) -> None:
        self.cluster, self.rng, self.log = cluster, rng, log
        self.schedule = Schedule()
        self.counts: Counter[str] = Counter()
        self.fences: list[tuple[int, float, subprocess.Popen[str]]] = []

    def inject(self, now: float) -> None:
        kind = self.rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        target = getattr(self, kind)(now)
        if target is not None:
            self.counts[kind] += 1
            self.log.event("fault", kind=kind, target=target)

    def kill_bookie(self, now: float) -> str | None:
        index = self._bookie_up()
        if index is None:
            return None
        bookie = self.cluster.bookies[index]
        bookie.proc.kill()
        bookie.proc.wait()
        self.cluster.down.add(index)
        self.schedule.at(now + self.rng.uniform(1, 8), "restart", lambda: self._restart(index))
        return bookie.bookie_id

    def _restart(self, index: int) -> None:
        self.cluster.bookies[index].restart()
        self.cluster.down.discard(index)

    def stop_bookie(self, now: float) -> str | None:
        index = self._bookie_up()
        if index is None:
            return None
        bookie = self.cluster.bookies[index]
        os.kill(bookie.proc.pid, signal.SIGSTOP)
        self.cluster.down.add(index)
        self.cluster.stopped.add(index)
        self.schedule.at(now + self.rng.uniform(1, 6), "continue", lambda: self._continue(index))
        return bookie.bookie_id

    def _continue(self, index: int) -> None:
        proc = self.cluster.bookies[index].proc
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        self.cluster.stopped.discard(index)
        self.cluster.down.discard(index)

    def _bookie_up(self) -> int | None:
        up = [i for i in range(len(self.cluster.bookies)) if i not in self.cluster.down]
        if len(self.cluster.down) >= DOWN_MAX or not up:
            return None
        return self.rng.choice(up)

    def pause_zookeeper(self, now: float) -> str | None:
        pid = self.cluster.zookeeper.pid
        if self.cluster.zk_paused or pid is None:
            return None
        os.kill(pid, signal.SIGSTOP)
        self.cluster.zk_paused = True
        self.schedule.at(now + ZK_PAUSE_S, "zookeeper continue", self._zk_continue)
        return "zookeeper"

    def _zk_continue(self) -> None:
        if self.cluster.zookeeper.pid is not None:
            os.kill(self.cluster.zookeeper.pid, signal.SIGCONT)
        self.cluster.zk_paused = False

    def kill_writer(self, now: float) -> str | None:
        alive = [w for w in self.cluster.writers if w.poll() is None]
        if not alive:
            return None
        victim = self.rng.choice(alive)
        victim.kill()
        victim.wait()
        self.cluster.start_writer(self.rng.randrange(1 << 30))
        return f"writer pid {victim.pid}"

    def kill_autorecovery(self, now: float) -> str | None:
        return self._kill_daemon(now, self.rng.randrange(len(self.cluster.daemons)))

    def kill_auditor(self, now: float) -> str | None:
        """The daemon holding the lowest vote (its id is host:pid: daemons run with no --bookie-id)."""
        if self.cluster.zk_paused:
            return None
        with layout_at(self.cluster.uri) as layout:
            auditor = layout.current_auditor()
        pids = [d.pid for d in self.cluster.daemons]
        pid = int(auditor.rsplit(":", 1)[1]) if auditor and auditor.rsplit(":", 1)[1].isdigit() else None
        if pid not in pids:
            return None
        target = self._kill_daemon(now, pids.index(pid))
        return f"auditor: {target}" if target else None

    def _kill_daemon(self, now: float, index: int) -> str | None:
        daemon = self.cluster.daemons[index]
        if daemon.poll() is not None:
            return None
        daemon.kill()
        daemon.wait()

        def restart() -> None:
            self.cluster.daemons[index] = self.cluster.start_daemon(index)

        self.schedule.at(now + self.rng.uniform(1, 8), "restart autorecovery", restart)
        return f"autorecovery {index}"

    def fill_disk(self, now: float) -> str | None:
        """Fill the last bookie's filesystem to the last byte, free it a few seconds later: the bookie
        turns read-only (usage threshold, or ENOSPC first) and back; nothing acknowledged is lost."""
        index = len(self.cluster.bookies) - 1
        if not self.cluster.tmpfs or index in self.cluster.down or len(self.cluster.down) >= DOWN_MAX:
            return None
        mount = self.rng.choice(self.cluster.tmpfs)
        filler = mount / "filler"
        _fill(filler)
        self.cluster.down.add(index)

        def free() -> None:
            filler.unlink(missing_ok=True)
            self.cluster.down.discard(index)

        self.schedule.at(now + self.rng.uniform(2, 8), "free the disk", free)
        return f"{self.cluster.bookies[index].bookie_id} {mount.name} disk full"

    def fence(self, now: float) -> str | None:
        open_ledgers = sorted(_open_ledgers(self.cluster.root / "history"))
        if not open_ledgers:
            return None
        ledger_id = self.rng.choice(open_ledgers)
        proc = subprocess.Popen(
            [sys.executable, "-m", "bkctl", "ledger", "fence", str(ledger_id), "--password", "chaos",
             "--metadata", self.cluster.uri, "-o", "json"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.fences.append((ledger_id, time.monotonic(), proc))
        return f"ledger {ledger_id}"

    def collect_fences(self, wait: bool = False) -> None:
        """Log every finished recovery open with the last entry it closed the ledger at."""
        running = []
        for ledger_id, t0, proc in self.fences:
            if wait:
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    proc.kill()
            if proc.poll() is None:
                running.append((ledger_id, t0, proc))
                continue
            out = proc.stdout.read() if proc.stdout else ""
            if proc.returncode in (0, 11):  # 11: it was closed already, the same data
                last = json.loads(out)["last_entry_id"]
                self.log.event("fence", l=ledger_id, last=last, t0=t0, t1=time.monotonic())
        self.fences = running


def _fill(path: Path) -> None:
    """Write zeros until the filesystem refuses (ENOSPC)."""
    block = bytes(1 << 20)
    with path.open("wb", buffering=0) as f:
        for _ in range(1 << 16):  # 64 GiB at most: the tmpfs is far smaller
            try:
                f.write(block)
            except OSError:
                break


def mount_tmpfs(base: Path) -> list[Path]:
    """Size-limited tmpfs mounts for a bookie's journal and ledger dirs (root only); none where
    mounting is not allowed."""
    mounts: list[Path] = []
    for directory in (base / "journal", base / "ledgers"):
        directory.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(directory)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            print(f"chaos: no disk-full faults: mount: {done.stderr.strip()}", file=sys.stderr)
            unmount(mounts)
            return []
        mounts.append(directory)
    return mounts


def unmount(mounts: list[Path]) -> None:
    for directory in mounts:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)


def _open_ledgers(directory: Path) -> set[int]:
    created, ended = set(), set()
    for path in directory.glob("writer-*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event["e"] == "create":
                created.add(event["l"])
            elif event["e"] in ("close", "close_fail"):
                ended.add(event["l"])
    return created - ended


def run(
    seed: int,
    duration_s: float,
    workers: tuple[int, int],
    root: Path,
    heal_timeout_s: float,
    storage: str = "interleaved",
) -> dict[str, Any]:
    """One chaos run with (writers, readers) processes on bookies of `storage`; its summary."""
    rng = random.Random(seed)
    for sub in ("history", "logs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    tmpfs = mount_tmpfs(root / "bookies" / f"bookie-{BOOKIES}")
    try:
        with ZooKeeperServer(tick_ms=200) as zookeeper:
            cluster = start_cluster(root, zookeeper, tmpfs, storage)
            log = HistoryLog(root / "history" / "runner.jsonl")
            faults = Faults(cluster, rng, log)
            try:
                for _ in range(workers[0]):
                    cluster.start_writer(rng.randrange(1 << 30))
                for n in range(1, workers[1] + 1):
                    cluster.start_reader(n, rng.randrange(1 << 30))
                inject_for(faults, duration_s)
                faults.schedule.run_all()  # every bookie, daemon, disk and ZooKeeper back
                _stop(cluster.writers + cluster.readers)
                faults.collect_fences(wait=True)
                verdict = _verify(cluster.uri, root, heal_timeout_s)
            finally:
                faults.schedule.run_all()
                _stop(cluster.writers + cluster.readers + cluster.daemons)
                stop_children(cluster.bookies)
                log.close()
    finally:
        unmount(tmpfs)
    summary = {"seed": seed, "duration_s": duration_s, "storage": storage, "faults": dict(faults.counts)}
    return {**summary, **verdict}


def storage_of(storage: str, index: int) -> str:
    """Bookie `index`'s ledger storage: "mixed" alternates them (odd: db, even: interleaved), so that
    ensembles span both engines and the bookie whose disk is filled (the last) is a db one."""
    if storage != "mixed":
        return storage
    return "db" if index % 2 else "interleaved"


def start_cluster(root: Path, zookeeper: ZooKeeperServer, tmpfs: list[Path], storage: str) -> Cluster:
    uri = f"zk://{zookeeper.hosts}/ledgers"
    with layout_at(uri) as layout:
        layout.init_cluster()

    def options(index: int) -> tuple[str, ...]:
        return ("--storage", storage_of(storage, index))

    bookies, _ = start_children(root / "bookies", uri, BOOKIES, free_base_port(BOOKIES), options)
    cluster = Cluster(root, uri, zookeeper, bookies, tmpfs=tmpfs)
    cluster.daemons = [cluster.start_daemon(i) for i in range(2)]
    return cluster


def inject_for(faults: Faults, duration_s: float) -> None:
    """A fault every 0.5-3 s (the seed's choice), with restarts and resumes as they fall due."""
    started = time.monotonic()
    next_fault = started + faults.rng.uniform(1, 3)
    while time.monotonic() - started < duration_s:
        now = time.monotonic()
        faults.schedule.run_due(now)
        faults.collect_fences()
        if now >= next_fault:
            faults.inject(now)
            next_fault = now + faults.rng.uniform(0.5, 3)
        time.sleep(0.05)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _verify(uri: str, root: Path, heal_timeout_s: float) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.chaos.verify", "--metadata", uri, "--dir", str(root / "history"),
         "--heal-timeout", str(heal_timeout_s)],
        cwd=REPO, capture_output=True, text=True, timeout=heal_timeout_s + 600,
    )  # fmt: skip
    if done.returncode != 0:
        return {"violations": [f"the verifier failed: {done.stderr.strip()[-2000:]}"]}
    return dict(json.loads(done.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of faults")
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--heal-timeout", type=float, default=180.0)
    parser.add_argument("--keep", type=Path, help="keep the run's directories here")
    parser.add_argument(
        "--storage",
        choices=("interleaved", "db", "mixed"),
        default="interleaved",
        help="the bookies' ledger storage; mixed: odd bookies interleaved, even ones db",
    )
    args = parser.parse_args()
    workers = (args.writers, args.readers)
    if args.keep:
        summary = run(args.seed, args.duration, workers, args.keep, args.heal_timeout, args.storage)
    else:
        with tempfile.TemporaryDirectory(prefix="bkctl-chaos-") as tmp:
            summary = run(args.seed, args.duration, workers, Path(tmp), args.heal_timeout, args.storage)
    print(json.dumps(summary), flush=True)
    sys.exit(1 if summary.get("violations") or summary.get("heal_s") is None else 0)


if __name__ == "__main__":
    main()
