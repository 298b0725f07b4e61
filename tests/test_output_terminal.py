"""Output for people: rich tables and colours on a terminal, progress on a terminal's
stderr; piped output byte for byte as before, no colour with NO_COLOR, no progress in a pipe.

Commands run as the console script does, in a child process whose stdout and/or stderr is a
pseudo-terminal (pty module) or a pipe, on the metadata of a real Java cluster (a ZooKeeper dump loaded
into SQLite) and a real Java bookie's journal and index files.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkctl.commands import output, progress
from bkctl.commands.output import Column, OutputFormat
from bkctl.metadata.sqlite import SqliteStore
from tests.conftest import JAVA_BOOKIES, REPO
from tests.layout.conftest import DUMP_1, load_dump

JOURNAL_DIR = JAVA_BOOKIES / "bookie1" / "journal" / "current"
INDEX_FILE = JAVA_BOOKIES / "bookie1" / "ledgers" / "current" / "0" / "1" / "1.idx"
RUN_TIMEOUT_S = 60.0
ESC = "\x1b["
RULE = "\u2500"  # rich's horizontal line under a table's header
BAR = "\u2501"  # rich's progress bar
SGR = "\x1b\\[[0-9;]*m"  # a colour or text style escape


@pytest.fixture(scope="module")
def metadata(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The first Java dump (ledger 1 OPEN, three registered bookies) in SQLite; the loading session
    stays open so the bookies stay registered (rw). One per module: its tests only read it (a load
    takes seconds of fsyncs)."""
    path = tmp_path_factory.mktemp("terminal") / "metadata.db"
    store = SqliteStore(str(path), session_timeout_ms=60_000)
    load_dump(store, DUMP_1)
    try:
        yield f"sqlite://{path}"
    finally:
        store.close()


def run(
    *args: str,
    stdout_tty: bool,
    stderr_tty: bool,
    no_color: bool = False,
    stop_after: str | None = None,
    **extra_env: str,
) -> tuple[str, str, int]:
    """`bkctl ARGS` with stdout and stderr each a pseudo-terminal or a pipe: (stdout, stderr, exit).
    `stop_after`: SIGTERM the child once its stderr holds this text (a daemon)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "BKCTL_OUTPUT")} | extra_env
    env |= {"COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color", "PYTHONPATH": str(REPO)}
    if no_color:
        env["NO_COLOR"] = "1"
    terminals: dict[str, tuple[int, int]] = {}
    for name, wanted in (("stdout", stdout_tty), ("stderr", stderr_tty)):
        if wanted:
            terminals[name] = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-m", "bkctl", *args],
        stdin=subprocess.DEVNULL,
        stdout=terminals["stdout"][1] if stdout_tty else subprocess.PIPE,
        stderr=terminals["stderr"][1] if stderr_tty else subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    for _, replica in terminals.values():
        os.close(replica)
    got = _read_all(child, {name: master for name, (master, _) in terminals.items()}, stop_after)
    code = child.wait(timeout=RUN_TIMEOUT_S)
    return got["stdout"], got["stderr"], code


def _read_all(
    child: subprocess.Popen[bytes], masters: dict[str, int], stop_after: str | None
) -> dict[str, str]:
    """Everything the child writes, from its pipes and terminals, until each closes (bounded)."""
    sources = {name: masters.get(name) for name in ("stdout", "stderr")}
    for name, fd in sources.items():
        if fd is None:
            stream = getattr(child, name)
            assert stream is not None
            sources[name] = stream.fileno()
    chunks: dict[str, list[bytes]] = {name: [] for name in sources}
    open_fds = {fd: name for name, fd in sources.items() if fd is not None}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while open_fds and time.monotonic() < deadline:
        ready, _, _ = select.select(list(open_fds), [], [], 1.0)
        for fd in ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # a terminal whose last writer closed (EIO)
                data = b""
            if data:
                chunks[open_fds[fd]].append(data)
            else:
                del open_fds[fd]
        if stop_after is not None and stop_after.encode() in b"".join(chunks["stderr"]):
            child.terminate()
            stop_after = None
    for fd in masters.values():
        os.close(fd)
    assert not open_fds, f"bkctl still writing after {RUN_TIMEOUT_S} s"
    # A terminal turns "\n" into "\r\n": undo it to compare with what a pipe gets.
    return {name: b"".join(data).decode().replace("\r\n", "\n") for name, data in chunks.items()}


# --- tables ---------------------------------------------------------------------------------------------

# What these commands printed before rich came (commit ebc2531~1), byte for byte: piped output is a
# contract for scripts and must not change.
LEDGER_INSPECT_PLAIN = """\
ledger_id\t1
state\tOPEN
ensemble_size\t3
write_quorum\t2
ack_quorum\t2
digest\tCRC32
last_entry_id\t-1
length\t0
ctime\t-
custom_metadata\t-
format_version\t3
metadata_version\t0
segment\t0\t-1\t127.0.0.1:33183,127.0.0.1:33181,127.0.0.1:33182
"""
LEDGER_INSPECT_TABLE = """\
ledger_id:         1
state:             OPEN
ensemble_size:     3
write_quorum:      2
ack_quorum:        2
digest:            CRC32
last_entry_id:     -1
length:            0
ctime:             -
custom_metadata:   -
format_version:    3
metadata_version:  0

segments:
FIRST ENTRY  LAST ENTRY  ENSEMBLE
          0          -1  127.0.0.1:33183,127.0.0.1:33181,127.0.0.1:33182
"""
BOOKIE_LIST_TABLE = """\
BOOKIE           STATE
127.0.0.1:33181  rw
127.0.0.1:33182  rw
127.0.0.1:33183  rw
"""


def test_piped_output_is_unchanged_byte_for_byte(metadata: str) -> None:
    for args, expected in [
        (("ledger", "inspect", "1"), LEDGER_INSPECT_PLAIN),
        (("ledger", "inspect", "1", "-o", "table"), LEDGER_INSPECT_TABLE),
        (("bookie", "list", "-o", "table"), BOOKIE_LIST_TABLE),
    ]:
        out, err, code = run(*args, "--metadata", metadata, stdout_tty=False, stderr_tty=True)
        assert (out, code) == (expected, 0), err
        assert ESC not in out


def test_a_terminal_gets_a_rich_table_with_coloured_states(metadata: str) -> None:
    out, err, code = run("ledger", "inspect", "1", "--metadata", metadata, stdout_tty=True, stderr_tty=True)
    assert code == 0, err
    assert RULE in out  # drawn by rich: a line under the header
    assert f"{ESC}33mOPEN" in out  # an open ledger in yellow
    out, err, code = run("bookie", "list", "--metadata", metadata, stdout_tty=True, stderr_tty=True)
    assert code == 0, err
    assert RULE in out and out.count(f"{ESC}32mrw") == 3  # read-write bookies in green


def test_no_color_draws_the_table_without_any_escape(metadata: str) -> None:
    for args in (("ledger", "inspect", "1"), ("bookie", "list")):
        out, err, code = run(*args, "--metadata", metadata, stdout_tty=True, stderr_tty=True, no_color=True)
        assert code == 0, err
        assert RULE in out and ESC not in out


def test_json_on_a_terminal_is_the_json_of_a_pipe(metadata: str) -> None:
    args = ("ledger", "inspect", "1", "-o", "json", "--metadata", metadata)
    on_terminal = run(*args, stdout_tty=True, stderr_tty=True)
    piped = run(*args, stdout_tty=False, stderr_tty=False)
    assert on_terminal == piped and ESC not in piped[0]


def test_a_long_table_on_a_terminal_keeps_its_widths_past_the_first_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    rows = ({"id": i, "state": "CLOSED" if i % 2 else "OPEN"} for i in range(output.TABLE_WIDTH_ROWS * 2 + 5))
    columns = [Column("id", "ID", numeric=True), Column("state", "STATE")]
    assert output.write_rows(rows, columns, OutputFormat.table, out) == output.TABLE_WIDTH_ROWS * 2 + 5
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["ID", "STATE"] and set(lines[1]) == {RULE}
    body = lines[2:]
    assert len(body) == output.TABLE_WIDTH_ROWS * 2 + 5  # one header, no blank line
    assert len({line.index("OPEN" if "OPEN" in line else "CLOSED") for line in body}) == 1  # aligned


# --- progress -------------------------------------------------------------------------------------------


def test_progress_shows_on_a_terminals_stderr_only() -> None:
    args = ("journal", "inspect", str(JOURNAL_DIR), "--summary", "-o", "json")
    piped_out, piped_err, code = run(*args, stdout_tty=False, stderr_tty=False)
    assert code == 0 and piped_err == ""  # stderr a pipe: not a byte of progress
    out, err, code = run(*args, stdout_tty=False, stderr_tty=True)
    assert code == 0
    assert out == piped_out  # stdout untouched by the bar
    assert BAR in err and JOURNAL_DIR.glob("*.txn").__next__().name in err and "MB" in err
    assert re.search(SGR, err)  # in colour
    out, err, code = run(*args, stdout_tty=False, stderr_tty=True, no_color=True)
    assert code == 0 and out == piped_out
    assert BAR in err and not re.search(SGR, err)  # NO_COLOR: drawn, without a colour (nor bold)


def test_no_progress_over_rows_streaming_to_the_same_terminal() -> None:
    """The records printed to the terminal are the progress there: a bar would tear them."""
    out, err, code = run("index", "inspect", str(INDEX_FILE), stdout_tty=True, stderr_tty=True)
    assert code == 0 and BAR not in err and BAR not in out
    out, err, code = run("index", "inspect", str(INDEX_FILE), "-o", "json", stdout_tty=False, stderr_tty=True)
    assert code == 0 and BAR in err and "slots" in err and BAR not in out


@pytest.mark.spark
def test_audit_shows_spark_tasks_on_a_terminals_stderr(tmp_path: Path) -> None:
    """Spark's own console bar is off; ours counts the tasks of the audit's stages."""
    from tests.client.test_java_data import prepare

    uri = prepare(tmp_path)
    dirs = [arg for n in (1, 2, 3) for arg in ("--bookie-dir", str(tmp_path / f"b{n}"))]
    out, err, code = run(
        "audit", "--metadata", uri, *dirs, "-o", "json", stdout_tty=False, stderr_tty=True,
        BKCTL_SPARK_MASTER="local[2]",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["summary"]["replicas_found"] == 2700
    assert BAR in err and "tasks" in err and "stage " in err
    assert "[Stage" not in err  # Spark's console progress


def test_replay_tells_its_progress_through_the_callback(tmp_path: Path) -> None:
    """The bookie's replay never draws: it tells the bytes it found and replayed to a callback."""
    from bkctl.server.replay import replay

    shutil.copytree(JOURNAL_DIR, tmp_path / "current")
    told: list[tuple[int, int]] = []
    report = replay(
        tmp_path / "current", (-1, 0), lambda kind, body: None, progress=lambda *t: told.append(t)
    )
    found = sum(f for _, f in told)
    journal = next((tmp_path / "current").glob("*.txn"))
    assert told[0][0] == 0 and 0 < found <= journal.stat().st_size
    assert sum(r for r, _ in told) == report.bytes > 0


def test_bookie_start_shows_its_replay_on_a_terminal(tmp_path: Path) -> None:
    from tests.client.test_java_data import prepare

    uri = prepare(tmp_path)
    base = tmp_path / "b1"
    (base / "ledgers" / "current" / "lastMark").unlink()  # the whole journal to replay
    args = ("bookie", "start", "-p", "0", "--bookie-id", "127.0.0.1:33181", "--metadata", uri)
    dirs = ("-j", str(base / "journal"), "-l", str(base / "ledgers"))
    _, err, _ = run(*args, *dirs, stdout_tty=False, stderr_tty=True, stop_after="serving on")
    assert "serving on" in err and "replay" in err and BAR in err
    _, err, _ = run(*args, *dirs, stdout_tty=False, stderr_tty=False, stop_after="serving on")
    assert "serving on" in err and BAR not in err and ESC not in err


@pytest.mark.slow
def test_ledger_write_and_read_show_their_entries_on_a_terminal(tmp_path: Path) -> None:
    """A real sandbox cluster: the bar counts the entries acknowledged (write) and read (read, stdout to
    a pipe); stdout is the same as with stderr piped."""
    from tests.commands.sandbox_proc import Sandbox

    sandbox = Sandbox(tmp_path / "sb", "--bookies", "3", "--base-port", "0", "--no-autorecovery")
    try:
        uri = str(sandbox.wait_ready()["metadata_uri"])
        write = ("ledger", "write", "-n", "3000", "-s", "100", "-o", "json", "--metadata", uri)
        out, err, code = run(*write, stdout_tty=False, stderr_tty=True)
        assert code == 0, err
        assert BAR in err and "/3,000 entries" in err
        ledger_id = json.loads(out)["ledger_id"]
        read = ("ledger", "read", str(ledger_id), "-o", "json", "--metadata", uri)
        out, err, code = run(*read, stdout_tty=False, stderr_tty=True)
        assert code == 0 and BAR in err and "entries" in err
        piped_out, piped_err, code = run(*read, stdout_tty=False, stderr_tty=False)
        assert code == 0 and out == piped_out and BAR not in piped_err
        assert len(json.loads(out)) == 3000
    finally:
        assert sandbox.stop(signal.SIGINT) == 0


def test_bar_is_a_silent_stand_in_without_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress.bar("recover", 10, "ledgers") as shown:
        shown.update(5, info="half")
    assert sys.stderr.getvalue() == ""
    items = iter(range(3))
    assert progress.tracked(items, "x", 3, lambda i: i) is items  # no wrapper: full speed
