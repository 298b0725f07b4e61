"""`sandbox --processes` supervises its bookies.

A kill -9'd bookie used to stay a zombie with nothing said and nothing restarted. Now the sandbox reaps
it, reports it on stderr with its signal, and restarts it on its directories and port (its entries are
readable again); `--no-restart` leaves it down and says how to start it by hand; Ctrl-C still stops
every child. A port in use is exit 6 in both modes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bkctl.errors import ExitCode
from tests.commands.sandbox_proc import Sandbox, bkctl, bkctl_all

pytestmark = pytest.mark.slow
WAIT_S = 60.0


def bookie_pids(data_dir: Path) -> dict[int, int]:
    """pid of each sandbox bookie child, by its port (from /proc: the children's command lines)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "bookie" in argv and "start" in argv and any(str(data_dir) in a for a in argv):
            try:  # its port file says the port it bound (it was started with --port 0)
                found[int(Path(argv[argv.index("--port-file") + 1]).read_text())] = int(entry.name)
            except (ValueError, IndexError, OSError):
                continue
    return found


def until(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"not reached within {timeout_s} s: {what}")


def start(tmp_path: Path, *args: str) -> tuple[Sandbox, str, list[str]]:
    sandbox = Sandbox(tmp_path / "sb", "--processes", "--bookies", "3", "--base-port", "0", *args)
    ready = sandbox.wait_ready()
    return sandbox, str(ready["metadata_uri"]), list(ready["bookies"])  # type: ignore[call-overload]


def test_a_killed_bookie_is_reported_and_restarted(tmp_path: Path) -> None:
    sandbox, uri, bookies = start(tmp_path)
    try:
        written = json.loads(bkctl("ledger", "write", "--entries", "100", "-o", "json", metadata=uri).stdout)
        victim = bookies[0]
        port = int(victim.rsplit(":", 1)[1])
        pid = bookie_pids(tmp_path / "sb")[port]
        os.kill(pid, signal.SIGKILL)
        until(lambda: f"bookie {victim} (pid {pid}) was killed by SIGKILL" in "".join(sandbox.err), "report")
        until(lambda: f"bookie {victim} is serving again" in "".join(sandbox.err), "restart")
        assert bookie_pids(tmp_path / "sb")[port] != pid
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped: not our child any more, and no zombie left
        read = bkctl(
            "ledger", "read", str(written["ledger_id"]), "--bookie", victim, "-o", "json", metadata=uri
        )
        assert read.returncode == 0 and json.loads(read.stdout), read.stderr
    finally:
        code = sandbox.stop(signal.SIGINT)
    assert code == 0, "".join(sandbox.err)
    assert bookie_pids(tmp_path / "sb") == {}  # Ctrl-C stopped every child


def test_no_restart_leaves_it_down_and_a_killed_sandbox_leaves_no_child(tmp_path: Path) -> None:
    sandbox, _, bookies = start(tmp_path, "--no-restart")
    try:
        port = int(bookies[1].rsplit(":", 1)[1])
        os.kill(bookie_pids(tmp_path / "sb")[port], signal.SIGKILL)
        until(lambda: "left down (--no-restart)" in "".join(sandbox.err), "report")
        assert f"bkctl bookie start --port {port} --journal-dir" in "".join(sandbox.err)
        # Left down is decided when it dies: no restart is scheduled (that would have said so at once).
        assert "restarting bookie" not in "".join(sandbox.err)
        assert port not in bookie_pids(tmp_path / "sb")
    finally:
        sandbox.kill()  # SIGKILL: the sandbox cannot stop its children, the kernel tells them (PDEATHSIG)
    until(lambda: bookie_pids(tmp_path / "sb") == {}, "every child stopped after its sandbox was killed")


@pytest.mark.parametrize("processes", [False, True])
def test_port_in_use_is_exit_6(tmp_path: Path, processes: bool) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["--bookies", "1", "--base-port", str(port), *(["--processes"] if processes else [])]
        if processes:  # a data dir that was there keeps what it held, and only that
            (tmp_path / "sb").mkdir()
            (tmp_path / "sb" / "keep.txt").write_text("mine")
        sandbox = Sandbox(tmp_path / "sb", *args)
        try:
            code = sandbox.proc.wait(WAIT_S)
        finally:
            sandbox.kill()
    assert code == ExitCode.UNAVAILABLE, "".join(sandbox.err)
    assert "Address already in use" in "".join(sandbox.err)
    # The failed start left nothing it created: no metadata.db, no bookie-1/, no new data dir.
    left = sorted(p.name for p in (tmp_path / "sb").iterdir()) if (tmp_path / "sb").exists() else None
    assert left == (["keep.txt"] if processes else None)


def test_bad_start_options_are_one_line_and_leave_nothing(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    runs = bkctl_all(
        [
            ["sandbox", "--data-dir", str(tmp_path / "a-file")],
            ["sandbox", "--data-dir", str(tmp_path / "sb1"), "--no-restart"],
            ["sandbox", "--data-dir", str(tmp_path / "sb2"), "--metadata", "zk://127.0.0.1:1/ledgers"],
        ],
        timeout_s=120,
    )
    codes = [run.returncode for run in runs]
    assert codes == [ExitCode.USAGE, ExitCode.USAGE, ExitCode.UNAVAILABLE], [r.stderr for r in runs]
    for run, says in zip(runs, ("is a file, not a directory", "--no-restart goes with --processes",
                                "ZooKeeper 127.0.0.1:1 not reachable"), strict=True):  # fmt: skip
        assert run.stderr.startswith("bkctl: error: ") and run.stderr.count("\n") == 1, run.stderr
        assert says in run.stderr and run.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_signals_while_it_stops_are_the_same_request(tmp_path: Path) -> None:
    """A shell's SIGTERM, then a supervisor's, then Ctrl-C while it shuts down (and while its
    autorecovery daemon still starts): it stops once, exit 0, and says nothing more (each extra signal
    used to print a ReactorNotRunning traceback, a stop during the daemon's start exit 6 and another)."""
    sandbox, _, _ = start(tmp_path)
    sandbox.proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    sandbox.proc.send_signal(signal.SIGTERM)
    code = sandbox.stop(signal.SIGINT)
    time.sleep(0.2)  # the drain threads catch up with the last lines
    err = "".join(sandbox.err)
    assert code == 0, err
    assert "Traceback" not in err and "ReactorNotRunning" not in err, err
    assert bookie_pids(tmp_path / "sb") == {}
