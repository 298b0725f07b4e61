"""Autorecovery faults with processes: two autorecovery daemons; a bookie dies; the daemon holding a
replication lock (and maybe the auditor's role) is killed -9 mid-copy. Its lock and vote go with its
session; the other daemon finishes: no mark left, no ensemble naming the dead bookie, no ensemble with
a bookie twice, every replica there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.commands.sandbox_proc import Sandbox, assert_fully_replicated, bkctl, naming, write_ledgers
from tests.commands.test_sandbox_supervision import bookie_pids, until
from tests.conftest import REPO

pytestmark = pytest.mark.slow
# A session expiry (10 s), an audit, the copies and a second expiry when a daemon is killed: bounded, generous
# for a loaded CI machine.
HEAL_WAIT_S = 150.0


def daemon(uri: str, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bkctl", "autorecovery", "start", "--metadata", uri, "--bookie-id", name,
         "--parallel", "1"],
        cwd=REPO, stderr=open(f"/tmp/daemon-{name}.log", "w"), text=True,
    )  # fmt: skip


def test_a_worker_killed_mid_copy_is_finished_by_the_other(tmp_path: Path) -> None:
    root = tmp_path / "sb"
    sandbox = Sandbox(
        root, "--processes", "--no-restart", "--no-autorecovery", "--bookies", "5", "--base-port", "0"
    )
    daemons = {}
    try:
        ready = sandbox.wait_ready()
        uri = str(ready["metadata_uri"])
        bookies = list(ready["bookies"])  # type: ignore[call-overload]
        ledgers = write_ledgers(uri, 10, 4000, 1000)
        daemons = {name: daemon(uri, name) for name in ("10.0.0.1:1", "10.0.0.2:1")}
        until(
            lambda: json.loads(bkctl("autorecovery", "status", "-o", "json", metadata=uri).stdout)[
                "auditor_running"
            ],
            "an auditor",
        )
        dead = bookies[0]
        os.kill(bookie_pids(root)[int(dead.rsplit(":", 1)[1])], signal.SIGKILL)

        def someone_copying() -> str | None:
            rows = json.loads(bkctl("underreplicated", "list", "-o", "json", metadata=uri).stdout)
            holders = [r["replication_worker"] for r in rows if r["replication_worker"]]
            return holders[0] if holders else None

        def healed() -> bool:
            count = json.loads(
                bkctl("underreplicated", "list", "--count", "-o", "json", metadata=uri).stdout
            )["count"]
            return count == 0 and naming(uri, ledgers, dead) == 0

        # Copies are quick: the locks may all be gone between two looks; then there is nothing to kill.
        until(lambda: someone_copying() is not None or healed(), "a worker holding a lock")
        victim = someone_copying()
        if victim in daemons:
            daemons[victim].kill()  # kill -9, mid-copy: its lock goes with its session
        until(healed, "healed by the surviving daemon", HEAL_WAIT_S)
        for ledger in ledgers:
            info = json.loads(bkctl("ledger", "inspect", str(ledger), "-o", "json", metadata=uri).stdout)
            for segment in info["segments"]:
                assert len(set(segment["ensemble"])) == len(segment["ensemble"]), segment  # no duplicate
        assert_fully_replicated(uri, ledgers)
    finally:
        for proc in daemons.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        assert sandbox.stop(signal.SIGINT) == 0


def test_the_auditor_killed_then_a_bookie_lost_the_other_daemon_audits_and_heals(tmp_path: Path) -> None:
    """AuditorBookieTest: the auditor dies (kill -9) as a bookie is lost; the other daemon is elected once
    the dead auditor's session expires, audits what it finds at its start, and the ledgers heal."""
    root = tmp_path / "sb"
    sandbox = Sandbox(
        root, "--processes", "--no-restart", "--no-autorecovery", "--bookies", "4", "--base-port", "0"
    )
    daemons = {}
    try:
        ready = sandbox.wait_ready()
        uri, bookies = str(ready["metadata_uri"]), list(ready["bookies"])  # type: ignore[call-overload]
        written = [
            json.loads(bkctl("ledger", "write", "--entries", "300", "-o", "json", metadata=uri).stdout)[
                "ledger_id"
            ]
            for _ in range(3)
        ]
        daemons = {name: daemon(uri, name) for name in ("10.0.0.1:1", "10.0.0.2:1")}

        def auditor() -> str | None:
            found = json.loads(
                bkctl("autorecovery", "whoisauditor", "-o", "json", metadata=uri).stdout or "{}"
            )
            return found.get("auditor") if found.get("auditor_running") else None

        until(lambda: auditor() in daemons, "an auditor")
        first = auditor()
        assert first is not None
        daemons[first].kill()
        dead = bookies[0]
        os.kill(bookie_pids(root)[int(dead.rsplit(":", 1)[1])], signal.SIGKILL)
        until(lambda: auditor() not in (None, first), "the other daemon elected")

        def healed() -> bool:
            count = json.loads(
                bkctl("underreplicated", "list", "--count", "-o", "json", metadata=uri).stdout
            )["count"]
            named = [
                i
                for i in written
                if dead in bkctl("ledger", "inspect", str(i), "-o", "json", metadata=uri).stdout
            ]
            return count == 0 and not named

        until(healed, "healed", HEAL_WAIT_S)
    finally:
        for proc in daemons.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        assert sandbox.stop(signal.SIGINT) == 0
