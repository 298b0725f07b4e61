"""The pure parts of garbage collection: candidates, compaction order, the rate limit."""

from __future__ import annotations

from pathlib import Path

from bkctl.server.gc import LogUsage, Throttle, collectable, compaction_order, log_usage, marker_path


def test_collectable_is_what_the_listing_lacks() -> None:
    assert collectable([5, 1, 3, 3], {3, 4}) == [1, 5]
    assert collectable([], {1}) == []


def test_usage_counts_only_held_ledgers() -> None:
    usage = log_usage(7, Path("7.log"), {1: 100, 2: 300}, lambda ledger_id: ledger_id == 1)
    assert (usage.total, usage.live, usage.fraction) == (400, 100, 0.25)
    assert LogUsage(1, Path("1.log"), 0, 0).fraction == 0.0


def test_compaction_order_least_live_first_under_threshold() -> None:
    usages = [
        LogUsage(1, Path("1.log"), 100, 50),
        LogUsage(2, Path("2.log"), 100, 10),
        LogUsage(3, Path("3.log"), 100, 0),  # removed without copying, never compacted
        LogUsage(4, Path("4.log"), 100, 90),
    ]
    assert [u.log_id for u in compaction_order(usages, 0.8)] == [2, 1]
    assert [u.log_id for u in compaction_order(usages, 0.2)] == [2]
    assert compaction_order(usages, 0.0) == []


def test_throttle_waits_for_the_rate() -> None:
    now = [0.0]
    limit = Throttle(1000, clock=lambda: now[0])
    assert limit.delay(500) == 0.5
    now[0] = 2.0
    assert limit.delay(500) == 0.0
    assert Throttle(0).delay(10**9) == 0.0


def test_marker_is_beside_the_log() -> None:
    assert marker_path(Path("/d/current/1a.log")) == Path("/d/current/1a.log.compacting")
