"""A replay's locations held in memory (server/replayed_locations.py): lookups, a later round winning,
holes, a deleted ledger, and the rounds handed back in order."""

from __future__ import annotations

from array import array

from bkctl.server.replayed_locations import ReplayedLocations


def _held(*rounds: tuple[int, dict[int, int]]) -> ReplayedLocations:
    held = ReplayedLocations()
    for ledger_id, slots in rounds:
        held.add(ledger_id, array("q", slots.keys()), array("q", slots.values()))
    return held


def test_entries_in_order_and_out_of_order_are_found() -> None:
    held = _held((1, {e: 100 + e for e in range(5, 15)}), (2, {9: 90, 3: 30, 7: 70}))
    assert [held.location(1, e) for e in (4, 5, 14, 15)] == [0, 105, 114, 0]
    assert [held.location(2, e) for e in (3, 7, 9, 8, 2)] == [30, 70, 90, 0, 0]
    assert held.location(3, 0) == 0
    assert held.count == 13


def test_a_later_round_wins_and_holes_fall_through_to_an_earlier_one() -> None:
    held = _held((1, {0: 10, 1: 11, 2: 12}), (1, {1: 21, 2: 0, 3: 23}))
    assert [held.location(1, e) for e in range(4)] == [10, 21, 12, 23]
    assert held.last_entry_id(1) == 3 and held.last_entry_id(2) == -1
    assert held.entry_ids(1) == {0, 1, 2, 3}


def test_a_dropped_ledger_is_gone_and_rounds_come_back_in_order() -> None:
    held = _held((1, {0: 10}), (2, {0: 20}), (1, {0: 30}))
    held.drop(2)
    held.drop(5)
    assert held.location(2, 0) == 0 and held.count == 2
    assert [(ledger_id, list(ids), list(locations)) for ledger_id, ids, locations in held.chunks()] == [
        (1, [0], [10]),
        (1, [0], [30]),
    ]


def test_an_empty_round_holds_nothing() -> None:
    held = _held((1, {}))
    assert held.count == 0 and held.location(1, 0) == 0 and list(held.chunks()) == []
