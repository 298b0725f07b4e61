"""entry_availability.py: BookKeeper's AvailabilityOfEntriesOfLedger bytes, as Java lays them out."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bkctl.errors import ProtocolError
from bkctl.protocol import entry_availability as ea


def java_bytes(*groups: tuple[int, int, int, int]) -> bytes:
    """Built by hand from Java's layout: int version, int count, zeros to 64 bytes, 24 bytes a group."""
    header = struct.pack(">ii", 0, len(groups)) + bytes(56)
    return header + b"".join(struct.pack(">qqii", *g) for g in groups)


def test_striped_entries_are_one_group_and_match_javas_layout() -> None:
    held = [0, 1, 3, 4, 6, 7, 9]  # two entries of every three (E=3, Qw=2), then a lone last one
    assert ea.encode(held) == java_bytes((0, 6, 2, 3), (9, 9, 1, 0))
    assert list(ea.entry_ids(ea.encode(held))) == held
    assert [g.entries for g in ea.decode(ea.encode(held))] == [6, 1]


def test_javas_one_run_per_group_form_decodes_too() -> None:
    # Java 4.14's encoder starts a new group for every run; any reader must take both forms.
    assert list(ea.entry_ids(java_bytes((0, 0, 2, 0), (3, 3, 2, 0), (6, 6, 2, 0)))) == [0, 1, 3, 4, 6, 7]


def test_nothing_held_is_a_bare_header() -> None:
    assert ea.encode([]) == java_bytes() and list(ea.entry_ids(java_bytes())) == []


@given(st.sets(st.integers(0, 5000), max_size=300))
def test_any_set_of_ids_round_trips(ids: set[int]) -> None:
    held = sorted(ids)
    assert list(ea.entry_ids(ea.encode(held))) == held


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (bytes(10), "cut in its 64-byte header"),
        (struct.pack(">ii", 1, 0) + bytes(56), "version 1"),
        (struct.pack(">ii", 0, 3) + bytes(56) + bytes(24), "says 3 groups"),
        (struct.pack(">ii", 0, -1) + bytes(56), "says -1 groups"),
        (java_bytes((5, 5, 0, 0)), "malformed"),
        (java_bytes((9, 5, 1, 2)), "malformed"),
        (java_bytes((0, 6, 2, 0)), "no period"),
    ],
)
def test_malformed_bytes_are_refused(data: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        ea.decode(data)


@given(st.sets(st.integers(0, 3000), max_size=300))
def test_holdings_answer_as_the_listed_ids(ids: set[int]) -> None:
    holdings = ea.Holdings(ea.decode(ea.encode(sorted(ids))))
    assert [i for i in range(-2, 3100) if i in holdings] == sorted(ids)


def test_holdings_of_javas_one_run_per_group_form() -> None:
    holdings = ea.Holdings(ea.decode(java_bytes((0, 0, 2, 0), (3, 3, 2, 0), (6, 6, 2, 0))))
    assert [i for i in range(10) if i in holdings] == [0, 1, 3, 4, 6, 7]
    assert "3" not in holdings
