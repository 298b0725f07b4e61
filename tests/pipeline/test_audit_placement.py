"""The audit's `placement` finding: planted violations (3 Java bookies, two of them in one rack, a
rack-aware policy asking for 2 racks per write quorum) counted exactly, entry by entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bkctl.client.placement import RACKAWARE
from bkctl.metadata.layout import Layout
from bkctl.metadata.racks import RackEntry, set_rack
from bkctl.metadata.sqlite import SqliteStore
from bkctl.model import LedgerState
from bkctl.pipeline.audit import AuditOptions, run_audit
from bkctl.pipeline.inventory import resolve_bookie_dirs
from bkctl.recovery.policy import placement_from_properties
from tests.client.test_java_data import prepare
from tests.pipeline.test_audit_cli import B1, B2, B3

pytestmark = pytest.mark.spark
RACKS = {B1: "/rack1", B2: "/rack1", B3: "/rack2"}


def test_entries_whose_write_set_is_in_one_rack(tmp_path: Path, spark: Any) -> None:
    prepare(tmp_path)
    uri = f"sqlite://{tmp_path / 'metadata.db'}"
    expected: dict[int, int] = {}
    with SqliteStore(tmp_path / "metadata.db") as store:
        for bookie, rack in RACKS.items():
            set_rack(store, RackEntry("default", bookie, rack))
        layout = Layout(store)
        for ledger_id, md in layout.read_ledgers(layout.ledger_ids()):
            if md.state is not LedgerState.CLOSED:
                continue  # an open ledger's last segment has no known end: nothing counted
            (segment,) = md.segments
            size = len(segment.ensemble)
            starts = [
                p for p in range(size) if {segment.ensemble[p], segment.ensemble[(p + 1) % size]} == {B1, B2}
            ]
            expected[ledger_id] = sum(1 for e in range(md.last_entry_id + 1) if e % size in starts)
        policy = placement_from_properties({"ensemblePlacementPolicy": RACKAWARE}, store)
        bookies = resolve_bookie_dirs([str(tmp_path / f"b{n}") for n in (1, 2, 3)])
        result = run_audit(spark, uri, bookies, AuditOptions(placement=policy))
    found = [f for f in result.findings if f["kind"] == "placement"]
    assert {f["ledger_id"]: f["entries"] for f in found} == {k: v for k, v in expected.items() if v}
    assert all(set(f["bookie"].split(",")) == {B1, B2} and f["racks"] == ["/rack1", "/rack1"] for f in found)
    assert result.summary["placement"] == sum(expected.values()) > 0
    assert result.summary["placement_ledgers"] == len(found)
    assert "spans 1 rack(s), needs 2" in found[0]["reason"]
