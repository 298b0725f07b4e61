"""Garbage collection and compaction of one bookie process.

Part 1, space returned: N ledgers of M MB each (1 KiB entries, written interleaved as concurrent writers
do, so every entry log holds all of them) on a bookie with `logSizeLimit` L; all but one are deleted from
the metadata store; a GC run without compaction, then one with `forceMinor` (logs under 20% live are
compacted): the share of the deleted ledgers' bytes each gave back.

Part 2, compaction throughput: N fresh ledgers, every other one deleted (each log ~50% live) and
collected; then a forced major compaction (unthrottled: compactionRateByEntries=0) while a writer adds
1 KiB entries to another ledger one at a time: MB/s and entries/s of live data copied, and the writer's
add latency during the compaction against the same writer just before it.

    python benchmarks/gc.py                                   # 10 ledgers of 100 MB (the reference size)
    python benchmarks/gc.py --ledgers 10 --ledger-mb 20 --log-mb 64
    python benchmarks/gc.py --storage db                      # the db engine (DbLedgerStorage)
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bkctl.metadata.layout import Layout  # noqa: E402
from bkctl.metadata.sqlite import SqliteStore  # noqa: E402
from bkctl.model import DigestType, LedgerMetadata, Segment  # noqa: E402
from bkctl.protocol import entry as entry_codec  # noqa: E402
from bkctl.protocol import wire  # noqa: E402
from bkctl.server.ledger_storage import ENGINE_CLASSES, ENGINES  # noqa: E402

MASTER_KEY = entry_codec.master_key(b"bench")
SERVING = re.compile(r"serving on [\d.]+:(\d+) \(admin http on [\d.]+:(\d+)\)")
ENTRY = 1024
WINDOW = 256  # adds in flight while filling
WRITER_LEDGER = 1_000_000
MB = 1024 * 1024


class Client:
    """Pipelined v2 adds over one connection."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = wire.FrameDecoder()
        self.ready: list[bytes] = []

    def add(self, ledger_id: int, first: int, count: int) -> None:
        frames = []
        for entry_id in range(first, first + count):
            body = entry_codec.package_entry(DigestType.CRC32C, ledger_id, entry_id, -1, ENTRY, b"x" * ENTRY)
            frames.append(wire.frame(wire.encode_add_request(body, MASTER_KEY)))
        self.sock.sendall(b"".join(frames))
        for _ in range(count):
            while not self.ready:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("bookie closed the connection")
                self.decoder.feed(data)
                self.ready = self.decoder.frames()
            response = wire.decode_response(self.ready.pop(0))
            assert isinstance(response, wire.AddResponse) and response.rc == 0, response

    def close(self) -> None:
        self.sock.close()


def metadata(ledger_id: int) -> LedgerMetadata:
    return LedgerMetadata(
        1, 1, 1, (Segment(0, ("127.0.0.1:3181",)),), digest=DigestType.CRC32C, password=b"bench"
    )


def layout(db: Path, action: str, ledger_ids: list[int]) -> None:
    with SqliteStore(db) as store:
        cluster = Layout(store)
        if cluster.instance_id() is None:
            cluster.init_cluster()
        for ledger_id in ledger_ids:
            if action == "create":
                cluster.create_ledger(metadata(ledger_id), ledger_id=ledger_id)
            else:
                cluster.delete_ledger(ledger_id)


def start_bookie(
    base: Path,
    db: Path,
    log_mb: int,
    rate: int = 0,
    journal: Path | None = None,
    storage: str = "interleaved",
) -> tuple[subprocess.Popen[str], int, int]:
    conf = base / "bk_server.conf"
    keys = {
        "bookiePort": "0",
        "httpServerPort": "0",
        "journalDirectories": str(journal / base.name if journal else base / "journal"),
        "ledgerDirectories": str(base / "ledgers"),
        "logSizeLimit": str(log_mb * MB),
        "gcWaitTime": "0",
        "compactionRateByEntries": str(rate),
        "metadataServiceUri": f"sqlite://{db}",
        "ledgerStorageClass": ENGINE_CLASSES[storage],
    }
    conf.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bkctl", "bookie", "start", "--conf", str(conf)],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    for line in proc.stderr:
        match = SERVING.search(line)
        if match:
            threading.Thread(target=lambda: [None for _ in proc.stderr or ()], daemon=True).start()
            return proc, int(match.group(1)), int(match.group(2))
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise SystemExit("bookie did not start")


def gc(http_port: int, body: dict[str, bool]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/api/v1/bookie/gc?wait=true",
        data=json.dumps(body).encode(),
        method="PUT",
    )
    with urllib.request.urlopen(request, timeout=3600) as answer:
        result: dict[str, Any] = json.loads(answer.read())
        return result


def fill(port: int, ledger_ids: list[int], ledger_mb: int) -> None:
    """Each ledger's entries, WINDOW at a time, round-robin over the ledgers (interleaved in every log)."""
    per_ledger = ledger_mb * MB // ENTRY
    client = Client(port)
    try:
        for first in range(0, per_ledger, WINDOW):
            for ledger_id in ledger_ids:
                client.add(ledger_id, first, min(WINDOW, per_ledger - first))
    finally:
        client.close()


def du(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


class LatencyWriter:
    """One add at a time to its own ledger, latencies kept per phase."""

    def __init__(self, port: int) -> None:
        self.client = Client(port)
        self.phase = "before"
        self.latencies: dict[str, list[float]] = {"before": [], "during": []}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        entry_id = 0
        while not self.stop.is_set():
            started = time.perf_counter()
            self.client.add(WRITER_LEDGER, entry_id, 1)
            self.latencies[self.phase].append((time.perf_counter() - started) * 1000)
            entry_id += 1
            time.sleep(0.002)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.client.close()


def percentiles(values: list[float]) -> dict[str, float]:
    if len(values) < 2:
        return {"n": len(values)}
    q = statistics.quantiles(values, n=100)
    return {"n": len(values), "p50": round(q[49], 2), "p99": round(q[98], 2), "max": round(max(values), 2)}


def part_space(base: Path, args: argparse.Namespace) -> dict[str, Any]:
    base.mkdir(parents=True, exist_ok=True)
    db = base / "metadata.db"
    ledger_ids = list(range(1, args.ledgers + 1))
    layout(db, "create", ledger_ids)
    proc, port, http_port = start_bookie(base, db, args.log_mb, storage=args.storage)
    try:
        fill(port, ledger_ids, args.ledger_mb)
        proc_ledgers = base / "ledgers" / "current"
        gc(http_port, {})  # settles: nothing deleted yet
        before = du(proc_ledgers)
        deleted = ledger_ids[1:]
        layout(db, "delete", deleted)
        deleted_bytes = len(deleted) * args.ledger_mb * MB
        plain = gc(http_port, {})
        after_plain = du(proc_ledgers)
        minor = gc(http_port, {"forceMinor": True})
        after_minor = du(proc_ledgers)
        return {
            "ledgers": args.ledgers,
            "ledger_mb": args.ledger_mb,
            "log_mb": args.log_mb,
            "ledger_dir_mb_before": round(before / MB, 1),
            "gc_returned_fraction": round((before - after_plain) / deleted_bytes, 3),
            "gc_seconds": plain["seconds"],
            "minor_returned_fraction": round((before - after_minor) / deleted_bytes, 3),
            "minor_seconds": minor["seconds"],
            "minor_logs_compacted": len(minor["entry_logs_compacted"]),
        }
    finally:
        proc.terminate()
        proc.wait(60)


def part_compaction(base: Path, args: argparse.Namespace) -> dict[str, Any]:
    base.mkdir(parents=True, exist_ok=True)
    db = base / "metadata.db"
    ledger_ids = list(range(1, args.ledgers + 1))
    layout(db, "create", [*ledger_ids, WRITER_LEDGER])
    proc, port, http_port = start_bookie(base, db, args.log_mb, args.rate, args.journal_dir, args.storage)
    try:
        fill(port, ledger_ids, args.ledger_mb)
        layout(db, "delete", ledger_ids[::2])
        gc(http_port, {})  # the deleted ledgers' indexes go; each log is now ~half live
        writer = LatencyWriter(port)
        time.sleep(args.baseline_s)
        writer.phase = "during"
        started = time.perf_counter()
        report = gc(http_port, {"forceMajor": True})
        seconds = time.perf_counter() - started
        writer.finish()
        return {
            "logs_compacted": len(report["entry_logs_compacted"]),
            "entries_moved": report["entries_moved"],
            "mb_moved": round(report["bytes_moved"] / MB, 1),
            "seconds": round(seconds, 2),
            "mb_per_s": round(report["bytes_moved"] / MB / seconds, 1),
            "entries_per_s": round(report["entries_moved"] / seconds),
            "mb_reclaimed": round(report["bytes_reclaimed"] / MB, 1),
            "writer_latency_ms_before": percentiles(writer.latencies["before"]),
            "writer_latency_ms_during": percentiles(writer.latencies["during"]),
        }
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ledgers", type=int, default=10)
    parser.add_argument("--ledger-mb", type=int, default=100)
    parser.add_argument("--log-mb", type=int, default=128, help="logSizeLimit in MB")
    parser.add_argument("--baseline-s", type=float, default=5.0, help="writer alone before the compaction")
    parser.add_argument("--dir", type=Path, default=None, help="where the bookie's directories go")
    parser.add_argument("--parts", default="space,compaction", help="which parts to run")
    parser.add_argument("--journal-dir", type=Path, default=None, help="part 2's journal on another device")
    parser.add_argument(
        "--rate", type=int, default=0, help="compactionRateByEntries of part 2 (0: unthrottled)"
    )
    parser.add_argument(
        "--storage", choices=ENGINES, default="interleaved", help="the bookie's ledger storage"
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bkctl-gc-", dir=args.dir))
    try:
        if "space" in args.parts:
            space = part_space(base / "space", args)
            print(json.dumps({"space": space}, indent=2), flush=True)
            shutil.rmtree(base / "space")
        if "compaction" in args.parts:
            compaction = part_compaction(base / "compaction", args)
            print(json.dumps({"compaction": compaction}, indent=2), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
