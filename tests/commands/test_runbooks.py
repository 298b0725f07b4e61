"""docs/operations.md, run: every runbook's commands on one sandbox of four bookie processes, in the
order the page gives them, with the exit codes and the outputs it shows.

One cluster for all of them (a sandbox start and each bookie's session expiry are the slow parts):
a first check, a ledger left open by a dead writer, metrics and a disk check, autorecovery stuck on a
ledger until a bookie is added, a decommission, a corrupt entry log repaired, a disk replaced, a
bookie died with autorecovery off (manual recover), and the final check that all is well again. Every
wait is bounded.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.request import urlopen

import pytest

from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from tests.commands.sandbox_proc import Sandbox, bkctl
from tests.commands.test_sandbox_supervision import bookie_pids, until
from tests.server_net.live import BookieProcess

pytestmark = pytest.mark.slow
T = TypeVar("T")
TRANSCRIPT = os.environ.get("BKCTL_RUNBOOK_TRANSCRIPT")  # a file to append every command and its output to
HEAL_WAIT_S = 120.0  # a session expiry (10 s), an audit, a backoff, the copies: bounded, for a loaded machine


class Ops:
    """The operator's terminal: bkctl commands against the sandbox, each checked for its exit code."""

    def __init__(self, uri: str, data_dir: Path) -> None:
        self.uri, self.data_dir = uri, data_dir

    def run(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        done = self.call(*args)
        assert done.returncode == code, f"bkctl {' '.join(args)}: exit {done.returncode}\n{done.stderr}"
        return done

    def call(self, *args: str) -> subprocess.CompletedProcess[str]:
        started = time.monotonic()
        done = bkctl(*args, metadata=self.uri)
        if TRANSCRIPT:  # what docs/operations.md shows was taken from such a run
            with open(TRANSCRIPT, "a") as out:
                took = time.monotonic() - started
                out.write(f"$ bkctl {shlex.join(args)}\n{done.stdout}{done.stderr}")
                out.write(f"(exit {done.returncode}, {took:.1f} s)\n")
        return done

    def json(self, *args: str, code: int = 0) -> Any:
        return json.loads(self.run(*args, "-o", "json", code=code).stdout)

    def doctor(self) -> dict[str, str]:
        """Each check's state, from the plain lines (`check<TAB>state<TAB>detail`, then `bookie` lines)."""
        lines = self.call("doctor", "-o", "plain").stdout.splitlines()
        return dict(line.split("\t")[:2] for line in lines if not line.startswith("bookie\t"))

    # Waits and lookups read the store in-process: the steps the runbooks show run as commands above.

    def read(self, function: Callable[[Layout], T]) -> T:
        with SqliteStore(self.uri.removeprefix("sqlite://")) as store:
            return function(Layout(store))

    def ensemble(self, ledger: int) -> list[str]:
        return list(self.read(lambda layout: layout.read_ledger(ledger).value.segments[-1].ensemble))

    def registered(self) -> set[str]:
        return self.read(lambda layout: {*layout.bookies(), *layout.bookies(readonly=True)})

    def marks(self) -> int:
        return self.read(lambda layout: sum(1 for _ in layout.underreplicated_ids()))

    def failing(self) -> set[str]:
        """Ledger ids the autorecovery daemons report failing (their published status)."""
        statuses = self.read(lambda layout: layout.daemon_statuses())
        return {lid for data in statuses.values() for lid in json.loads(data).get("failing", {})}

    def http(self, bookie: str) -> str:
        address = self.read(lambda layout: layout.bookie_endpoint(bookie, "http"))
        assert address is not None, f"{bookie} registers no admin HTTP endpoint"
        return f"http://{address[0]}:{address[1]}"

    def sandbox_bookie(self, bookie: str) -> tuple[int, Path, Path]:
        """pid, journal dir and ledger dir of a sandbox bookie process."""
        pid = bookie_pids(self.data_dir)[int(bookie.rsplit(":", 1)[1])]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        return pid, Path(argv[argv.index("--journal-dir") + 1]), Path(argv[argv.index("--ledger-dir") + 1])


def flip_last_payload_byte(ops: Ops, ledger_dir: Path, ledger: int) -> Path:
    """A flipped byte in an entry log (returned): the last payload byte of the ledger's first entry there."""
    for log in sorted((ledger_dir / "current").glob("*.log")):
        records = ops.json("entrylog", "inspect", str(log), "--ledger", str(ledger))["records"]
        data = [r for r in records if r["type"] == "DATA"]
        if data:
            position = data[0]["offset"] + 4 + data[0]["size"] - 1  # after the record's length prefix
            with log.open("r+b") as file:
                file.seek(position)
                byte = file.read(1)
                file.seek(position)
                file.write(bytes([byte[0] ^ 0xFF]))
            return log
    raise AssertionError(f"no entry of ledger {ledger} in an entry log of {ledger_dir}")


def test_every_runbook_on_a_sandbox(tmp_path: Path) -> None:
    data_dir = tmp_path / "sb"
    sandbox = Sandbox(data_dir, "--processes", "--no-restart", "--bookies", "4", "--base-port", "0")
    added: list[BookieProcess] = []
    try:
        ops = Ops(str(sandbox.wait_ready()["metadata_uri"]), data_dir)
        first_check(ops)
        ledger_left_open(ops)
        metrics_and_disks(ops)
        stuck, lost = autorecovery_stuck(ops, tmp_path, added)
        decommission(ops, lost, stuck)
        corrupt_entry_log_then_bookie_died_without_autorecovery(ops, tmp_path, added)
        assert set(ops.doctor().values()) <= {"ok", "unknown"}
    finally:
        for process in added:
            process.kill()
        assert sandbox.stop(signal.SIGINT) == 0, "".join(sandbox.err)


def first_check(ops: Ops) -> None:
    done = ops.run("doctor", "-o", "table")
    assert done.stdout.splitlines()[0].split() == ["CHECK", "STATE", "DETAIL"]


def ledger_left_open(ops: Ops) -> None:
    """Runbook: a ledger left open by a dead writer."""
    written = ops.json("ledger", "write", "--entries", "20", "--no-close")
    ledger = str(written["ledger_id"])
    assert written["closed"] is False
    assert ops.json("ledger", "inspect", ledger)["state"] == "OPEN"
    assert len(ops.json("ledger", "read", ledger)) <= 20  # up to the last add confirmed the bookies know
    assert ops.json("ledger", "inspect", ledger)["state"] == "OPEN"  # a read fences nothing
    fenced = ops.json("ledger", "fence", ledger)
    assert (fenced["state"], fenced["last_entry_id"]) == ("CLOSED", 19)
    assert ops.json("ledger", "fence", ledger, code=11)["state"] == "CLOSED"


def metrics_and_disks(ops: Ops) -> None:
    """Runbooks: reading the metrics; a full disk (what doctor and gc show)."""
    bookie = ops.json("bookie", "list")[0]["bookie_id"]
    with urlopen(f"{ops.http(bookie)}/metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    assert "bkctl_bookie_read_only 0" in metrics and "bkctl_bookie_adds_total" in metrics
    done = ops.call("doctor", "--disk-warn", "0.01")
    assert done.returncode == 3 and "bkctl: disk: at or above 1% used" in done.stderr
    assert ops.json("bookie", "gc", bookie, "--wait")["errors"] == []


def autorecovery_stuck(ops: Ops, tmp_path: Path, added: list[BookieProcess]) -> tuple[int, str]:
    """Runbooks: a bookie died (autorecovery on); autorecovery stuck on a ledger (no bookie to copy to)."""
    ledger = ops.json("ledger", "write", "--entries", "50", "-E", "4", "-Qw", "2", "-Qa", "2")["ledger_id"]
    lost = ops.ensemble(ledger)[0]
    pid, _, _ = ops.sandbox_bookie(lost)
    os.kill(pid, signal.SIGKILL)

    until(lambda: str(ledger) in ops.failing(), "the worker reports the ledger failing", HEAL_WAIT_S)
    status = ops.json("autorecovery", "status")
    assert "not enough bookies" in status["daemons"][0]["failing"][str(ledger)]
    marks = ops.json("underreplicated", "list")
    assert {m["ledger_id"] for m in marks} >= {ledger} and lost in marks[0]["missing_replicas"]
    found = ops.doctor()
    assert (found["bookies"], found["underreplicated"]) == ("problem", "problem")

    fresh = tmp_path / "b5"
    process = BookieProcess(
        [
            "--port",
            "0",
            "--http-port",
            "0",
            "-j",
            str(fresh / "j"),
            "-l",
            str(fresh / "l"),
            "--metadata",
            ops.uri,
        ]
    )
    added.append(process)
    process.wait_serving()
    until(lambda: ops.marks() == 0, "healed", HEAL_WAIT_S)
    assert ops.json("underreplicated", "list", "--count") == {"count": 0}
    assert lost not in ops.ensemble(ledger)
    ops.run("ledger", "check", str(ledger), "--full")
    return ledger, lost


def decommission(ops: Ops, lost: str, stuck: int) -> None:
    """Runbook: decommission (here the dead bookie, once healed: only its cookie is left)."""
    report = ops.json("bookie", "decommission", lost, "--yes")
    assert report["ledgers_unrecoverable"] == []
    assert lost not in [b["bookie_id"] for b in ops.json("bookie", "list", "--all")]
    ops.run("ledger", "delete", str(stuck), "--yes")  # four-bookie ensembles have no spare left below


def corrupt_entry_log_then_bookie_died_without_autorecovery(
    ops: Ops, tmp_path: Path, added: list[BookieProcess]
) -> None:
    """Runbooks: a corrupt entry log (stop, damage, start, check, repair); replace a disk; a bookie died
    with autorecovery off (recover by hand, delete its cookie)."""
    ops.run("autorecovery", "disable")
    ledger = ops.json("ledger", "write", "--entries", "30", "--size", "100")["ledger_id"]
    sandbox_bookies = set(bookie_pids(ops.data_dir))
    victim = next(b for b in ops.ensemble(ledger) if int(b.rsplit(":", 1)[1]) in sandbox_bookies)
    pid, journal_dir, ledger_dir = ops.sandbox_bookie(victim)
    os.kill(pid, signal.SIGTERM)  # a clean stop: its entry logs hold the entries
    until(lambda: victim not in ops.registered(), "stopped")
    damaged = flip_last_payload_byte(ops, ledger_dir, ledger)
    inspected = ops.json("entrylog", "inspect", str(damaged), "--ledger", str(ledger), "--digest", "crc32c")
    records = inspected["records"]
    assert next(r["digest_ok"] for r in records if r["type"] == "DATA") is False
    port = victim.rsplit(":", 1)[1]
    restarted = BookieProcess(
        ["--port", port, "-j", str(journal_dir), "-l", str(ledger_dir), "--metadata", ops.uri]
    )
    added.append(restarted)
    restarted.wait_serving()
    checked = ops.json("ledger", "check", str(ledger), "--full", code=3)
    bad = [f for f in checked["fragments"] if f["state"] != "ok"]
    assert [f["bookie"] for f in bad] == [victim]
    ops.json("ledger", "recover", str(ledger))
    ops.run("ledger", "check", str(ledger), "--full")
    assert victim not in ops.ensemble(ledger)

    # Its ledger disk is replaced by a blank one: the bookie refuses it; its ledgers are recovered
    # elsewhere while it is down, the cookies are updated, and it starts empty.
    restarted.terminate()
    blank = tmp_path / "new-disk"
    dirs = ["--port", port, "-j", str(journal_dir), "-l", str(blank)]
    done = ops.run("bookie", "start", *dirs, code=10)
    assert "bkctl bookie cookie update" in done.stderr
    assert ops.json("recover", ops.uri, victim, "--yes")["ledgers_unrecoverable"] == []
    assert ops.json("ledger", "list", "--bookie", victim) == []
    ops.run("bookie", "cookie", "update", *dirs)
    # A short metadata session (bk_server.conf zkTimeout): its death below is seen in 2 s, not 10.
    conf = tmp_path / "bk_server.conf"
    conf.write_text("zkTimeout=2000\n")
    restarted = BookieProcess([*dirs, "-c", str(conf), "--http-port", "0", "--metadata", ops.uri])
    added.append(restarted)
    restarted.wait_serving()
    assert ops.doctor()["bookies"] == "ok"

    # The same bookie now dies for good, with autorecovery off.
    other = ops.json("ledger", "write", "--entries", "30", "-E", "3")["ledger_id"]
    on_victim = victim in ops.ensemble(other)
    restarted.kill()
    until(lambda: victim not in ops.registered(), "its session expired", HEAL_WAIT_S)
    found = ops.doctor()
    assert (found["bookies"], found["autorecovery"]) == ("problem", "problem")
    plan = ops.json("recover", ops.uri, victim, "--dry-run")
    assert plan["dry_run"] is True and (len(plan["plan"]) > 0) == on_victim
    report = ops.json("recover", ops.uri, victim, "--yes", "--delete-cookie")
    assert report["ledgers_unrecoverable"] == [] and (report["ledgers_recovered"] > 0) == on_victim
    assert ops.json("ledger", "list", "--bookie", victim) == []
    ops.run("ledger", "check", str(other), "--full")
    ops.run("autorecovery", "enable")


def test_damaged_index_runbook(tmp_path: Path) -> None:
    """docs/operations.md, "A damaged or missing index", on one bookie process: the refused start, the
    check, the rebuild (dry run first), the clean check, the start, every entry read back."""
    from bkctl.protocol import index_format as ixf
    from tests.server_net.live import metadata_uri

    ops = Ops(metadata_uri(tmp_path), tmp_path)
    journal, ledgers = str(tmp_path / "b1" / "journal"), str(tmp_path / "b1" / "ledgers")
    dirs = ["-j", journal, "-l", ledgers, "--metadata", ops.uri]
    bookie = BookieProcess([*dirs, "-p", "0"])
    try:
        _, port = bookie.wait_serving()
        quorum = ["-E", "1", "-Qw", "1", "-Qa", "1"]
        ledger = ops.json("ledger", "write", "--entries", "100", "--size", "100", *quorum)["ledger_id"]
        assert bookie.terminate() == 0
    finally:
        bookie.kill()
    index = tmp_path / "b1" / "ledgers" / "current" / ixf.index_path(ledger)
    with index.open("r+b") as file:
        file.write(b"\xbd")  # "BKLE" -> "\xbdKLE"
    refused = ops.run("bookie", "start", *dirs, "-p", str(port), code=7)
    assert f"ledger {ledger}: corrupt index header" in refused.stderr
    assert f"bkctl index rebuild --ledger-dir {ledgers} --ledger {ledger}" in refused.stderr
    checked = ops.json("bookie", "check", "-l", ledgers, "-j", journal, code=3)
    assert {p["problem"] for p in checked["problems"]} == {"index", "unreachable"}
    (planned,) = ops.json("index", "rebuild", "-l", ledgers, "--ledger", str(ledger), "--dry-run")
    assert (planned["entries"], planned["key_from"], planned["written"]) == (100, "metadata", False)
    ops.run("index", "rebuild", "-l", ledgers, "--ledger", str(ledger))
    ops.run("bookie", "check", "-l", ledgers, "-j", journal)
    again = BookieProcess([*dirs, "-p", str(port)])
    try:
        again.wait_serving()
        read = ops.run("ledger", "read", str(ledger), "-o", "json")
        assert len(read.stdout.splitlines()) == 100
        assert again.terminate() == 0
    finally:
        again.kill()
