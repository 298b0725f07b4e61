"""A bookie stopped while ZooKeeper is gone: it waits a bounded time for its registration's removal, then
drains its journal and checkpoints as any stop, instead of retrying the unregister for the whole
metadata deadline (120 s) first."""

from __future__ import annotations

import subprocess
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
