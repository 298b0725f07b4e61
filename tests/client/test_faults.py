"""Faults while writing, against real bookies: a bookie that dies mid-write (ensemble change), a bookie
that never answers (timeouts, not hangs), no replacement left, and a concurrent close seen on CAS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bkctl.errors import FencedError, LedgerClosedError, UnavailableError
from bkctl.model import LedgerState
from tests.client.cluster import Cluster, bounded, sleep
from tests.client.test_ledger import PW
from tests.server.helpers import wait_until
from tests.server_net.live import in_thread, twisted_test


class Tally:
    def __init__(self) -> None:
        self.acked: list[int] = []
        self.errors: list[BaseException] = []

    def ok(self, entry_id: int) -> None:
        self.acked.append(entry_id)

    def bad(self, failure: Any) -> None:
        self.errors.append(failure.value)

    async def settle(self, total: int, timeout_s: float = 20.0) -> None:
        for _ in range(int(timeout_s / 0.05)):
            if len(self.acked) + len(self.errors) >= total:
                return
            await sleep(0.05)
        raise AssertionError(f"only {len(self.acked)} acked + {len(self.errors)} failed of {total}")


@twisted_test
async def test_bookie_dies_mid_write_ensemble_change_keeps_every_ack(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(4)
    try:
        writer = await bounded(cluster.client().create_ledger(3, 2, 2, password=PW))
        tally = Tally()
        for i in range(200):
            writer.add(f"a{i}".encode()).addCallbacks(tally.ok, tally.bad)
        await tally.settle(50)
        victim = writer.ensemble[1]
        await bounded(cluster.bookie(victim).stop())
        for i in range(200, 400):
            writer.add(f"a{i}".encode()).addCallbacks(tally.ok, tally.bad)
        await tally.settle(400)
        assert tally.errors == [] and tally.acked == list(range(400))
        assert victim not in writer.ensemble
        await bounded(writer.close())
        md = (await in_thread(cluster.layout.read_ledger, writer.ledger_id)).value  # type: ignore[union-attr]
        assert len(md.segments) >= 2 and md.last_entry_id == 399
        assert victim not in md.segments[-1].ensemble
        reader = await bounded(cluster.client(3).open_ledger(writer.ledger_id, PW))
        got = await bounded(reader.read(0, 399))
        assert [e.payload for e in got] == [f"a{i}".encode() for i in range(400)]
    finally:
        await cluster.stop()


@twisted_test
async def test_bookie_that_never_answers_times_out_and_is_replaced(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(2)
    try:
        silent = await cluster.silent_bookie()
        client = cluster.client(request_timeout_ms=300)
        writer = await bounded(client.create_ledger(3, 3, 2, password=PW))
        assert silent in writer.ensemble
        # Qa = 2 of 3 still answer: adds are acknowledged, the silent one times out and is dropped...
        assert await bounded(writer.add_many([b"x"] * 5)) == list(range(5))
        # ...but with no bookie to replace it the ensemble change fails: a clear error, not a hang.
        tally = Tally()
        for _ in range(5):
            writer.add(b"y").addCallbacks(tally.ok, tally.bad)
        await tally.settle(5)
        await cluster.add_bookie()
        assert all(isinstance(e, UnavailableError) for e in tally.errors)
        assert tally.acked == list(range(5, 5 + len(tally.acked)))
    finally:
        await cluster.stop()


@twisted_test
async def test_silent_bookie_replaced_when_a_spare_exists(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(3)
    try:
        silent = await cluster.silent_bookie()
        client = cluster.client(seed=0, request_timeout_ms=300)
        for seed in range(50):  # pick a seed whose ensemble has the silent bookie
            client.rng.seed(seed)
            writer = await bounded(client.create_ledger(3, 3, 3, password=PW))
            if silent in writer.ensemble:
                break
        assert silent in writer.ensemble
        # Qa = 3: nothing is acknowledged until the silent bookie is replaced.
        assert await bounded(writer.add_many([b"z"] * 20)) == list(range(20))
        assert silent not in writer.ensemble
        await bounded(writer.close())
    finally:
        await cluster.stop()


@twisted_test
async def test_ensemble_change_after_recovery_started_gives_fenced(tmp_path: Path) -> None:
    """A writer whose ensemble change meets IN_RECOVERY/CLOSED metadata gets a fenced/closed error."""
    cluster = await Cluster(tmp_path).start(4)
    try:
        writer = await bounded(cluster.client().create_ledger(3, 2, 2, password=PW))
        await bounded(writer.add_many([b"w"] * 10))
        await bounded(cluster.client(8).open_ledger(writer.ledger_id, PW))  # recovers and closes
        await bounded(cluster.bookie(writer.ensemble[0]).stop())
        with pytest.raises((FencedError, LedgerClosedError)):
            await bounded(writer.add_many([b"late"] * 3))
        md = (await in_thread(cluster.layout.read_ledger, writer.ledger_id)).value  # type: ignore[union-attr]
        assert (md.state, md.last_entry_id) == (LedgerState.CLOSED, 9)
    finally:
        await cluster.stop()


@twisted_test
async def test_outstanding_adds_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bkctl import limits

    monkeypatch.setattr(limits, "CLIENT_ADDS_IN_FLIGHT_MAX", 3)
    monkeypatch.setattr(limits, "CLIENT_ADDS_WAITING_MAX", 20)
    cluster = await Cluster(tmp_path).start(1)
    try:
        silent = await cluster.silent_bookie()
        client = cluster.client(request_timeout_ms=5000)
        writer = await bounded(
            client.create_ledger(2, 2, 2, password=PW, ensemble=[cluster.bookies[0].bookie_id, silent])
        )
        pending = writer.add_many([b"q"] * 15)
        await wait_until(lambda: client.bookies.get(silent).in_flight == 3)  # the rest wait unsent
        assert not pending.called
        with pytest.raises(UnavailableError, match="adds waiting"):
            await bounded(writer.add_many([b"r"] * 10))
        pending.addErrback(lambda _: None)
    finally:
        await cluster.stop()


@twisted_test
async def test_a_copy_missed_by_an_acknowledged_entry_changes_the_ensemble_and_marks_the_ledger(
    tmp_path: Path,
) -> None:
    """Found by the chaos checker: with Qa < Qw, an entry acknowledged by Qa bookies whose
    add then failed on the last one was left short of that copy, silently, and later entries kept
    going to the failing bookie. Now the ensemble changes (as Java's notifyWriteFailed) and the ledger
    is marked under-replicated naming that bookie, for autorecovery to copy what is missing."""
    cluster = await Cluster(tmp_path).start(3)
    try:
        silent = await cluster.silent_bookie()
        client = cluster.client(request_timeout_ms=300)
        silent_ensemble = [*(b.bookie_id for b in cluster.bookies[:2]), silent]
        writer = await bounded(client.create_ledger(3, 3, 2, password=PW, ensemble=silent_ensemble))
        assert await bounded(writer.add_many([b"x"] * 5)) == list(range(5))  # 2 of 3: acknowledged
        for _ in range(100):  # the silent bookie's adds time out: replaced, the ledger marked
            if silent not in writer.ensemble:
                break
            await sleep(0.05)
        assert silent not in writer.ensemble
        assert await bounded(writer.add_many([b"y"] * 5)) == list(range(5, 10))
        await bounded(writer.close())
        md = (await in_thread(cluster.layout.read_ledger, writer.ledger_id)).value  # type: ignore[union-attr]
        assert silent in md.segments[0].ensemble and silent not in md.segments[-1].ensemble
        mark = await in_thread(cluster.layout.read_underreplicated, writer.ledger_id)  # type: ignore[union-attr]
        assert mark is not None and mark.value.replicas == (silent,)
    finally:
        await cluster.stop()


@twisted_test
async def test_a_close_waits_for_a_hung_bookies_copies_and_marks_the_ledger(tmp_path: Path) -> None:
    """Found by the chaos checker: a ledger closed while a hung bookie still owed answers for entries
    the others had acknowledged was left short of those copies with no mark (the writer's process ends
    after its close). The close now waits until every copy answered or timed out, then marks."""
    cluster = await Cluster(tmp_path).start(2)
    try:
        hung = await cluster.silent_bookie()
        client = cluster.client(request_timeout_ms=500)
        ensemble = [*(b.bookie_id for b in cluster.bookies), hung]
        writer = await bounded(client.create_ledger(3, 3, 2, password=PW, ensemble=ensemble))
        assert await bounded(writer.add_many([b"x"] * 5)) == list(range(5))  # 2 of 3: acknowledged
        await bounded(writer.close())  # at once, before the hung bookie's requests time out
        md = (await in_thread(cluster.layout.read_ledger, writer.ledger_id)).value  # type: ignore[union-attr]
        assert (md.state, md.last_entry_id) == (LedgerState.CLOSED, 4)
        mark = await in_thread(cluster.layout.read_underreplicated, writer.ledger_id)  # type: ignore[union-attr]
        assert mark is not None and mark.value.replicas == (hung,)
    finally:
        await cluster.stop()
