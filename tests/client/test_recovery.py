"""Recovery open and fencing against real bookies: the scenarios of BookKeeper's TestFencing,
LedgerRecoveryTest and ParallelLedgerRecoveryTest."""

from __future__ import annotations

from pathlib import Path

import pytest
from twisted.internet import defer

from bkctl.errors import FencedError, TimeoutError_, UnauthorizedError, UnavailableError
from bkctl.model import DigestType, LedgerState
from bkctl.protocol import wire
from bkctl.protocol.entry import package_entry
from tests.client.cluster import Cluster, bounded
from tests.client.test_ledger import PW, _raw_add, payloads
from tests.conftest import StoreTarget
from tests.server_net.live import in_thread, start_bookie, twisted_test


async def _metadata(cluster: Cluster, ledger_id: int):  # type: ignore[no-untyped-def]
    return (await in_thread(cluster.layout.read_ledger, ledger_id)).value  # type: ignore[union-attr]


@pytest.mark.parametrize("count", [100, 1, 0])
@twisted_test
async def test_recovery_closes_at_the_last_entry_with_the_exact_length(tmp_path: Path, count: int) -> None:
    cluster = await Cluster(tmp_path).start(3)
    try:
        writer = await bounded(cluster.client().create_ledger(3, 2, 2, password=PW))
        data = payloads(count)
        for p in data:
            await bounded(writer.add(p))
        # The writer "crashes": no close. A second client recovers.
        reader = await bounded(cluster.client(7).open_ledger(writer.ledger_id, PW))
        assert reader.is_closed and reader.last_add_confirmed == count - 1
        assert reader.length == sum(map(len, data))
        md = await _metadata(cluster, writer.ledger_id)
        assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, count - 1, reader.length)
        if count:
            assert [e.payload for e in await bounded(reader.read(0, count - 1))] == data
    finally:
        await cluster.stop()


@twisted_test
async def test_fencing_stops_the_writer_and_reader_sees_its_lac(tmp_path: Path) -> None:
    """TestFencing: after a recovery open the writer's next add fails with FencedError."""
    cluster = await Cluster(tmp_path).start(3)
    try:
        writer = await bounded(cluster.client().create_ledger(3, 2, 2, password=PW))
        await bounded(writer.add_many(payloads(20)))
        reader = await bounded(cluster.client(3).open_ledger(writer.ledger_id, PW))
        assert reader.last_add_confirmed == writer.last_add_confirmed == 19
        with pytest.raises(FencedError):
            await bounded(writer.add(b"after fence"))
        with pytest.raises(FencedError):
            await bounded(writer.add(b"and again"))
        # Nothing the fenced writer tried was acknowledged, and the ledger stays at 19.
        md = await _metadata(cluster, writer.ledger_id)
        assert (md.state, md.last_entry_id) == (LedgerState.CLOSED, 19)
    finally:
        await cluster.stop()


@twisted_test
async def test_pipelined_writer_is_fenced_midway_and_no_ack_is_lost(tmp_path: Path) -> None:
    """A writer keeps adds in flight while another client recovers: every add it saw acknowledged is in
    the recovered ledger, and after the fence nothing more is acknowledged."""
    cluster = await Cluster(tmp_path).start(3)
    try:
        writer = await bounded(cluster.client().create_ledger(3, 2, 2, password=PW))
        acked: list[int] = []
        errors: list[Exception] = []

        def ok(entry_id: int) -> None:
            acked.append(entry_id)

        def bad(failure):  # type: ignore[no-untyped-def]
            errors.append(failure.value)

        for i in range(300):
            writer.add(f"p{i}".encode()).addCallbacks(ok, bad)
        recovering = cluster.client(9).open_ledger(writer.ledger_id, PW)
        for i in range(300, 600):
            writer.add(f"p{i}".encode()).addCallbacks(ok, bad)
        reader = await bounded(recovering)
        await bounded(defer.succeed(None))
        for _ in range(100):
            if len(acked) + len(errors) == 600:
                break
            from tests.client.cluster import sleep

            await sleep(0.05)
        assert len(acked) + len(errors) == 600
        assert acked == list(range(len(acked)))  # in order
        assert all(isinstance(e, FencedError) for e in errors)
        assert reader.last_add_confirmed >= (acked[-1] if acked else -1)
        got = (
            await bounded(reader.read(0, reader.last_add_confirmed)) if reader.last_add_confirmed >= 0 else []
        )
        assert [e.payload for e in got] == [f"p{i}".encode() for i in range(len(got))]
    finally:
        await cluster.stop()


@twisted_test
async def test_open_without_recovery_does_not_fence_and_bad_password_fences_nothing(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(3)
    try:
        writer = await bounded(cluster.client().create_ledger(3, 2, 2, password=PW))
        await bounded(writer.add_many(payloads(5)))
        await bounded(cluster.client(2).open_ledger(writer.ledger_id, PW, recovery=False))
        with pytest.raises(UnauthorizedError):
            await bounded(cluster.client(2).open_ledger(writer.ledger_id, b"bad"))
        assert await bounded(writer.add(b"still writable")) == 5
        assert (await _metadata(cluster, writer.ledger_id)).state is LedgerState.OPEN
        await bounded(writer.close())
    finally:
        await cluster.stop()


@pytest.mark.parametrize("store_target", ["sqlite", "zookeeper"], indirect=True)
@twisted_test
async def test_parallel_recoveries_converge(tmp_path: Path, store_target: StoreTarget) -> None:
    """ParallelLedgerRecoveryTest: several recoveries race; all end with the same last entry and length."""
    cluster = await Cluster(tmp_path, store_target.uri).start(3)
    try:
        writer = await bounded(cluster.client().create_ledger(3, 2, 2, password=PW))
        data = payloads(30)
        for p in data:
            await bounded(writer.add(p))
        racing = [cluster.client(10 + i).open_ledger(writer.ledger_id, PW) for i in range(4)]
        handles = [await bounded(d) for d in racing]
        assert {(h.last_add_confirmed, h.length) for h in handles} == {(29, sum(map(len, data)))}
        md = await _metadata(cluster, writer.ledger_id)
        assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 29, sum(map(len, data)))
        again = await bounded(cluster.client(20).open_ledger(writer.ledger_id, PW))
        assert again.last_add_confirmed == 29
    finally:
        await cluster.stop()


@twisted_test
async def test_recovery_with_a_dead_bookie_and_too_few_bookies(tmp_path: Path) -> None:
    """E=3 Qw=2 Qa=2: one dead bookie still leaves coverage (Qw-Qa+1 = 1 per write quorum); two do not."""
    cluster = await Cluster(tmp_path).start(3)
    try:
        writer = await bounded(cluster.client().create_ledger(3, 2, 2, password=PW))
        data = payloads(10)
        for p in data:
            await bounded(writer.add(p))
        first, second = writer.ensemble[0], writer.ensemble[1]
        await bounded(cluster.bookie(first).stop())
        # Recovery writes back to Qw bookies: with one dead it needs a replacement, and there is none.
        # Coverage alone is not enough here; add a bookie so the write-back can change the ensemble.
        await cluster.add_bookie()
        reader = await bounded(cluster.client(4).open_ledger(writer.ledger_id, PW), 30)
        assert reader.last_add_confirmed == 9
        assert [e.payload for e in await bounded(reader.read(0, 9))] == data

        other = await bounded(cluster.client().create_ledger(3, 2, 2, password=PW))
        await bounded(other.add_many(payloads(3)))
        for bookie_id in other.ensemble[:2]:
            if bookie_id != first:
                await bounded(cluster.bookie(bookie_id).stop())
        await cluster.unregister(second)
        with pytest.raises((UnavailableError, TimeoutError_)):
            await bounded(cluster.client(6).open_ledger(other.ledger_id, PW), 30)
    finally:
        await cluster.stop()


@twisted_test
async def test_tail_gap_closes_before_the_gap_with_the_length_at_the_lac(tmp_path: Path) -> None:
    """Entries 0-4 everywhere, 5 nowhere, 6 (carrying LAC 4) on one bookie: recovery closes at 4.

    The highest LAC (4) comes from entry 6, whose length field counts entries 5 and 6; the ledger's
    length must be entry 4's.
    """
    cluster = await Cluster(tmp_path).start(3)
    try:
        client = cluster.client()
        lh = await bounded(client.create_ledger(3, 3, 2, digest=DigestType.CRC32, password=PW))
        lid, ensemble = lh.ledger_id, lh.ensemble
        length = 0
        for entry_id in (0, 1, 2, 3, 4, 6):
            length += 10 if entry_id != 6 else 20  # entry 5 (10 bytes) was sent but never stored
            entry = package_entry(
                DigestType.CRC32, lid, entry_id, entry_id - 1 if entry_id < 6 else 4, length, b"0123456789"
            )
            targets = ensemble if entry_id != 6 else ensemble[:1]
            for bookie in targets:
                assert await _raw_add(client.bookies.get(bookie), entry, entry_id, lid) == 0
        reader = await bounded(cluster.client(2).open_ledger(lid, PW))
        assert (reader.last_add_confirmed, reader.length) == (4, 50)
        md = await _metadata(cluster, lid)
        assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 4, 50)
    finally:
        await cluster.stop()


@twisted_test
async def test_fence_survives_bookie_restart(tmp_path: Path) -> None:
    """TestFencing: bookies restarted after a recovery still refuse the old writer's adds (EFENCED)."""
    cluster = await Cluster(tmp_path).start(3)
    try:
        writer = await bounded(cluster.client().create_ledger(3, 3, 2, password=PW))
        await bounded(writer.add_many(payloads(5)))
        await bounded(cluster.client(2).open_ledger(writer.ledger_id, PW))
        for index, service in enumerate(list(cluster.bookies)):
            port = service.port
            await bounded(service.stop())
            cluster.bookies[index] = await start_bookie(
                tmp_path, f"b{index + 1}", cluster.uri, bookiePort=str(port)
            )
        probe = cluster.client(3)
        entry = package_entry(writer.digest, writer.ledger_id, 5, 4, 999, b"late")
        codes = [await _raw_add(probe.bookies.get(b), entry, 5, writer.ledger_id) for b in writer.ensemble]
        # Coverage needs Qw - Qa + 1 = 2 fenced bookies per write quorum; the third is fenced as well
        # unless its fencing read was still on its way when recovery finished.
        assert codes.count(wire.ReturnCode.EFENCED) >= 2, codes
    finally:
        await cluster.stop()
