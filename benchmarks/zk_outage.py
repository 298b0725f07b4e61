"""How long after ZooKeeper comes back each kind of metadata operation completes.

A dedicated ZooKeeper (tickTime 1 s, so sessions of 10 s as Java's default), a bookie process on it and
a store in this process (session timeout 10 s). For each pause length, ZooKeeper is stopped with SIGSTOP;
during the pause a create, a versioned set, a get and an ephemeral-sequential create (an auditor vote) are
issued from threads; then SIGCONT. Printed: for each operation the seconds from SIGCONT to its
completion, and for the bookie the seconds until it is registered again (its session expired in every
pause longer than 10 s).

    python benchmarks/zk_outage.py                  # pauses of 5, 15 and 30 s
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bkctl.commands.sandbox_procs import start_children, stop_children  # noqa: E402
from bkctl.metadata.layout import Layout  # noqa: E402
from bkctl.metadata.retry import RetryPolicy  # noqa: E402
from bkctl.metadata.zk_server import ZooKeeperServer  # noqa: E402
from bkctl.metadata.zookeeper import ZooKeeperStore  # noqa: E402

SESSION_MS = 10_000
POLICY = RetryPolicy(deadline_ms=120_000)


def one_pause(server: ZooKeeperServer, store: ZooKeeperStore, bookie: str, pause_s: float) -> dict[str, Any]:
    assert server.pid is not None
    tag = f"{int(pause_s)}-{time.monotonic_ns()}"
    store.create(f"/bench-set-{tag}", b"0")
    done: dict[str, float] = {}
    work = {
        "create": lambda: store.create(f"/bench-create-{tag}", b"x"),
        "set": lambda: store.set(f"/bench-set-{tag}", b"1", version=0),
        "get": lambda: store.get(f"/bench-set-{tag}"),
        "vote": lambda: store.create(f"/bench-vote-{tag}-", b"v", ephemeral=True, sequential=True),
    }

    def run(name: str) -> None:
        work[name]()
        done[name] = time.monotonic()

    os.kill(server.pid, signal.SIGSTOP)
    threads = [threading.Thread(target=run, args=(name,)) for name in work]
    for thread in threads:
        thread.start()
    time.sleep(pause_s)
    os.kill(server.pid, signal.SIGCONT)
    resumed = time.monotonic()
    layout = Layout(store)
    while bookie not in layout.bookies() and time.monotonic() - resumed < 120:
        time.sleep(0.05)
    registered = time.monotonic()
    for thread in threads:
        thread.join(120)
    result = {name: round(done[name] - resumed, 2) for name in work if name in done}
    return {"pause_s": pause_s, **result, "bookie_registered": round(registered - resumed, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pauses", default="5,15,30")
    args = parser.parse_args()
    with ZooKeeperServer(tick_ms=1000) as server, tempfile.TemporaryDirectory() as tmp:
        uri = server.hosts
        with ZooKeeperStore(uri, session_timeout_ms=SESSION_MS, retry=POLICY) as store:
            Layout(store).init_cluster()
            children, ids = start_children(Path(tmp), uri, 1, 0)
            try:
                for pause in (float(p) for p in args.pauses.split(",")):
                    print(json.dumps(one_pause(server, store, ids[0], pause)), flush=True)
            finally:
                stop_children(children)


if __name__ == "__main__":
    main()
