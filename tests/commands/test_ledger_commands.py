"""`bkctl ledger create|write|read|fence|delete|simpletest` and `bkctl bookie sanity` as subprocesses
against a real 3-bookie `bkctl sandbox` (one per module), with their exit codes."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkctl.commands.ledger_options import TEMPLATE_DEFAULT, payload
from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from tests.commands.sandbox_proc import Sandbox, bkctl
from tests.commands.test_sandbox_supervision import until


class Cluster:
    def __init__(self, uri: str, bookies: list[str]) -> None:
        self.uri = uri
        self.bookies = bookies

    def run(self, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
        done = bkctl(*args, metadata=self.uri, stdin=stdin)
        return done.returncode, done.stdout, done.stderr

    def json(self, *args: str, stdin: str | None = None) -> object:
        code, out, err = self.run(*args, "-o", "json", stdin=stdin)
        assert code == 0, err
        return json.loads(out)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    sandbox = Sandbox(tmp_path_factory.mktemp("sandbox"), "--bookies", "3", "--base-port", "0")
    try:
        ready = sandbox.wait_ready()
        yield Cluster(str(ready["metadata_uri"]), list(ready["bookies"]))  # type: ignore[call-overload]
    finally:
        code = sandbox.stop(signal.SIGINT)
    # Ctrl-C is the documented way to stop a sandbox: a clean stop, exit 0, bookies unregistered.
    assert code == 0, "".join(sandbox.err)
    assert "sandbox stopped" in "".join(sandbox.err)


def test_write_then_read_round_trip_in_every_format(cluster: Cluster) -> None:
    written = cluster.json("ledger", "write", "--entries", "300", "--size", "1024")
    assert isinstance(written, dict)
    assert set(written) == {"ledger_id", "entries_written", "last_entry_id", "closed"}
    assert written["closed"] is True
    assert (written["entries_written"], written["last_entry_id"]) == (300, 299)
    ledger = written["ledger_id"]
    entries = cluster.json("ledger", "read", str(ledger))
    assert isinstance(entries, list) and len(entries) == 300
    assert set(entries[0]) == {"entry_id", "payload_base64"}
    for item in entries:
        data = base64.b64decode(item["payload_base64"])
        assert data == payload(ledger, item["entry_id"], TEMPLATE_DEFAULT, 1024)
    code, out, _ = cluster.run("ledger", "read", str(ledger), "--first", "10", "--last", "12", "-o", "plain")
    assert code == 0
    lines = out.splitlines()
    assert [line.split("\t")[:2] for line in lines] == [["10", "1024"], ["11", "1024"], ["12", "1024"]]
    code, out, _ = cluster.run("ledger", "read", str(ledger), "--first", "5", "--last", "5", "-o", "table")
    assert code == 0 and out.splitlines()[0].split() == ["ENTRY", "SIZE", "PAYLOAD"]
    inspected = cluster.json("ledger", "inspect", str(ledger))
    assert isinstance(inspected, dict)
    assert (inspected["state"], inspected["last_entry_id"], inspected["length"]) == (
        "CLOSED",
        299,
        300 * 1024,
    )


def test_template_and_as_text(cluster: Cluster) -> None:
    written = cluster.json("ledger", "write", "--entries", "3", "--template", "id {ledger}/{entry}")
    assert isinstance(written, dict)
    ledger = written["ledger_id"]
    got = cluster.json("ledger", "read", str(ledger), "--as-text")
    assert got == [{"entry_id": i, "payload": f"id {ledger}/{i}"} for i in range(3)]
    code, _, err = cluster.run("ledger", "write", "--entries", "1", "--template", "{nope}")
    assert code == 2 and "--template" in err


def test_from_file_and_stdin(cluster: Cluster, tmp_path: Path) -> None:
    source = tmp_path / "lines.txt"
    source.write_bytes(b"first\n\nthird line\r\nlast")
    written = cluster.json("ledger", "write", "--from-file", str(source))
    assert isinstance(written, dict) and written["entries_written"] == 4
    got = cluster.json("ledger", "read", str(written["ledger_id"]), "--as-text")
    assert [e["payload"] for e in got] == ["first", "", "third line", "last"]  # type: ignore[union-attr, index]
    written = cluster.json("ledger", "write", "--from-file", "-", stdin="a\nb\n")
    assert isinstance(written, dict) and (written["entries_written"], written["last_entry_id"]) == (2, 1)
    code, _, err = cluster.run("ledger", "write", "--from-file", str(tmp_path / "missing"))
    assert code == 4 and "missing" in err
    code, _, err = cluster.run("ledger", "write", "--entries", "3", "--from-file", str(source))
    assert code == 2


def test_no_close_then_fence_then_fence_again(cluster: Cluster) -> None:
    written = cluster.json("ledger", "write", "--entries", "50", "--no-close", "--password", "s3cret")
    assert isinstance(written, dict)
    ledger = str(written["ledger_id"])
    # Without recovery the reader sees up to the LAC the bookies know, and fences nothing.
    state = cluster.json("ledger", "inspect", ledger)
    assert isinstance(state, dict) and state["state"] == "OPEN"
    code, out, _ = cluster.run("ledger", "read", ledger, "--password", "s3cret", "-o", "plain")
    assert code == 0 and len(out.splitlines()) <= 50
    assert cluster.json("ledger", "inspect", ledger)["state"] == "OPEN"  # type: ignore[index]
    fenced = cluster.json("ledger", "fence", ledger, "--password", "s3cret")
    length = sum(len(payload(int(ledger), i, TEMPLATE_DEFAULT, None)) for i in range(50))
    assert fenced == {"ledger_id": int(ledger), "state": "CLOSED", "last_entry_id": 49, "length": length}
    code, out, err = cluster.run("ledger", "fence", ledger, "--password", "s3cret", "-o", "json")
    assert code == 11 and json.loads(out)["last_entry_id"] == 49 and "already closed" in err
    entries = cluster.json("ledger", "read", ledger, "--password", "s3cret", "--as-text")
    assert [e["entry_id"] for e in entries] == list(range(50))  # type: ignore[union-attr, index]


def test_read_recovery_flag_closes_an_open_ledger(cluster: Cluster) -> None:
    written = cluster.json("ledger", "write", "--entries", "5", "--no-close")
    assert isinstance(written, dict)
    ledger = str(written["ledger_id"])
    got = cluster.json("ledger", "read", ledger, "--recovery", "--as-text")
    assert [e["entry_id"] for e in got] == [0, 1, 2, 3, 4]  # type: ignore[union-attr, index]
    assert cluster.json("ledger", "inspect", ledger)["state"] == "CLOSED"  # type: ignore[index]


def test_read_from_one_bookie_shows_its_copies_past_the_lac(cluster: Cluster) -> None:
    written = cluster.json(
        "ledger", "write", "--entries", "6", "--no-close", "-E", "2", "-Qw", "2", "-Qa", "1"
    )
    assert isinstance(written, dict)
    ledger = str(written["ledger_id"])
    # The writer left once every copy answered: its exit replaced no bookie by the spare third one.
    segments = cluster.json("ledger", "inspect", ledger)["segments"]  # type: ignore[index]
    assert len(segments) == 1
    for bookie in segments[0]["ensemble"]:
        code, out, err = cluster.run("ledger", "read", ledger, "--bookie", bookie, "--as-text", "-o", "plain")
        assert code == 0, err
        # Qw = E: every bookie holds every entry, including the unconfirmed tail.
        assert [line.split("\t")[0] for line in out.splitlines()] == [str(i) for i in range(6)]
    code, _, _ = cluster.run("ledger", "read", ledger, "--bookie", bookie, "--recovery")
    assert code == 2


def test_errors_have_their_exit_codes(cluster: Cluster) -> None:
    code, _, err = cluster.run("ledger", "read", "987654")
    assert code == 4 and "987654" in err and "Traceback" not in err
    code, _, err = cluster.run("ledger", "fence", "987654")
    assert code == 4
    written = cluster.json("ledger", "write", "--entries", "2", "--password", "right")
    assert isinstance(written, dict)
    code, _, err = cluster.run("ledger", "read", str(written["ledger_id"]), "--password", "wrong")
    assert code == 9 and "password" in err
    code, _, err = cluster.run("ledger", "write", "--entries", "1", "-E", "5", "-Qw", "2", "-Qa", "2")
    assert code == 6 and "bookies" in err
    code, _, err = cluster.run("ledger", "write", "--entries", "1", "-E", "2", "-Qw", "3", "-Qa", "2")
    assert code == 2
    code, out, err = cluster.run(
        "ledger", "read", str(written["ledger_id"]), "--last", "5", "--password", "right", "-o", "plain"
    )
    assert code == 0 and [line.split("\t")[0] for line in out.splitlines()] == ["0", "1"]  # clamped


def test_a_mac_ledger_reads_back_with_its_stored_password(cluster: Cluster) -> None:
    """Administrative open: read, check and fence use the password and digest the metadata
    stores; a --password given must match it."""
    written = cluster.json("ledger", "write", "--entries", "3", "--digest", "mac", "--password", "s3cret")
    assert isinstance(written, dict)
    ledger = str(written["ledger_id"])
    inspected, entries, checked = (
        cluster.json("ledger", *args)
        for args in (("inspect", ledger), ("read", ledger, "--as-text"), ("check", ledger, "--full"))
    )
    assert isinstance(inspected, dict) and inspected["digest"] == "MAC"
    assert isinstance(entries, list) and [e["payload"] for e in entries] == [
        f"L{ledger}-E{i}" for i in range(3)
    ]
    assert isinstance(checked, dict) and {f["state"] for f in checked["fragments"]} == {"ok"}
    code, _, err = cluster.run("ledger", "check", ledger, "--password", "guess")
    assert code == 9 and "wrong password" in err
    code, _, _ = cluster.run("ledger", "fence", ledger)
    assert code == 11  # already closed by its writer


def test_a_ledger_storing_no_password_is_fenced_with_password(cluster: Cluster) -> None:
    """Metadata without a password (format v1, or written without one): an administrative open uses ""
    (Java's bookieRecoveryPasswd default), which the bookies refuse for fencing: the error says to give
    --password, and with it the ledger is fenced."""
    written = cluster.json("ledger", "write", "--entries", "5", "--no-close", "--password", "kept")
    assert isinstance(written, dict)
    ledger = int(written["ledger_id"])
    with SqliteStore(cluster.uri.removeprefix("sqlite://")) as store:
        layout = Layout(store)
        versioned = layout.read_ledger(ledger)
        bare = dataclasses.replace(versioned.value, password=None)
        layout.write_ledger(ledger, bare, versioned.version)
    assert cluster.json("ledger", "read", str(ledger), "--as-text") is not None  # CRC32C reads need no key
    code, _, err = cluster.run("ledger", "fence", str(ledger))
    assert code == 9 and "its metadata stores no password: give --password" in err
    fenced = cluster.json("ledger", "fence", str(ledger), "--password", "kept")
    assert isinstance(fenced, dict) and (fenced["state"], fenced["last_entry_id"]) == ("CLOSED", 4)


def test_unanswering_bookie_times_out_instead_of_hanging(cluster: Cluster) -> None:
    """A registered bookie that accepts connections and never answers: the write fails with a clear
    error within the request timeout (no spare bookie to replace it), it does not hang."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    silent = f"127.0.0.1:{listener.getsockname()[1]}"
    path = cluster.uri.removeprefix("sqlite://")
    with SqliteStore(path) as store:
        Layout(store).register_bookie(silent)
        try:
            code, _, err = cluster.run(
                "ledger", "write", "--entries", "20", "-E", "4", "-Qw", "4", "-Qa", "4", "--timeout-ms", "500"
            )
        finally:
            Layout(store).unregister_bookie(silent)
            listener.close()
    assert code == 6, err
    assert "acknowledged" in err and "Traceback" not in err
    assert f"bookie {silent} failed" in err  # the dead bookie is named


def test_failed_write_prints_how_far_it_got(cluster: Cluster) -> None:
    """A write that fails still prints its document, with the error."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    silent = f"127.0.0.1:{listener.getsockname()[1]}"
    with SqliteStore(cluster.uri.removeprefix("sqlite://")) as store:
        Layout(store).register_bookie(silent)
        try:
            code, out, err = cluster.run(
                "ledger", "write", "--entries", "20", "-E", "4", "-Qw", "4", "-Qa", "4",
                "--timeout-ms", "500", "-o", "json",
            )  # fmt: skip
        finally:
            Layout(store).unregister_bookie(silent)
            listener.close()
    assert code == 6, err
    document = json.loads(out)
    assert document["entries_written"] == 0 and document["last_entry_id"] == -1
    assert document["deleted"] is True and silent in document["error"]  # nothing acknowledged: no orphan
    assert cluster.run("ledger", "inspect", str(document["ledger_id"]))[0] == 4


def test_read_past_the_end_of_a_closed_ledger(cluster: Cluster) -> None:
    """As a trial run saw it, on a ledger closed at entry 999."""
    ledger = str(cluster.json("ledger", "write", "--entries", "1000", "--size", "10")["ledger_id"])  # type: ignore[index]
    got = cluster.json("ledger", "read", ledger, "--first", "998", "--last", "5000")
    assert [e["entry_id"] for e in got] == [998, 999]  # type: ignore[union-attr, index]
    got = cluster.json("ledger", "read", ledger, "--first", "1", "--last", "5000")
    assert [e["entry_id"] for e in got] == list(range(1, 1000))  # type: ignore[union-attr, index]
    code, out, err = cluster.run("ledger", "read", ledger, "--first", "5000", "-o", "json")
    assert code == 4 and out == "" and "closed and ends at entry 999: no entry 5000" in err
    assert "until the writer" not in err
    code, out, err = cluster.run("ledger", "read", ledger, "--first", "5", "--last", "2", "-o", "json")
    assert code == 2 and out == "" and "--first 5 is after --last 2" in err


def test_the_largest_entry_the_cli_accepts_is_written_and_read(cluster: Cluster) -> None:
    """Every size the CLI accepts works (sizes from 5,241,824 used to fail)."""
    from bkctl import limits

    written = cluster.json("ledger", "write", "--entries", "2", "--size", str(limits.ENTRY_SIZE_MAX))
    assert written["entries_written"] == 2  # type: ignore[index]
    code, out, _ = cluster.run("ledger", "read", str(written["ledger_id"]), "-o", "plain")  # type: ignore[index]
    assert (
        code == 0 and [line.split("\t")[1] for line in out.splitlines()] == [str(limits.ENTRY_SIZE_MAX)] * 2
    )
    code, _, _ = cluster.run("ledger", "write", "--entries", "1", "--size", str(limits.ENTRY_SIZE_MAX + 1))
    assert code == 2


def test_bad_input_leaves_no_open_ledger(cluster: Cluster, tmp_path: Path) -> None:
    """Input is checked before the ledger exists; a bad line later closes it there."""
    from bkctl import limits

    before = cluster.json("ledger", "list")
    code, out, err = cluster.run("ledger", "write", "--from-file", str(tmp_path / "nonexistent"))
    assert code == 4 and out == "" and "no such file" in err
    assert cluster.json("ledger", "list") == before
    too_long = b"x" * (limits.ENTRY_SIZE_MAX + 1)
    first_bad = tmp_path / "first.txt"
    first_bad.write_bytes(too_long + b"\nok\n")
    code, out, err = cluster.run("ledger", "write", "--from-file", str(first_bad), "-o", "json")
    assert code == 2 and "line 1 is over" in err
    assert json.loads(out)["deleted"] is True
    assert cluster.json("ledger", "list") == before
    later_bad = tmp_path / "later.txt"
    later_bad.write_bytes(b"a\nb\nc\n" + too_long + b"\nd\n")
    code, out, err = cluster.run("ledger", "write", "--from-file", str(later_bad), "-o", "json")
    document = json.loads(out)
    assert code == 2 and "line 4 is over" in document["error"]
    assert (document["entries_written"], document["last_entry_id"], document["closed"]) == (3, 2, True)
    info = cluster.json("ledger", "inspect", str(document["ledger_id"]))
    assert (info["state"], info["last_entry_id"]) == ("CLOSED", 2)  # type: ignore[index]


def test_ctrl_c_of_a_write_says_how_far_it_got(cluster: Cluster) -> None:
    """Ctrl-C printed only ^C; now the adds in flight finish, the ledger is closed
    there, the document names the range, and the exit code is 130."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bkctl",
            "ledger",
            "write",
            "--entries",
            "5000000",
            "--size",
            "10",
            "-o",
            "json",
        ],
        env={**os.environ, "BKCTL_METADATA": cluster.uri},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        created = re.search(r"ledger (\d+) created on", proc.stderr.readline())  # writing now
        assert created is not None
        # Some entries acknowledged (a Ctrl-C before any would delete the ledger): entry 0 readable
        # up to the last add confirmed, without recovery (the writer goes on).
        first = ("ledger", "read", created[1], "--last", "0")
        until(lambda: cluster.run(*first)[0] == 0, "an entry acknowledged")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    document = json.loads(out)
    assert document["closed"] is True and document["error"] == "interrupted by Ctrl-C"
    assert 0 < document["entries_written"] < 5000000
    info = cluster.json("ledger", "inspect", str(document["ledger_id"]))
    assert (info["state"], info["last_entry_id"]) == ("CLOSED", document["last_entry_id"])  # type: ignore[index]


def test_create_then_delete(cluster: Cluster) -> None:
    created = cluster.json("ledger", "create", "-E", "2", "-Qw", "2", "-Qa", "1", "--digest", "mac")
    assert isinstance(created, dict) and len(created["ensemble"]) == 2
    ledger = str(created["ledger_id"])
    info = cluster.json("ledger", "inspect", ledger)
    assert isinstance(info, dict) and (info["state"], info["digest"]) == ("OPEN", "MAC")
    code, _, err = cluster.run("ledger", "delete", ledger)
    assert code == 2 and "--yes" in err
    code, _, _ = cluster.run("ledger", "delete", ledger, "--yes")
    assert code == 0
    code, _, _ = cluster.run("ledger", "inspect", ledger)
    assert code == 4
    code, _, _ = cluster.run("ledger", "delete", ledger, "--yes")
    assert code == 4


def test_simpletest_and_bookie_sanity(cluster: Cluster) -> None:
    code, out, err = cluster.run("ledger", "simpletest", "-n", "100", "-o", "json")
    assert code == 0, err
    result = json.loads(out)
    assert (result["entries_written"], result["entries_read"], result["last_entry_id"]) == (100, 100, 99)
    assert f"100 entries written to ledger {result['ledger_id']}" in err
    code, _, _ = cluster.run("ledger", "inspect", str(result["ledger_id"]))
    assert code == 4  # simpletest deletes its ledger
    rows = cluster.json("bookie", "sanity")
    assert isinstance(rows, list)
    assert sorted(r["bookie_id"] for r in rows) == sorted(cluster.bookies)
    assert all(r["ok"] and r["entries"] == 10 for r in rows)
    code, out, err = cluster.run("bookie", "sanity", "--bookie", "127.0.0.1:1", "-t", "0.5", "-o", "json")
    assert code == 6 and json.loads(out)[0]["ok"] is False


def test_read_into_a_closed_pipe_stops_quietly(cluster: Cluster) -> None:
    # `bkctl ledger read ... | head -1` in a script: the reader goes away, bkctl stops with success and
    # says nothing (it printed "bkctl: error: OutputClosed:" once, from inside the reactor).
    written = cluster.json("ledger", "write", "--entries", "2000", "--size", "1024")
    assert isinstance(written, dict)
    reader, writer = socket.socketpair()
    reader.close()  # stdout is a socket whose reader is gone: every write is a broken pipe
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bkctl", "ledger", "read", str(written["ledger_id"]), "-o", "json"],
            env={**os.environ, "BKCTL_METADATA": cluster.uri},
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        writer.close()
    assert (done.returncode, done.stderr) == (0, "")
