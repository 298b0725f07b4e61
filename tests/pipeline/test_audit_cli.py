"""`bkctl audit` as an operator runs it: the JSON contract of docs/cli.md, exit 3 on findings, marks for
autorecovery, Parquet output, and bad input refused before Spark starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bkctl.files.index import ledger_index_path
from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from tests.client.test_java_data import prepare
from tests.conftest import REPO

pytestmark = pytest.mark.spark
SUMMARY_KEYS = {
    "ledgers", "bookies", "entries_expected", "replicas_expected", "replicas_found", "missing", "lost",
    "extra", "orphan_ledgers", "orphan_bytes", "corrupt", "divergent", "unknown", "seconds",
}  # fmt: skip
FINDING_KEYS = {"kind", "ledger_id", "bookie", "first_entry_id", "last_entry_id", "entries"}


def bkctl_audit(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    dirs = [a for n in (1, 2, 3) for a in ("--bookie-dir", str(root / f"b{n}"))]
    metadata = f"sqlite://{root / 'metadata.db'}"
    return subprocess.run(
        [sys.executable, "-m", "bkctl", "audit", "--metadata", metadata, *dirs, *args],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "BKCTL_SPARK_MASTER": "local[2]"},
    )  # fmt: skip


def test_findings_exit_3_with_the_json_contract_marks_and_parquet(tmp_path: Path, spark: Any) -> None:
    prepare(tmp_path)
    os.remove(ledger_index_path(3, tmp_path / "b1" / "ledgers"))
    out = tmp_path / "report"
    run = bkctl_audit(tmp_path, "--mark-underreplicated", "--output-dir", str(out), "-o", "json")
    assert run.returncode == 3, run.stderr
    document = json.loads(run.stdout)  # stdout is the document alone: Spark's chatter is on stderr
    assert set(document) == {"summary", "findings", "errors"} and set(document["summary"]) == SUMMARY_KEYS
    assert [set(f) for f in document["findings"]] == [FINDING_KEYS] * len(document["findings"])
    assert {(f["kind"], f["ledger_id"], f["bookie"]) for f in document["findings"]} == {
        ("missing", 3, "127.0.0.1:33181")
    }
    assert document["summary"]["missing"] == 134
    with SqliteStore(tmp_path / "metadata.db") as store:
        mark = Layout(store).read_underreplicated(3)
    assert mark is not None and mark.value.replicas == ("127.0.0.1:33181",)
    findings = spark.read.parquet(str(out / "findings"))
    assert findings.groupBy().sum("entries").collect()[0][0] == 134
    assert json.loads((out / "summary.json").read_text())["missing"] == 134


def test_bad_input_is_refused_before_spark_starts(tmp_path: Path) -> None:
    (tmp_path / "nocookie" / "current").mkdir(parents=True)
    run = subprocess.run(
        [sys.executable, "-m", "bkctl", "audit", "--metadata", f"sqlite://{tmp_path / 'm.db'}",
         "--bookie-dir", str(tmp_path / "nocookie")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and "no cookie" in run.stderr and "ID=DIR" in run.stderr, run.stderr
    given = ["--bookie-dir", f"b1={tmp_path / 'nocookie'}"]
    for args, says in (
        ([*given, "--ledgers", "9-3"], "--ledgers"),
        ([*given, "--sample", "0.5"], "--sample goes with --verify-digests"),
        (["--bookie-dir", str(tmp_path / "absent")], "no such directory"),
    ):
        run = subprocess.run(
            [sys.executable, "-m", "bkctl", "audit", *args],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and says in run.stderr and len(lines) == 1, run.stderr
