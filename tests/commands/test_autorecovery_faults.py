"""Autorecovery faults with processes: two autorecovery daemons; a bookie dies; the daemon holding a
replication lock (and maybe the auditor's role) is killed -9 mid-copy. Its lock and vote go with its
session; the other daemon finishes: no mark left, no ensemble naming the dead bookie, no ensemble with
a bookie twice, every replica there.

The waits read the metadata in-process (a store of the test's own): each look is milliseconds, not a
`bkctl` process start; the commands that show the same state are tested in test_autorecovery_commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bkctl.metadata.layout import Layout
from bkctl.metadata.stores import open_store
from tests.commands.sandbox_proc import Sandbox, assert_fully_replicated, bkctl_all, write_ledgers
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


def lock_holders(layout: Layout) -> list[str]:
    """The workers holding a replication lock of a marked ledger now."""
    return [e.replication_worker for e in layout.underreplicated_ledgers() if e.replication_worker]


def healed(layout: Layout, ledgers: list[int], dead: str) -> bool:
    """No mark left and no ensemble of `ledgers` naming `dead`."""
    if next(iter(layout.underreplicated_ids()), None) is not None:
        return False
    return not any(dead in s.ensemble for _, md in layout.read_ledgers(ledgers) for s in md.segments)


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
        # 2 MB ledgers: a copy holds its lock long enough to be seen by a look every 0.1 s, and every
        # entry is copied and read back in full at the end.
        ledgers = write_ledgers(uri, 10, 2000, 1000)
        daemons = {name: daemon(uri, name) for name in ("10.0.0.1:1", "10.0.0.2:1")}
        with open_store(uri) as store:
            layout = Layout(store)
            until(lambda: layout.current_auditor() is not None, "an auditor")
            dead = bookies[0]
            os.kill(bookie_pids(root)[int(dead.rsplit(":", 1)[1])], signal.SIGKILL)
            # Copies are quick: the locks may all be gone between two looks; then there is nothing to kill.
            until(
                lambda: bool(lock_holders(layout)) or healed(layout, ledgers, dead), "a worker holding a lock"
            )
            victim = next(iter(lock_holders(layout)), None)
            if victim in daemons:
                daemons[victim].kill()  # kill -9, mid-copy: its lock goes with its session
            until(lambda: healed(layout, ledgers, dead), "healed by the surviving daemon", HEAL_WAIT_S)
            for _, md in layout.read_ledgers(ledgers):
                for segment in md.segments:
                    assert len(set(segment.ensemble)) == len(segment.ensemble), md  # no bookie twice
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
        writes = bkctl_all([["ledger", "write", "--entries", "300", "-o", "json"]] * 3, uri)
        written = [json.loads(write.stdout)["ledger_id"] for write in writes]
        daemons = {name: daemon(uri, name) for name in ("10.0.0.1:1", "10.0.0.2:1")}
        with open_store(uri) as store:
            layout = Layout(store)
            until(lambda: layout.current_auditor() in daemons, "an auditor")
            first = layout.current_auditor()
            assert first is not None
            daemons[first].kill()
            dead = bookies[0]
            os.kill(bookie_pids(root)[int(dead.rsplit(":", 1)[1])], signal.SIGKILL)
            until(lambda: layout.current_auditor() not in (None, first), "the other daemon elected")
            until(lambda: healed(layout, written, dead), "healed", HEAL_WAIT_S)
    finally:
        for proc in daemons.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        assert sandbox.stop(signal.SIGINT) == 0
