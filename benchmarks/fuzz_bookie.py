"""Protocol fuzzing of a running bookie process (docs/reliability.md): frames of a real Java
client's captures (tests/data/bookkeeper-java/wire/, v2 and v3) mutated at random (bit flips,
cuts, lying length prefixes, wrong versions and opcodes, splices, random bytes), sent in batches over
fresh connections from several threads, while slow byte-by-byte senders, half-open connections and
thousands of idle connections hang on. Every second a good client adds and reads an entry (latency
measured) and the bookie's RSS is sampled. The bookie must stay up, keep answering the good client,
keep its memory bounded, and stop cleanly at the end.

    python benchmarks/fuzz_bookie.py                      # 1,000,000 frames
    python benchmarks/fuzz_bookie.py --frames 20000       # a quick run
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import socket
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bkctl import limits  # noqa: E402
from bkctl.commands.sandbox_procs import BookieChild, start_children  # noqa: E402
from bkctl.metadata.stores import layout_at  # noqa: E402
from bkctl.protocol import wire  # noqa: E402
from tests.server_net.wire_client import WireClient  # noqa: E402

CAPTURES = REPO / "tests" / "data" / "bookkeeper-java" / "wire"
FRAMES_PER_CONNECTION_MAX = 40
SENDERS = 4
REPLY_WAIT_S = 2.0
PROBE_LEDGER = 987_654_321


def captured_frames() -> list[bytes]:
    """Every client->bookie frame payload (without its length prefix) of the Java captures."""
    frames = []
    for path in sorted(CAPTURES.glob("*.frames.json")):
        for connection in json.loads(path.read_text()):
            frames += [
                bytes.fromhex(f["frame_hex"]) for f in connection["frames"] if f["dir"] == "client->bookie"
            ]
    if not frames:
        raise SystemExit(f"fuzz: no captured frames under {CAPTURES}")
    return frames


def mutate(rng: random.Random, seeds: list[bytes]) -> bytes:
    """One framed request: a captured frame, most often damaged one way or another."""
    payload = bytearray(rng.choice(seeds))
    kind = rng.randrange(8)
    if kind == 0:  # bit flips
        for _ in range(rng.randint(1, 8)):
            payload[rng.randrange(len(payload))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # cut short, honestly framed
        payload = payload[: rng.randrange(len(payload))]
    elif kind == 2:  # another version or opcode
        payload[rng.choice((0, 1))] = rng.choice((0, 1, 3, 4, 9, 0x7F, 0xFF))
    elif kind == 3:  # random bytes
        payload = bytearray(rng.randbytes(rng.randrange(200)))
    elif kind == 4:  # two frames spliced
        other = rng.choice(seeds)
        payload = payload[: rng.randrange(len(payload))] + other[rng.randrange(len(other)) :]
    elif kind == 5:  # a lying length prefix
        lie = rng.choice((-1, 0, 1, len(payload) + 7, limits.FRAME_SIZE_MAX + 1, 2**31 - 1))
        return struct.pack(">i", lie) + bytes(payload)
    # kinds 6, 7: the frame as captured (adds, reads and fencing reads of the capture's ledgers)
    return wire.frame(bytes(payload))


@dataclass
class Tally:
    frames: int = 0
    connections: int = 0
    replies_bytes: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, frames: int, replies: int) -> None:
        with self.lock:
            self.frames += frames
            self.connections += 1
            self.replies_bytes += replies


def sender(port: int, seed: int, frames: int, seeds: list[bytes], tally: Tally) -> None:
    rng = random.Random(seed)
    sent = 0
    while sent < frames:
        batch = [
            mutate(rng, seeds) for _ in range(min(frames - sent, rng.randint(1, FRAMES_PER_CONNECTION_MAX)))
        ]
        try:
            received = exchange(port, b"".join(batch))
        except OSError as exc:  # refused or reset: the bookie must still be there (checked by probes)
            with tally.lock:
                tally.errors.append(f"{type(exc).__name__}: {exc}")
            received = 0
        tally.add(len(batch), received)
        sent += len(batch)


def exchange(port: int, data: bytes) -> int:
    """Send, half-close, read until the bookie closes or goes quiet; bytes of replies received."""
    received = 0
    with socket.create_connection(("127.0.0.1", port), timeout=REPLY_WAIT_S) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while chunk := sock.recv(1 << 16):
                received += len(chunk)
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            pass
    return received


def slow_sender(port: int, frame: bytes, stop: threading.Event) -> int:
    """A valid frame a byte at a time, 5 ms apart, again and again: replies must still come."""
    answered = 0
    while not stop.is_set():
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            for byte in frame:
                sock.sendall(bytes([byte]))
                time.sleep(0.005)
            if sock.recv(1 << 16):
                answered += 1
    return answered


def raise_file_limit(count: int) -> None:
    """Room for `count` more descriptors here and in the bookie process started after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 1024)), hard))


def hang_on(port: int, count: int) -> list[socket.socket]:
    """`count` connections that sent half a frame header (half-open requests) or nothing at all."""
    held = []
    for n in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if n % 2:
            sock.sendall(b"\x00\x00")
        held.append(sock)
    return held


@dataclass
class Probe:
    """A good client's add + read once a second, and the bookie's RSS."""

    port: int
    pid: int
    latencies_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)

    def once(self, entry_id: int) -> None:
        self.rss_mb.append(rss_mb(self.pid))
        started = time.perf_counter()
        try:
            with WireClient("127.0.0.1", self.port, timeout_s=10) as client:
                payload = f"probe {entry_id}".encode()
                added = client.add(PROBE_LEDGER, entry_id, payload).rc
                assert added == wire.ReturnCode.EOK, f"add rc {added}"
                read = client.read(PROBE_LEDGER, entry_id).rc
                assert read == wire.ReturnCode.EOK, f"read rc {read}"
        except (OSError, AssertionError) as exc:
            self.failures.append(f"probe {entry_id}: {type(exc).__name__}: {exc}")
            return
        self.latencies_ms.append((time.perf_counter() - started) * 1000)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(frames: int, idle: int, seed: int, root: Path) -> dict[str, Any]:
    uri = f"sqlite://{root / 'metadata.db'}"
    with layout_at(uri) as layout:
        layout.init_cluster()
    raise_file_limit(idle)
    (bookie,), _ = start_children(root, uri, 1, 0)
    try:
        result = fuzz(bookie, frames, idle, seed)
    finally:
        bookie.proc.terminate()
        exit_code = bookie.proc.wait(60)
    if result["probe_failures"] or exit_code != 0:
        result["bookie_log_tail"] = bookie.log_path.read_text(errors="replace")[-3000:]
    return {**result, "bookie_exit_code": exit_code}


def fuzz(bookie: BookieChild, frames: int, idle: int, seed: int) -> dict[str, Any]:
    port = bookie.serving_port()
    assert port is not None
    seeds = captured_frames()
    probe = Probe(port, bookie.proc.pid)
    probe.once(0)
    held = hang_on(port, idle)
    stop = threading.Event()
    slow = [threading.Thread(target=slow_sender, args=(port, wire.frame(s), stop)) for s in seeds[:3]]
    tally = Tally()
    share = frames // SENDERS
    senders = [
        threading.Thread(target=sender, args=(port, seed * 100 + n, share, seeds, tally))
        for n in range(SENDERS)
    ]
    started = time.monotonic()
    for thread in (*slow, *senders):
        thread.start()
    entry_id = 1
    while any(t.is_alive() for t in senders):
        probe.once(entry_id)
        entry_id += 1
        time.sleep(1.0)
    seconds = time.monotonic() - started
    stop.set()
    for thread in (*senders, *slow):
        thread.join(60)
    for sock in held:
        sock.close()
    probe.once(entry_id)
    latencies = sorted(probe.latencies_ms)
    return {
        "frames": tally.frames,
        "connections": tally.connections + len(held),
        "idle_connections": len(held),
        "seconds": round(seconds, 1),
        "frames_per_s": round(tally.frames / seconds),
        "send_errors": len(tally.errors),
        "probe_failures": probe.failures[:10],
        "probes": len(probe.latencies_ms),
        "probe_ms_median": round(latencies[len(latencies) // 2], 2) if latencies else None,
        "probe_ms_max": round(latencies[-1], 2) if latencies else None,
        "rss_mb_start": round(probe.rss_mb[0], 1),
        "rss_mb_max": round(max(probe.rss_mb), 1),
        "rss_mb_end": round(probe.rss_mb[-1], 1),
        "bookie_alive": bookie.proc.poll() is None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--idle", type=int, default=2000, help="connections held open meanwhile")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bkctl-fuzz-") as tmp:
        result = run(args.frames, args.idle, args.seed, Path(tmp))
    print(json.dumps(result), flush=True)
    ok = result["bookie_alive"] and not result["probe_failures"] and result["bookie_exit_code"] == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
