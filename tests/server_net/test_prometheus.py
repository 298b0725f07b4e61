"""examples/grafana/bookkeeper.json works: a real Prometheus server (Debian's `prometheus`, installed by
scripts/install-system-deps) scrapes a running bookie and an autorecovery daemon, and every query of the
dashboard, evaluated through Prometheus's HTTP API, returns data. Prometheus also parses the op stats'
summaries as Java writes them: 7 quantiles of each `success` value, with numbers once a window
(`prometheusStatsLatencyRolloverSeconds=1` here) saw adds and reads."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.server_net.live import WAIT_S, in_thread, metadata_uri, start_bookie, twisted_test
from tests.server_net.wire_client import WireClient

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "examples" / "grafana" / "bookkeeper.json"
DAEMON_HOST = "127.0.0.2"  # not the default (127.0.0.1): Prometheus finds the daemon where its conf says
QUERY_WAIT_S = 90.0  # a busy machine: two scrapes a second, rates over a 1 m window need two samples


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


# Prometheus's view of the op stats: every quantile series, and quantiles that are numbers (not NaN).
OP_STAT_QUERIES = [
    "count(bookkeeper_server_ADD_ENTRY_REQUEST) == 14",
    'count(bookie_journal_JOURNAL_SYNC{quantile="1.0"}) == 2',
    'max_over_time(bookkeeper_server_ADD_ENTRY_REQUEST{success="true",quantile="0.99"}[5m]) > 0',
    'max_over_time(bookkeeper_server_READ_ENTRY_REQUEST{success="true",quantile="0.5"}[5m]) >= 0',
    'max_over_time(bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES{success="true",quantile="1.0"}[5m]) >= 1',
]


def start_daemon(uri: str, conf: Path) -> tuple[subprocess.Popen[str], int]:
    """The daemon, its HTTP server on DAEMON_HOST (its conf's httpServerHost); its port."""
    conf.write_text(f"httpServerHost={DAEMON_HOST}\n")
    command = ["autorecovery", "start", "--metadata", uri, "--http-port", "0", "--conf", str(conf)]
    daemon = subprocess.Popen(
        [sys.executable, "-m", "bkctl", *command],
        cwd=REPO,
        text=True,
        stderr=subprocess.PIPE,
    )
    assert daemon.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(daemon.stderr or ()), daemon=True)
    reader.start()
    deadline = time.monotonic() + WAIT_S * 2
    while time.monotonic() < deadline:
        for line in list(lines):
            match = re.search(rf"metrics on {re.escape(DAEMON_HOST)}:(\d+)", line)
            if match:
                return daemon, int(match.group(1))
        assert daemon.poll() is None, "".join(lines)
        time.sleep(0.05)
    daemon.kill()
    raise AssertionError("autorecovery daemon did not start:\n" + "".join(lines))


def start_prometheus(tmp_path: Path, targets: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("prometheus")
    assert binary is not None, "prometheus is not installed: run scripts/install-system-deps"
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 500ms\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: bkctl\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(t) for t in targets)}]\n"
    )
    port = free_port()
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("wb"),
    )
    return server, port


def query(port: int, expr: str) -> list[Any]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.loads(answer.read())
    except OSError:
        return []  # not up yet
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def wait_for_data(port: int, expressions: list[str], poke: Callable[[], None]) -> dict[str, list[Any]]:
    """The expressions' results, asked until each has some; `poke` makes traffic between rounds (the op
    stats' quantiles are those of the last complete window: it must see events while Prometheus scrapes)."""
    found: dict[str, list[Any]] = {}
    deadline = time.monotonic() + QUERY_WAIT_S
    while time.monotonic() < deadline and len(found) < len(expressions):
        poke()
        for expr in expressions:
            if expr not in found:
                result = query(port, expr)
                if result:
                    found[expr] = result
        time.sleep(0.5)
    return found


@twisted_test
async def test_every_dashboard_query_returns_data(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    service = await start_bookie(
        tmp_path,
        uri=uri,
        httpServerEnabled="true",
        httpServerPort="0",
        prometheusStatsLatencyRolloverSeconds="1",
    )
    daemon = None
    prometheus = None
    try:
        assert service.gc is not None
        await service.gc.trigger(force_major=True)
        daemon, daemon_port = await in_thread(start_daemon, uri, tmp_path / "daemon.conf")
        targets = [f"127.0.0.1:{service.http_port}", f"{DAEMON_HOST}:{daemon_port}"]
        prometheus, port = await in_thread(start_prometheus, tmp_path, targets)

        def traffic_and_queries() -> dict[str, list[Any]]:
            with WireClient("127.0.0.1", service.port) as client:
                entries = itertools.count()

                def add_and_read() -> None:
                    entry = next(entries)
                    client.add(7, entry, b"x" * 100)
                    client.read(7, entry)

                for _ in range(20):
                    add_and_read()
                    time.sleep(0.05)
                return wait_for_data(port, dashboard_queries() + OP_STAT_QUERIES, add_and_read)

        found = await in_thread(traffic_and_queries)
        missing = [expr for expr in dashboard_queries() + OP_STAT_QUERIES if expr not in found]
        log = (tmp_path / "prometheus.log").read_text()[-2000:]
        assert not missing, f"queries without data: {missing}\n{log}"
    finally:
        for process in (prometheus, daemon):
            if process is not None:
                process.terminate()
                try:
                    process.wait(WAIT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(WAIT_S)
        await service.stop()
