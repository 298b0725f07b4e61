"""Start on a copy of a Java 4.14.8 bookie's dirs: serve entries byte for byte, keep files readable."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from twisted.internet import reactor

from bkctl.files.entrylog import entry_log_records, open_entry_log
from bkctl.files.index import index_entries, open_index
from bkctl.files.journal import journal_records, open_journal
from bkctl.files.marks import find_last_marks, read_last_mark
from bkctl.model import DigestType
from bkctl.protocol import entry as entry_codec
from bkctl.protocol.entrylog_format import RecordKind, record_key
from bkctl.protocol.wire import ReturnCode as RC
from bkctl.server.storage import Storage, StorageConfig
from tests.conftest import JAVA_BOOKIES
from tests.server.helpers import KEY, Durable, packaged, twisted_test, wait_until


def copy_bookie(tmp_path: Path, name: str = "bookie1") -> Path:
    target = tmp_path / name
    shutil.copytree(JAVA_BOOKIES / name, target)
    for root, dirs, files in os.walk(target):
        for item in [*dirs, *files]:
            os.chmod(os.path.join(root, item), 0o755 if item in dirs else 0o644)
    os.chmod(target, 0o755)
    return target


def java_config(bookie: Path) -> StorageConfig:
    return StorageConfig(
        journal_dirs=(bookie / "journal",),
        ledger_dirs=(bookie / "ledgers",),
        journal_prealloc_size=1024 * 1024,
        flush_interval_ms=3_600_000,
    )


def original_records(bookie: str = "bookie1") -> dict[tuple[int, int], bytes]:
    log = open_entry_log(JAVA_BOOKIES / bookie / "ledgers" / "current" / "0.log")
    return {record_key(b): bytes(b) for _, kind, b in entry_log_records(log) if kind is RecordKind.DATA}


def assert_files_read_cleanly(bookie: Path) -> None:
    for path in sorted((bookie / "journal" / "current").glob("*.txn")):
        journal_scan = journal_records(open_journal(path))
        assert sum(1 for _ in journal_scan) > 0
        assert journal_scan.stop is not None and not journal_scan.stop.is_error, (path, journal_scan.stop)
    for path in sorted((bookie / "ledgers" / "current").glob("*.log")):
        log = open_entry_log(path)
        assert log.header_error is None, path
        if not log.empty:
            scan = entry_log_records(log)
            for _ in scan:
                pass
            assert scan.stop is not None and not scan.stop.is_error, (path, scan.stop)
    for path in sorted((bookie / "ledgers" / "current").rglob("*.idx")):
        assert list(index_entries(open_index(path))), path
    for path in find_last_marks(bookie / "ledgers"):
        read_last_mark(path)


def crc32_packaged(ledger_id: int, entry_id: int) -> bytes:
    """An entry like `packaged`, with the CRC32 digest of the Java cluster's ledgers."""
    return entry_codec.package_entry(DigestType.CRC32, ledger_id, entry_id, entry_id - 1, 0, b"from bkctl")


@twisted_test
async def test_serves_java_entries_byte_for_byte_and_keeps_files_readable(tmp_path: Path) -> None:
    bookie = copy_bookie(tmp_path)
    durable = Durable()
    storage = Storage(java_config(bookie), durable, reactor)
    report = storage.start()
    assert report.entries == 0 and not report.stops  # Java checkpointed everything before it stopped
    records = original_records()
    assert {lid for lid, _ in records} == {0, 1, 2, 3}
    for (ledger_id, entry_id), data in records.items():
        assert storage.read(ledger_id, entry_id) == (RC.EOK, data)
    for ledger_id in range(4):
        last = max(e for lid, e in records if lid == ledger_id)
        assert storage.read(ledger_id, -1) == (RC.EOK, records[(ledger_id, last)])
    assert storage.read(2, 2) == (RC.ENOENTRY, b"")  # entry 2 of ledger 2 was striped to other bookies
    assert storage.is_fenced(2) and not storage.is_fenced(0) and not storage.is_fenced(1)
    assert storage.add(2, 100, KEY, packaged(2, 100), False, None) == RC.EFENCED
    # Appends to a Java index, with the ledger's digest type (reads verify it against the Java entries).
    assert storage.add(1, 50, KEY, crc32_packaged(1, 50), False, "l1") == RC.EOK
    for entry_id in range(10):
        assert storage.add(100, entry_id, KEY, packaged(100, entry_id), False, entry_id) == RC.EOK
    await wait_until(lambda: 9 in durable.tokens and "l1" in durable.tokens)
    await storage.checkpoint()
    await storage.stop()
    assert_files_read_cleanly(bookie)
    again = Storage(java_config(bookie), Durable(), reactor)
    again.start()
    for (ledger_id, entry_id), data in records.items():
        assert again.read(ledger_id, entry_id) == (RC.EOK, data)
    assert again.read(1, 50) == (RC.EOK, crc32_packaged(1, 50))
    assert all(again.read(100, e) == (RC.EOK, packaged(100, e)) for e in range(10))
    assert again.is_fenced(2)
    await again.stop()
    # The Java entry log itself is untouched.
    assert (bookie / "ledgers" / "current" / "0.log").read_bytes() == (
        JAVA_BOOKIES / "bookie1" / "ledgers" / "current" / "0.log"
    ).read_bytes()
