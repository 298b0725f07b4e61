"""`bkctl bookie convert` of a bookie with three ledger dirs, both ways, killed (kill -9 through
BKCTL_FAULT_POINT) at each step and run again, then `bkctl bookie start` on the result reading every
entry: to db, entries held in another dir than their ledger's are copied there; to interleaved, log ids
the dirs share are renamed apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bkctl.files.entrylog import ledger_sizes, open_entry_log
from bkctl.server.db_ledger_index import open_ledgers, read_ledgers
from bkctl.server.entrylog import existing_log_ids
from bkctl.server.ledger_storage import ENGINE_CLASSES
from bkctl.server.storage_kind import DB, INTERLEAVED
from tests.conftest import REPO
from tests.server_net.live import BookieProcess, bookie_flags, metadata_uri
from tests.server_net.test_gc import layout_call
from tests.server_net.test_gc_crash import put_gc, start
from tests.server_net.wire_client import WireClient, package

pytestmark = pytest.mark.slow

LEDGERS = [3, 5, 8, 10, 13]  # written in this order, ~one entry log each: some in place, some not
ENTRIES = 400
ENTRY = 2000
DIRS = 3


def _payload(ledger_id: int, entry_id: int) -> bytes:
    seed = f"L{ledger_id}E{entry_id}-".encode()
    return (seed * (ENTRY // len(seed) + 1))[:ENTRY]


def _conf(tmp_path: Path, dirs: list[Path], storage: str) -> Path:
    keys = bookie_flags(
        tmp_path / "b1",
        logSizeLimit=str(1024 * 1024),
        ledgerDirectories=",".join(map(str, dirs)),
        bookieId="convert-dirs",
        metadataServiceUri=metadata_uri(tmp_path),
        ledgerStorageClass=ENGINE_CLASSES[storage],
        gcWaitTime="0",
        httpServerPort="0",
    )
    path = tmp_path / f"{storage}.conf"
    path.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    return path


def _foreign_bytes(dirs: list[Path]) -> tuple[int, int]:
    """(bytes of records in a dir their ledger does not live in, logs holding nothing else)."""
    foreign = only_foreign = 0
    for index, directory in enumerate(dirs):
        for path in existing_log_ids((directory,)).values():
            sizes = ledger_sizes(open_entry_log(path)).sizes
            elsewhere = sum(size for ledger_id, size in sizes.items() if ledger_id % DIRS != index)
            foreign += elsewhere
            only_foreign += bool(sizes) and elsewhere == sum(sizes.values())
    return foreign, only_foreign


def _write(port: int) -> None:
    with WireClient("127.0.0.1", port) as c:
        for first in range(0, ENTRIES, 100):  # ledgers interleaved in every entry log
            for ledger_id in LEDGERS:
                payloads = [_payload(ledger_id, e) for e in range(first, first + 100)]
                assert all(r.rc == 0 for r in c.add_many(ledger_id, payloads, first=first))


def _serves_everything(conf: Path) -> None:
    bookie = BookieProcess(["--conf", str(conf)])
    try:
        _, port = bookie.wait_serving()
        with WireClient("127.0.0.1", port) as c:
            for ledger_id in LEDGERS:
                for entry_id in range(ENTRIES):
                    r = c.read(ledger_id, entry_id)
                    expected = package(ledger_id, entry_id, _payload(ledger_id, entry_id))
                    assert (r.rc, r.entry) == (0, expected), (ledger_id, entry_id)
        assert bookie.terminate() == 0, bookie.stderr
    finally:
        bookie.kill()


def _convert(to: str, dirs: list[Path], fault: str = "") -> tuple[int, dict[str, Any], str]:
    args = [a for d in dirs for a in ("-l", str(d))]
    command = [sys.executable, "-m", "bkctl", "bookie", "convert", "--to", to, *args, "-o", "json"]
    env = {**os.environ, "BKCTL_FAULT_POINT": fault}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, json.loads(done.stdout) if done.returncode == 0 else {}, done.stderr


def _killed_then_finished(to: str, dirs: list[Path], old: Path, conf: Path) -> dict[str, Any]:
    """Killed before the decision (the old storage still serves), after it (a start is refused),
    while moving files in; then run to the end."""
    code, _, err = _convert(to, dirs, "convert-built")
    assert code == -9, err
    assert not (dirs[0] / "current" / "convert.json").exists()
    _serves_everything(old)  # the old storage, whole
    for fault, started in (("convert-decided", old), ("convert-moving", conf)):
        code, _, err = _convert(to, dirs, fault)
        assert code == -9, err
        refused = BookieProcess(["--conf", str(started)])
        assert refused.wait_exit() != 0 and "run the same `bkctl bookie convert` again" in refused.stderr
    code, report, err = _convert(to, dirs)
    assert code == 0, err
    assert not any((d / "convert-staging").exists() for d in dirs)
    assert not (dirs[0] / "current" / "convert.json").exists()
    return report


def test_three_dirs_convert_both_ways_killed_at_each_step(tmp_path: Path) -> None:
    dirs = [tmp_path / "b1" / "ledgers", *(tmp_path / "b1" / f"ledgers{i}" for i in range(1, DIRS))]
    interleaved, db = _conf(tmp_path, dirs, INTERLEAVED), _conf(tmp_path, dirs, DB)
    layout_call(metadata_uri(tmp_path), "create", LEDGERS)  # the collector keeps them
    bookie = BookieProcess(["--conf", str(interleaved)])
    try:
        _, port = bookie.wait_serving()
        _write(port)
        assert bookie.terminate() == 0, bookie.stderr
    finally:
        bookie.kill()
    assert all(existing_log_ids((d,)) for d in dirs)  # the interleaved engine spreads its logs

    report = _killed_then_finished(DB, dirs, interleaved, db)
    assert report["ledgers"] == len(LEDGERS) and report["entries"] == len(LEDGERS) * ENTRIES
    assert 0 < report["copied"] < report["entries"]  # what was in its ledger's dir stayed in place
    for index, directory in enumerate(dirs):  # Java's rule: ledger L in dir L mod n
        ledgers = open_ledgers(directory / "current", read_only=True)
        assert set(read_ledgers(ledgers)) == {i for i in LEDGERS if i % DIRS == index}
        ledgers.close()
        assert not list((directory / "current").glob("*/*/*.idx"))
    _serves_everything(db)
    # The records copied away are garbage where they were, as Java's per-dir collector counts them.
    foreign, only_foreign = _foreign_bytes(dirs)
    assert foreign > 0 and only_foreign > 0
    bookie, _, http_port = start(db)
    try:
        report = put_gc(http_port, {"forceMajor": True})
        assert report["errors"] == [] and report["unindexed_kept"] == [], report
        assert bookie.terminate() == 0, bookie.stderr
    finally:
        bookie.kill()
    left, only_left = _foreign_bytes(dirs)
    assert left < foreign / 2 and only_left == 0, (foreign, left)

    # Each db dir counts log ids on its own (the copies and the db bookie's new logs share ids).
    ids = [set(existing_log_ids((d,))) for d in dirs]
    shared = sum(map(len, ids)) - len(set().union(*ids))
    assert shared > 0
    report = _killed_then_finished(INTERLEAVED, dirs, db, interleaved)
    assert report["renamed_logs"] >= shared  # and the logs the db bookie opened at its starts since
    ids = [set(existing_log_ids((d,))) for d in dirs]
    assert sum(map(len, ids)) == len(set().union(*ids))  # one id, one log, over every dir
    assert not any((d / "current" / "locations").exists() for d in dirs)
    _serves_everything(interleaved)
