"""quorum.py: write sets, striping, ordered acks and the recovery coverage rule."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.protocol import wire
from bkctl.protocol.quorum import AckTracker, Quorum, ReadAnswer, answer_for_rc, write_set
from tests.conftest import JAVA_WIRE

OK, NO_ENTRY, NO_LEDGER, UNKNOWN = (
    ReadAnswer.OK,
    ReadAnswer.NO_SUCH_ENTRY,
    ReadAnswer.NO_SUCH_LEDGER,
    ReadAnswer.UNKNOWN,
)


@st.composite
def quorums(draw: st.DrawFn, ensemble_max: int = 8) -> Quorum:
    ensemble = draw(st.integers(1, ensemble_max))
    write = draw(st.integers(1, ensemble))
    ack = draw(st.integers(1, write))
    return Quorum(ensemble, write, ack)


def test_write_sets_are_round_robin() -> None:
    q = Quorum(3, 2, 2)
    assert [q.write_set(e) for e in range(4)] == [[0, 1], [1, 2], [2, 0], [0, 1]]
    assert write_set(7, 5, 3) == [2, 3, 4]
    assert write_set(9, 5, 3) == [4, 0, 1]
    assert Quorum(3, 3, 2).write_set(1) == [1, 2, 0]


@pytest.mark.parametrize(
    "shape", [(3, 4, 2), (3, 2, 3), (3, 2, 0), (0, 0, 0), (limits.ENSEMBLE_SIZE_MAX + 1, 2, 2)]
)
def test_quorum_shape_is_validated(shape: tuple[int, int, int]) -> None:
    with pytest.raises(ProtocolError):
        Quorum(*shape)


def test_bad_indexes_and_entries() -> None:
    q = Quorum(3, 2, 2)
    with pytest.raises(ProtocolError):
        q.stores(3, 0)
    with pytest.raises(ProtocolError):
        q.write_set(-1)
    with pytest.raises(ProtocolError):
        q.is_covered({5: OK})


@given(quorums(), st.integers(0, 10**12))
def test_stores_agrees_with_the_write_set(q: Quorum, entry_id: int) -> None:
    members = q.write_set(entry_id)
    assert len(set(members)) == q.write_quorum
    assert [i for i in range(q.ensemble_size) if q.stores(i, entry_id)] == sorted(members)


@given(quorums(), st.data())
def test_striped_range_is_the_first_and_last_striped_entry(q: Quorum, data: st.DataObject) -> None:
    first = data.draw(st.integers(0, 50))
    last = data.draw(st.integers(first - 2, first + 30))
    index = data.draw(st.integers(0, q.ensemble_size - 1))
    on_bookie = list(q.entries_on(index, first, last))
    expected = (on_bookie[0], on_bookie[-1]) if on_bookie else None
    assert q.striped_range(index, first, last) == expected


def test_striped_range_examples() -> None:
    q = Quorum(3, 2, 2)
    # Fragment [0, 9]: bookie 0 has entries 0,2,3,5,6,8,9; bookie 1 has 0,1,3,...; bookie 2 has 1,2,...,8.
    assert q.striped_range(0, 0, 9) == (0, 9)
    assert q.striped_range(1, 0, 9) == (0, 9)
    assert q.striped_range(2, 0, 9) == (1, 8)
    assert Quorum(5, 2, 2).striped_range(4, 0, 2) is None  # a short fragment may miss a bookie
    assert q.striped_range(0, 5, 4) is None  # empty fragment
    assert q.striped_range(2, 10**15, 10**15 + 1) == (10**15, 10**15 + 1)


def ensemble_of(ledger_id: int) -> list[str]:
    # From the capture README: ledger 7 on bookie1,2,4; ledger 8 on bookie4,1,2 (ports 3318N).
    bookies = {7: [1, 2, 4], 8: [4, 1, 2]}[ledger_id]
    return [f"127.0.0.1:3318{n}" for n in bookies]


def test_java_client_sent_each_add_exactly_to_its_write_set() -> None:
    connections: list[dict[str, Any]] = json.loads(
        (JAVA_WIRE / "v2-protocol-write-read-fence.frames.json").read_text()
    )
    q = Quorum(3, 2, 2)
    sent: dict[tuple[int, int, int], set[str]] = {}
    for connection in connections:
        for f in connection["frames"]:
            if f["dir"] != "client->bookie":
                continue
            request = wire.decode_request(bytes.fromhex(f["frame_hex"]))
            if isinstance(request, wire.AddRequest):
                key = (request.ledger_id, request.entry_id, request.flags)
                sent.setdefault(key, set()).add(connection["bookie"])
    assert len(sent) > 10
    for (ledger_id, entry_id, _), bookies in sent.items():
        ensemble = ensemble_of(ledger_id)
        assert bookies == {ensemble[i] for i in q.write_set(entry_id)}


# --- acks ------------------------------------------------------------------------------------------------


def test_acks_are_delivered_in_entry_order() -> None:
    tracker = AckTracker(Quorum(3, 2, 2))
    assert tracker.ack(1, 1) == range(0)
    assert tracker.ack(1, 2) == range(0)  # entry 1 has its quorum but entry 0 has not
    assert tracker.ack(0, 0) == range(0)
    assert tracker.ack(0, 0) == range(0)  # a duplicate counts once
    assert tracker.acked_by(0) == {0}
    assert list(tracker.ack(0, 1)) == [0, 1]
    assert tracker.last_add_confirmed == 1
    assert tracker.ack(1, 1) == range(0)  # late ack of an acknowledged entry
    assert tracker.acked_by(1) == frozenset()


def test_ack_from_outside_the_write_set_or_too_far_ahead() -> None:
    tracker = AckTracker(Quorum(3, 2, 1), pending_max=10)
    with pytest.raises(ProtocolError):
        tracker.ack(0, 2)
    with pytest.raises(ProtocolError):
        tracker.ack(11, 2)
    assert list(tracker.ack(0, 0)) == [0]
    assert tracker.ack(10, 2) == range(0)


def test_forget_bookie_removes_its_acks_from_pending_entries() -> None:
    tracker = AckTracker(Quorum(3, 3, 2), last_add_confirmed=4)
    tracker.ack(6, 0)
    tracker.ack(6, 1)  # complete, waiting for entry 5
    tracker.ack(7, 1)
    assert tracker.forget_bookie(1) == [6, 7]
    assert list(tracker.ack(5, 0)) + list(tracker.ack(5, 2)) == [5]
    assert list(tracker.ack(6, 2)) == [6]
    with pytest.raises(ProtocolError):
        tracker.forget_bookie(3)


@given(quorums(), st.integers(1, 25), st.randoms(use_true_random=False))
def test_acks_in_any_order_acknowledge_every_entry_once_in_order(q: Quorum, count: int, rnd: Any) -> None:
    acks = [(e, i) for e in range(count) for i in q.write_set(e)]
    rnd.shuffle(acks)
    tracker = AckTracker(q)
    delivered: list[int] = []
    seen: dict[int, set[int]] = {}
    for entry_id, index in acks:
        seen.setdefault(entry_id, set()).add(index)
        newly = list(tracker.ack(entry_id, index))
        for e in newly:
            assert len(seen.get(e, ())) >= q.ack_quorum
        delivered += newly
        assert delivered == list(range(len(delivered)))
        assert tracker.last_add_confirmed == len(delivered) - 1
    assert delivered == list(range(count))


# --- coverage --------------------------------------------------------------------------------------------


def test_coverage_examples_from_the_brief() -> None:
    q = Quorum(3, 2, 2)  # Qw - Qa + 1 = 1 answer per write quorum
    assert not q.is_covered({})
    assert not q.is_covered({0: OK})  # write quorum {1, 2} has 2 unknown
    assert q.is_covered({0: OK, 1: NO_ENTRY})
    assert q.is_covered({1: NO_LEDGER, 2: OK})
    assert not q.is_covered({0: OK, 1: UNKNOWN})
    q = Quorum(5, 3, 2)  # needs 2 answers in each write quorum
    assert not q.is_covered({0: OK, 2: OK, 4: OK})  # write quorum {1, 2, 3} has only one answer
    assert q.is_covered({0: OK, 1: OK, 2: OK, 3: OK})
    assert q.is_covered({0: OK, 1: OK, 3: OK, 4: OK})
    assert Quorum(3, 3, 3).is_covered({2: NO_ENTRY})  # Qw = Qa: one answer is enough
    assert not Quorum(3, 3, 1).is_covered({0: OK, 1: OK})  # Qa = 1: everyone must answer


def brute_force_covered(q: Quorum, answered: set[int]) -> bool:
    quorums = {frozenset(q.write_set(start)) for start in range(q.ensemble_size)}
    return all(len(members & answered) >= q.write_quorum - q.ack_quorum + 1 for members in quorums)


@given(quorums(), st.data())
def test_coverage_matches_its_definition(q: Quorum, data: st.DataObject) -> None:
    answers = data.draw(
        st.dictionaries(st.integers(0, q.ensemble_size - 1), st.sampled_from(list(ReadAnswer)))
    )
    answered = {i for i, a in answers.items() if a is not UNKNOWN}
    assert q.is_covered(answers) == brute_force_covered(q, answered)


@given(quorums(), st.data())
def test_coverage_is_monotonic(q: Quorum, data: st.DataObject) -> None:
    order = data.draw(st.permutations(range(q.ensemble_size)))
    answers: dict[int, ReadAnswer] = {}
    covered = False
    for index in order:
        answers[index] = data.draw(st.sampled_from([OK, NO_ENTRY, NO_LEDGER]))
        now = q.is_covered(answers)
        assert now or not covered
        covered = now
    assert covered  # everyone answered


@given(quorums())
def test_exhaustive_small_coverage_sets(q: Quorum) -> None:
    for bits in itertools.product([False, True], repeat=q.ensemble_size):
        answers = {i: OK for i, b in enumerate(bits) if b}
        assert q.is_covered(answers) == brute_force_covered(q, set(answers))


def test_entry_missing_needs_qw_minus_qa_plus_one_no_such_answers() -> None:
    q = Quorum(5, 3, 2)  # entry 4 lives on 4, 0, 1
    assert not q.entry_missing(4, {4: NO_ENTRY})
    assert q.entry_missing(4, {4: NO_ENTRY, 0: NO_LEDGER})
    assert not q.entry_missing(4, {4: NO_ENTRY, 2: NO_ENTRY, 3: NO_ENTRY})  # 2, 3 are not in its write set
    assert not q.entry_missing(4, {4: NO_ENTRY, 0: UNKNOWN, 1: OK})
    assert Quorum(3, 2, 2).entry_missing(0, {1: NO_ENTRY})


@given(quorums(), st.integers(0, 100), st.data())
def test_entry_missing_counts_only_absent_answers_of_the_write_set(
    q: Quorum, entry_id: int, data: st.DataObject
) -> None:
    answers = data.draw(
        st.dictionaries(st.integers(0, q.ensemble_size - 1), st.sampled_from(list(ReadAnswer)))
    )
    absent = sum(1 for i in q.write_set(entry_id) if answers.get(i) in (NO_ENTRY, NO_LEDGER))
    assert q.entry_missing(entry_id, answers) == (absent >= q.answers_needed)


def test_answer_for_rc() -> None:
    assert answer_for_rc(wire.ReturnCode.EOK) is OK
    assert answer_for_rc(wire.ReturnCode.ENOENTRY) is NO_ENTRY
    assert answer_for_rc(wire.ReturnCode.ENOLEDGER) is NO_LEDGER
    assert answer_for_rc(wire.ReturnCode.EIO) is UNKNOWN
    assert answer_for_rc(wire.ReturnCode.EUA) is UNKNOWN
