"""Auditor election on both backends (Java's AuditorBookieTest): one auditor, re-election on loss."""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet import reactor

from bkctl.metadata.layout import Layout
from bkctl.recovery.election import AuditorElection
from tests.client.cluster import bounded, sleep
from tests.conftest import StoreTarget
from tests.server_net.live import in_thread, twisted_test

WAIT_S = 15.0


async def until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
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
