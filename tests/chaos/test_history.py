"""The chaos checker's history check (benchmarks/chaos/history.py) on hand-made histories: each kind of
violation is reported, a clean history is not, and a line cut by a kill -9 claims nothing."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.chaos.history import Facts, HistoryLog, check, load
from benchmarks.chaos.payloads import SIZE_MAX, SIZE_MIN, payload


def history(tmp_path: Path, *events: dict[str, object], name: str = "writer-1") -> Path:
    log = HistoryLog(tmp_path / f"{name}.jsonl")
    for event in events:
        fields = dict(event)
        log.event(str(fields.pop("e")), **fields)
    log.close()
    return tmp_path


def test_a_clean_history_has_no_violation(tmp_path: Path) -> None:
    history(
        tmp_path, {"e": "create", "l": 1}, {"e": "ack", "l": 1, "upto": 9}, {"e": "close", "l": 1, "last": 9}
    )
    ledgers, _ = load(tmp_path)
    verdict = check(ledgers, {1: Facts(9)})
    assert verdict.violations == [] and verdict.entries_acknowledged == 10 and verdict.entries_lost == 0


def test_each_violation_is_reported(tmp_path: Path) -> None:
    history(
        tmp_path,
        {"e": "create", "l": 1}, {"e": "ack", "l": 1, "upto": 9},  # closed below its acks
        {"e": "create", "l": 2}, {"e": "ack", "l": 2, "upto": 4},  # gone
        {"e": "create", "l": 3}, {"e": "ack", "l": 3, "upto": 4}, {"e": "close", "l": 3, "last": 4},
    )  # fmt: skip
    ledgers, _ = load(tmp_path)
    verdict = check(ledgers, {1: Facts(6), 3: Facts(5, [(2, "bytes differ from what was written")])})
    text = "\n".join(verdict.violations)
    assert "ledger 1: closed at 6 below acknowledged entry 9" in text
    assert "ledger 2: gone, 5 acknowledged entries lost" in text
    assert "ledger 3 entry 2" in text and "its writer closed it at 4, now 5" in text
    assert verdict.entries_lost == 3 + 5 + 1


def test_an_ack_after_a_recovery_open_past_its_end_is_a_violation(tmp_path: Path) -> None:
    history(tmp_path, {"e": "create", "l": 1}, {"e": "ack", "l": 1, "upto": 3})
    history(tmp_path, {"e": "fence", "l": 1, "last": 3, "t0": 0.0, "t1": 0.0}, name="runner")
    history(tmp_path, {"e": "ack", "l": 1, "upto": 5}, name="writer-2")
    ledgers, _ = load(tmp_path)
    text = "\n".join(check(ledgers, {1: Facts(3)}).violations)
    assert "entry 5 acknowledged after recovery closed it" in text


def test_a_line_cut_by_a_kill_claims_nothing(tmp_path: Path) -> None:
    line = json.dumps({"e": "ack", "l": 1, "upto": 99, "t": 1.0})
    (tmp_path / "writer-1.jsonl").write_text(json.dumps({"e": "create", "l": 1, "t": 0.5}) + "\n" + line[:-5])
    ledgers, _ = load(tmp_path)
    assert ledgers[1].acked_max == -1


def test_payloads_are_a_function_of_the_ids() -> None:
    assert payload(3, 4) == payload(3, 4) != payload(4, 3)
    assert all(SIZE_MIN <= len(payload(1, e)) <= SIZE_MAX for e in range(200))


def test_reads_past_the_end_or_of_wrong_bytes_are_violations(tmp_path: Path) -> None:
    history(
        tmp_path, {"e": "create", "l": 1}, {"e": "ack", "l": 1, "upto": 4}, {"e": "close", "l": 1, "last": 4}
    )
    history(
        tmp_path,
        {"e": "read", "l": 1, "first": 0, "last": 4, "bad": []},
        {"e": "read", "l": 1, "first": 2, "last": 6, "bad": []},
        {"e": "read", "l": 1, "first": 1, "last": 3, "bad": [2]},
        name="reader-1",
    )
    ledgers, _ = load(tmp_path)
    text = "\n".join(check(ledgers, {1: Facts(4)}).violations)
    assert "a reader saw entry 6, past the end it closed at 4" in text
    assert "a read of 1..3 got wrong entries [2]" in text
    assert "0..4" not in text
