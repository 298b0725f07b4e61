"""A bookie killed (SIGKILL) in the middle of `bkctl ledger write`: the writer replaces it (ensemble
change), finishes with exit 0, and every entry reads back.

The entries come on stdin, half before the kill and half after, so that the kill falls mid-write on a
machine of any speed (a timed sleep let a fast CI machine finish all of them first)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from bkctl.errors import ExitCode
from bkctl.metadata.stores import layout_at
from tests.commands.sandbox_proc import WAIT_S, Sandbox, bkctl
from tests.commands.test_sandbox_supervision import until
from tests.conftest import REPO
from tests.server_net.live import BookieProcess, metadata_uri
from tests.server_net.test_commands import bkctl as server_bkctl
from tests.server_net.test_commands import dirs

ENTRIES = 20_000


def bookie_pids(sandbox_pid: int) -> dict[str, int]:
    """Child bookie processes of a `sandbox --processes`, by the port file they were given."""
    children = Path(f"/proc/{sandbox_pid}/task/{sandbox_pid}/children").read_text().split()
    found = {}
    for pid in map(int, children):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        port_file = Path(args[args.index(b"--port-file") + 1].decode())
        found[f"127.0.0.1:{int(port_file.read_text())}"] = pid
    return found


def entry_line(entry_id: int) -> str:
    return f"E{entry_id}-" + "x" * 1000 + "\n"


def test_bookie_killed_mid_write_loses_no_acknowledged_entry(tmp_path: Path) -> None:
    # The writer alone must cope: no restart of the killed bookie, no autorecovery repairing behind it.
    sandbox = Sandbox(
        tmp_path / "sb",
        "--processes",
        "--no-restart",
        "--no-autorecovery",
        "--bookies",
        "4",
        "--base-port",
        "0",
    )
    try:
        uri = str(sandbox.wait_ready()["metadata_uri"])
        pids = bookie_pids(sandbox.proc.pid)
        writer = subprocess.Popen(
            [sys.executable, "-m", "bkctl", "ledger", "write", "--from-file", "-", "-o", "json"],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "BKCTL_METADATA": uri},
        )  # fmt: skip
        assert writer.stderr is not None and writer.stdin is not None
        created = writer.stderr.readline()  # "ledger N created on a,b,c"
        assert "created on" in created, created
        victim = created.split()[-1].split(",")[0]
        half = ENTRIES // 2
        writer.stdin.write("".join(entry_line(i) for i in range(half)))
        writer.stdin.flush()
        # Some adds acknowledged (entry 0 readable up to the last add confirmed, without recovery);
        # the second half must go to a new ensemble.
        ledger_id = created.split()[created.split().index("ledger") + 1]
        first = ("ledger", "read", ledger_id, "--last", "0")
        until(lambda: bkctl(*first, metadata=uri).returncode == 0, "an entry acknowledged")
        os.kill(pids[victim], signal.SIGKILL)
        writer.stdin.write("".join(entry_line(i) for i in range(half, ENTRIES)))
        out, err = writer.communicate(timeout=WAIT_S * 2)
        assert writer.returncode == 0, created + err
        result = json.loads(out)
        assert (result["entries_written"], result["last_entry_id"]) == (ENTRIES, ENTRIES - 1)
        ledger = str(result["ledger_id"])
        info = json.loads(bkctl("ledger", "inspect", ledger, "-o", "json", metadata=uri).stdout)
        assert info["state"] == "CLOSED" and info["last_entry_id"] == ENTRIES - 1
        assert len(info["segments"]) >= 2 and victim not in info["segments"][-1]["ensemble"]
        read = bkctl("ledger", "read", ledger, "--as-text", "-o", "plain", metadata=uri)
        assert read.returncode == 0, read.stderr
        rows = [line.split("\t") for line in read.stdout.splitlines()]
        assert [(row[0], row[2] + "\n") for row in rows] == [(str(i), entry_line(i)) for i in range(ENTRIES)]
    finally:
        sandbox.stop()


def test_cookie_update_is_refused_while_a_bookie_holds_the_directories(tmp_path: Path) -> None:
    """`bookie cookie update` on the directories of a running bookie (under another id, so
    the registration check cannot stop it) is refused by the directory lock: exit 13, one line naming
    the holder's pid; no cookie changed, in the directories or in the metadata store."""
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b1"
    bookie = BookieProcess([*dirs(base), "--metadata", uri, "-p", "0", "--bookie-id", "127.0.0.1:4601"])
    try:
        bookie.wait_serving()
        cookie_files = sorted(base.glob("*/current/VERSION"))
        before = [path.read_bytes() for path in cookie_files]
        update = server_bkctl(
            "bookie", "cookie", "update", *dirs(base), "--bookie-id", "127.0.0.1:4602", "--metadata", uri
        )
        assert update.returncode == ExitCode.LOCKED, update.stderr
        assert update.stderr.count("\n") == 1 and update.stderr.startswith("bkctl: error: "), update.stderr
        assert f"is in use by another process (pid {bookie.proc.pid}, bkctl bookie start" in update.stderr
        assert len(cookie_files) == 2 and [path.read_bytes() for path in cookie_files] == before
        with layout_at(uri) as layout:
            assert sorted(layout.cookie_bookies()) == ["127.0.0.1:4601"]
        assert bookie.terminate() == 0
    finally:
        bookie.kill()
