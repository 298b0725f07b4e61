"""The per-ledger audit (bkctl/pipeline/compare.py) against a per-entry reference written from the rules
in docs/commands/audit.md, on generated ledgers: several segments, open or closed, copies missing,
extra, corrupt or divergent, bookies not audited, holdings split in rows (index, journal, big gaps).
No Spark: the function the cogroup runs, called directly."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bkctl.pipeline import bitmaps, compare, online
from bkctl.pipeline.compare import Segment
from bkctl.pipeline.inventory import Checks, holding_rows
from bkctl.protocol import entry_availability

BOOKIES = ["b0", "b1", "b2", "b3", "b4"]


def reference(
    segments: list[Segment], copies: dict[str, dict[int, tuple[bool | None, int]]], audited: set[str]
) -> tuple[Counter[tuple[str, str | None, int]], dict[str, int]]:
    """(kind, bookie, entry) of every finding, and the totals, one entry at a time."""
    found: Counter[tuple[str, str | None, int]] = Counter()
    totals: Counter[str] = Counter()
    held_by: dict[int, set[str]] = {}
    for bookie, entries in copies.items():
        for e, (ok, _) in entries.items():
            held_by.setdefault(e, set()).add(bookie)
            totals["digests_checked"] += ok is not None
            if ok is False:
                found[("corrupt", bookie, e)] += 1
    for e in held_by:
        crcs = {entries[e][1] for entries in copies.values() if e in entries and entries[e][0] is True}
        if len(crcs) > 1:
            found[("divergent", None, e)] += 1
    if not segments:
        for e, holders in held_by.items():
            for b in holders:
                found[("orphan", b, e)] += 1
        return found, dict(totals)
    first = segments[0]
    closed = first.state == "CLOSED"
    if closed:
        end = first.last_entry_id
    else:
        end = max((e for e, h in held_by.items() if len(h) >= first.ack_quorum), default=-1)
    write_sets: dict[int, list[str]] = {}
    for s in segments:
        last = min(s.segment_last, end) if s.segment_last >= 0 else end
        for e in range(s.first_entry_id, last + 1):
            write_sets[e] = [s.ensemble[(e + i) % s.ensemble_size] for i in range(s.write_quorum)]
    totals["ledgers"] = 1
    for e, ws in write_sets.items():
        holders = held_by.get(e, set())
        absent = [b for b in ws if b not in holders]
        unknown = [b for b in absent if b not in audited]
        totals["entries_expected"] += 1
        totals["replicas_expected"] += len(ws)
        totals["replicas_found"] += len(ws) - len(absent)
        totals["unknown"] += len(unknown)
        if not holders and not unknown:
            found[("lost", None, e)] += 1
        else:
            for b in absent:
                if b in audited:
                    found[("missing", b, e)] += 1
    for e, holders in held_by.items():
        if e not in write_sets and not closed and e > end:
            continue
        for b in holders - set(write_sets.get(e, [])):
            found[("extra", b, e)] += 1
    return found, dict(totals)


@st.composite
def ledgers(draw: Any) -> tuple[list[Segment], dict[str, dict[int, tuple[bool | None, int]]], set[str]]:
    size = draw(st.integers(1, 5))
    write_quorum = draw(st.integers(1, size))
    ack_quorum = draw(st.integers(1, write_quorum))
    entries = draw(st.integers(0, 60))
    closed = draw(st.booleans())
    starts = sorted(set(draw(st.lists(st.integers(1, max(1, entries)), max_size=3)))) if entries else []
    firsts = [0, *[s for s in starts if s < entries]]
    segments = [
        Segment(
            "CLOSED" if closed else "OPEN",
            entries - 1 if closed else -1,
            size,
            write_quorum,
            ack_quorum,
            first,
            (firsts[i + 1] - 1) if i + 1 < len(firsts) else -1,
            draw(st.permutations(BOOKIES).map(lambda p: p[:size])),
        )
        for i, first in enumerate(firsts)
    ]
    if draw(st.integers(0, 9)) == 0:
        segments = []  # an orphan
    copies: dict[str, dict[int, tuple[bool | None, int]]] = {}
    for bookie in draw(st.sets(st.sampled_from(BOOKIES))):
        held = draw(st.sets(st.integers(0, entries + 5)))
        checked = st.sampled_from([None, True, True, False])
        copies[bookie] = {e: (draw(checked), draw(st.integers(0, 1))) for e in sorted(held)}
    audited = set(copies) | draw(st.sets(st.sampled_from(BOOKIES)))
    return segments, copies, audited


def rows_of(bookie: str, copies: dict[int, tuple[bool | None, int]]) -> list[Any]:
    """The holding rows of a bookie's copies, split in two like an index file and a journal."""
    ordered = sorted(copies.items())
    out = []
    for part in (ordered[::2], ordered[1::2]):
        if not part:
            continue
        ids = np.array([e for e, _ in part], dtype=np.int64)
        checks = Checks.of([(ok, crc if ok else None) for _, (ok, crc) in part])
        out += [r[:1] + r[2:] for r in holding_rows(bookie, 7, ids, checks)]
    return out


def audited_by_compare(
    segments: list[Segment], copies: dict[str, dict[int, tuple[bool | None, int]]], audited: set[str]
) -> tuple[Counter[tuple[str, str | None, int]], dict[str, int]]:
    holdings = [row for bookie, entries in copies.items() for row in rows_of(bookie, entries)]
    rows = compare.audit_ledger(7, segments, [], holdings, frozenset(audited))
    found: Counter[tuple[str, str | None, int]] = Counter()
    totals: Counter[str] = Counter()
    for kind, ledger_id, bookie, first, last, count, _ in rows:
        assert ledger_id == 7
        if kind in compare.TOTAL_KINDS:
            totals[kind] += count
            continue
        assert count == last - first + 1 > 0
        for e in range(first, last + 1):
            found[(kind, bookie, e)] += 1
    ranges = [(r[0], r[2], r[3], r[4]) for r in rows if r[0] in compare.FINDING_KINDS]
    for kind, bookie, first, last in ranges:  # ranges are maximal: none touches another of its kind
        assert (kind, bookie, last + 1) not in found and (kind, bookie, first - 1) not in found
    return found, {k: v for k, v in totals.items() if v}


@settings(max_examples=400, deadline=None)
@given(ledgers())
def test_the_ledger_audit_matches_the_per_entry_rules(case: Any) -> None:
    segments, copies, audited = case
    expected, expected_totals = reference(segments, copies, audited)
    found, totals = audited_by_compare(segments, copies, audited)
    assert found == expected
    assert totals == {k: v for k, v in expected_totals.items() if v}


def test_far_apart_copies_travel_in_separate_small_rows() -> None:
    ids = np.array([0, 1, 5, bitmaps.GAP_MAX * 3, bitmaps.GAP_MAX * 3 + 2], dtype=np.int64)
    rows = list(holding_rows("b0", 1, ids, None))
    assert [(r[2], len(r[3])) for r in rows] == [(0, 1), (bitmaps.GAP_MAX * 3, 1)]
    long_run = np.arange(bitmaps.SPAN_MAX + 10, dtype=np.int64)
    rows = list(holding_rows("b0", 1, long_run, None))
    assert [r[2] for r in rows] == [0, bitmaps.SPAN_MAX]
    segment = Segment("CLOSED", bitmaps.SPAN_MAX + 9, 1, 1, 1, 0, -1, ["b0"])
    result = compare.audit_ledger(1, [segment], [], [r[:1] + r[2:] for r in rows], frozenset({"b0"}))
    assert [r for r in result if r[0] in compare.FINDING_KINDS] == []


def test_problem_rows_are_errors_and_an_undecodable_ledger_is_not_audited() -> None:
    (held,) = holding_rows("b0", 3, np.arange(10, dtype=np.int64), None)
    problem = ("b1", -1, b"", b"", b"", b"", "/x/3.idx: bad header")
    result = compare.audit_ledger(
        3, [], ["/ledgers/L3: bad metadata"], [held[:1] + held[2:], problem], frozenset()
    )
    assert result == [
        ("warning", 3, None, -1, -1, 0, "/ledgers/L3: bad metadata"),
        ("error", 3, "b1", -1, -1, 0, "/x/3.idx: bad header"),
    ]


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 5000)))
def test_an_availability_answer_gives_back_its_entry_ids(ids: set[int]) -> None:
    """GET_LIST_OF_ENTRIES_OF_LEDGER's groups (runs every `period` ids) -> the ids, with numpy."""
    groups = entry_availability.decode(entry_availability.encode(sorted(ids)))
    assert online._group_ids(groups).tolist() == sorted(ids)
