"""`bkctl recover`, `ledger check|recover` and `bookie decommission` as an operator's script runs them,
against a `sandbox --processes --no-restart` whose bookie is killed -9 (BookieShellTest's recover
matrix, BookieRecoveryTest, BookieDecommissionTest)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkctl.errors import ExitCode
from bkctl.metadata.layout import Layout
from bkctl.metadata.stores import open_store
from bkctl.recovery import recover_lock
from tests.commands.sandbox_proc import Sandbox, bkctl, bkctl_all, registered
from tests.commands.test_sandbox_supervision import bookie_pids, until
from tests.conftest import REPO

pytestmark = pytest.mark.slow


class Dead:
    def __init__(self, uri: str, bookie: str, ledgers: dict[str, int], sandbox: Sandbox) -> None:
        self.uri, self.bookie, self.ledgers, self.sandbox = uri, bookie, ledgers, sandbox

    def run(self, *args: str) -> tuple[int, str, str]:
        done = bkctl(*args, metadata=self.uri)
        return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def dead(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dead]:
    base = tmp_path_factory.mktemp("recover")
    # Manual recovery alone: no autorecovery daemon repairing the same ledgers behind the commands.
    sandbox = Sandbox(
        base / "sb", "--processes", "--no-restart", "--no-autorecovery", "--bookies", "5", "--base-port", "0"
    )
    try:
        ready = sandbox.wait_ready()
        uri = str(ready["metadata_uri"])
        ledgers = {}
        for name, args in {
            "closed": ["--entries", "600", "--size", "100"],
            "closed2": ["--entries", "300", "-E", "4", "-Qw", "3", "-Qa", "2"],
            "single_copy": ["--entries", "40", "-E", "4", "-Qw", "1", "-Qa", "1"],
            "open": ["--entries", "50", "-E", "4", "-Qw", "4", "-Qa", "3", "--no-close"],
        }.items():
            done = bkctl("ledger", "write", *args, "-o", "json", metadata=uri)
            ledgers[name] = json.loads(done.stdout)["ledger_id"]
        # The victim holds part of the single-copy ledger and of the open one's last ensemble.
        ensembles = [
            set(json.loads(bkctl("ledger", "inspect", str(ledgers[n]), "-o", "json", metadata=uri).stdout)
                ["segments"][-1]["ensemble"])
            for n in ("single_copy", "open")
        ]  # fmt: skip
        victim = sorted(ensembles[0] & ensembles[1])[0]
        os.kill(bookie_pids(base / "sb")[int(victim.rsplit(":", 1)[1])], signal.SIGKILL)
        yield Dead(uri, victim, ledgers, sandbox)
    finally:
        assert sandbox.stop(signal.SIGINT) == 0


def step_1_recover_refuses_a_registered_bookie(dead: Dead, _: Path) -> None:
    # Its session outlives it for a while: the bookie still looks alive, and recover says so.
    code, out, err = dead.run("recover", dead.uri, dead.bookie, "-o", "json")
    if code == ExitCode.CONFLICT:
        assert out == "" and "is registered: it is alive" in err
    until(lambda: dead.bookie not in registered(dead.uri), "its session expired")


def step_2_dry_run_prints_the_plan_and_changes_nothing(dead: Dead, tmp_path: Path) -> None:
    before = [dead.run("ledger", "inspect", str(i), "-o", "json")[1] for i in dead.ledgers.values()]
    plan_file = tmp_path / "plan.json"
    code, out, err = dead.run(
        "recover", dead.uri, dead.bookie, "--dry-run", "--plan-out", str(plan_file), "-o", "json"
    )
    assert code == 0, err
    report = json.loads(out)
    assert report["dry_run"] is True and report["entries_copied"] == 0 and report["plan"]
    assert all(
        dead.bookie in s["old_ensemble"] and dead.bookie not in s["new_ensemble"] for s in report["plan"]
    )
    assert all(s["bytes"] > 0 and s["segment"] >= 0 for s in report["plan"])
    assert json.loads(plan_file.read_text()) == report["plan"]
    after = [dead.run("ledger", "inspect", str(i), "-o", "json")[1] for i in dead.ledgers.values()]
    assert before == after


def step_2b_progress_on_a_terminals_stderr_and_the_same_report(dead: Dead, _: Path) -> None:
    """A bar on stderr when it is a terminal; stdout the same report as with stderr piped."""
    from tests.test_output_terminal import BAR, run

    args = ("recover", dead.uri, dead.bookie, "--dry-run", "-o", "json")
    out, err, code = run(*args, stdout_tty=False, stderr_tty=True)
    assert code == 0, err
    assert BAR in err and "recover" in err and "ledgers" in err
    piped_out, piped_err, code = run(*args, stdout_tty=False, stderr_tty=False)
    assert code == 0 and BAR not in piped_err
    # The same report but for its timing and the new bookies (placement picks them at random).
    same = [
        {**doc, "seconds": 0, "plan": [{**step, "new_ensemble": None} for step in doc["plan"]]}
        for doc in (json.loads(out), json.loads(piped_out))
    ]
    assert same[0] == same[1]


def step_2c_bad_input_is_refused_before_any_work(dead: Dead, tmp_path: Path) -> None:
    """A plan file that cannot be written, a ledger or target that does not exist, a missing argument,
    a negative id: one line, exit 2 (4 for the ledger), nothing recovered."""
    before = [dead.run("ledger", "inspect", str(i), "-o", "json")[1] for i in dead.ledgers.values()]
    recover = ["recover", dead.uri, dead.bookie, "--yes", "-o", "json"]
    cases = {
        ExitCode.USAGE: [
            [*recover, "--plan-out", str(tmp_path)],
            [*recover, "--plan-out", str(tmp_path / "absent" / "plan.json")],
            ["recover", dead.uri, dead.bookie, "garbage", "--yes"],
            ["ledger", "recover", str(dead.ledgers["closed"]), "--target", "127.0.0.1:9999"],
            ["ledger", "recover", str(dead.ledgers["closed"]), "--target", "garbage"],
            ["ledger", "check", "-5"],
        ],
        ExitCode.NOT_FOUND: [[*recover, "--ledger", "12345"]],
    }
    runs = bkctl_all([args for batch in cases.values() for args in batch], dead.uri)
    codes = [code for code, batch in cases.items() for _ in batch]
    for run, code in zip(runs, codes, strict=True):
        lines = [line for line in run.stderr.strip().splitlines() if not line.startswith("Try 'bkctl ")]
        assert (run.returncode, run.stdout, len(lines)) == (code, "", 1), (run.args, run.stderr)
        assert lines[0].startswith("bkctl: error:") and "internal error" not in run.stderr
    missing = dead.run("recover", dead.uri)
    assert missing[0] == ExitCode.USAGE and "missing argument FAILED: The failed bookie(s)" in missing[2]
    after = [dead.run("ledger", "inspect", str(i), "-o", "json")[1] for i in dead.ledgers.values()]
    assert before == after


def step_3_recover_then_every_replica_is_there(dead: Dead, tmp_path: Path) -> None:
    # Another recover of the bookie holds its lock: refused at once (exit 15, the holder named)...
    with open_store(dead.uri) as store:
        recover_lock.take(Layout(store), [dead.bookie])
        code, out, err = dead.run("recover", dead.uri, dead.bookie, "-o", "json")
        assert (code, out) == (ExitCode.BUSY, "") and f"pid {os.getpid()}" in err, err
        # ... or, with --wait, it waits (said on stderr) and goes on once the other run ends.
        waiting = subprocess.Popen(
            [sys.executable, "-m", "bkctl", "recover", dead.uri, dead.bookie, "-o", "json", "--wait", "120",
             "--plan-out", str(tmp_path / "plan.json")],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        watchdog = threading.Timer(60, waiting.kill)
        watchdog.start()
        told = waiting.stderr.readline()  # type: ignore[union-attr]
        watchdog.cancel()
        assert "is running: waiting for it to end (up to 120 s)" in told, told
    out, err = waiting.communicate(timeout=120)
    code = waiting.returncode
    report = json.loads(out)
    assert json.loads((tmp_path / "plan.json").read_text())  # the steps it took, after the work
    names_it = [
        i
        for i in dead.ledgers.values()
        if dead.bookie in dead.run("ledger", "inspect", str(i), "-o", "json")[1]
    ]
    single = dead.ledgers["single_copy"]
    # The Qw=1 ledger lost the entries that were only on the dead bookie: exit 3, named with ranges.
    assert code == ExitCode.PROBLEMS_FOUND, err
    assert "not fully recovered (listed above); the others were recovered" in err
    assert [u["ledger_id"] for u in report["ledgers_unrecoverable"]] == [single]
    assert f"ledger {single}: no surviving copy of entries" in err
    assert names_it == [single]
    for name in ("closed", "closed2", "open"):
        ledger = str(dead.ledgers[name])
        code, out, err = dead.run("ledger", "check", ledger, "--full", "-o", "json")
        assert code == 0 and all(f["state"] == "ok" for f in json.loads(out)["fragments"]), (name, out, err)
    info = json.loads(dead.run("ledger", "inspect", str(dead.ledgers["open"]), "-o", "json")[1])
    assert info["state"] == "CLOSED" and info["last_entry_id"] == 49  # fenced and closed first
    # With --skip-unrecoverable the same report is a success; everything else is done: nothing copied.
    code, out, _ = dead.run("recover", dead.uri, dead.bookie, "--skip-unrecoverable", "-o", "json")
    assert code == 0 and json.loads(out)["entries_copied"] == 0


def step_4_ledger_check_finds_the_lost_replica(dead: Dead, _: Path) -> None:
    code, out, _ = dead.run("ledger", "check", str(dead.ledgers["single_copy"]), "-o", "json")
    assert code == ExitCode.PROBLEMS_FOUND
    states = {f["bookie"]: f["state"] for f in json.loads(out)["fragments"]}
    assert states[dead.bookie] == "bookie_down"


def step_5_decommission_names_an_unrecoverable_ledger_at_once(dead: Dead, _: Path) -> None:
    # The Qw=1 ledger's entries on the dead bookie are gone: no wait for what cannot change, exit 3.
    single = dead.ledgers["single_copy"]
    code, out, err = dead.run("bookie", "decommission", dead.bookie, "-o", "json")
    assert code == ExitCode.PROBLEMS_FOUND, err
    assert [u["ledger_id"] for u in json.loads(out)["ledgers_unrecoverable"]] == [single]
    assert f"ledger {single}: no surviving copy of entries" in err
    assert f"cookie of {dead.bookie} kept" in err and "waiting:" not in err
    assert dead.bookie in dead.run("bookie", "list", "--all", "-o", "plain")[1]


def step_6_decommission_waits_for_the_last_reference(dead: Dead, _: Path) -> None:
    # Drop the unrecoverable ledger (its data is gone), then retire the bookie: cookie deleted.
    assert dead.run("ledger", "delete", str(dead.ledgers["single_copy"]), "--yes")[0] == 0
    code, _, err = dead.run("bookie", "decommission", dead.bookie, "-o", "json")
    assert code == 0, err
    assert f"cookie of {dead.bookie} deleted" in err
    assert dead.bookie not in dead.run("bookie", "list", "--all", "-o", "plain")[1]


def step_7_unknown_bookie_is_not_found(dead: Dead, _: Path) -> None:
    code, out, err = dead.run("recover", dead.uri, "10.9.9.9:3181", "-o", "json")
    assert code == ExitCode.NOT_FOUND and out == ""
    assert "no cookie and no ledger names bookie 10.9.9.9:3181: nothing to recover" in err


STEPS = (
    step_1_recover_refuses_a_registered_bookie,
    step_2_dry_run_prints_the_plan_and_changes_nothing,
    step_2b_progress_on_a_terminals_stderr_and_the_same_report,
    step_2c_bad_input_is_refused_before_any_work,
    step_3_recover_then_every_replica_is_there,
    step_4_ledger_check_finds_the_lost_replica,
    step_5_decommission_names_an_unrecoverable_ledger_at_once,
    step_6_decommission_waits_for_the_last_reference,
    step_7_unknown_bookie_is_not_found,
)


def test_the_steps_in_order_on_one_cluster(dead: Dead, tmp_path: Path) -> None:
    """The steps build on each other (recover, then check, then decommission) on one cluster, so they are
    one test: pytest-xdist may hand a module's tests to two workers, and a step alone would meet a
    cluster its predecessors never touched."""
    for step in STEPS:
        own = tmp_path / step.__name__
        own.mkdir()
        step(dead, own)
