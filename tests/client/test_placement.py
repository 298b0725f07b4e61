"""Ensemble placement."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bkctl.client.placement import place_ensemble, replace_bookies
from bkctl.errors import UnavailableError

BOOKIES = [f"10.0.0.{i}:3181" for i in range(8)]
BOTH_PROTOCOLS = False  # no bookie connection here (tests/client/conftest.py)


def test_distinct_and_seeded() -> None:
    a = place_ensemble(BOOKIES, 5, rng=random.Random(7))
    assert len(set(a)) == 5 and set(a) <= set(BOOKIES)
    assert a == place_ensemble(reversed(BOOKIES), 5, rng=random.Random(7))


def test_too_few_bookies() -> None:
    with pytest.raises(UnavailableError, match=r"4 more needed, 3 read-write bookie\(s\) to choose from$"):
        place_ensemble(BOOKIES[:3], 4)
    with pytest.raises(UnavailableError, match="once the 2 already in the ensemble or failed are left out"):
        place_ensemble(BOOKIES[:4], 3, exclude=BOOKIES[:2])


@given(st.sets(st.integers(0, 2), min_size=1), st.integers(0, 2**32))
def test_replace_keeps_the_rest_and_avoids_excluded(indexes: set[int], seed: int) -> None:
    ensemble = BOOKIES[:3]
    new = replace_bookies(ensemble, indexes, BOOKIES, exclude=[BOOKIES[7]], rng=random.Random(seed))
    assert len(set(new)) == 3
    for i in range(3):
        if i in indexes:
            assert new[i] not in ensemble and new[i] != BOOKIES[7]
        else:
            assert new[i] == ensemble[i]


# --- failure domains -----------------------------------------------------------------------------

from bkctl.client.placement import (  # noqa: E402
    RACKAWARE,
    ZONEAWARE,
    Placement,
    settings_from_properties,
)
from bkctl.errors import UsageError  # noqa: E402

RACKS = {f"10.0.1.{i}:3181": f"/rack{i // 2}" for i in range(6)}  # 3 racks x 2 bookies


def rack_policy(seed: int = 1, racks: dict[str, str] | None = None, **keys: str) -> Placement:
    where = RACKS if racks is None else racks
    settings = settings_from_properties({"ensemblePlacementPolicy": RACKAWARE, **keys})
    return Placement(settings, lambda bookies: {b: where.get(b) for b in bookies}, random.Random(seed))


def test_java_keys_and_defaults() -> None:
    rack = settings_from_properties({"ensemblePlacementPolicy": RACKAWARE})
    assert (rack.kind, rack.min_domains, rack.enforce, rack.default_location) == (
        "rack",
        2,
        False,
        "/default-rack",
    )
    zone = settings_from_properties({"ensemblePlacementPolicy": ZONEAWARE})
    assert (zone.min_domains, zone.desired_domains, zone.enforce) == (2, 3, True)
    assert zone.default_location == "/default-zone/default-upgradedomain"
    assert settings_from_properties({}).kind == "default"
    with pytest.raises(UsageError, match="not one of"):
        settings_from_properties({"ensemblePlacementPolicy": "com.example.Mine"})
    with pytest.raises(UsageError, match="minNumRacksPerWriteQuorum"):
        settings_from_properties({"ensemblePlacementPolicy": RACKAWARE, "minNumRacksPerWriteQuorum": "x"})


@given(st.integers(0, 2**32), st.sampled_from([(3, 2), (3, 3), (4, 2), (5, 3), (6, 2)]))
def test_new_ensembles_span_racks(seed: int, shape: tuple[int, int]) -> None:
    size, quorum = shape
    policy = rack_policy(seed)
    choice = policy.new_ensemble(RACKS, size, quorum)
    assert choice.adheres and len(set(choice.bookies)) == size
    assert policy.violations(choice.bookies, quorum) == []


@given(st.integers(0, 2**32), st.sets(st.integers(0, 2), min_size=1))
def test_replacements_keep_the_racks(seed: int, indexes: set[int]) -> None:
    policy = rack_policy(seed)
    ensemble = ["10.0.1.0:3181", "10.0.1.2:3181", "10.0.1.4:3181"]
    choice = policy.replace(ensemble, indexes, RACKS, 2)
    assert choice.adheres and policy.violations(choice.bookies, 2) == []
    assert all(choice.bookies[i] == ensemble[i] for i in range(3) if i not in indexes)


def test_a_target_in_the_wrong_rack_is_named() -> None:
    policy = rack_policy()
    ensemble = ["10.0.1.0:3181", "10.0.1.2:3181", "10.0.1.4:3181"]
    # 10.0.1.3 is in rack1 like its neighbour 10.0.1.2: the write set {pos 0, pos 1}... spans one rack
    choice = policy.replace(ensemble, [0], RACKS, 2, keep={0: "10.0.1.3:3181"})
    assert not choice.adheres
    assert choice.violations[0].domains == ("/rack1",) and "spans 1 rack(s), needs 2" in choice.reason


def test_a_rack_down_falls_back_loudly_or_fails_when_enforced() -> None:
    alive = {b: r for b, r in RACKS.items() if r != "/rack2"}  # two racks left
    ensemble = ["10.0.1.0:3181", "10.0.1.2:3181", "10.0.1.4:3181"]
    # E=3 Qw=3 needs min(3, 3) = 3 racks: only two are up
    choice = rack_policy(minNumRacksPerWriteQuorum="3").replace(ensemble, [2], alive, 3)
    assert choice.bookies[2] in alive and not choice.adheres and "spans 2 rack(s), needs 3" in choice.reason
    strict = rack_policy(minNumRacksPerWriteQuorum="3", enforceMinNumRacksPerWriteQuorum="true")
    with pytest.raises(UnavailableError, match="needs 3"):
        strict.replace(ensemble, [2], alive, 3)


def test_unknown_bookies_are_in_the_default_rack_left_out_when_enforced() -> None:
    racks = {**RACKS, "10.0.9.9:3181": None}
    policy = rack_policy(racks=racks)  # type: ignore[arg-type]
    assert policy.locations(["10.0.9.9:3181"]) == {"10.0.9.9:3181": "/default-rack"}
    strict = rack_policy(racks=racks, enforceMinNumRacksPerWriteQuorum="true")  # type: ignore[arg-type]
    for seed in range(20):
        strict.rng.seed(seed)
        assert "10.0.9.9:3181" not in strict.new_ensemble(racks, 6, 2).bookies


def test_zones_count_the_first_part() -> None:
    zones = {f"10.0.2.{i}:3181": f"/zone{i % 3}/ud{i}" for i in range(6)}
    settings = settings_from_properties({"ensemblePlacementPolicy": ZONEAWARE})
    policy = Placement(settings, lambda bs: {b: zones[b] for b in bs}, random.Random(3))
    choice = policy.new_ensemble(zones, 3, 3)
    assert choice.adheres and len({zones[b].split("/")[1] for b in choice.bookies}) == 3
    assert policy.violations(["10.0.2.0:3181", "10.0.2.3:3181"], 2)[0].domains == ("/zone0",)


def test_placement_flags_override_keys() -> None:
    from bkctl.commands.options import placement_keys

    assert placement_keys(["minNumRacksPerWriteQuorum=3", " enforceDurability = true"]) == {
        "minNumRacksPerWriteQuorum": "3",
        "enforceDurability": "true",
    }
    with pytest.raises(UsageError, match="expected KEY=VALUE"):
        placement_keys(["minNumRacksPerWriteQuorum"])
