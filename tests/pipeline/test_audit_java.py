"""`bkctl audit` on the Java BookKeeper 4.14.8 cluster's files (snapshot 1: bookie1-3, ledgers 0-3 of
ZooKeeper dump 1, ledger 1 still OPEN), clean and with one kind of damage at a time: each damage is
found exactly, and nothing else is reported. Real files (copies), a real local SparkSession."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bkctl.files.index import index_entries, ledger_index_path, open_index
from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from bkctl.model import DigestType, LedgerState, Segment
from bkctl.pipeline.audit import AuditOptions, AuditResult, run_audit
from bkctl.pipeline.inventory import Verify, resolve_bookie_dirs
from bkctl.protocol import entry as entry_codec
from bkctl.protocol import entrylog_format as ef
from tests.client.test_java_data import prepare

pytestmark = pytest.mark.spark
B1, B2, B3 = "127.0.0.1:33181", "127.0.0.1:33182", "127.0.0.1:33183"
B4 = "127.0.0.1:33184"  # in no directory given to the audit
ENTRIES = {0: 1000, 1: 50, 2: 100, 3: 200}  # ledger 1 is open: 50 entries on the bookies


@pytest.fixture
def java(tmp_path: Path) -> Path:
    prepare(tmp_path)
    return tmp_path


def audit(spark: Any, root: Path, **options: Any) -> AuditResult:
    bookies = resolve_bookie_dirs([str(root / f"b{n}") for n in (1, 2, 3)])
    return run_audit(spark, f"sqlite://{root / 'metadata.db'}", bookies, AuditOptions(**options))


def kinds(result: AuditResult) -> Counter[tuple[str, int, str | None]]:
    """Entries found per (kind, ledger, bookie)."""
    counted: Counter[tuple[str, int, str | None]] = Counter()
    for f in result.findings:
        counted[(f["kind"], f["ledger_id"], f["bookie"])] += f["entries"]
    return counted


def record(root: Path, bookie: int, ledger_id: int, entry_id: int) -> tuple[Path, int, int]:
    """(entry log, offset, size) of one stored entry of a copied Java bookie."""
    ledgers = root / f"b{bookie}" / "ledgers"
    index = open_index(ledger_index_path(ledger_id, ledgers))
    log_id, offset = next((log, off) for e, log, off in index_entries(index) if e == entry_id)
    log = ledgers / "current" / ef.log_file_name(log_id)
    with log.open("rb") as f:
        f.seek(offset - 4)
        size = int.from_bytes(f.read(4), "big")
    return log, offset, size


def test_the_java_cluster_is_clean(spark: Any, java: Path) -> None:
    result = audit(spark, java, verify_digests=True)
    assert result.findings == [] and result.errors == []
    summary = result.summary
    assert summary["entries_expected"] == sum(ENTRIES.values())
    assert summary["replicas_expected"] == summary["replicas_found"] == 2 * sum(ENTRIES.values())
    assert (summary["ledgers"], summary["bookies"]) == (4, 3)


def test_a_removed_index_is_missing_replicas_and_two_are_lost_entries(spark: Any, java: Path) -> None:
    os.remove(ledger_index_path(3, java / "b1" / "ledgers"))
    result = audit(spark, java)
    # Ledger 3's ensemble is b2,b1,b3 (Qw 2): b1 holds entries e % 3 in (0, 1), two thirds of 200.
    assert kinds(result) == {("missing", 3, B1): 134}
    os.remove(ledger_index_path(3, java / "b2" / "ledgers"))
    result = audit(spark, java)
    # Entries e % 3 == 0 were on b2 and b1 only: lost. The others are each missing one copy.
    assert kinds(result) == {("lost", 3, None): 67, ("missing", 3, B1): 67, ("missing", 3, B2): 66}


def test_a_deleted_entry_log_is_missing_replicas(spark: Any, java: Path) -> None:
    os.remove(java / "b2" / "ledgers" / "current" / "0.log")
    result = audit(spark, java)
    held_by_b2 = {(k[0], k[1]) for k in kinds(result)}
    assert held_by_b2 == {("missing", lid) for lid in ENTRIES}
    assert {k[2] for k in kinds(result)} == {B2}


def test_flipped_bytes_are_corrupt_and_a_rewritten_copy_is_divergent(spark: Any, java: Path) -> None:
    log, offset, size = record(java, 1, 0, 17)
    with log.open("r+b") as f:  # last payload byte of ledger 0 entry 17 on bookie1
        f.seek(offset + size - 1)
        byte = f.read(1)
        f.seek(offset + size - 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    log, offset, size = record(java, 2, 3, 5)
    with log.open("r+b") as f:  # ledger 3 entry 5 on bookie2: other bytes, a valid CRC32 digest
        f.seek(offset)
        stored = entry_codec.parse_entry(f.read(size), DigestType.CRC32)
        payload = stored.payload.replace(b"E", b"X")
        f.seek(offset)
        f.write(
            entry_codec.package_entry(
                DigestType.CRC32, 3, 5, stored.last_add_confirmed, stored.length, payload
            )
        )
    result = audit(spark, java, verify_digests=True)
    assert kinds(result) == {("corrupt", 0, B1): 1, ("divergent", 3, None): 1}
    corrupt = next(f for f in result.findings if f["kind"] == "corrupt")
    assert (corrupt["first_entry_id"], corrupt["last_entry_id"]) == (17, 17)
    assert result.summary["digests_checked"] == 2 * sum(ENTRIES.values())  # every copy, bad ones too
    assert audit(spark, java).findings == []  # without digests, bytes are not looked at

    # --sample 0.3: the entries Verify picks, every copy of each (so divergence is still seen).
    sampled = Verify({}, 0.3).sampled
    picked = [(lid, e) for lid, n in ENTRIES.items() for e in range(n) if sampled(lid, e)]
    result = audit(spark, java, verify_digests=True, sample=0.3)
    assert result.summary["digests_checked"] == 2 * len(picked)
    assert 0.2 < len(picked) / sum(ENTRIES.values()) < 0.4
    expected = {("corrupt", 0, B1): (0, 17) in picked, ("divergent", 3, None): (3, 5) in picked}
    assert kinds(result) == {k: 1 for k, chosen in expected.items() if chosen}


def test_metadata_only_deletion_is_an_orphan_and_ensemble_changes_leave_extras(
    spark: Any, java: Path
) -> None:
    with SqliteStore(java / "metadata.db") as store:
        layout = Layout(store)
        store.delete(layout.ledger_path(0))
        versioned = layout.read_ledger(3)
        assert versioned.value.state is LedgerState.CLOSED
        layout.write_ledger(3, replace(versioned.value, last_entry_id=149), versioned.version)
        # Ledger 2 (b3, b1, b2): from entry 60 on, b1 was replaced by a bookie not audited here, as an
        # ensemble change does; b1 still holds its old share of entries 60..99.
        versioned = layout.read_ledger(2)
        first = versioned.value.segments[0]
        changed = Segment(60, tuple(B4 if b == B1 else b for b in first.ensemble))
        layout.write_ledger(2, replace(versioned.value, segments=(first, changed)), versioned.version)
    result = audit(spark, java)
    found = kinds(result)
    assert {k for k in found if k[0] == "orphan"} == {("orphan", 0, b) for b in (B1, B2, B3)}
    assert sum(n for k, n in found.items() if k[0] == "orphan") == 2 * 1000
    on_3 = sum(n for k, n in found.items() if k[:2] == ("extra", 3))
    assert on_3 == 2 * 50  # entries 150..199, two copies
    # b1 is ensemble[1]: in the write sets of entries e % 3 in (0, 1); 27 of entries 60..99.
    b1_share = [e for e in range(60, 100) if e % 3 in (0, 1)]
    assert found[("extra", 2, B1)] == len(b1_share) == 27
    extras = {(f["first_entry_id"], f["last_entry_id"]) for f in result.findings if f["ledger_id"] == 2}
    assert extras == {(60, 99)}  # runs of 1-2 entries, one row: 27 entries from 60 to 99
    assert {k[0] for k in found} == {"orphan", "extra"} and len([k for k in found if k[1] == 2]) == 1
    assert result.summary["unknown"] == 27  # the new bookie's replicas: not audited, never missing
    assert result.summary["orphan_ledgers"] == 1 and result.summary["orphan_bytes"] > 2 * 1000 * 40


def test_a_garbage_index_file_is_an_error_naming_it_and_the_rest_is_audited(spark: Any, java: Path) -> None:
    path = ledger_index_path(2, java / "b3" / "ledgers")
    path.write_bytes(b"not an index" * 10)
    result = audit(spark, java)
    assert len(result.errors) == 1 and str(path) in result.errors[0]
    assert set(kinds(result)) == {("missing", 2, B3)}  # what it held cannot be known to be there
