"""Which storage a conf and a ledger directory hold (server/storage_kind.py): pure over real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkctl.errors import ConflictError, UsageError
from bkctl.server.storage_kind import (
    DB,
    INTERLEAVED,
    check_storage,
    configured_kind,
    found_engine,
    found_kinds,
)

PACKAGE = "org.apache.bookkeeper.bookie."


def test_interleaved_sorted_and_db_are_served_an_unknown_class_refused() -> None:
    assert configured_kind(None) == INTERLEAVED
    assert configured_kind(PACKAGE + "SortedLedgerStorage") == INTERLEAVED
    assert configured_kind(PACKAGE + "InterleavedLedgerStorage") == INTERLEAVED
    assert configured_kind(PACKAGE + "storage.ldb.DbLedgerStorage") == DB
    with pytest.raises(UsageError, match="a storage bkctl does not know"):
        configured_kind("org.example.MyStorage")


def test_directory_contents_tell_the_storage(tmp_path: Path) -> None:
    current = tmp_path / "current"
    assert found_kinds(tmp_path) == set() and found_engine(tmp_path) is None
    (current / "0" / "1").mkdir(parents=True)
    (current / "0" / "1" / "1.idx").write_bytes(b"")
    assert found_kinds(tmp_path) == {INTERLEAVED} and found_engine(tmp_path) == INTERLEAVED
    check_storage(INTERLEAVED, [tmp_path])
    with pytest.raises(ConflictError, match="holds interleaved files but DbLedgerStorage storage"):
        check_storage(DB, [tmp_path])
    (current / "locations").mkdir()
    assert found_kinds(tmp_path) == {INTERLEAVED, DB} and found_engine(tmp_path) == DB
    with pytest.raises(ConflictError, match="holds DbLedgerStorage files but interleaved storage"):
        check_storage(INTERLEAVED, [tmp_path])
