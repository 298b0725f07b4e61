"""The Spark replica audit (issue 13's setup): 3 bookie processes write LEDGERS ledgers of 100-byte
entries (E=3, Qw=2, Qa=2) with `bkctl bench write` for about a million entries, stop (a checkpoint), and
`bkctl audit` runs offline on their directories on local Spark, without and with --verify-digests; then
the bookies start again on the same directories and ports and the audit runs online (asking them), without
and with --verify-digests. The SparkSession's start is timed apart from the audits.

    python benchmarks/audit.py                    # ~1 million entries (bench write for 25 s)
    python benchmarks/audit.py --seconds 125      # ~5 million
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

from benchmarks.chaos.process import free_base_port  # noqa: E402
from benchmarks.recover import bkctl  # noqa: E402
from bkctl.commands.sandbox_procs import start_children, stop_children  # noqa: E402
from bkctl.metadata.stores import layout_at  # noqa: E402
from bkctl.pipeline.audit import AuditOptions, run_audit  # noqa: E402
from bkctl.pipeline.inventory import resolve_bookie_dirs  # noqa: E402
from bkctl.pipeline.online import registered_bookies  # noqa: E402
from bkctl.pipeline.session import spark_session  # noqa: E402


def write_cluster(root: Path, uri: str, ledgers: int, seconds: float, base_port: int) -> None:
    with layout_at(uri) as layout:
        layout.init_cluster()
    children, _ = start_children(root, uri, 3, base_port)
    try:
        done = bkctl(uri, "bench", "write", "-l", str(ledgers), "-s", "100", "-D", "2000", "-t", str(seconds),
            "-o", "json")  # fmt: skip
        assert done.returncode == 0, done.stderr
    finally:
        stop_children(children)  # SIGTERM: a checkpoint flushes the index files


def run(ledgers: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=REPO / "benchmarks") as tmp:
        root = Path(tmp)
        uri = f"sqlite://{root / 'metadata.db'}"
        base_port = free_base_port(3)
        write_cluster(root, uri, ledgers, seconds, base_port)
        bookies = resolve_bookie_dirs([str(p) for p in sorted(root.glob("bookie-*"))])
        started = time.monotonic()
        spark = spark_session()
        spark.range(1).count()  # the session is up when a first job has run
        figures: dict[str, Any] = {"session_start_s": round(time.monotonic() - started, 2)}
        try:
            for name, verify in (("offline", False), ("offline_verify_digests", True)):
                figures.update(timed_audit(spark, uri, bookies, name, verify))
            children, _ = start_children(root, uri, 3, base_port)
            try:
                online, problems = registered_bookies(uri)
                assert len(online) == 3 and not problems, problems
                for name, verify in (("online", False), ("online_verify_digests", True)):
                    figures.update(timed_audit(spark, uri, online, name, verify))
            finally:
                stop_children(children)
        finally:
            spark.stop()
    return {"ledgers": ledgers, **figures}


def timed_audit(spark: Any, uri: str, bookies: Any, name: str, verify: bool) -> dict[str, Any]:
    started = time.monotonic()
    result = run_audit(spark, uri, bookies, AuditOptions(verify_digests=verify))
    seconds = round(time.monotonic() - started, 2)
    assert result.clean, result.as_dict()
    found = result.summary
    return {f"{name}_s": seconds, "entries": found["entries_expected"], "replicas": found["replicas_found"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ledgers", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=25.0, help="bench write duration")
    args = parser.parse_args()
    print(json.dumps(run(args.ledgers, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
