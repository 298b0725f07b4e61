"""Adds to one bookie on loopback: adds/s, MB/s, latency, entries per fsync, bookie CPU per add,
next to a raw baseline (the same bytes, the same group sizes, write + fdatasync, nothing else).

The bookie is `python -m bkctl bookie start` (journal on the local disk, fsync on, admin HTTP for its
counters); the load generator is this script in `--client` mode, in its own process, pipelining v2 adds
over one connection with D in flight. Entries are CRC32C-sized templates with the entry id patched in
(the bookie does not check digests, so the client spends its CPU on the socket, not on packaging).

    python benchmarks/bookie_add.py                   # the full table (about a minute)
    python benchmarks/bookie_add.py --seconds 1 --depths 1,64 --sizes 100
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import socket
import struct
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

from bkctl.model import DigestType  # noqa: E402
from bkctl.protocol import entry as entry_codec  # noqa: E402
from bkctl.protocol import wire  # noqa: E402

MASTER_KEY = entry_codec.master_key(b"bench")
SERVING = re.compile(r"serving on [\d.]+:(\d+) \(admin http on [\d.]+:(\d+)\)")
REPLY = struct.Struct(">iIiqq")  # length prefix + add response
ENTRY_ID_OFFSET = 4 + 4 + 20 + 8  # frame prefix, header, master key, ledger id


# --- client process -----------------------------------------------------------------------------------


def frame_template(ledger_id: int, payload_size: int) -> bytearray:
    body = entry_codec.package_entry(DigestType.CRC32C, ledger_id, 0, -1, payload_size, b"x" * payload_size)
    return bytearray(wire.frame(wire.encode_add_request(body, MASTER_KEY)))


def run_client(
    port: int, ledger_id: int, payload_size: int, depth: int, warmup_s: float, seconds: float
) -> dict:
    template = frame_template(ledger_id, payload_size)
    frame_size = len(template)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sent_at: list[float] = []
    latencies: list[float] = []
    buffer = bytearray()
    next_id = acked = measured_from = 0
    start = time.perf_counter()
    measure_start = start + warmup_s
    end = measure_start + seconds
    measuring = False
    pack_id = struct.Struct(">q").pack_into
    ring = bytearray(template * depth)
    ring_view = memoryview(ring)
    while True:
        now = time.perf_counter()
        if not measuring and now >= measure_start:
            measuring, measured_from, measure_start = True, acked, now
        if now >= end:
            break
        room = depth - (next_id - acked)
        if room > 0:
            # Entry n lives in ring slot n % depth: patch its id in place, send the slots in one or two
            # writes (no per-frame copy, so the client leaves the CPU to the bookie).
            first = next_id % depth
            for n in range(next_id, next_id + room):
                pack_id(ring, (n % depth) * frame_size + ENTRY_ID_OFFSET, n)
            next_id += room
            sent_at.extend([now] * room)
            last = first + room
            if last <= depth:
                sock.sendall(ring_view[first * frame_size : last * frame_size])
            else:
                sock.sendall(ring_view[first * frame_size :])
                sock.sendall(ring_view[: (last - depth) * frame_size])
        data = sock.recv(1 << 20)
        if not data:
            raise ConnectionError("bookie closed the connection")
        buffer += data
        whole = len(buffer) // REPLY.size * REPLY.size
        now = time.perf_counter()
        for _, _, rc, _, entry_id in REPLY.iter_unpack(memoryview(buffer)[:whole]):
            if rc:
                raise RuntimeError(f"add {entry_id} failed with rc {rc}")
            if measuring:
                latencies.append(now - sent_at[entry_id])
            acked += 1
        del buffer[:whole]
    elapsed = time.perf_counter() - measure_start
    sock.close()
    latencies.sort()
    count = acked - measured_from
    return {
        "adds": count,
        "seconds": elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1000 if latencies else None,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000 if latencies else None,
        "entry_size": frame_size - 4 - 4 - 20,
    }


# --- bookie process -----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metrics(http_port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split()
            values[name] = float(value)
    return values


def start_bookie(workdir: Path, extra: list[str]) -> tuple[subprocess.Popen[str], int, int]:
    """The bookie process, its port and its admin HTTP port (from the `serving on` line)."""
    metadata = f"sqlite://{workdir / 'metadata.db'}"
    env = {**os.environ, "BKCTL_METADATA": metadata}
    init = [sys.executable, "-m", "bkctl", "cluster", "init"]
    subprocess.run(init, env=env, check=True, capture_output=True, cwd=REPO)
    # Commit a group as soon as the reactor has read everything (BookKeeper's journalFlushWhenQueueEmpty);
    # the fsync thread still groups every commit that arrives while it syncs.
    (workdir / "bk.conf").write_text("journalFlushWhenQueueEmpty=true\n" + "".join(f"{k}\n" for k in extra))
    command = [sys.executable, "-m", "bkctl", "bookie", "start", "-p", "0", "--http-port", "0"]
    command += [
        "-j",
        str(workdir / "journal"),
        "-l",
        str(workdir / "ledgers"),
        "--conf",
        str(workdir / "bk.conf"),
    ]
    bookie = subprocess.Popen(command, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    assert bookie.stderr is not None
    # A reader thread, not select() + readline(): two lines in one read would leave the second one in
    # the file object's buffer, invisible to select().
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_forward, args=(bookie.stderr, lines), daemon=True).start()
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and bookie.poll() is None:
        try:
            seen.append(lines.get(timeout=1))
        except queue.Empty:
            continue
        match = SERVING.search(seen[-1])
        if match:
            return bookie, int(match.group(1)), int(match.group(2))
    bookie.kill()
    raise RuntimeError("bookie did not start:\n" + "".join(seen))


def _forward(stream: Any, lines: queue.Queue[str]) -> None:
    """Hand the bookie's stderr lines over until it closes (later lines are just dropped)."""
    for line in stream:
        lines.put(line)


# --- raw baseline ---------------------------------------------------------------------------------------


def raw_baseline(directory: Path, entry_size: int, group: int, seconds: float) -> dict:
    """write() groups of `group` records (4-byte length + entry) to one file, fdatasync after each."""
    record = struct.pack(">i", entry_size) + b"r" * entry_size
    chunk = record * max(1, group)
    path = directory / "raw.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    latencies = []
    groups = 0
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < seconds:
            t0 = time.perf_counter()
            os.write(fd, chunk)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - t0)
            groups += 1
    finally:
        os.close(fd)
        path.unlink()
    elapsed = time.perf_counter() - started
    latencies.sort()
    adds = groups * max(1, group)
    return {
        "adds_per_s": adds / elapsed,
        "mb_per_s": adds * entry_size / elapsed / 1e6,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
    }


# --- driver ---------------------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> list[dict]:
    rows = []
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bkctl-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    bookie, port, http_port = start_bookie(base, args.conf)
    try:
        ledger_id = 1
        for size in [int(s) for s in args.sizes.split(",")]:
            for depth in [int(d) for d in args.depths.split(",")]:
                before, cpu_before = metrics(http_port), cpu_seconds(bookie.pid)
                command = [
                    sys.executable,
                    __file__,
                    "--client",
                    str(port),
                    str(ledger_id),
                    str(size),
                    str(depth),
                ]
                command += ["--warmup", str(args.warmup), "--seconds", str(args.seconds)]
                client = subprocess.run(
                    command,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                after, cpu_after = metrics(http_port), cpu_seconds(bookie.pid)
                result = json.loads(client.stdout)
                ledger_id += 1
                total_adds = after["bkctl_bookie_adds_total"] - before["bkctl_bookie_adds_total"]
                fsyncs = (
                    after["bkctl_bookie_journal_fsyncs_total"] - before["bkctl_bookie_journal_fsyncs_total"]
                )
                synced = (
                    after["bkctl_bookie_journal_synced_entries_total"]
                    - before["bkctl_bookie_journal_synced_entries_total"]
                )
                group = synced / fsyncs if fsyncs else 0.0
                raw = raw_baseline(base, result["entry_size"], round(group) or 1, args.seconds)
                row = {
                    "payload": size,
                    "depth": depth,
                    "adds_per_s": result["adds"] / result["seconds"],
                    "mb_per_s": result["adds"] * size / result["seconds"] / 1e6,
                    "p50_ms": result["p50_ms"],
                    "p99_ms": result["p99_ms"],
                    "entries_per_fsync": group,
                    "cpu_us_per_add": (cpu_after - cpu_before) / total_adds * 1e6 if total_adds else None,
                    "raw": raw,
                }
                rows.append(row)
                print(format_row(row), file=sys.stderr, flush=True)
    finally:
        bookie.terminate()
        bookie.wait(30)
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    return rows


def format_row(row: dict) -> str:
    raw = row["raw"]
    return (
        f"| {row['payload']} B | {row['depth']} | {row['adds_per_s']:,.0f} | {row['mb_per_s']:.1f} | "
        f"{row['p50_ms']:.2f} / {row['p99_ms']:.2f} | {row['entries_per_fsync']:.1f} | "
        f"{row['cpu_us_per_add']:.1f} | {raw['adds_per_s']:,.0f} ({raw['mb_per_s']:.1f} MB/s, "
        f"p50 {raw['p50_ms']:.2f} / p99 {raw['p99_ms']:.2f} ms) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--client", nargs=4, type=int, metavar=("PORT", "LEDGER", "SIZE", "DEPTH"))
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--sizes", default="100,1024")
    parser.add_argument("--depths", default="1,8,64,512")
    parser.add_argument("--conf", action="append", default=[], help="an extra bk_server.conf line, key=value")
    parser.add_argument(
        "--dir", help="work directory (journal, ledgers), kept; default: a temporary one, removed"
    )
    args = parser.parse_args()
    if args.client:
        port, ledger_id, size, depth = args.client
        print(json.dumps(run_client(port, ledger_id, size, depth, args.warmup, args.seconds)))
        return
    print(
        "| payload | in flight | adds/s | MB/s | p50 / p99 ms | entries per fsync | bookie CPU us/add | "
        "raw baseline adds/s |\n|---|---:|---:|---:|---:|---:|---:|---|"
    )
    for row in measure(args):
        print(format_row(row))


if __name__ == "__main__":
    main()
