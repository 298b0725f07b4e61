"""The metadata request budget of an autorecovery daemon (replicationMetadataOpsPerSecond)."""

from __future__ import annotations

import pytest

from bkctl.metadata.metered import BURST_S, MeteredStore, OpsRate
from bkctl.metadata.store import DeleteOp, MetadataStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_requests_are_spaced_at_the_rate_and_idle_time_is_credited_up_to_the_burst() -> None:
    clock = Clock()
    rate = OpsRate(10, clock)
    assert rate.delay_for(1) == 0.0  # idle before: the burst's credit
    assert [rate.delay_for(1) for _ in range(int(10 * BURST_S) - 1)] == [0.0] * 9
    assert rate.delay_for(1) == pytest.approx(0.0)  # the last of the credit
    assert rate.delay_for(5) == pytest.approx(0.1)  # then each at 1/10 s: due after the one before
    assert rate.delay_for(1) == pytest.approx(0.6)
    clock.now += 60  # a long pause earns no more than the burst
    assert sum(rate.delay_for(1) == 0.0 for _ in range(20)) == 10 * BURST_S + 1
    assert rate.requests == 37
    with pytest.raises(ValueError):
        OpsRate(0)


def test_every_request_through_the_store_is_counted(store: MetadataStore) -> None:
    metered = MeteredStore(store, OpsRate(1_000_000))
    metered.create("/m")
    assert metered.create_each([(f"/m/{n}", b"") for n in range(3)], ephemeral=True) == [True] * 3
    assert metered.children("/m") == ["0", "1", "2"]
    assert len(metered.get_many([f"/m/{n}" for n in range(600)])) == 600  # three multiRead requests
    metered.multi([DeleteOp("/m/0"), DeleteOp("/m/1")])
    metered.set("/m/2", b"x")
    assert metered.get("/m/2")[0] == b"x" and metered.exists("/m/1") is None
    metered.delete("/m", recursive=True)
    assert metered.rate.requests == 1 + 3 + 1 + 3 + 1 + 1 + 2 + 1
    assert metered.session_id == store.session_id
    metered.close()  # the wrapped store is its owner's: still open
    assert store.exists("/m") is None
