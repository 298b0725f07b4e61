"""The offline audit's reading of a DbLedgerStorage dir (a Java 4.14.8 bookie's): what its locations db
says the bookie holds, the digests of the copies checked, the directory left unchanged; each of a
bookie's two ledger dirs read against its own entry logs."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np

from bkctl.model import DigestType
from bkctl.pipeline import bitmaps, inventory
from bkctl.pipeline.bookie_dirs import BookieDirs, db_dirs
from tests.conftest import REPO
from tests.server.helpers import Durable, ledger_dirs, started, twisted_test
from tests.server.test_storage import add_all
from tests.test_inspect import _hashes

PLACEMENT_INDEX = (0, 0, 1, 1)  # bookie1's index in the ensembles of ledgers 0-3
LAST = (999, 49, 2999, 99)


def test_db_holdings_of_a_java_db_dir(tmp_path: Path) -> None:
    with tarfile.open(REPO / "tests" / "data" / "java-db-bookie1.tgz") as archive:
        archive.extractall(tmp_path, filter="data")
    current = tmp_path / "ledgers" / "current"
    bookie = BookieDirs("127.0.0.1:5101", [current])
    assert db_dirs(bookie) == [current]
    before = _hashes(tmp_path)
    verify = inventory.Verify({0: (DigestType.CRC32, None), 2: (DigestType.CRC32C, None)})
    rows = list(inventory.db_holdings(bookie, current, verify))
    assert _hashes(tmp_path) == before
    held: dict[int, list[int]] = {}
    for _, ledger_id, first, bits, ok, bad, _, problem in rows:
        assert problem is None
        size = len(bits) * 8
        ids = (np.flatnonzero(bitmaps.unpack(bits, size)) + first).tolist()
        held.setdefault(ledger_id, []).extend(ids)
        if ledger_id in (0, 2):  # checked: every copy verified, none bad
            assert bitmaps.unpack(ok, size).sum() == len(ids) and not bitmaps.unpack(bad, size).any()
    for ledger_id, last in enumerate(LAST):
        index = PLACEMENT_INDEX[ledger_id]
        expected = [e for e in range(last + 1) if index in (e % 3, (e + 1) % 3)]
        assert held[ledger_id] == expected


@twisted_test
async def test_db_holdings_of_two_ledger_dirs_read_each_dirs_own_logs(tmp_path: Path) -> None:
    durable = Durable()
    dirs = ledger_dirs(tmp_path, 2)
    storage = started(tmp_path, durable, engine="db", ledger_dirs=dirs, log_size_limit=16 * 1024)
    for ledger_id in range(4):
        await add_all(storage, durable, ledger_id, 200)
    await storage.stop()
    assert all((d / "current" / "0.log").is_file() for d in dirs)  # the same log ids in both
    bookie = BookieDirs("b", [d / "current" for d in dirs])
    verify = inventory.Verify({i: (DigestType.CRC32C, None) for i in range(4)})
    for n, current in enumerate(db_dirs(bookie)):
        rows = list(inventory.db_holdings(bookie, current, verify))
        assert {row[1] for row in rows} == {n, n + 2}
        for _, _, _, bits, ok, bad, _, problem in rows:
            size = len(bits) * 8
            assert problem is None and not bitmaps.unpack(bad, size).any()
            assert bitmaps.unpack(ok, size).sum() == bitmaps.unpack(bits, size).sum() == 200


@twisted_test
async def test_db_holdings_in_key_ranges_are_the_whole_dbs_and_name_a_bad_key(tmp_path: Path) -> None:
    """The audit reads one locations db in several tasks, in key ranges cut at ledgers of the ledgers
    db: together they are the whole db, also the locations of a ledger the ledgers db does not list;
    a key of the wrong size is a problem row that names it."""
    from bkctl.protocol import db_format as dbf
    from bkctl.server.db_ledger_index import open_ledgers, open_locations

    durable = Durable()
    storage = started(tmp_path, durable, engine="db")
    for ledger_id in range(7):
        await add_all(storage, durable, ledger_id, 30)
    await storage.stop()
    current = tmp_path / "ledgers" / "current"
    ledgers = open_ledgers(current)
    ledgers.write({}, [dbf.ledger_key(4)])  # ledger 4's locations stay, its state goes
    ledgers.close()
    bookie = BookieDirs("b", [current])
    whole = list(inventory.db_holdings(bookie, current, None))
    assert [row[1] for row in whole] == list(range(7))
    ranges = inventory.db_ranges(current, 2)
    assert len(ranges) == 3 and ranges[0][0] == b"" and ranges[-1][1] is None  # ledgers 0-1, 2-3|5, 6
    assert [
        row for first, end in ranges for row in inventory.db_holdings(bookie, current, None, first, end)
    ] == whole
    locations = open_locations(current)
    locations.write({b"\x00" * 15: bytes(8)})
    locations.close()
    [problem] = [row for row in inventory.db_holdings(bookie, current, None) if row[-1] is not None]
    assert "key 000000000000000000000000000000: not a 16-byte key and 8-byte value" in problem[-1]
