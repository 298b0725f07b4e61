"""Auditor election on both backends (Java's AuditorBookieTest): one auditor, re-election on loss."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from twisted.internet import reactor

from bkctl.metadata.layout import Layout
from bkctl.recovery.election import AuditorElection
from tests.client.cluster import bounded, sleep
from tests.conftest import StoreTarget
from tests.server_net.live import in_thread, twisted_test

WAIT_S = 15.0


async def until(predicate: Callable[[], object], timeout_s: float = WAIT_S) -> None:
    """Poll `predicate` (a bool, or an awaitable of one: blocking reads go through in_thread) every
    50 ms until it holds; bounded."""
    for _ in range(int(timeout_s / 0.05)):
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        await sleep(0.05)
    raise AssertionError("condition not reached in time")


def elections(target: StoreTarget, count: int) -> tuple[list[AuditorElection], list[Layout], list[str]]:
    layouts = [Layout(target.open()) for _ in range(count)]
    events: list[str] = []
    made = []
    for i, layout in enumerate(layouts):
        name = f"127.0.0.{i + 1}:3181"
        made.append(
            AuditorElection(
                layout,
                name,
                reactor,
                lambda n=name: events.append(f"+{n}"),
                lambda n=name: events.append(f"-{n}"),
            )
        )
    return made, layouts, events


@twisted_test
async def test_one_auditor_then_the_next_takes_over(store_target: StoreTarget) -> None:
    made, layouts, events = elections(store_target, 3)
    for election in made:
        await bounded(election.start())
    await until(lambda: sum(e.is_auditor for e in made) == 1)
    assert made[0].is_auditor and events == ["+127.0.0.1:3181"]
    assert await in_thread(layouts[1].current_auditor) == "127.0.0.1:3181"
    assert await in_thread(layouts[1].last_elected_auditor) == "127.0.0.1:3181"
    await bounded(made[0].stop())
    await until(lambda: made[1].is_auditor)
    assert not made[2].is_auditor
    assert events == ["+127.0.0.1:3181", "-127.0.0.1:3181", "+127.0.0.2:3181"]
    for election in made[1:]:
        await bounded(election.stop())


@twisted_test
async def test_session_loss_makes_the_auditor_vote_again(store_target: StoreTarget) -> None:
    made, layouts, events = elections(store_target, 2)
    for election in made:
        await bounded(election.start())
    await until(lambda: made[0].is_auditor)
    first_vote = made[0].vote_path
    store_target.expire(layouts[0].store)
    # The second daemon wins; the first votes again behind it and is no longer the auditor.
    await until(
        lambda: made[1].is_auditor and not made[0].is_auditor and made[0].vote_path not in (None, first_vote)
    )
    votes = await in_thread(layouts[1].auditor_votes)
    assert [bookie for _, bookie in votes] == ["127.0.0.2:3181", "127.0.0.1:3181"]
    assert "-127.0.0.1:3181" in events
    for election in made:
        await bounded(election.stop())


@twisted_test
async def test_the_two_signals_of_one_lost_vote_cast_one_new_vote(store_target: StoreTarget) -> None:
    """A session loss tells a daemon twice: the session callback, and its predecessor watch finding its
    own vote gone. Both ask to vote again; one vote must come of them (two would make the daemon
    count twice in the line, and the check of exactly one vote per live daemon fail)."""
    made, layouts, _events = elections(store_target, 2)
    for election in made:
        await bounded(election.start())
    await until(lambda: made[0].is_auditor)
    lost = made[1].vote_path
    assert lost is not None
    await in_thread(layouts[1].store.delete, lost)
    made[1].revote(lost)  # the watch's way
    made[1].revote()  # the session callback's way, at once
    await until(lambda: made[1].vote_path not in (None, lost))
    kept = made[1].vote_path
    made[1].revote(lost)  # late news of the vote already replaced: nothing to do
    assert made[1].vote_path == kept  # a revote that acts drops its vote at once, before voting
    await until(lambda: in_thread(_votes_are_the_elections, layouts[0], made))
    votes = await in_thread(layouts[0].auditor_votes)
    assert [bookie for _, bookie in votes] == ["127.0.0.1:3181", "127.0.0.2:3181"]
    assert made[0].is_auditor and not made[1].is_auditor
    for election in made:
        await bounded(election.stop())


@twisted_test
async def test_every_session_lost_at_once_one_vote_each_and_one_auditor(store_target: StoreTarget) -> None:
    """ZooKeeper back from a pause past every session timeout: every daemon votes again, once."""
    made, layouts, _events = elections(store_target, 3)
    for election in made:
        await bounded(election.start())
    await until(lambda: made[0].is_auditor)
    before = [e.vote_path for e in made]
    for layout in layouts:
        store_target.expire(layout.store)
    await until(lambda: all(e.vote_path not in (None, *before) for e in made))
    await until(lambda: sum(e.is_auditor for e in made) == 1)
    await until(lambda: in_thread(_votes_are_the_elections, layouts[0], made))
    votes = await in_thread(layouts[0].auditor_votes)
    assert sorted(bookie for _, bookie in votes) == ["127.0.0.1:3181", "127.0.0.2:3181", "127.0.0.3:3181"]
    (auditor,) = [e for e in made if e.is_auditor]
    assert auditor.vote_path is not None and auditor.vote_path.endswith(votes[0][0])
    for election in made:
        await bounded(election.stop())


def _votes_are_the_elections(layout: Layout, made: list[AuditorElection]) -> bool:
    """The votes in the store are exactly the elections' current votes: none missing, none extra (a
    second vote of one daemon would stay in the store beside the one it remembers)."""
    names = sorted(name for name, _ in layout.auditor_votes())
    return names == sorted(e.vote_path.rsplit("/", 1)[-1] for e in made if e.vote_path is not None)
