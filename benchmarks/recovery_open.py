"""Recovery open of a ledger whose writer died with an unconfirmed tail: 3 bookie processes
(`bkctl bookie start`, SQLite metadata), a ledger (E3/Qw2/Qa2, 1 KiB) of N confirmed entries plus
T entries sent in one batch (so every copy of them carries a LAC before them), the writer abandoned;
then a second client times `open_ledger(recovery=True)`: fence, read forward T entries, write them
back, close. Also times a plain open of the closed ledger and a read of its tail.

    python benchmarks/recovery_open.py                      # 99,000 + 1,000 entries
    python benchmarks/recovery_open.py --confirmed 9000 --tail 1000 --runs 1
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bkctl.commands.ledger_data import write_entries  # noqa: E402
from bkctl.commands.sandbox_procs import start_children, stop_children  # noqa: E402
from bkctl.metadata.layout import Layout  # noqa: E402
from bkctl.metadata.stores import open_store  # noqa: E402


async def scenario(reactor: Any, uri: str, confirmed: int, tail: int, size: int) -> dict[str, Any]:
    from bkctl.client.client import Client

    store = open_store(uri)
    writer = Client(Layout(store), reactor)
    reader = Client(Layout(store), reactor)
    data = b"r" * size
    lh = await writer.create_ledger(3, 2, 2)
    started = time.perf_counter()
    await write_entries(lh, (data for _ in range(confirmed)))
    write_s = time.perf_counter() - started
    await lh.add_many([data] * tail)  # one batch: every copy carries LAC = confirmed - 1
    assert lh.last_add_confirmed == confirmed + tail - 1
    await writer.close()  # the writer "dies": connections gone, ledger left OPEN
    started = time.perf_counter()
    recovered = await reader.open_ledger(lh.ledger_id, b"", recovery=True)
    recovery_s = time.perf_counter() - started
    assert recovered.is_closed and recovered.last_add_confirmed == confirmed + tail - 1
    tail_entries = await recovered.read(confirmed, confirmed + tail - 1)
    assert all(e.payload == data for e in tail_entries)
    await reader.close()
    store.close()
    return {
        "ledger_id": lh.ledger_id,
        "entries": confirmed + tail,
        "unconfirmed_tail": tail,
        "write_s": round(write_s, 2),
        "recovery_open_s": round(recovery_s, 3),
        "last_entry_id": recovered.last_add_confirmed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--confirmed", type=int, default=99_000)
    parser.add_argument("--tail", type=int, default=1_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from twisted.internet import defer, task

    with tempfile.TemporaryDirectory(prefix="bkctl-recovery-") as tmp:
        root = Path(tmp)
        uri = f"sqlite://{root / 'metadata.db'}"
        with open_store(uri) as store:
            Layout(store).init_cluster()
        children, _ = start_children(root, uri, 3, 0)
        results: list[dict[str, Any]] = []
        try:

            async def runs(reactor: Any) -> None:
                for _ in range(args.runs):
                    result = await scenario(reactor, uri, args.confirmed, args.tail, args.size)
                    print(json.dumps(result), flush=True)
                    results.append(result)

            try:
                task.react(lambda reactor: defer.ensureDeferred(runs(reactor)))
            except SystemExit as exc:
                if exc.code:
                    raise
        finally:
            stop_children(children)
    best = min(r["recovery_open_s"] for r in results)
    print(json.dumps({"runs": len(results), "best_recovery_open_s": best}))


if __name__ == "__main__":
    main()
