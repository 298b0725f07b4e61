"""A bookie stopped while ZooKeeper is gone: it waits a bounded time for its registration's removal, then
drains its journal and checkpoints as any stop, instead of retrying the unregister for the whole
metadata deadline (120 s) first."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bkctl import limits
from bkctl.commands.sandbox_procs import start_children, stop_children
from bkctl.metadata.layout import Layout
from bkctl.metadata.zk_server import ZooKeeperServer
from bkctl.metadata.zookeeper import ZooKeeperStore

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_bookie_stops_promptly_when_zookeeper_is_away(tmp_path: Path, how: str) -> None:
    """Killed: connections refused. Frozen (SIGSTOP): connections open, requests unanswered."""
    with ZooKeeperServer(tick_ms=200) as server:
        with ZooKeeperStore(server.hosts) as store:
            Layout(store).init_cluster()
        children, _ = start_children(tmp_path, server.hosts, 1, 0)
        try:
            server.stop() if how == "killed" else server.freeze()
            bookie = children[0].proc
            bookie.terminate()
            try:
                bookie.wait(limits.METADATA_AT_STOP_S + 20)
            except subprocess.TimeoutExpired:
                pytest.fail("the bookie did not stop within its unregister wait and 20 s")
        finally:
            stop_children(children)
    log = children[0].log_path.read_text(errors="replace")
    assert bookie.returncode == 0, log[-2000:]
    assert "bookie stop: unregister: the metadata store did not answer within 5 s; stopping anyway" in log
    assert log.rstrip().endswith("stopped")  # the journal drained and the last checkpoint done


def test_ctrl_c_while_zookeeper_is_away_at_the_start_ends_the_bookie_at_once(tmp_path: Path) -> None:
    """The store opens on a daemon thread: a stop during that wait (up to 120 s) does not wait it out."""
    bookie = subprocess.Popen(
        [sys.executable, "-m", "bkctl", "bookie", "start", "--metadata", "zk://127.0.0.1:1/ledgers",
         "--journal-dir", str(tmp_path / "j"), "--ledger-dir", str(tmp_path / "l"), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    watchdog = threading.Timer(100, bookie.kill)
    watchdog.start()
    try:
        said = _line_saying(bookie, "bkctl: waiting for ZooKeeper at 127.0.0.1:1 (up to 120 s)")
        bookie.send_signal(signal.SIGINT)
        _, err = bookie.communicate(timeout=30)
    finally:
        watchdog.cancel()
    assert said and bookie.returncode == 0, err[-2000:]  # a stop asked for, as a running bookie's
    assert "generator ignored GeneratorExit" not in err and "Traceback" not in err


def _line_saying(process: subprocess.Popen[str], wanted: str, lines_max: int = 200) -> bool:
    """Read stderr lines (kazoo logs its retries there too) until `wanted` comes; bounded."""
    assert process.stderr is not None
    for _ in range(lines_max):
        line = process.stderr.readline()
        if not line or line.rstrip("\n") == wanted:
            return bool(line)
    return False
