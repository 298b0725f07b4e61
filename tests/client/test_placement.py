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
    with pytest.raises(UnavailableError, match=r"an ensemble of 4 needs 4 .* 3 available"):
        place_ensemble(BOOKIES[:3], 4)
    with pytest.raises(UnavailableError, match="excluding"):
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
