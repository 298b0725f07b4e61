"""`bkctl sandbox --demo`, a sandbox restarted on its data dir, SIGTERM, and `bkctl bench` short runs."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest

from tests.commands.sandbox_proc import Sandbox, bkctl

BENCH_KEYS = {
    "mode",
    "entry_size",
    "outstanding",
    "duration_s",
    "ops",
    "seconds",
    "ops_per_s",
    "mb_per_s",
    "latency_ms",
    "errors",
    "ledgers",
}


def free_port_range(count: int) -> int:
    """A base port with `count` free ports after it (best effort: probed, then released)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    pytest.fail("no free port range")


def test_demo_writes_fences_reads_and_stops_with_exit_0(tmp_path: Path) -> None:
    done = bkctl("sandbox", "--demo", "--data-dir", str(tmp_path / "demo"), "-o", "json", timeout_s=120)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    ledger = document["ledger"]
    assert (ledger["state"], ledger["last_entry_id"], ledger["length"]) == ("CLOSED", 999, 1000 * 1024)
    assert (ledger["ensemble_size"], ledger["write_quorum"], ledger["ack_quorum"]) == (3, 2, 2)
    assert len(document["cluster"]["bookies_rw"]) == 3 and document["cluster"]["ledger_count"] == 1
    assert "every byte matches" in done.stderr and "sandbox stopped" in done.stderr
    assert "Traceback" not in done.stderr


def test_sandbox_restarts_on_its_data_dir_and_stops_on_sigterm(tmp_path: Path) -> None:
    data = tmp_path / "sb"
    base = free_port_range(2)
    first = Sandbox(data, "--bookies", "2", "--base-port", str(base))
    ready = first.wait_ready()
    assert ready["bookies"] == [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
    uri = str(ready["metadata_uri"])
    assert uri == f"sqlite://{data.absolute() / 'metadata.db'}"
    written = bkctl("ledger", "write", "--entries", "20", "-E", "2", "-Qw", "2", "-Qa", "2", "-o", "json",
                    metadata=uri)  # fmt: skip
    assert written.returncode == 0, written.stderr
    assert first.stop(signal.SIGTERM) == 0
    second = Sandbox(data, "--bookies", "2", "--base-port", str(base))
    try:
        assert second.wait_ready()["bookies"] == ready["bookies"]
        read = bkctl("ledger", "read", "0", "--as-text", "-o", "json", metadata=uri)
        assert read.returncode == 0, read.stderr
        assert [e["payload"] for e in json.loads(read.stdout)] == [f"L0-E{i}" for i in range(20)]
    finally:
        assert second.stop(signal.SIGINT) == 0


def test_bench_write_and_read_json(tmp_path: Path) -> None:
    sandbox = Sandbox(tmp_path / "bench", "--base-port", "0")
    try:
        uri = str(sandbox.wait_ready()["metadata_uri"])
        args = ("bench", "write", "--duration", "1", "--outstanding", "16", "--ledgers", "2", "-o", "json")
        done = bkctl(*args, metadata=uri)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert BENCH_KEYS | {"ensemble_size", "write_quorum", "ack_quorum"} == set(result)
        assert result["mode"] == "write" and result["ops"] > 0 and result["errors"] == 0
        assert set(result["latency_ms"]) == {"p50", "p95", "p99", "max"}
        assert len(result["ledgers"]) == 2
        assert "\x1b[" not in done.stderr  # no progress display when stderr is not a terminal
        done = bkctl(
            "bench", "read", str(result["ledgers"][0]), "--duration", "1", "-o", "json", metadata=uri
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        assert set(result) == BENCH_KEYS and result["mode"] == "read" and result["ops"] > 0
        done = bkctl("bench", "write", "--outstanding", "1", "--ledgers", "2", metadata=uri)
        assert done.returncode == 2
    finally:
        assert sandbox.stop() == 0
