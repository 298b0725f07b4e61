"""Issue 18's scenario as an operator saw it: bookie processes and `bkctl ledger write` on ZooKeeper,
ZooKeeper paused (SIGSTOP) past every session timeout during the write. The writer ends with exit 0 and
its JSON, the bookies are registered read-write again, every entry is readable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bkctl.commands.sandbox_procs import start_children, stop_children
from bkctl.metadata.layout import Layout
from bkctl.metadata.zk_server import ZooKeeperServer
from bkctl.metadata.zookeeper import ZooKeeperStore
from tests.commands.sandbox_proc import bkctl
from tests.commands.test_sandbox_supervision import until
from tests.conftest import REPO

pytestmark = pytest.mark.slow
PAUSE_S = 6.0  # the server's sessions last at most 4 s (tickTime 200 ms): every session expires


def test_a_write_rides_through_a_zookeeper_pause(tmp_path: Path) -> None:
    with ZooKeeperServer(tick_ms=200) as server:
        uri = server.hosts
        with ZooKeeperStore(uri) as store:
            Layout(store).init_cluster()
        children, ids = start_children(tmp_path, uri, 4, 0)
        try:
            writer = subprocess.Popen(
                [sys.executable, "-m", "bkctl", "ledger", "write", "--entries", "150000", "--size", "100",
                 "-E", "4", "-Qw", "3", "-Qa", "2", "--metadata", uri, "-o", "json"],
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert writer.stderr is not None and "created on" in writer.stderr.readline()
            assert server.pid is not None
            os.kill(server.pid, signal.SIGSTOP)
            try:
                time.sleep(PAUSE_S)
            finally:
                os.kill(server.pid, signal.SIGCONT)
            out, err = writer.communicate(timeout=180)
            assert writer.returncode == 0, err
            document = json.loads(out)
            assert document == {"ledger_id": document["ledger_id"], "entries_written": 150000,
                                "last_entry_id": 149999, "closed": True}  # fmt: skip

            def all_registered() -> bool:
                listed = bkctl("bookie", "list", "-o", "plain", metadata=uri).stdout
                return all(f"{b}\trw" in listed for b in ids)

            until(all_registered, "every bookie registered read-write again")
            check = bkctl("ledger", "check", str(document["ledger_id"]), "--full", "-o", "json", metadata=uri)
            assert check.returncode == 0, check.stdout + check.stderr
        finally:
            stop_children(children)
