"""Autorecovery as processes: `sandbox --processes` heals a kill -9'd bookie with nothing typed,
`bkctl autorecovery start` and `bookie start --autorecovery` join the election and stop on SIGTERM
(AutoRecoveryMainTest, BookieAutoRecoveryTest)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from urllib.request import urlopen

import pytest

from bkctl.metadata.layout import Layout
from bkctl.metadata.stores import open_store
from tests.commands.sandbox_proc import Sandbox, bkctl
from tests.commands.test_sandbox_supervision import bookie_pids, until
from tests.conftest import REPO
from tests.server_net.live import BookieProcess

pytestmark = pytest.mark.slow
# A session expiry (10 s), an audit, the copies and a second expiry when a daemon is killed: bounded, generous
# for a loaded CI machine.
HEAL_WAIT_S = 150.0


def elected(uri: str) -> str | None:
    """The current auditor, read in-process (a wait's look: no process start)."""
    with open_store(uri) as store:
        return Layout(store).current_auditor()


def whoisauditor(uri: str) -> str | None:
    found: dict[str, str] = json.loads(
        bkctl("autorecovery", "whoisauditor", "-o", "json", metadata=uri).stdout
    )
    return found.get("auditor")


def test_a_killed_bookie_heals_with_nothing_typed(tmp_path: Path) -> None:
    sandbox = Sandbox(tmp_path / "sb", "--processes", "--no-restart", "--bookies", "4", "--base-port", "0")
    try:
        uri = str(sandbox.wait_ready()["metadata_uri"])
        written = json.loads(
            bkctl("ledger", "write", "--entries", "500", "--size", "200", "-o", "json", metadata=uri).stdout
        )
        ledger = str(written["ledger_id"])
        victim = json.loads(bkctl("ledger", "inspect", ledger, "-o", "json", metadata=uri).stdout)[
            "segments"
        ][0]["ensemble"][0]
        os.kill(bookie_pids(tmp_path / "sb")[int(victim.rsplit(":", 1)[1])], signal.SIGKILL)

        with open_store(uri) as store:  # the waits read in-process: each look is no process start
            layout = Layout(store)

            def healed() -> bool:
                marked = next(iter(layout.underreplicated_ids()), None) is not None
                return not marked and victim not in layout.read_ledger(int(ledger)).value.segments[0].ensemble

            # The killed bookie's session expires first (10 s).
            until(healed, "the ledger healed", HEAL_WAIT_S)

            def reported() -> bool:  # daemons publish their status every 2 s
                statuses = [json.loads(data) for data in layout.daemon_statuses().values()]
                return bool(statuses) and statuses[0]["ledgers_replicated"] >= 1

            until(reported, "the daemon's status shows the ledger replicated")
        # What the operator sees of it, once.
        info = json.loads(bkctl("ledger", "inspect", ledger, "-o", "json", metadata=uri).stdout)
        assert victim not in info["segments"][0]["ensemble"]
        marks = bkctl("underreplicated", "list", "--count", "-o", "json", metadata=uri).stdout
        assert json.loads(marks)["count"] == 0
        check = bkctl("ledger", "check", ledger, "--full", "-o", "json", metadata=uri)
        assert check.returncode == 0, check.stdout + check.stderr
        status = json.loads(bkctl("autorecovery", "status", "-o", "json", metadata=uri).stdout)
        assert status["daemons"][0]["ledgers_replicated"] >= 1, status
    finally:
        assert sandbox.stop(signal.SIGINT) == 0


def test_autorecovery_start_and_bookie_start_autorecovery_join_the_election(tmp_path: Path) -> None:
    sandbox = Sandbox(tmp_path / "sb", "--no-autorecovery", "--bookies", "1", "--base-port", "0")
    daemon = None
    bookie = None
    try:
        uri = str(sandbox.wait_ready()["metadata_uri"])
        command = [
            "autorecovery",
            "start",
            "--metadata",
            uri,
            "--bookie-id",
            "10.0.0.9:3181",
            "--http-port",
            "0",
        ]
        daemon = subprocess.Popen(
            [sys.executable, "-m", "bkctl", *command], cwd=REPO, text=True, stderr=subprocess.PIPE
        )
        assert daemon.stderr is not None
        running = next(line for line in daemon.stderr if "running on" in line)
        threading.Thread(target=daemon.stderr.read, daemon=True).start()  # keep draining its log
        metrics_port = int(re.search(r"metrics on 127\.0\.0\.1:(\d+)", running).group(1))  # type: ignore[union-attr]
        until(lambda: elected(uri) == "10.0.0.9:3181", "elected")
        assert whoisauditor(uri) == "10.0.0.9:3181"
        bookie = BookieProcess(
            [
                "-p",
                "0",
                "-j",
                str(tmp_path / "b/j"),
                "-l",
                str(tmp_path / "b/l"),
                "--metadata",
                uri,
                "--autorecovery",
                "--http-port",
                "0",
            ]
        )
        bookie_id, _ = bookie.wait_serving()
        admin = re.search(r"admin http on [\d.]+:(\d+)", bookie.stderr)
        assert admin is not None
        bookie_metrics = urlopen(f"http://127.0.0.1:{admin.group(1)}/metrics", timeout=10).read().decode()
        assert "bkctl_autorecovery_auditor 0" in bookie_metrics and "bkctl_bookie_read_only" in bookie_metrics
        daemon_metrics = urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        assert (
            "bkctl_autorecovery_auditor 1" in daemon_metrics
            and "bkctl_autorecovery_audits_total" in daemon_metrics
        )
        # The daemon goes: the bookie's daemon, next in line, becomes the auditor at once.
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
        until(lambda: elected(uri) == bookie_id, "re-elected")
        assert whoisauditor(uri) == bookie_id
        assert bookie.terminate() == 0
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
        if bookie is not None:
            bookie.kill()
        assert sandbox.stop(signal.SIGINT) == 0


def test_a_zookeeper_away_at_the_start_is_said_and_ctrl_c_works() -> None:
    """The daemon waits for ZooKeeper (up to the metadata deadline): said on stderr, not silent for
    two minutes; Ctrl-C ends the wait (exit 130)."""
    daemon = subprocess.Popen(
        [sys.executable, "-m", "bkctl", "autorecovery", "start", "--metadata", "zk://127.0.0.1:1/ledgers"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    watchdog = threading.Timer(100, daemon.kill)
    watchdog.start()
    try:
        told = daemon.stderr.readline()  # type: ignore[union-attr]
        assert told == "bkctl: waiting for ZooKeeper at 127.0.0.1:1 (up to 120 s)\n"
        daemon.send_signal(signal.SIGINT)
        out, _ = daemon.communicate(timeout=60)
    finally:
        watchdog.cancel()
    assert daemon.returncode == 130 and out == ""
