"""The operation history of a chaos run, and its check (pure: facts in, violations out).

Writers append one JSON line per event to their own file (`writer-<n>.jsonl`), the runner to
`runner.jsonl`; a line is written with one `write` after the event happened, so a kill -9 can lose the
record of an acknowledgement but never invent one. Events: `create` (ledger), `ack` (every entry up to
`upto` acknowledged: adds complete in entry order), `fail` (an add failed), `close` / `close_fail`;
the runner's `fault` and `fence` (a recovery open: `last` is what it closed the ledger at, `t0`/`t1` when
it started and ended); the readers' `read` (`first`..`last` read, `bad`: entries whose bytes were not
what was written) and `read_fail`. Times are CLOCK_MONOTONIC seconds, one clock for every process on
the machine.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class HistoryLog:
    """Appends events to one file, one `write` per line."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def event(self, name: str, **fields: Any) -> None:
        line = json.dumps({"e": name, "t": time.monotonic(), **fields}, separators=(",", ":")) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        os.close(self._fd)


@dataclass
class Fence:
    last: int
    t0: float
    t1: float


@dataclass
class Read:
    first: int
    last: int
    bad: list[int]


@dataclass
class LedgerHistory:
    ledger_id: int
    acked_max: int = -1
    acks: list[tuple[float, int]] = field(default_factory=list)  # (time, upto)
    fences: list[Fence] = field(default_factory=list)
    closed_by_writer: int | None = None
    reads: list[Read] = field(default_factory=list)


@dataclass
class Facts:
    """What the checker found of one ledger after the run: the last entry it is closed at (None: the
    ledger is gone from the metadata) and the entries up to it that could not be read back as written."""

    closed_last: int | None
    bad_entries: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    entries_acknowledged: int = 0
    entries_lost: int = 0


def load(directory: Path) -> tuple[dict[int, LedgerHistory], list[dict[str, Any]]]:
    """Ledgers by id from every history file in `directory`, and the runner's fault events."""
    ledgers: dict[int, LedgerHistory] = {}
    faults: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.jsonl")):
        for event in _events(path):
            kind = event["e"]
            if kind == "fault":
                faults.append(event)
                continue
            if "l" not in event:
                continue
            ledger = ledgers.setdefault(event["l"], LedgerHistory(event["l"]))
            if kind == "ack":
                ledger.acks.append((event["t"], event["upto"]))
                ledger.acked_max = max(ledger.acked_max, event["upto"])
            elif kind == "fence" and event.get("last") is not None:
                ledger.fences.append(Fence(event["last"], event["t0"], event["t1"]))
            elif kind == "close":
                ledger.closed_by_writer = event["last"]
            elif kind == "read":
                ledger.reads.append(Read(event["first"], event["last"], event["bad"]))
    return ledgers, faults


def _events(path: Path) -> Iterable[dict[str, Any]]:
    for line in path.read_text().splitlines():
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill -9: the event it describes is not claimed


def check(ledgers: dict[int, LedgerHistory], facts: dict[int, Facts]) -> Verdict:
    verdict = Verdict()
    for ledger_id, ledger in sorted(ledgers.items()):
        verdict.entries_acknowledged += ledger.acked_max + 1
        _check_ledger(ledger, facts.get(ledger_id, Facts(None)), verdict)
    return verdict


def _check_ledger(ledger: LedgerHistory, fact: Facts, verdict: Verdict) -> None:
    lid, acked = ledger.ledger_id, ledger.acked_max
    problems = verdict.violations
    if fact.closed_last is None:
        if acked >= 0:
            verdict.entries_lost += acked + 1
            problems.append(f"ledger {lid}: gone, {acked + 1} acknowledged entries lost")
        return
    last = fact.closed_last
    if acked > last:
        verdict.entries_lost += acked - last
        problems.append(f"ledger {lid}: closed at {last} below acknowledged entry {acked}")
    for entry_id, why in fact.bad_entries:
        if entry_id <= acked:
            verdict.entries_lost += 1
        problems.append(f"ledger {lid} entry {entry_id} (closed range 0..{last}): {why}")
    if ledger.closed_by_writer is not None and ledger.closed_by_writer != last:
        problems.append(f"ledger {lid}: its writer closed it at {ledger.closed_by_writer}, now {last}")
    for fence in ledger.fences:
        if fence.last != last:
            problems.append(f"ledger {lid}: a recovery open closed it at {fence.last}, now {last}")
        late = [upto for t, upto in ledger.acks if t > fence.t1 and upto > fence.last]
        if late:
            problems.append(f"ledger {lid}: entry {max(late)} acknowledged after recovery closed it")
    _check_reads(ledger, last, problems)


def _check_reads(ledger: LedgerHistory, last: int, problems: list[str]) -> None:
    """Readers saw one sequence: the bytes written, and nothing past where the ledger ended."""
    lid = ledger.ledger_id
    for read in ledger.reads:
        if read.bad:
            problems.append(f"ledger {lid}: a read of {read.first}..{read.last} got wrong entries {read.bad}")
        if read.last > last:
            problems.append(f"ledger {lid}: a reader saw entry {read.last}, past the end it closed at {last}")
