"""A live ledger whose index file is gone, as real processes: a forced major GC keeps every one of its
entry log records (the metadata still names this bookie), says so in its report, its metric and
`bkctl doctor`; `bkctl bookie check` lists the records no index reaches; after `bkctl index rebuild`
(the master key from the metadata) every entry reads back."""

from __future__ import annotations

import hashlib
import json
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from bkctl.errors import ExitCode
from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from bkctl.protocol import index_format as ixf
from tests.server_net.live import metadata_uri
from tests.server_net.test_gc import metadata, payload
from tests.server_net.test_gc_crash import conf_file, start
from tests.server_net.test_refusals import bkctl_run
from tests.server_net.wire_client import PASSWORD, WireClient, package

pytestmark = pytest.mark.slow

LEDGER = 5
ENTRIES = 3000  # ~3 MB of 1 KiB entries: several 1 MiB entry logs


def logs_digest(current: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(current.glob("*.log"))}


def read_back(port: int) -> None:
    with WireClient("127.0.0.1", port) as client:
        for entry_id in range(ENTRIES):
            r = client.read(LEDGER, entry_id)
            assert (r.rc, r.entry) == (0, package(LEDGER, entry_id, payload(LEDGER, entry_id))), entry_id


def test_missing_index_forced_gc_keeps_every_record_then_rebuild(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    with SqliteStore(Path(uri.removeprefix("sqlite://"))) as store:
        live = replace(metadata(LEDGER), password=PASSWORD)
        live = replace(live, segments=(replace(live.segments[0], ensemble=("gc-crash",)),))
        Layout(store).create_ledger(live, ledger_id=LEDGER)
    conf = conf_file(tmp_path, uri)
    ledgers = tmp_path / "b1" / "ledgers"
    current = ledgers / "current"
    bookie, port, http_port = start(conf)
    try:
        with WireClient("127.0.0.1", port) as client:
            replies = client.add_many(LEDGER, [payload(LEDGER, e) for e in range(ENTRIES)])
            assert all(r.rc == 0 for r in replies)
        assert bookie.terminate() == 0  # every entry checkpointed into the entry logs
        (current / ixf.index_path(LEDGER)).unlink()  # the index is lost while the bookie is stopped
        before = logs_digest(current)
        assert len(before) >= 3

        bookie, port, http_port = start(conf)
        done = bkctl_run(
            "bookie", "gc", "--http", f"127.0.0.1:{http_port}", "--major", "--wait", "-o", "json"
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["unindexed_kept"] == [LEDGER] and report["entry_logs_removed"] == [], report
        assert report["entry_logs_compacted"] == [], report
        after = logs_digest(current)  # every record kept, byte for byte (the restart opened a new log)
        assert {name: after.get(name) for name in before} == before
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=30) as answer:
            assert "bkctl_bookie_gc_unindexed_ledgers_kept 1" in answer.read().decode()
        doctor = bkctl_run("doctor", "--metadata", uri, "-o", "json")
        assert doctor.returncode == ExitCode.PROBLEMS_FOUND, doctor.stderr
        (indexes,) = [c for c in json.loads(doctor.stdout)["checks"] if c["check"] == "indexes"]
        assert indexes["state"] == "problem" and f"gc-crash ledgers {LEDGER}" in indexes["detail"]
        assert "bkctl index rebuild" in indexes["detail"]
        busy = bkctl_run("index", "rebuild", "-l", str(ledgers), "--ledger", str(LEDGER), "--metadata", uri)
        assert busy.returncode == ExitCode.LOCKED, busy.stderr  # never under a running bookie
        assert bookie.terminate() == 0

        check = bkctl_run("bookie", "check", "--ledger-dir", str(ledgers), "-o", "json")
        assert check.returncode == ExitCode.PROBLEMS_FOUND, check.stderr
        problems = json.loads(check.stdout)["problems"]
        assert {p["ledger_id"] for p in problems} == {LEDGER}
        assert all(p["problem"] == "unreachable" for p in problems)

        rebuilt = bkctl_run(
            "index", "rebuild", "-l", str(ledgers), "--ledger", str(LEDGER), "--metadata", uri
        )
        assert rebuilt.returncode == 0, rebuilt.stderr
        clean = bkctl_run("bookie", "check", "--ledger-dir", str(ledgers))
        assert clean.returncode == 0, clean.stdout + clean.stderr
        bookie, port, http_port = start(conf)
        read_back(port)
        assert bookie.terminate() == 0
    finally:
        bookie.kill()
