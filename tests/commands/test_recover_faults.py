"""Manual recovery faults: the recover process killed -9 mid-run then run again, stopped by Ctrl-C (exit 130
and the JSON of what it did) then run again, two recovers of the same bookie at once (one refused), a metadata
store that cannot be reached (exit 6, nothing written)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bkctl.errors import ExitCode
from tests.commands.sandbox_proc import (
    Sandbox,
    assert_fully_replicated,
    bkctl,
    naming,
    registered,
    write_ledgers,
)
from tests.commands.test_sandbox_supervision import bookie_pids, until
from tests.conftest import REPO

pytestmark = pytest.mark.slow


def kill_bookie(root: Path, uri: str, bookie: str) -> None:
    """kill -9, then its registration waited out (read in-process: each look is no process start)."""
    os.kill(bookie_pids(root)[int(bookie.rsplit(":", 1)[1])], signal.SIGKILL)
    until(lambda: bookie not in registered(uri), "session expired")


def recover(uri: str, bookie: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bkctl", "recover", uri, bookie, "-o", "json", *args],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def assert_healed(uri: str, ledgers: list[int], dead: set[str]) -> None:
    for bookie in dead:
        assert naming(uri, ledgers, bookie) == 0, bookie
    assert_fully_replicated(uri, ledgers)


def test_killed_mid_run_then_again_and_two_at_once(tmp_path: Path) -> None:
    root = tmp_path / "sb"
    sandbox = Sandbox(
        root, "--processes", "--no-restart", "--no-autorecovery", "--bookies", "5", "--base-port", "0"
    )
    try:
        ready = sandbox.wait_ready()
        uri, bookies = str(ready["metadata_uri"]), list(ready["bookies"])  # type: ignore[call-overload]
        # 1.5 MB ledgers: at --rate 1 a ledger's copy takes about a second, so the runs below are
        # still copying when killed or interrupted; every ledger is read back in full twice.
        ledgers = write_ledgers(uri, 12, 1500, 1000)
        kill_bookie(root, uri, bookies[0])
        slow = recover(uri, bookies[0], "--rate", "1", "--parallel", "1")  # ~1 MB/s: still copying at 2 s
        time.sleep(2.0)
        slow.kill()
        slow.wait(30)
        # Ctrl-C once a ledger more is done: it stops between metadata updates, exit 130, and -o json
        # still prints the document of what was done so far.
        left = naming(uri, ledgers, bookies[0])
        # The killed run's lock goes with its metadata session: --wait rides that out.
        stopped = recover(uri, bookies[0], "--rate", "1", "--parallel", "1", "--wait", "120")
        until(lambda: naming(uri, ledgers, bookies[0]) < left, "a ledger recovered", 240)
        stopped.send_signal(signal.SIGINT)
        out, err = stopped.communicate(timeout=60)
        assert stopped.returncode == ExitCode.INTERRUPTED, err
        report = json.loads(out)
        assert 1 <= report["ledgers_recovered"] < report["ledgers_total"], report
        assert report["entries_copied"] > 0 and "interrupted after" in err
        again = recover(uri, bookies[0])
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
        assert json.loads(out)["ledgers_recovered"] >= 1
        assert_healed(uri, ledgers, {bookies[0]})
        # Two recovers of the next dead bookie at once: one holds the bookie's lock, the other is
        # refused (exit 15) unless the first was already done; the reports claim each ledger once.
        kill_bookie(root, uri, bookies[1])
        named = naming(uri, ledgers, bookies[1])
        both = [recover(uri, bookies[1]), recover(uri, bookies[1])]
        claimed = 0
        for proc in both:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode in (0, ExitCode.BUSY), err
            if proc.returncode == 0:
                claimed += json.loads(out)["ledgers_recovered"]
            else:
                assert out == "" and "is being recovered by another `bkctl recover`" in err, err
        assert claimed == named > 0
        assert_healed(uri, ledgers, {bookies[0], bookies[1]})
    finally:
        assert sandbox.stop(signal.SIGINT) == 0


def test_metadata_store_unreachable_is_exit_6() -> None:
    done = bkctl("recover", "127.0.0.1:1", "127.0.0.1:3181", "-o", "json")
    assert done.returncode == ExitCode.UNAVAILABLE and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "not reachable" in done.stderr
