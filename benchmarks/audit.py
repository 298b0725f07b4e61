"""The Spark replica audit (the reference setup of docs/commands/audit.md): 3 bookie processes hold LEDGERS
closed ledgers of exactly ENTRIES 100-byte entries each (E=3, Qw=2, Qa=2), written through the ledger
client, then stop (a checkpoint); `bkctl audit`'s pipeline runs offline on their directories on local
Spark, without and with --verify-digests; then the bookies start again on the same directories and ports
and the audit runs online (asking them), without and with --verify-digests. The SparkSession's start is
timed apart from the audits; each audit's line carries the load average (`/proc/loadavg`) just before it
ran.

    python benchmarks/audit.py                          # 1,000 ledgers x 1,000 entries = 1 million
    python benchmarks/audit.py --entries 5000           # 5 million
    python benchmarks/audit.py --keep /tmp/c1 --only offline --rounds 3   # build once, audit again
    python benchmarks/audit.py --storage db             # DbLedgerStorage bookies (RocksDB indexes)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bkctl.commands.running import run_client  # noqa: E402
from bkctl.commands.sandbox_procs import start_children, stop_children  # noqa: E402
from bkctl.metadata.stores import layout_at  # noqa: E402
from bkctl.pipeline.audit import AuditOptions, run_audit  # noqa: E402
from bkctl.pipeline.inventory import resolve_bookie_dirs  # noqa: E402
from bkctl.pipeline.online import registered_bookies  # noqa: E402
from bkctl.pipeline.session import spark_session  # noqa: E402

PER_LEDGER_IN_FLIGHT = 2  # 2,000 adds in flight over 1,000 ledgers
MODES = {
    "offline": (False, False),
    "offline_verify_digests": (False, True),
    "online": (True, False),
    "online_verify_digests": (True, True),
}


def write_cluster(root: Path, uri: str, ledgers: int, entries: int, base_port: int, storage: str) -> None:
    """`ledgers` closed ledgers of exactly `entries` entries each, on 3 bookie processes."""
    with layout_at(uri) as layout:
        layout.init_cluster()
    children, _ = start_children(root, uri, 3, base_port, ("--storage", storage))
    try:
        written = run_client(uri, lambda client: fill(client, ledgers, entries, 100))
        assert written == ledgers * entries, written
    finally:
        stop_children(children)  # SIGTERM: a checkpoint flushes the index files


async def fill(client: Any, ledgers: int, entries: int, size: int) -> int:
    from twisted.internet.defer import Deferred

    handles = [await client.create_ledger(3, 2, 2) for _ in range(ledgers)]
    finished: Deferred[None] = Deferred()
    data = b"x" * size
    state = {"in_flight": 0, "acked": 0}
    failures: list[BaseException] = []

    def stream(lh: Any) -> None:
        issued = 0

        def issue() -> None:
            nonlocal issued
            issued += 1
            state["in_flight"] += 1
            lh.add_callback(data, acknowledged)

        def acknowledged(_: int, error: BaseException | None) -> None:
            state["in_flight"] -= 1
            if error is not None:
                failures.append(error)
            else:
                state["acked"] += 1
            if issued < entries and not failures:
                issue()
            elif state["in_flight"] == 0 and not finished.called:
                finished.callback(None)

        for _ in range(min(PER_LEDGER_IN_FLIGHT, entries)):
            issue()

    for lh in handles:
        stream(lh)
    await finished
    if failures:
        raise failures[0]
    for lh in handles:
        await lh.close()
    return state["acked"]


@contextmanager
def cluster(keep: Path | None, ledgers: int, entries: int, storage: str) -> Iterator[tuple[Path, str, int]]:
    """(root, metadata URI, base port) of a written cluster: built in `keep` once and reused, or in a
    temporary directory removed afterwards."""
    if keep is not None and (keep / "built.json").is_file():
        built = json.loads((keep / "built.json").read_text())
        assert (built["ledgers"], built["entries"], built.get("storage", "interleaved")) == (
            ledgers,
            entries,
            storage,
        ), built
        yield keep, built["uri"], built["base_port"]
        return
    with tempfile.TemporaryDirectory(dir=REPO / "benchmarks") as tmp:
        root = keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        uri = f"sqlite://{root / 'metadata.db'}"
        base_port = free_base_port(3)
        write_cluster(root, uri, ledgers, entries, base_port, storage)
        built = {"ledgers": ledgers, "entries": entries, "uri": uri, "base_port": base_port}
        built["storage"] = storage
        (root / "built.json").write_text(json.dumps(built))
        yield root, uri, base_port


def free_base_port(count: int) -> int:
    from benchmarks.chaos.process import free_base_port as free

    return free(count)


def run(
    ledgers: int, entries: int, keep: Path | None, modes: list[str], rounds: int, storage: str
) -> Iterator[dict[str, Any]]:
    with cluster(keep, ledgers, entries, storage) as (root, uri, base_port):
        offline = resolve_bookie_dirs([str(p) for p in sorted(root.glob("bookie-*"))])
        load = loadavg()
        started = time.monotonic()
        spark = spark_session()
        spark.range(1).count()  # the session is up when a first job has run
        yield {"session_start_s": round(time.monotonic() - started, 2), "load": load}
        try:
            for name in (m for m in modes if not MODES[m][0]):
                for _ in range(rounds):
                    yield timed_audit(spark, uri, offline, name, MODES[name][1])
            if any(MODES[m][0] for m in modes):
                children, _ = start_children(root, uri, 3, base_port, ("--storage", storage))
                try:
                    online, problems = registered_bookies(uri)
                    assert len(online) == 3 and not problems, problems
                    for name in (m for m in modes if MODES[m][0]):
                        for _ in range(rounds):
                            yield timed_audit(spark, uri, online, name, MODES[name][1])
                finally:
                    stop_children(children)
        finally:
            spark.stop()


def timed_audit(spark: Any, uri: str, bookies: Any, name: str, verify: bool) -> dict[str, Any]:
    load = loadavg()
    started = time.monotonic()
    result = run_audit(spark, uri, bookies, AuditOptions(verify_digests=verify))
    seconds = round(time.monotonic() - started, 2)
    assert result.clean, result.as_dict()
    found = result.summary
    return {
        "mode": name,
        "seconds": seconds,
        "entries": found["entries_expected"],
        "replicas": found["replicas_found"],
        "digests_checked": found["digests_checked"],
        "load": load,
    }


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ledgers", type=int, default=1000)
    parser.add_argument("--entries", type=int, default=1000, help="entries per ledger")
    parser.add_argument("--keep", type=Path, help="build the cluster here once; later runs reuse it")
    parser.add_argument("--only", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--rounds", type=int, default=1, help="audits per mode")
    parser.add_argument("--storage", choices=("interleaved", "db"), default="interleaved")
    args = parser.parse_args()
    for line in run(args.ledgers, args.entries, args.keep, args.only, args.rounds, args.storage):
        print(json.dumps({"ledgers": args.ledgers, "storage": args.storage, **line}), flush=True)


if __name__ == "__main__":
    main()
