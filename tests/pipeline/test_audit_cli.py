"""`bkctl audit` as an operator runs it: the JSON contract of docs/cli.md, exit 3 on findings, marks for
autorecovery, Parquet output, a ledger range and the table output, an undecodable metadata node (a
warning, never orphans), bad input refused before Spark starts, no pyspark, and Spark Connect."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyspark
import pytest

from bkctl.cli import main
from bkctl.commands.audit import SPARK_MISSING, _foreign_dirs, _ledger_range, _render
from bkctl.commands.output import OutputFormat
from bkctl.files.index import ledger_index_path
from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from bkctl.pipeline.audit import AuditOptions, AuditResult, run_audit
from bkctl.pipeline.inventory import resolve_bookie_dirs
from tests.client.test_java_data import JAVA_INSTANCE_ID, prepare
from tests.conftest import REPO

pytestmark = pytest.mark.spark
SUMMARY_KEYS = {
    "ledgers", "bookies", "entries_expected", "replicas_expected", "replicas_found", "missing", "lost",
    "extra", "orphan_ledgers", "orphan_bytes", "corrupt", "divergent", "unknown", "digests_checked",
    "seconds", "foreign_dirs",
}  # fmt: skip
B1, B2, B3 = "127.0.0.1:33181", "127.0.0.1:33182", "127.0.0.1:33183"
TOTALS = ["replicas_expected", "replicas_found"]
FINDING_KEYS = {"kind", "ledger_id", "bookie", "first_entry_id", "last_entry_id", "entries"}


def bkctl_audit(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    dirs = [a for n in (1, 2, 3) for a in ("--bookie-dir", str(root / f"b{n}"))]
    metadata = f"sqlite://{root / 'metadata.db'}"
    return subprocess.run(
        [sys.executable, "-m", "bkctl", "audit", "--metadata", metadata, *dirs, *args],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "BKCTL_SPARK_MASTER": "local[2]"},
    )  # fmt: skip


def in_process_audit(spark: Any, root: Path, **options: Any) -> AuditResult:
    """The pipeline `bkctl_audit` runs, on the session's SparkSession: b1-b3 of `root`."""
    bookies = resolve_bookie_dirs([str(root / f"b{n}") for n in (1, 2, 3)])
    return run_audit(spark, f"sqlite://{root / 'metadata.db'}", bookies, AuditOptions(**options))


def test_findings_exit_3_with_the_json_contract_marks_and_parquet(
    tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    prepare(tmp_path)
    os.remove(ledger_index_path(3, tmp_path / "b1" / "ledgers"))
    with SqliteStore(tmp_path / "metadata.db") as store:  # ledger 2's node no longer decodes
        bad_node = Layout(store).ledger_path(2)
        store.set(bad_node, b"\x08garbage")
    out = tmp_path / "report"
    run = bkctl_audit(tmp_path, "--mark-underreplicated", "--output-dir", str(out), "-o", "json")
    assert run.returncode == 3, run.stderr
    document = json.loads(run.stdout)  # stdout is the document alone: Spark's chatter is on stderr
    assert set(document) == {"summary", "findings", "errors", "warnings"}
    assert set(document["summary"]) == SUMMARY_KEYS
    assert [set(f) for f in document["findings"]] == [FINDING_KEYS] * len(document["findings"])
    # Ledger 2's copies on all three bookies are neither orphan (reclaimable!) nor extra: not audited.
    assert {(f["kind"], f["ledger_id"], f["bookie"]) for f in document["findings"]} == {("missing", 3, B1)}
    assert document["summary"]["missing"] == 134 and document["summary"]["ledgers"] == 3
    assert document["errors"] == [] and len(document["warnings"]) == 1 and bad_node in document["warnings"][0]
    warnings = [line for line in run.stderr.splitlines() if line.startswith("bkctl: warning:")]
    assert len(warnings) == 1 and bad_node in warnings[0] and "ledger 2 not audited" in warnings[0]
    assert not [line for line in run.stderr.splitlines() if bad_node in line and "error" in line]
    with SqliteStore(tmp_path / "metadata.db") as store:
        mark = Layout(store).read_underreplicated(3)
    assert mark is not None and mark.value.replicas == (B1,)
    findings = spark.read.parquet(str(out / "findings"))
    assert findings.groupBy().sum("entries").collect()[0][0] == 134
    assert json.loads((out / "summary.json").read_text())["missing"] == 134
    # Totals (E=3, Qw=2: each bookie gets 2/3 of a ledger's entries; ledger 1 is open at 50 entries).
    per_ledger = {r.ledger_id: r.asDict() for r in spark.read.parquet(str(out / "per_ledger")).collect()}
    assert set(per_ledger) == {0, 1, 3}
    assert set(per_ledger[3]) == {
        "ledger_id",
        *TOTALS,
        "missing",
        "lost",
        "extra",
        "orphan",
        "corrupt",
        "divergent",
    }
    assert [per_ledger[i]["replicas_expected"] for i in (0, 1, 3)] == [2000, 100, 400]
    assert [per_ledger[i]["replicas_found"] for i in (0, 1, 3)] == [2000, 100, 400 - 134]
    assert (per_ledger[3]["missing"], per_ledger[0]["missing"], per_ledger[3]["lost"]) == (134, 0, 0)
    per_bookie = {r.bookie: r.asDict() for r in spark.read.parquet(str(out / "per_bookie")).collect()}
    assert set(per_bookie) == {B1, B2, B3}
    assert set(per_bookie[B1]) == {"bookie", *TOTALS, "missing", "extra", "orphan", "corrupt"}
    assert sum(b["replicas_expected"] for b in per_bookie.values()) == 2500
    b1 = per_bookie[B1]
    assert b1["replicas_expected"] - b1["replicas_found"] == b1["missing"] == 134
    assert per_bookie[B2]["replicas_expected"] == per_bookie[B2]["replicas_found"]

    # Only ledgers 3-3: ledger 0-2 are not looked at (no warning for ledger 2); the table output. In
    # process on the session's Spark (a CLI run is a JVM start): the range and rendering of the command.
    result = in_process_audit(spark, tmp_path, ledgers=_ledger_range("3-3"))
    assert not result.clean and result.warnings == [] and result.errors == []
    capsys.readouterr()
    _render(result.as_dict(), OutputFormat.table)
    table = capsys.readouterr().out
    summary = dict(line.split(":", 1) for line in table.split("\n\n")[0].splitlines())
    assert {k: summary[k].strip() for k in ("ledgers", "entries_expected", "missing")} == {
        "ledgers": "1", "entries_expected": "200", "missing": "134"
    }  # fmt: skip
    rows = [line.split() for line in table.splitlines() if line.startswith("missing ")]
    # b1 held entries e % 3 in (0, 1) of ledger 3: 67 runs of 1-2 entries, one row from 0 to 199.
    assert rows == [["missing", "3", B1, "0", "199", "134"]], table


def test_bad_input_is_refused_before_spark_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nocookie" / "current").mkdir(parents=True)
    run = subprocess.run(
        [sys.executable, "-m", "bkctl", "audit", "--metadata", f"sqlite://{tmp_path / 'm.db'}",
         "--bookie-dir", str(tmp_path / "nocookie")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and "no cookie" in run.stderr and "ID=DIR" in run.stderr, run.stderr
    given = ["--bookie-dir", f"b1={tmp_path / 'nocookie'}"]
    (tmp_path / "a-file").write_text("")
    for args, says in (
        ([*given, "--ledgers", "9-3"], "--ledgers"),
        ([*given, "--sample", "0.5"], "--sample goes with --verify-digests"),
        (["--bookie-dir", str(tmp_path / "absent")], "no such directory"),
        ([*given, "--master", "bogus://x"], "--master 'bogus://x' is not a Spark master URL"),
        ([*given, "--remote", "http://x"], "--remote 'http://x' is not a Spark Connect URL"),
        ([*given, "--output-dir", str(tmp_path / "a-file")], "is a file, not a directory"),
    ):  # in process: the command's own checks, as the child process above runs them
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            main(["audit", *args])
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert exited.value.code == 2 and says in err and len(lines) == 1, err


def test_without_pyspark_one_line_and_exit_6(tmp_path: Path) -> None:
    # A `pyspark` first on the path that fails to import, as a missing one does.
    (tmp_path / "shim" / "pyspark").mkdir(parents=True)
    (tmp_path / "shim" / "pyspark" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pyspark'\", name='pyspark')\n"
    )
    (tmp_path / "b1" / "current").mkdir(parents=True)
    run = subprocess.run(
        [sys.executable, "-m", "bkctl", "audit", "--metadata", f"sqlite://{tmp_path / 'm.db'}",
         "--bookie-dir", f"b1={tmp_path / 'b1'}"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "shim")},
    )  # fmt: skip
    assert run.returncode == 6, run.stderr
    assert run.stderr.splitlines() == [f"bkctl: error: {SPARK_MISSING}"]


@contextmanager
def connect_server(log: Path) -> Iterator[str]:
    """A Spark Connect server (local[2]) started from the pyspark package's own jars; its sc:// URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    home = Path(pyspark.__file__).parent
    confs = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
    }
    command = [str(home / "bin" / "spark-submit"), "--master", "local[2]",
               "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]  # fmt: skip
    command += [arg for key, value in confs.items() for arg in ("--conf", f"{key}={value}")]
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    with log.open("wb") as out:
        server = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, f"the Spark Connect server exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "the Spark Connect server did not listen within 180 s"
            with socket.socket() as client:
                if client.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)


def test_over_spark_connect(tmp_path: Path) -> None:
    """--remote sc://: no SparkContext on the client; the data sources run in the server's executors."""
    prepare(tmp_path)
    os.remove(ledger_index_path(3, tmp_path / "b1" / "ledgers"))
    with connect_server(tmp_path / "connect.log") as url:
        run = bkctl_audit(tmp_path, "--remote", url, "--verify-digests", "-o", "json")
    assert run.returncode == 3, run.stderr
    document = json.loads(run.stdout)
    assert {(f["kind"], f["ledger_id"], f["bookie"]) for f in document["findings"]} == {("missing", 3, B1)}
    summary = document["summary"]
    assert (summary["missing"], summary["ledgers"], summary["entries_expected"]) == (134, 4, 1350)
    assert summary["digests_checked"] == summary["replicas_found"] == 2700 - 134


def test_another_clusters_bookie_is_refused_unless_forced(
    tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bookie directory whose cookie names another instance id: exit 10 before Spark starts; --force
    audits it, says so, and every copy of that cluster's ledgers comes out as one row per ledger (the
    forced audit in process, on the session's Spark: the command's steps, without a JVM start)."""
    prepare(tmp_path)
    other = tmp_path / "other.db"
    with SqliteStore(other) as store:
        Layout(store).init_cluster()
    audit = [sys.executable, "-m", "bkctl", "audit", "--metadata", f"sqlite://{other}",
             "--bookie-dir", str(tmp_path / "b1"), "-o", "json"]  # fmt: skip
    run = subprocess.run(audit, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 10 and run.stdout == "", run.stderr
    assert run.stderr.count("\n") == 1 and "another cluster's bookie" in run.stderr
    bookies = resolve_bookie_dirs([str(tmp_path / "b1")])
    capsys.readouterr()
    foreign = _foreign_dirs(f"sqlite://{other}", bookies, force=True)
    assert "--force: auditing" in capsys.readouterr().err
    result = run_audit(spark, f"sqlite://{other}", bookies, AuditOptions(foreign_dirs=foreign))
    assert not result.clean
    document = result.as_dict()
    assert document["summary"]["foreign_dirs"] == [
        f"{tmp_path / 'b1' / name} (instance id {JAVA_INSTANCE_ID})" for name in ("journal", "ledgers")
    ]
    rows = [(f["kind"], f["ledger_id"], f["bookie"]) for f in document["findings"]]
    assert rows and len(rows) == len(set(rows)) and {kind for kind, _, _ in rows} == {"orphan"}


@contextmanager
def silent_server() -> Iterator[str]:
    """Accepts connections and never answers: a Spark Connect URL that hangs its client."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"sc://127.0.0.1:{server.getsockname()[1]}"


def test_a_spark_connect_server_that_never_answers(tmp_path: Path) -> None:
    """Refused: exit 6 at once; silent: the wait is said, then exit 6 within its bound; Ctrl-C during
    it: exit 130. One line each, before any Spark session."""
    (tmp_path / "b1" / "current").mkdir(parents=True)
    with SqliteStore(tmp_path / "m.db") as store:
        Layout(store).init_cluster()
    audit = [sys.executable, "-m", "bkctl", "audit", "--metadata", f"sqlite://{tmp_path / 'm.db'}",
             "--bookie-dir", f"b1={tmp_path / 'b1'}", "--remote"]  # fmt: skip
    refused = subprocess.run(
        [*audit, "sc://127.0.0.1:1"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 6 and refused.stderr.count("\n") == 1, refused.stderr
    assert "no Spark Connect server at sc://127.0.0.1:1" in refused.stderr
    with silent_server() as url:
        silent = subprocess.run([*audit, url], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert silent.returncode == 6, silent.stderr
        assert silent.stderr.splitlines() == [
            f"bkctl: waiting for the Spark Connect server at {url} (up to 10 s)",
            f"bkctl: error: the Spark Connect server at {url} did not answer within 10 s",
        ]
        stopped = subprocess.Popen([*audit, url], cwd=REPO, stderr=subprocess.PIPE, text=True)
        try:
            assert "waiting for the Spark Connect server" in stopped.stderr.readline()  # type: ignore[union-attr]
            stopped.send_signal(signal.SIGINT)
            assert stopped.wait(60) == 130
        finally:
            stopped.kill()
            stopped.wait(60)
