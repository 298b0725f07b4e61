"""Which storage a conf and a ledger directory hold (server/storage_kind.py): pure over real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkctl.errors import ConflictError, UsageError
from bkctl.server.storage_kind import StorageKind, check_storage, configured_kind, found_kinds

PACKAGE = "org.apache.bookkeeper.bookie."


def test_interleaved_and_sorted_are_served_db_and_unknown_refused() -> None:
    assert configured_kind(None) is StorageKind.INTERLEAVED
    assert configured_kind(PACKAGE + "SortedLedgerStorage") is StorageKind.INTERLEAVED
    assert configured_kind(PACKAGE + "InterleavedLedgerStorage") is StorageKind.INTERLEAVED
    with pytest.raises(UsageError, match="does not serve DbLedgerStorage yet"):
        configured_kind(PACKAGE + "storage.ldb.DbLedgerStorage")
    with pytest.raises(UsageError, match="a storage bkctl does not know"):
        configured_kind("org.example.MyStorage")


def test_directory_contents_tell_the_storage(tmp_path: Path) -> None:
    current = tmp_path / "current"
    assert found_kinds(tmp_path) == set()
    (current / "0" / "1").mkdir(parents=True)
    (current / "0" / "1" / "1.idx").write_bytes(b"")
    assert found_kinds(tmp_path) == {StorageKind.INTERLEAVED}
    assert check_storage(None, [tmp_path]) is StorageKind.INTERLEAVED
    (current / "locations").mkdir()
    assert found_kinds(tmp_path) == {StorageKind.INTERLEAVED, StorageKind.DB}
    with pytest.raises(ConflictError, match="holds DbLedgerStorage files but interleaved storage"):
        check_storage(None, [tmp_path])
