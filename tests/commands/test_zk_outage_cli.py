"""A ZooKeeper outage as an operator sees it: bookie processes and `bkctl ledger write` on ZooKeeper,
ZooKeeper paused (SIGSTOP) past every session timeout during the write. The writer ends with exit 0 and
its JSON, the bookies are registered read-write again, every entry is readable. And when the pause
outlasts the writer's metadata deadline, the writer says how far it got and `ledger fence` closes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bkctl.commands.sandbox_procs import start_children, stop_children
from bkctl.errors import ExitCode
from bkctl.metadata.layout import Layout
from bkctl.metadata.zk_server import ZooKeeperServer
from bkctl.metadata.zookeeper import ZooKeeperStore
from tests.commands.sandbox_proc import bkctl, registered
from tests.commands.test_sandbox_supervision import until
from tests.conftest import REPO

pytestmark = pytest.mark.slow
PAUSE_S = 6.0  # the server's sessions last at most 4 s (tickTime 200 ms): every session expires


@contextmanager
def zk_cluster(tmp_path: Path, bookies: int = 4) -> Iterator[tuple[ZooKeeperServer, list[str]]]:
    """A throwaway ZooKeeper (sessions of at most 4 s) with an initialized cluster and bookie processes."""
    with ZooKeeperServer(tick_ms=200) as server:
        with ZooKeeperStore(server.hosts) as store:
            Layout(store).init_cluster()
        children, ids = start_children(tmp_path, server.hosts, bookies, 0)
        try:
            yield server, ids
        finally:
            stop_children(children)


def start_writer(uri: str, entries: int, *root_options: str) -> subprocess.Popen[str]:
    """`bkctl [root options] ledger write` of `entries` 100-byte entries, once it has created its ledger."""
    writer = subprocess.Popen(
        [sys.executable, "-m", "bkctl", *root_options, "ledger", "write", "--entries", str(entries),
         "--size", "100", "-E", "4", "-Qw", "3", "-Qa", "2", "--metadata", uri, "-o", "json"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert writer.stderr is not None and "created on" in writer.stderr.readline()
    return writer


def test_a_write_rides_through_a_zookeeper_pause(tmp_path: Path) -> None:
    with zk_cluster(tmp_path) as (server, ids):
        uri = server.hosts
        writer = start_writer(uri, 150_000)
        server.pause(PAUSE_S)
        out, err = writer.communicate(timeout=180)
        assert writer.returncode == 0, err
        document = json.loads(out)
        assert document == {"ledger_id": document["ledger_id"], "entries_written": 150000,
                            "last_entry_id": 149999, "closed": True}  # fmt: skip

        until(lambda: set(ids) <= registered(uri, readonly=False), "every bookie registered read-write again")
        listed = bkctl("bookie", "list", "-o", "plain", metadata=uri).stdout
        assert all(f"{b}\trw" in listed for b in ids), listed
        # 150,000 entries read from every copy: past the default 60 s bound on a loaded machine.
        check = bkctl(
            "ledger", "check", str(document["ledger_id"]), "--full", "-o", "json", metadata=uri, timeout_s=180
        )
        assert check.returncode == 0, check.stdout + check.stderr


def test_a_close_that_cannot_reach_zookeeper_by_the_deadline_says_how_far_it_got(tmp_path: Path) -> None:
    """The adds are acknowledged, the close meets a ZooKeeper paused longer than the
    1 s deadline: the JSON still names the ledger and the acknowledged range, with `closed: false` and the
    error, stderr says `bkctl ledger fence <id>` closes it, exit 6. Once ZooKeeper is back, the ledger is
    closed (by the fence, or by the close's request ZooKeeper applied when it went on) at the last
    acknowledged entry, every entry readable."""
    with zk_cluster(tmp_path, bookies=4) as (server, _):
        uri = server.hosts
        entries = 20_000
        assert server.pid is not None
        writer = start_writer(uri, entries, "--metadata-timeout", "1000")
        os.kill(server.pid, signal.SIGSTOP)  # adds need no metadata; the close does
        try:
            out, err = writer.communicate(timeout=120)  # fails while ZooKeeper is still paused
        finally:
            os.kill(server.pid, signal.SIGCONT)
        assert writer.returncode == ExitCode.UNAVAILABLE, err
        document = json.loads(out)
        ledger_id = document["ledger_id"]
        assert isinstance(ledger_id, int) and document["error"]
        assert document == {"ledger_id": ledger_id, "entries_written": entries, "last_entry_id": entries - 1,
                            "closed": False, "error": document["error"]}  # fmt: skip
        assert f"`bkctl ledger fence {ledger_id}` closes it" in err
        assert err.splitlines()[-1].startswith("bkctl: error: "), err

        fence = bkctl("ledger", "fence", str(ledger_id), "-o", "json", metadata=uri, timeout_s=120)
        # 11: the close's request was in ZooKeeper's socket when it stopped and was applied when it went
        # on (the writer could not know); either way the ledger ends CLOSED at the last acknowledged entry.
        assert fence.returncode in (ExitCode.OK, ExitCode.CLOSED), fence.stderr
        fenced = json.loads(fence.stdout)
        assert (fenced["state"], fenced["last_entry_id"]) == ("CLOSED", entries - 1)
        check = bkctl("ledger", "check", str(ledger_id), "--full", "-o", "json", metadata=uri, timeout_s=120)
        assert check.returncode == 0, check.stdout + check.stderr
