"""`bkctl audit --online`: bkctl bookie processes serving the Java cluster's copied directories answer
GET_LIST_OF_ENTRIES_OF_LEDGER; the online audit finds what the offline one finds (entries in a bookie's
write cache included), checks digests over the wire, and a registered bookie that does not answer is
reported with its replicas `unknown`, never `missing`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bkctl.files.index import ledger_index_path
from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from bkctl.pipeline.audit import AuditOptions, AuditResult, run_audit
from bkctl.pipeline.inventory import resolve_bookie_dirs
from bkctl.pipeline.online import registered_bookies
from bkctl.protocol import metadata_format as mf
from tests.client.test_java_data import prepare
from tests.conftest import REPO
from tests.pipeline.test_audit_java import B1, ENTRIES, kinds, record
from tests.server_net.live import BookieProcess

pytestmark = pytest.mark.spark
IDS = {n: f"127.0.0.1:3318{n}" for n in (1, 2, 3)}


@contextmanager
def bookies(root: Path, uri: str, which: tuple[int, ...] = (1, 2, 3)) -> Iterator[None]:
    processes = [
        BookieProcess(
            ["-j", str(root / f"b{n}" / "journal"), "-l", str(root / f"b{n}" / "ledgers"),
             "--metadata", uri, "--bookie-id", IDS[n], "-p", "0"]
        )
        for n in which
    ]  # fmt: skip
    try:
        for process in processes:
            process.wait_serving()
        yield
    finally:
        for process in processes:
            process.kill()


def bkctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bkctl", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "BKCTL_SPARK_MASTER": "local[2]"},
    )  # fmt: skip


def both(spark: Any, root: Path, uri: str, **options: Any) -> tuple[AuditResult, AuditResult]:
    online, problems = registered_bookies(uri)
    assert problems == [] and [b.bookie_id for b in online] == sorted(IDS.values())
    offline = resolve_bookie_dirs([str(root / f"b{n}") for n in (1, 2, 3)])
    return (
        run_audit(spark, uri, offline, AuditOptions(**options)),
        run_audit(spark, uri, online, AuditOptions(**options)),
    )


def comparable(result: AuditResult) -> tuple[Any, ...]:
    summary = {k: v for k, v in result.summary.items() if k != "seconds"}
    return summary, result.findings, result.errors


def test_online_finds_what_offline_finds_write_cache_included(spark: Any, tmp_path: Path) -> None:
    uri = prepare(tmp_path)
    os.remove(ledger_index_path(3, tmp_path / "b1" / "ledgers"))
    with bookies(tmp_path, uri):
        write = bkctl("ledger", "write", "--metadata", uri, "--entries", "300", "-E", "3", "-Qw", "2",
                      "-Qa", "2", "-o", "json")  # fmt: skip
        assert write.returncode == 0, write.stderr
        offline, online = both(spark, tmp_path, uri)
    assert comparable(online) == comparable(offline)
    assert kinds(online) == {("missing", 3, B1): 134}
    assert online.summary["entries_expected"] == sum(ENTRIES.values()) + 300
    assert online.summary["ledgers"] == 5


def test_online_digests_and_a_bookie_that_does_not_answer(spark: Any, tmp_path: Path) -> None:
    uri = prepare(tmp_path)
    log, offset, size = record(tmp_path, 1, 0, 17)
    with log.open("r+b") as f:  # the last payload byte of ledger 0 entry 17 on bookie1
        f.seek(offset + size - 1)
        byte = f.read(1)[0]
        f.seek(offset + size - 1)
        f.write(bytes([byte ^ 0xFF]))
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with SqliteStore(tmp_path / "metadata.db") as store, bookies(tmp_path, uri, (1, 2)):
        # bookie3 registered (its session alive) but nothing listens where it says it does.
        endpoint = mf.BookieEndpoint("bookie", port, "127.0.0.1", "bookie-rpc")
        Layout(store).register_bookie(IDS[3], mf.BookieServiceInfo((endpoint,)))
        run = bkctl("audit", "--online", "--verify-digests", "--metadata", uri, "-o", "json", timeout=300)
    assert run.returncode == 3, run.stderr
    document = json.loads(run.stdout)
    assert [(f["kind"], f["ledger_id"], f["bookie"], f["first_entry_id"]) for f in document["findings"]] == [
        ("corrupt", 0, B1, 17)
    ]
    assert len(document["errors"]) == 1 and IDS[3] in document["errors"][0]
    assert "does not answer" in document["errors"][0]
    # Every replica bookie3 should hold is unknown: nothing missing, nothing lost.
    summary = document["summary"]
    assert summary["missing"] == summary["lost"] == 0 and summary["unknown"] > 0
    assert summary["replicas_found"] + summary["unknown"] == summary["replicas_expected"]
