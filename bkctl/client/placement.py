"""Ensemble placement: distinct read-write bookies chosen at random, never one that is excluded.

BookKeeper's default policy without racks is the same: a random choice among the writable bookies.
A seeded `random.Random` makes the choice reproducible in tests.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Sequence

from bkctl.errors import UnavailableError


def place_ensemble(
    available: Iterable[str], size: int, exclude: Collection[str] = (), rng: random.Random | None = None
) -> list[str]:
    """`size` distinct bookies from `available` minus `exclude`; UnavailableError when too few remain."""
    candidates = sorted(set(available) - set(exclude))  # sorted: the seed alone decides the choice
    if len(candidates) < size:
        # Say what the count is of: "0 available (excluding 3)" read as if the 3 were the problem.
        left_out = (
            f" once the {len(set(exclude))} already in the ensemble or failed are left out" if exclude else ""
        )
        raise UnavailableError(
            f"not enough bookies: {size} more needed, {len(candidates)} read-write bookie(s) to choose "
            f"from{left_out}"
        )
    return (rng or random.Random()).sample(candidates, size)


def replace_bookies(
    ensemble: Sequence[str],
    indexes: Collection[int],
    available: Iterable[str],
    exclude: Collection[str] = (),
    rng: random.Random | None = None,
) -> list[str]:
    """A copy of `ensemble` with the bookies at `indexes` replaced by new distinct bookies.

    The new ones are neither in the ensemble nor in `exclude` (e.g. bookies that already failed).
    """
    chosen = place_ensemble(available, len(indexes), {*ensemble, *exclude}, rng)
    replaced = list(ensemble)
    for index, bookie in zip(sorted(indexes), chosen, strict=True):
        replaced[index] = bookie
    return replaced
