"""The cluster's copy budget: each daemon's share follows the rate node and the daemons registered,
over a real store; the throttle's arithmetic on a fake clock."""

from __future__ import annotations

import pytest
from twisted.internet import task

from bkctl.metadata.autorecovery import RATE_UNLIMITED
from bkctl.metadata.layout import Layout
from bkctl.recovery.budget import CopyBudget, share
from bkctl.recovery.replicator import BURST_S, Throttle, window_for
from tests.conftest import StoreTarget
from tests.recovery.test_daemon import until
from tests.server_net.live import twisted_test


def test_share_of_the_budget() -> None:
    assert share(None, 3) is None and share(RATE_UNLIMITED, 3) is None
    assert share(6_000_000, 3) == 2_000_000 and share(5, 0) == 5


def test_the_throttle_holds_the_rate_and_follows_a_new_one() -> None:
    clock = task.Clock()
    throttle = Throttle(clock, 1000)
    assert throttle.delay_after(500) == pytest.approx(0.5)
    assert throttle.delay_after(500) == pytest.approx(1.0)
    assert throttle.wait_s() == pytest.approx(1.0)  # a new copy waits for what others sent
    clock.advance(1.0)
    throttle.set_rate(100)  # bytes from now on are due at the new rate
    assert throttle.delay_after(100) == pytest.approx(1.0)
    clock.advance(60)  # idle: at most BURST_S of credit
    assert throttle.delay_after(100) == pytest.approx(1.0 - BURST_S)
    throttle.set_rate(None)
    assert throttle.delay_after(10**9) == 0.0


@twisted_test
async def test_each_daemon_takes_its_share_at_once(store_target: StoreTarget) -> None:
    from twisted.internet import reactor

    store, other = store_target.open(), store_target.open()
    layout = Layout(store)
    layout.init_cluster()
    budget = CopyBudget(layout, reactor, Throttle(reactor, None), configured=8_000_000)
    try:
        await budget.start()
        await until(lambda: budget.throttle.rate == 8_000_000)  # its configuration, one daemon
        layout.publish_daemon_status("d1", b"{}")
        Layout(other).publish_daemon_status("d2", b"{}")
        await until(lambda: budget.throttle.rate == 4_000_000)
        Layout(other).set_replication_rate(5_000_000)  # `autorecovery set-rate 5M` from anywhere
        await until(lambda: budget.throttle.rate == 2_500_000)
        other.close()  # a daemon goes: its share comes back
        await until(lambda: budget.throttle.rate == 5_000_000)
        layout.set_replication_rate(RATE_UNLIMITED)
        await until(lambda: budget.throttle.rate is None)
        store.set(layout.ur_path("bkctl-replication-rate"), b"fast")  # not a rate: the last one stays
        layout.set_replication_rate(1000)
        await until(lambda: budget.throttle.rate == 1000)
    finally:
        budget.stop()
        store.close()


def test_the_copies_at_once_share_the_entries_in_flight() -> None:
    assert [window_for(n) for n in (1, 4, 16, 32, 1000)] == [512, 512, 128, 64, 16]
