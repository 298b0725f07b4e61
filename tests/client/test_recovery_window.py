"""Recovery with a window of recovery reads in flight: it ends where a one-at-a-time reader ends (the
first missing entry), writes back only entries before it, and survives an ensemble change while the
write-backs are under way."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkctl.model import DigestType, LedgerState
from bkctl.protocol.entry import package_entry
from tests.client.cluster import Cluster, bounded
from tests.client.test_ledger import PW, _raw_add, payloads
from tests.server_net.live import in_thread, twisted_test


async def _stored(cluster: Cluster, count: int, missing: int | None) -> tuple[int, list[str]]:
    """A ledger (E3 Qw3 Qa2) whose entries 0..count-1 all carry LAC -1 (so recovery reads every one),
    stored on every bookie except entry `missing`, stored nowhere. Each payload is 10 bytes."""
    client = cluster.client()
    lh = await bounded(client.create_ledger(3, 3, 2, digest=DigestType.CRC32, password=PW))
    lid, ensemble = lh.ledger_id, lh.ensemble
    for entry_id in range(count):
        if entry_id == missing:
            continue
        entry = package_entry(DigestType.CRC32, lid, entry_id, -1, 10 * (entry_id + 1), b"0123456789")
        for bookie in ensemble:
            assert await _raw_add(client.bookies.get(bookie), entry, entry_id, lid) == 0
    return lid, ensemble


@pytest.mark.parametrize(("count", "missing", "window"), [(12, 5, 32), (12, 5, 1), (12, 5, 4), (12, 0, 8)])
@twisted_test
async def test_gap_inside_the_window_closes_before_it(
    tmp_path: Path, count: int, missing: int, window: int
) -> None:
    cluster = await Cluster(tmp_path).start(3)
    try:
        lid, _ = await _stored(cluster, count, missing)
        reader = await bounded(cluster.client(2, recovery_reads_in_flight=window).open_ledger(lid, PW))
        assert (reader.last_add_confirmed, reader.length) == (missing - 1, 10 * missing)
        md = (await in_thread(cluster.layout.read_ledger, lid)).value  # type: ignore[union-attr]
        assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, missing - 1, 10 * missing)
    finally:
        await cluster.stop()


@pytest.mark.parametrize(("count", "window"), [(10, 32), (8, 4), (9, 4), (3, 1)])
@twisted_test
async def test_last_entry_inside_the_window(tmp_path: Path, count: int, window: int) -> None:
    cluster = await Cluster(tmp_path).start(3)
    try:
        lid, _ = await _stored(cluster, count, None)
        reader = await bounded(cluster.client(2, recovery_reads_in_flight=window).open_ledger(lid, PW))
        assert (reader.last_add_confirmed, reader.length) == (count - 1, 10 * count)
        entries = await bounded(reader.read(0, count - 1))
        assert [e.payload for e in entries] == [b"0123456789"] * count
    finally:
        await cluster.stop()


@twisted_test
async def test_ensemble_change_during_windowed_write_back(tmp_path: Path) -> None:
    """50 entries sent in one batch (all carry LAC -1), a bookie dies, recovery with a window of 16
    writes them back: the write-backs to the dead bookie move to a new one, nothing is lost."""
    cluster = await Cluster(tmp_path).start(3)
    try:
        writer = await bounded(cluster.client().create_ledger(3, 2, 2, password=PW))
        data = payloads(50)
        await bounded(writer.add_many(data))
        dead = writer.ensemble[0]
        await bounded(cluster.bookie(dead).stop())
        await cluster.add_bookie()
        reader = await bounded(
            cluster.client(4, recovery_reads_in_flight=16).open_ledger(writer.ledger_id, PW), 30
        )
        assert reader.last_add_confirmed == 49
        assert dead not in reader.ensemble
        assert [e.payload for e in await bounded(reader.read(0, 49))] == data
    finally:
        await cluster.stop()
