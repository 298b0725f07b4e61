"""A short seeded chaos run (docs/reliability.md) in the normal suite: its own ZooKeeper
(it is paused on purpose), five bookie processes of both storages (`--storage mixed`: three db, two
interleaved, the one whose disk is filled a db one), two autorecovery daemons, writers and readers, and
about 20 random faults; the run must end with nothing acknowledged lost, no violation, and the cluster
healed. The long runs and their figures are in benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_a_short_chaos_run_loses_nothing() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.chaos", "--seed", "11", "--duration", "40",
         "--heal-timeout", "120", "--storage", "mixed"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.stdout.strip(), run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["violations"] == [] and summary["entries_lost"] == 0, summary
    assert summary["storage"] == "mixed"
    assert run.returncode == 0, (summary, run.stderr[-3000:])
    assert summary["entries_acknowledged"] > 1000 and summary["reads_checked"] > 10, summary
    assert sum(summary["faults"].values()) >= 8 and summary["heal_s"] is not None, summary
    assert "no disk-full faults" not in run.stderr, run.stderr[-2000:]
