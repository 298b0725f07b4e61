"""`bkctl index rebuild` on a db bookie of two ledger dirs: the ledgers db (Java's rebuild-db-ledgers-index)
and the locations db, chosen automatically or with --db; kill -9 while building and while swapping."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bkctl.errors import ConflictError
from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from bkctl.model import DigestType, LedgerMetadata, Segment
from bkctl.protocol import db_format as dbf
from bkctl.protocol.wire import ReturnCode as RC
from bkctl.server.db_ledger_index import open_ledgers, read_ledgers
from bkctl.server.rocksdb_store import KeyValueDb
from tests.conftest import REPO
from tests.server.helpers import KEY, Durable, ledger_dirs, packaged, started, twisted_test, wait_until
from tests.server.test_storage import add_all
from tests.server_net.live import metadata_uri
from tests.test_inspect import invoke, invoke_json

LEDGERS = range(5)
ENTRIES = 40


async def _written(tmp_path: Path) -> tuple[Path, ...]:
    """A stopped two-dir db bookie: ledgers 0-4 (ledger 3 fenced) over ledgers/ and ledgers1/."""
    durable = Durable()
    dirs = ledger_dirs(tmp_path, 2)
    storage = started(tmp_path, durable, engine="db", ledger_dirs=dirs, log_size_limit=16 * 1024)
    for ledger_id in LEDGERS:
        await add_all(storage, durable, ledger_id, ENTRIES)
    assert storage.fence(3, KEY, "fence") == RC.EOK
    await wait_until(lambda: "fence" in durable.tokens)
    await storage.stop()
    return dirs


def _ledgers(directory: Path) -> dict[int, dbf.LedgerData]:
    db = open_ledgers(directory / "current", read_only=True)
    try:
        return read_ledgers(db)
    finally:
        db.close()


def _locations(directory: Path) -> list[tuple[bytes, bytes]]:
    db = KeyValueDb(directory / "current" / dbf.LOCATIONS_DB, huge=True, read_only=True)
    try:
        return list(db.items())
    finally:
        db.close()


async def _serves_everything(tmp_path: Path, dirs: tuple[Path, ...]) -> None:
    storage = started(tmp_path, engine="db", ledger_dirs=dirs)
    for ledger_id in LEDGERS:
        assert [storage.read(ledger_id, e) for e in range(ENTRIES)] == [
            (RC.EOK, packaged(ledger_id, e)) for e in range(ENTRIES)
        ]
    await storage.stop()


def _rebuild(*args: str, fault: str = "") -> subprocess.CompletedProcess[str]:
    env = {"BKCTL_FAULT_POINT": fault, "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "bkctl", "index", "rebuild", *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@twisted_test
async def test_a_lost_ledgers_db_is_rebuilt_from_entry_logs_and_journal(tmp_path: Path) -> None:
    dirs = await _written(tmp_path)
    kept = _ledgers(dirs[0])
    locations = [_locations(d) for d in dirs]
    shutil.rmtree(dirs[1] / "current" / dbf.LEDGERS_DB)
    args = ["-l", str(dirs[0]), "-l", str(dirs[1]), "--journal-dir", str(tmp_path / "journal")]
    wrong_order = invoke("index", "rebuild", "-l", str(dirs[1]), "-l", str(dirs[0]), "--db", "ledgers")
    assert wrong_order[0] == 2 and "ledgerDirectories' order" in str(wrong_order[3])
    assert not (dirs[1] / "current" / dbf.LEDGERS_DB).exists()
    reports = invoke_json("index", "rebuild", *args)  # auto: dir 1 lacks its ledgers db, dir 0 does not
    assert "ledgers_db" not in reports[0] and reports[0]["keys"] == 3 * ENTRIES
    rebuilt = reports[1]["ledgers_db"]
    assert (rebuilt["ledgers"], rebuilt["key_from_journal"], rebuilt["old_db"]) == (2, 2, "absent")
    assert _ledgers(dirs[0]) == kept
    # Java's rule: every rebuilt ledger is fenced; the master key came from the journal.
    assert _ledgers(dirs[1]) == {1: dbf.LedgerData(KEY, fenced=True), 3: dbf.LedgerData(KEY, fenced=True)}
    assert [_locations(d) for d in dirs] == locations
    await _serves_everything(tmp_path, dirs)


@twisted_test
async def test_master_keys_from_the_metadata_without_a_journal(tmp_path: Path) -> None:
    dirs = await _written(tmp_path)
    uri = metadata_uri(tmp_path)
    with SqliteStore(Path(uri.removeprefix("sqlite://"))) as store:
        segments = (Segment(0, ("127.0.0.1:3181",)),)
        Layout(store).create_ledger(
            LedgerMetadata(
                ensemble_size=1,
                write_quorum=1,
                ack_quorum=1,
                segments=segments,
                digest=DigestType.CRC32C,
                password=b"testpasswd",
            ),
            ledger_id=1,
        )
    for directory in dirs:
        shutil.rmtree(directory / "current" / dbf.LEDGERS_DB)
    report = invoke_json("index", "rebuild", "-l", str(dirs[0]), "-l", str(dirs[1]), "--metadata", uri)
    assert report[1]["ledgers_db"]["key_from_metadata"] == 1
    assert report[1]["ledgers_db"]["without_key"] == 1  # ledger 3: Java's empty key
    assert _ledgers(dirs[1]) == {1: dbf.LedgerData(KEY, fenced=True), 3: dbf.LedgerData(b"", fenced=True)}
    assert set(_ledgers(dirs[0])) == {0, 2, 4}


@twisted_test
async def test_kill_9_while_building_or_swapping_loses_nothing(tmp_path: Path) -> None:
    dirs = await _written(tmp_path)
    expected = [(_ledgers(d), _locations(d)) for d in dirs]
    args = ["-l", str(dirs[0]), "-l", str(dirs[1]), "--db", "all"]
    building = _rebuild(*args, fault="db-rebuild-building")
    assert building.returncode == -9, building.stderr
    assert [(_ledgers(d), _locations(d)) for d in dirs] == expected  # every db whole
    swapping = _rebuild(*args, fault="db-rebuild-swapping")
    assert swapping.returncode == -9, swapping.stderr
    assert not (dirs[0] / "current" / dbf.LEDGERS_DB).exists()  # moved aside, the new one not in place
    with pytest.raises(ConflictError, match="killed while swapping"):
        started(tmp_path, engine="db", ledger_dirs=dirs)
    done = _rebuild(*args)
    assert done.returncode == 0, done.stderr
    for directory, (ledgers, locations) in zip(dirs, expected, strict=True):
        assert set(_ledgers(directory)) == set(ledgers) and _locations(directory) == locations
        assert not list((directory / "current").glob("*.rebuil*"))
    await _serves_everything(tmp_path, dirs)


@twisted_test
async def test_bookie_check_reads_each_dirs_dbs_against_its_own_logs(tmp_path: Path) -> None:
    dirs = await _written(tmp_path)
    args = ["bookie", "check", "-l", str(dirs[0]), "-l", str(dirs[1]), "-j", str(tmp_path / "journal")]
    clean = invoke_json(*args)
    assert clean["problems"] == [] and clean["index_files"] == len(LEDGERS)
    assert clean["slots"] == clean["records"] == len(LEDGERS) * ENTRIES
    db = KeyValueDb(dirs[1] / "current" / dbf.LOCATIONS_DB, huge=True)
    try:  # entry 0 of ledger 1 pointed at entry 1's record
        db.write({dbf.location_key(1, 0): db.get(dbf.location_key(1, 1)) or b""})
    finally:
        db.close()
    code, out, _, _ = invoke(*args, "-o", "json")
    problems = json.loads(out)["problems"]
    assert code == 3 and [(p["problem"], p["ledger_id"], p["entry_id"]) for p in problems] == [("slot", 1, 0)]


def test_a_backup_never_lands_on_another_of_the_same_second(tmp_path: Path) -> None:
    """A rebuild killed after one swap and rerun within the same second: the second backup gets `.1`."""
    from bkctl.server.db_rebuild import _backup_name

    first = _backup_name(tmp_path, dbf.LEDGERS_DB)
    first.mkdir()
    (first / "CURRENT").write_bytes(b"")
    second = _backup_name(tmp_path, dbf.LEDGERS_DB)
    assert second != first and not second.exists()
    assert second.name.startswith(f"{dbf.LEDGERS_DB}.BACKUP-")
