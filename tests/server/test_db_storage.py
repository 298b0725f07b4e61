"""The db engine (DbLedgerStorage): adds, reads, fencing, explicit LAC, checkpoints into RocksDB, replay
after kill -9, refusal of the other engine's directories, Java's files served, `ldb` reading ours."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
from twisted.internet import reactor
from twisted.internet.task import LoopingCall

from bkctl.errors import ConflictError, UsageError
from bkctl.protocol import db_format as dbf
from bkctl.protocol import index_format as ixf
from bkctl.protocol.wire import ReturnCode as RC
from bkctl.server import db_ledger_index
from bkctl.server.db_ledger_index import DbLedgerIndex, open_ledgers, open_locations, read_ledgers
from bkctl.server.rocksdb_settings import DEFAULT as ROCKSDB_DEFAULT
from bkctl.server.rocksdb_store import KeyValueDb
from bkctl.server.storage import Storage
from tests.conftest import REPO
from tests.server.crash_writer import assert_served_right, run_until_killed
from tests.server.helpers import (
    KEY,
    OTHER_KEY,
    Durable,
    ThreadedClock,
    abandon,
    config,
    packaged,
    started,
    twisted_test,
    wait_until,
)
from tests.server.test_storage import add_all

DATA = REPO / "tests" / "data"


def _killed(storage: Storage) -> None:
    """As kill -9: no checkpoint; RocksDB closed without a flush (its data only in its WAL)."""
    abandon(storage)
    for store in range(storage.store_count):
        storage.store(store).index.close()


@twisted_test
async def test_adds_checkpoint_into_rocksdb_and_survive_restarts(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable, engine="db")
    await add_all(storage, durable, 5, 20)
    await add_all(storage, durable, 7, 3)
    lac_body = (7).to_bytes(8, "big") + (2).to_bytes(8, "big") + b"digest"
    assert storage.write_lac(7, KEY, lac_body, "lac") == RC.EOK
    assert storage.fence(7, KEY, "fence") == RC.EOK
    await wait_until(lambda: "fence" in durable.tokens and "lac" in durable.tokens)
    await storage.checkpoint()
    assert storage.read(5, 19) == (RC.EOK, packaged(5, 19))
    assert storage.read(5, -1) == (RC.EOK, packaged(5, 19))
    assert storage.read(5, 20) == (RC.ENOENTRY, b"")
    await storage.stop()
    assert not list((tmp_path / "ledgers" / "current").glob("*/*/*.idx"))
    ledgers = open_ledgers(tmp_path / "ledgers" / "current", read_only=True)
    state = read_ledgers(ledgers)
    ledgers.close()
    assert state[5] == dbf.LedgerData(KEY)
    assert state[7] == dbf.LedgerData(KEY, fenced=True, explicit_lac=lac_body)
    locations = open_locations(tmp_path / "ledgers" / "current", read_only=True)
    keys = [dbf.decode_location_key(k) for k, _ in locations.items()]
    locations.close()
    assert keys == [(5, e) for e in range(20)] + [(7, e) for e in range(3)]
    again = started(tmp_path, engine="db")
    assert again.is_fenced(7) and again.explicit_lac(7) == lac_body
    assert again.add(7, 3, KEY, packaged(7, 3), False, None) == RC.EFENCED
    assert [again.read(5, e) for e in range(20)] == [(RC.EOK, packaged(5, e)) for e in range(20)]
    _killed(again)
    third = started(tmp_path, engine="db")  # after a kill: the WAL-only RocksDB data comes back
    assert third.read(7, -1) == (RC.EOK, packaged(7, 2)) and third.is_fenced(7)
    await third.stop()


async def _killed_past_a_checkpoint(tmp_path: Path, fence: bool = False) -> None:
    """Ledger 1's entries 0-9 checkpointed, 10-29 in the journal only (and ledger 2 fenced), then kill -9."""
    durable = Durable()
    storage = started(tmp_path, durable, engine="db")
    await add_all(storage, durable, 1, 10)
    await storage.checkpoint()
    for entry_id in range(10, 30):
        assert storage.add(1, entry_id, KEY, packaged(1, entry_id), False, entry_id) == RC.EOK
    if fence:
        assert storage.fence(2, KEY, "fence") == RC.EOK
    await wait_until(lambda: 29 in durable.tokens and (not fence or "fence" in durable.tokens))
    _killed(storage)


@twisted_test
async def test_entries_past_the_last_checkpoint_come_back_from_the_journal(tmp_path: Path) -> None:
    await _killed_past_a_checkpoint(tmp_path, fence=True)
    again = Storage(config(tmp_path, engine="db"), Durable(), reactor)
    report = again.start()
    assert report.entries == 20
    assert [again.read(1, e) for e in range(30)] == [(RC.EOK, packaged(1, e)) for e in range(30)]
    assert again.is_fenced(2)
    await again.stop()


@twisted_test
async def test_replayed_locations_are_served_from_memory_until_the_first_checkpoint(tmp_path: Path) -> None:
    """The replay holds the db engine's locations in memory: the bookie serves them at once while
    lastMark stays behind them, a kill -9 then replays the same records again, and the first checkpoint
    (started as the reactor runs) writes them and moves lastMark."""
    await _killed_past_a_checkpoint(tmp_path)
    last_mark = tmp_path / "ledgers" / "current" / "lastMark"
    mark = last_mark.read_bytes()
    held = Storage(config(tmp_path, engine="db"), Durable(), ThreadedClock())  # its checkpoint never runs
    assert held.start().entries == 20
    index = held.store(0).index
    assert index.unpersisted and last_mark.read_bytes() == mark
    assert [held.read(1, e) for e in range(30)] == [(RC.EOK, packaged(1, e)) for e in range(30)]
    assert list(index.entry_ids(1)) == list(range(30)) and index.last_entry_id(1) == 29
    _killed(held)
    again = Storage(config(tmp_path, engine="db"), Durable(), reactor)
    assert again.start().entries == 20
    await wait_until(lambda: last_mark.read_bytes() != mark)
    assert not again.store(0).index.unpersisted
    await again.stop()
    final = Storage(config(tmp_path, engine="db"), Durable(), reactor)
    assert final.start().entries == 0
    assert [final.read(1, e) for e in range(30)] == [(RC.EOK, packaged(1, e)) for e in range(30)]
    await final.stop()


@twisted_test
async def test_a_ledger_deleted_before_the_first_checkpoint_leaves_no_held_location_behind(
    tmp_path: Path,
) -> None:
    durable = Durable()
    storage = started(tmp_path, durable, engine="db")
    await add_all(storage, durable, 1, 10)
    await add_all(storage, durable, 2, 10)
    _killed(storage)  # no checkpoint: every entry is replayed, its location held
    last_mark = tmp_path / "ledgers" / "current" / "lastMark"
    mark = last_mark.read_bytes()
    again = Storage(config(tmp_path, engine="db"), Durable(), reactor)
    assert again.start().entries == 20
    assert again.delete_ledger(2)  # GC, before the reactor runs the first checkpoint
    await wait_until(lambda: last_mark.read_bytes() != mark)
    assert again.read(2, 0) == (RC.ENOLEDGER, b"") and again.read(1, 9) == (RC.EOK, packaged(1, 9))
    await again.stop()
    locations = KeyValueDb(tmp_path / "ledgers" / "current" / dbf.LOCATIONS_DB, huge=True, read_only=True)
    assert sorted(dbf.decode_location_key(k) for k, _ in locations.items()) == [(1, e) for e in range(10)]
    locations.close()


def _header() -> ixf.IndexHeader:
    return ixf.IndexHeader(ixf.V1, KEY)


def test_held_locations_are_written_once_by_persist_and_dropped_with_their_ledger(tmp_path: Path) -> None:
    index = DbLedgerIndex(tmp_path / "current")
    index.open()
    index.write(1, _header(), {e: 1000 + e for e in range(10)})
    index.write(2, _header(), {3: 76})
    index.commit(replayed=True)
    index.write(1, None, {4: 2004})  # a later replay round: its location wins
    index.commit(replayed=True)
    assert index.unpersisted
    assert [index.location(1, 4)[0], index.location(1, 9)[0], index.location(2, 3)[0]] == [2004, 1009, 76]
    assert index.delete(2) is not None and index.location(2, 3)[0] == 0
    index.persist()
    assert not index.unpersisted
    index.close()
    reopened = DbLedgerIndex(tmp_path / "current")
    assert [reopened.location(1, 4)[0], reopened.location(1, 9)[0], reopened.location(2, 3)[0]] == [
        2004,
        1009,
        0,
    ]
    reopened.close()


def test_a_replay_past_the_held_bound_writes_its_locations_through_the_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held locations die with the process (the journal has them again); past REPLAY_HELD_MAX a replay
    writes them all to RocksDB's WAL as it goes, which RocksDB replays at the next open."""
    monkeypatch.setattr(db_ledger_index, "REPLAY_HELD_MAX", 15)
    index = DbLedgerIndex(tmp_path / "current")
    index.open()
    index.write(1, _header(), {e: 1000 + e for e in range(10)})
    index.commit(replayed=True)  # held
    index.close()
    index = DbLedgerIndex(tmp_path / "current")
    assert index.location(1, 0)[0] == 0
    index.write(1, _header(), {e: 1000 + e for e in range(10)})
    index.commit(replayed=True)  # held
    index.write(1, None, {e: 2000 + e for e in range(10, 20)})
    index.commit(replayed=True)  # 20 > 15: both rounds to the WAL
    index.close()
    index = DbLedgerIndex(tmp_path / "current")
    assert [index.location(1, e)[0] for e in (0, 9, 10, 19)] == [1000, 1009, 2010, 2019]
    index.close()


@twisted_test
async def test_every_acknowledged_entry_survives_sigkill(tmp_path: Path) -> None:
    acked = run_until_killed(tmp_path, engine="db")
    storage = Storage(config(tmp_path, engine="db"), Durable(), reactor)
    report = storage.start()
    assert report.start_mark[1] > 512  # from a checkpoint mid-journal
    assert_served_right(storage, acked)
    await storage.stop()


@twisted_test
async def test_acknowledged_entries_survive_sigkill_while_locations_are_in_the_memtable_only(
    tmp_path: Path,
) -> None:
    # Killed at a checkpoint that left its locations out of the WAL and lastMark behind them (the 50th:
    # after adds were acknowledged; the writer checkpoints every 64 KiB).
    acked = run_until_killed(tmp_path, engine="db", fault="checkpoint-unpersisted*50")
    storage = Storage(config(tmp_path, engine="db"), Durable(), reactor)
    storage.start()
    assert_served_right(storage, acked)
    await storage.stop()


@twisted_test
async def test_acknowledged_entries_survive_sigkill_in_the_first_checkpoint_after_a_replay(
    tmp_path: Path,
) -> None:
    # The restarted writer replays the first one's journal tail (its locations held), and is killed
    # right after the checkpoint that wrote them moved lastMark past them: the next start replays none
    # of that tail, so its locations must be in RocksDB. The second writer adds the same entries again
    # from entry 0; it may die before any is acknowledged.
    acked = run_until_killed(tmp_path, engine="db")
    acked += run_until_killed(tmp_path, engine="db", fault="done:lastMark", acked_at_fault=0)
    storage = Storage(config(tmp_path, engine="db"), Durable(), reactor)
    storage.start()
    assert_served_right(storage, acked)
    await storage.stop()


@twisted_test
async def test_each_engine_refuses_the_others_directories(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path / "interleaved", durable)
    await add_all(storage, durable, 1, 1)
    await storage.stop()
    with pytest.raises(ConflictError, match="holds interleaved files"):
        started(tmp_path / "interleaved", engine="db")
    storage = started(tmp_path / "db", durable, engine="db")
    await storage.stop()
    with pytest.raises(ConflictError, match="holds DbLedgerStorage files"):
        started(tmp_path / "db")
    with pytest.raises(UsageError, match="listed twice"):
        config(tmp_path, engine="db", ledger_dirs=(tmp_path / "a", tmp_path / "a"))


def _placement(ledger_id: int, entry_id: int) -> bool:
    """Whether bookie1 (127.0.0.1:5101) of the Java data holds an entry: its index in each ledger's
    ensemble (0, 0, 1, 1 for ledgers 0-3) is one of the entry's write set (e % 3, (e + 1) % 3)."""
    index = (0, 0, 1, 1)[ledger_id]
    return index in (entry_id % 3, (entry_id + 1) % 3)


@twisted_test
async def test_serves_a_java_db_ledger_storage_directory(tmp_path: Path) -> None:
    with tarfile.open(DATA / "java-db-bookie1.tgz") as archive:
        archive.extractall(tmp_path, filter="data")
    storage = Storage(config(tmp_path, engine="db"), Durable(), reactor)
    storage.start()
    for ledger_id, last in enumerate((999, 49, 2999, 99)):
        for entry_id in range(last + 1):
            code, data = storage.read(ledger_id, entry_id)
            if _placement(ledger_id, entry_id):
                assert code == RC.EOK and data.endswith(f"L{ledger_id}-E{entry_id}".encode())
                assert data[:16] == ledger_id.to_bytes(8, "big") + entry_id.to_bytes(8, "big")
            else:
                assert code == RC.ENOENTRY, (ledger_id, entry_id)
    assert storage.add(0, 1000, OTHER_KEY, packaged(0, 1000), False, None) == RC.EUA
    assert storage.add(0, 1000, KEY, packaged(0, 1000), False, None) == RC.EOK  # Java's key is ours
    await storage.stop()


@twisted_test
async def test_ldb_reads_what_we_wrote(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable, engine="db")
    await add_all(storage, durable, 3, 4)
    await storage.stop()
    current = tmp_path / "ledgers" / "current"
    keys = [line.split(" : ")[0] for line in _ldb_scan(current / "locations")]
    assert keys == ["0x" + dbf.location_key(3, e).hex().upper() for e in range(4)]
    [line] = _ldb_scan(current / "ledgers")
    key, value = line.split(" : ")
    assert key == "0x" + dbf.ledger_key(3).hex().upper()
    assert value == "0x" + dbf.encode_ledger_data(dbf.LedgerData(KEY)).hex().upper()


def test_a_reopened_locations_db_keeps_its_bloom_filter_and_block_cache(tmp_path: Path) -> None:
    """The options are the database's on every open, not only the first: RocksDB's OPTIONS file cannot
    carry a block cache or a bloom filter, and an open that took its family's options from there ran
    with an 8 MiB cache and wrote SST files without filters. The filters are held with the open files
    (read once), not in the block cache (where a big one was read again for every lookup)."""
    per_open = 2000
    for opened in range(3):
        db = KeyValueDb(tmp_path / "locations", huge=True)
        assert db.property_int("rocksdb.block-cache-capacity") == ROCKSDB_DEFAULT.block_cache_size
        held = db.property_int("rocksdb.estimate-table-readers-mem") or 0
        assert held >= opened * per_open * ROCKSDB_DEFAULT.bloom_bits_per_key // 8
        records = b"".join(dbf.location_key(opened, e) + bytes(8) for e in range(per_open))
        db.write_records([records], dbf.LOCATION_RECORD)
        db.flush()
        db.close()
    tables = sorted((tmp_path / "locations").glob("*.sst"))
    assert len(tables) == 3
    for table in tables:  # Debian's RocksDB 7.8 tools, as the ldb checks
        command = ["sst_dump", f"--file={table}", "--show_properties"]
        shown = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
        assert "filter policy name: bloomfilter" in shown and "compression algo: LZ4" in shown


def _ldb_scan(db: Path) -> list[str]:
    """`ldb scan --hex` of a database (Debian's RocksDB 7.8): `0xKEY : 0xVALUE` lines."""
    command = ["ldb", f"--db={db}", "--ignore_unknown_options", "scan", "--hex"]
    scan = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    return scan.stdout.splitlines()


def ldb_logs_named(current: Path) -> tuple[set[int], int]:
    """The entry log ids the locations db names, read by `ldb`, and how many locations it holds."""
    lines = _ldb_scan(current / dbf.LOCATIONS_DB)
    return {int(line.split(" : ")[1], 16) >> 32 for line in lines}, len(lines)


@twisted_test
async def test_a_db_bookie_opens_both_dbs_with_its_rocksdb_settings(tmp_path: Path) -> None:
    """The conf's dbStorage_rocksDB_* keys reach the bookie's own opens: the locations db's block cache,
    both dbs' info logs under the log path (Java's <logPath>/<db name>)."""
    settings = replace(ROCKSDB_DEFAULT, block_cache_size=8 * 1024 * 1024, log_path=tmp_path / "logs")
    durable = Durable()
    storage = started(tmp_path, durable, engine="db", rocksdb=settings)
    await add_all(storage, durable, 3, 10)
    await storage.checkpoint()
    index = storage.store(0).index
    assert isinstance(index, DbLedgerIndex)
    assert index._locations.property_int("rocksdb.block-cache-capacity") == 8 * 1024 * 1024
    await storage.stop()
    assert [p.name for p in sorted((tmp_path / "logs").iterdir())] == [dbf.LEDGERS_DB, dbf.LOCATIONS_DB]
    assert all(any(d.iterdir()) for d in (tmp_path / "logs").iterdir())
    again = started(tmp_path, engine="db", rocksdb=settings)
    assert [again.read(3, e) for e in range(10)] == [(RC.EOK, packaged(3, e)) for e in range(10)]
    await again.stop()


_WRITE_THEN_KILL = """
import os, signal, sys
from pathlib import Path
from bkctl.protocol import db_format as dbf
from bkctl.server.rocksdb_store import KeyValueDb
db = KeyValueDb(Path(sys.argv[1]), huge=True)
records = b"".join(dbf.location_key(1, e) + e.to_bytes(8, "big") for e in range(30_000))
db.write_records([records], dbf.LOCATION_RECORD, sync=False)
assert db.unpersisted
db.persist()
assert not db.unpersisted
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_replayed_locations_are_durable_by_a_wal_sync_without_a_flush(tmp_path: Path) -> None:
    """A replay's locations go through the WAL unsynced; persist then syncs the WAL (no memtable flush,
    no SST file) and they survive a kill -9 right after (RocksDB replays its WAL at the next open). A
    checkpoint's (no WAL) still need the flush."""
    path = tmp_path / "locations"
    killed = subprocess.run([sys.executable, "-c", _WRITE_THEN_KILL, str(path)], cwd=REPO, timeout=60)
    assert killed.returncode == -9 and not list(path.glob("*.sst"))
    shutil.copytree(path, tmp_path / "copy")  # Debian's RocksDB 7.8 (Java's era) replays our WAL too
    assert len(_ldb_scan(tmp_path / "copy")) == 30_000
    db = KeyValueDb(path, huge=True)
    assert db.get(dbf.location_key(1, 29_999)) == (29_999).to_bytes(8, "big")
    db.write_records([dbf.location_key(2, 0) + bytes(8)], dbf.LOCATION_RECORD, wal=False)
    assert db.unpersisted
    db.persist()
    assert not db.unpersisted and list(path.glob("*.sst"))
    db.close()


def test_index_inspect_and_ledgers_read_a_java_db_dir_without_changing_it(tmp_path: Path) -> None:
    from tests.test_inspect import invoke, invoke_json, run_guarded

    with tarfile.open(DATA / "java-db-bookie1.tgz") as archive:
        archive.extractall(tmp_path, filter="data")
    ledger_dir = tmp_path / "ledgers"
    code, _, err, _ = run_guarded(
        [ledger_dir], "index", "inspect", "-l", "1", "--ledger-dir", str(ledger_dir)
    )
    assert code == 0, err
    doc = invoke_json("index", "inspect", "-l", "1", "--ledger-dir", str(ledger_dir / "current"))
    assert doc["storage"] == "db" and doc["master_key"] == KEY.hex() and not doc["fenced"]
    assert [e["entry_id"] for e in doc["entries"]] == [e for e in range(50) if _placement(1, e)]
    assert doc["entries"][0] == {"entry_id": 0, "log_id": 0, "offset": 34971}  # Java's `ledger -m 1`
    assert doc["last_entry_id"] == 48 and doc["missing"] == 16
    listed = invoke_json("index", "ledgers", str(ledger_dir))["ledgers"]
    assert [(row["ledger_id"], row["fenced"], row["master_key"]) for row in listed] == [
        (ledger_id, False, KEY.hex()) for ledger_id in range(4)
    ]
    assert invoke("index", "inspect", "-l", "9", "--ledger-dir", str(ledger_dir))[0] == 4
    assert invoke("index", "ledgers", str(tmp_path / "nothing"))[0] == 2


def test_index_rebuild_gives_java_locations_key_for_key_and_resumes(tmp_path: Path) -> None:
    from tests.test_inspect import invoke, invoke_json

    with tarfile.open(DATA / "java-db-bookie1.tgz") as archive:
        archive.extractall(tmp_path, filter="data")
    current = tmp_path / "ledgers" / "current"
    before = _scan(current / dbf.LOCATIONS_DB)
    (current / "locations.rebuilding").mkdir()  # left by a killed rebuild
    (current / "locations.rebuilding" / "000001.log").write_bytes(b"junk")
    report = invoke_json("index", "rebuild", "--ledger-dir", str(tmp_path / "ledgers"))
    assert report["keys"] == len(before) == 2767 and report["entry_logs"] == [0, 1, 2]
    assert _scan(current / dbf.LOCATIONS_DB) == before
    assert _scan(Path(report["backup"])) == before
    assert not (current / "locations.rebuilding").exists()
    assert invoke("index", "rebuild", "--ledger-dir", str(tmp_path / "nothing"))[0] == 4


def _scan(db: Path) -> list[tuple[bytes, bytes]]:
    locations = KeyValueDb(db, huge=True, read_only=True)
    try:
        return list(locations.items())
    finally:
        locations.close()


@twisted_test
async def test_convert_both_ways_verified_and_resumable(tmp_path: Path) -> None:
    from bkctl.server import storage_convert
    from tests.test_inspect import invoke, invoke_json

    with tarfile.open(DATA / "java-db-bookie1.tgz") as archive:
        archive.extractall(tmp_path, filter="data")
    ledger_dir = tmp_path / "ledgers"
    current = ledger_dir / "current"
    java_locations = _scan(current / dbf.LOCATIONS_DB)
    report = invoke_json("bookie", "convert", "--to", "interleaved", "--ledger-dir", str(ledger_dir))
    assert (report["ledgers"], report["entries"]) == (4, 2767)
    assert not (current / dbf.LOCATIONS_DB).exists() and len(list(current.glob("*/*/*.idx"))) == 4
    storage = Storage(config(tmp_path), Durable(), reactor)  # interleaved now
    storage.start()
    assert storage.read(2, 2998)[1].endswith(b"L2-E2998") and storage.read(1, 1)[0] == RC.ENOENTRY
    await storage.stop()
    # A decided conversion not finished: no bookie starts, and only the same conversion runs.
    (current / "convert.json").write_text('{"to": "db", "renames": []}')
    with pytest.raises(ConflictError, match="run the same `bkctl bookie convert` again"):
        Storage(config(tmp_path), Durable(), reactor).start()
    code, _, _, refused = invoke("bookie", "convert", "--to", "interleaved", "--ledger-dir", str(ledger_dir))
    assert code == 2 and "rerun with --to db" in str(refused)
    (current / "convert.json").unlink()
    # A conversion killed after building its databases (staging left, old index whole): a rerun redoes it.
    dirs = (ledger_dir,)
    storage_convert._build_db(dirs, storage_convert._index_files(dirs), storage_convert.ConvertReport("db"))
    assert (current / "locations.converting").is_dir()
    invoke_json("bookie", "convert", "--to", "db", "--ledger-dir", str(ledger_dir))
    assert _scan(current / dbf.LOCATIONS_DB) == java_locations  # key for key Java's
    assert not list(current.glob("*/*/*.idx")) and not list(current.glob("*.converting"))
    assert invoke("bookie", "convert", "--to", "db", "--ledger-dir", str(ledger_dir))[0] == 2
    assert invoke("bookie", "convert", "--to", "x", "--ledger-dir", str(ledger_dir))[0] == 2


@twisted_test
async def test_deleted_ledger_leaves_both_databases(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable, engine="db")
    await add_all(storage, durable, 4, 5)
    await add_all(storage, durable, 6, 5)
    await storage.checkpoint()
    assert await storage.ledger_ids() == {4, 6}
    assert storage.delete_ledger(4)
    assert storage.read(4, 0) == (RC.ENOLEDGER, b"") and storage.read(6, 4) == (RC.EOK, packaged(6, 4))
    await storage.stop()
    again = started(tmp_path, engine="db")
    assert await again.ledger_ids() == {6} and again.read(4, 0) == (RC.ENOLEDGER, b"")
    await again.stop()
    locations = KeyValueDb(tmp_path / "ledgers" / "current" / dbf.LOCATIONS_DB, huge=True, read_only=True)
    assert {dbf.decode_location_key(k)[0] for k, _ in locations.items()} == {6}
    locations.close()


@twisted_test
async def test_reads_and_adds_are_served_while_entry_locations_compact(tmp_path: Path) -> None:
    # Locations of a ledger the bookie never wrote, in several SST files: enough for the compaction
    # to take a while, as a grown locations db's does.
    current = tmp_path / "ledgers" / "current"
    current.mkdir(parents=True)
    filler = open_locations(current)
    for part in range(4):
        ids = range(part, 400_000, 4)
        records = b"".join(dbf.location_key(99, e) + e.to_bytes(8, "big") for e in ids)
        filler.write_records([records], dbf.LOCATION_RECORD, wal=False)
        filler.persist()
    filler.close()
    durable = Durable()
    storage = started(tmp_path, durable, engine="db")
    await add_all(storage, durable, 5, 50)
    await storage.checkpoint()
    index = storage.store(0).index
    assert isinstance(index, DbLedgerIndex)
    served: list[int] = []

    def serve() -> None:
        # On the reactor thread, as the bookie's requests: a location lookup in RocksDB and an add.
        if not index.compacting:
            return
        entry_id = len(served)
        assert storage.read(5, entry_id % 50) == (RC.EOK, packaged(5, entry_id % 50))
        assert storage.add(6, entry_id, KEY, packaged(6, entry_id), False, None) == RC.EOK
        served.append(entry_id)

    ticker = LoopingCall(serve)
    ticker.start(0.001)
    compacted = storage.compact_entry_locations()
    assert compacted is not None
    try:
        assert await compacted
    finally:
        ticker.stop()
    # Served between the compaction's start and its end (a compaction holding the GIL allows none).
    assert len(served) >= 3, served
    assert [storage.read(6, e) for e in served] == [(RC.EOK, packaged(6, e)) for e in served]
    await storage.stop()
