"""Quorum arithmetic of a ledger segment: striping, ordered acks and the recovery coverage rule.

Entries are striped round-robin: entry e goes to the write quorum of Qw bookies starting at ensemble
index e % E. An add is acknowledged once Qa of them have it, and entries are acknowledged to the writer
in entry order. Recovery may only trust "the last entry is X" when no write quorum could hide an entry
acknowledged without it: every write quorum must have fewer than Qa bookies in an unknown state, i.e.
at least Qw - Qa + 1 bookies that answered OK, NoSuchEntry or NoSuchLedger. By the same count an entry
is missing (was never acknowledged) once Qw - Qa + 1 of its bookies say NoSuchEntry / NoSuchLedger.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.protocol.wire import ReturnCode


class ReadAnswer(Enum):
    """How a bookie answered a (fencing or recovery) read, as far as the coverage rule cares."""

    OK = "ok"
    NO_SUCH_ENTRY = "no-such-entry"
    NO_SUCH_LEDGER = "no-such-ledger"
    UNKNOWN = "unknown"  # no answer yet, or any other error: it may hold entries we cannot see


_ABSENT = frozenset({ReadAnswer.NO_SUCH_ENTRY, ReadAnswer.NO_SUCH_LEDGER})


def answer_for_rc(rc: int) -> ReadAnswer:
    """The coverage meaning of a v2 read reply code."""
    if rc == ReturnCode.EOK:
        return ReadAnswer.OK
    if rc == ReturnCode.ENOENTRY:
        return ReadAnswer.NO_SUCH_ENTRY
    if rc == ReturnCode.ENOLEDGER:
        return ReadAnswer.NO_SUCH_LEDGER
    return ReadAnswer.UNKNOWN


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> list[int]:
    """Ensemble indexes that store `entry_id`, in the order the writer sends to them."""
    return [(entry_id + i) % ensemble_size for i in range(write_quorum)]


@dataclass(frozen=True)
class Quorum:
    """The shape of a ledger: ensemble size E, write quorum Qw, ack quorum Qa (E >= Qw >= Qa >= 1)."""

    ensemble_size: int
    write_quorum: int
    ack_quorum: int

    def __post_init__(self) -> None:
        if not limits.ENSEMBLE_SIZE_MAX >= self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise ProtocolError(
                f"quorum needs {limits.ENSEMBLE_SIZE_MAX} >= E >= Qw >= Qa >= 1, got "
                f"E={self.ensemble_size} Qw={self.write_quorum} Qa={self.ack_quorum}"
            )

    @property
    def answers_needed(self) -> int:
        """Qw - Qa + 1: answers per write quorum for coverage, NoSuchEntry answers for "missing"."""
        return self.write_quorum - self.ack_quorum + 1

    def write_set(self, entry_id: int) -> list[int]:
        self._check_entry(entry_id)
        return write_set(entry_id, self.ensemble_size, self.write_quorum)

    def stores(self, bookie_index: int, entry_id: int) -> bool:
        """Whether the bookie at `bookie_index` is in the write set of `entry_id`."""
        self.check_index(bookie_index)
        self._check_entry(entry_id)
        return (bookie_index - entry_id) % self.ensemble_size < self.write_quorum

    def entries_on(self, bookie_index: int, first_entry_id: int, last_entry_id: int) -> Iterator[int]:
        """The entries of [first, last] striped onto `bookie_index`, ascending."""
        for entry_id in range(first_entry_id, last_entry_id + 1):
            if self.stores(bookie_index, entry_id):
                yield entry_id

    def striped_range(
        self, bookie_index: int, first_entry_id: int, last_entry_id: int
    ) -> tuple[int, int] | None:
        """(first, last) entry of the fragment [first, last] stored on `bookie_index`, None when none is.

        The pattern repeats every E entries, so each end is found within E steps.
        """
        if last_entry_id < first_entry_id:
            return None
        window = self.ensemble_size - 1
        ascending = range(first_entry_id, min(last_entry_id, first_entry_id + window) + 1)
        low = next((e for e in ascending if self.stores(bookie_index, e)), None)
        if low is None:
            return None
        descending = range(last_entry_id, max(low, last_entry_id - window) - 1, -1)
        high = next(e for e in descending if self.stores(bookie_index, e))
        return low, high

    def is_covered(self, answers: Mapping[int, ReadAnswer]) -> bool:
        """Whether every write quorum has fewer than Qa unknown bookies (indexes absent = unknown)."""
        for index in answers:
            self.check_index(index)
        size = self.ensemble_size
        known = [answers.get(i, ReadAnswer.UNKNOWN) is not ReadAnswer.UNKNOWN for i in range(size)]
        for start in range(size if self.write_quorum < size else 1):
            unknown = sum(1 for i in range(self.write_quorum) if not known[(start + i) % size])
            if unknown >= self.ack_quorum:
                return False
        return True

    def entry_missing(self, entry_id: int, answers: Mapping[int, ReadAnswer]) -> bool:
        """Whether Qw - Qa + 1 bookies of the entry's write set say NoSuchEntry / NoSuchLedger."""
        absent = sum(1 for i in self.write_set(entry_id) if answers.get(i) in _ABSENT)
        return absent >= self.answers_needed

    def check_index(self, bookie_index: int) -> None:
        """ProtocolError unless 0 <= bookie_index < E."""
        if not 0 <= bookie_index < self.ensemble_size:
            raise ProtocolError(f"bookie index {bookie_index} outside an ensemble of {self.ensemble_size}")

    @staticmethod
    def _check_entry(entry_id: int) -> None:
        if entry_id < 0:
            raise ProtocolError(f"entry id {entry_id} is not striped (negative)")


class AckTracker:
    """Which entries are acknowledged, in entry order, as per-bookie add acks arrive.

    `ack` returns the entry ids that became acknowledged (possibly several, when an earlier slow entry
    completes); acks for entries at or below the LAC are ignored, duplicates count once.
    """

    __slots__ = ("_acks", "_complete", "_last_add_confirmed", "_pending_max", "quorum")

    def __init__(
        self, quorum: Quorum, last_add_confirmed: int = -1, pending_max: int = limits.PENDING_ADDS_MAX
    ) -> None:
        self.quorum = quorum
        self._last_add_confirmed = last_add_confirmed
        self._pending_max = pending_max
        self._acks: dict[int, set[int]] = {}
        self._complete: set[int] = set()

    @property
    def last_add_confirmed(self) -> int:
        return self._last_add_confirmed

    def acked_by(self, entry_id: int) -> frozenset[int]:
        """Bookie indexes that acked a not yet acknowledged entry."""
        return frozenset(self._acks.get(entry_id, ()))

    def ack(self, entry_id: int, bookie_index: int) -> range:
        if entry_id <= self._last_add_confirmed:
            return range(0)
        if entry_id > self._last_add_confirmed + self._pending_max:
            raise ProtocolError(
                f"ack for entry {entry_id} is more than {self._pending_max} entries past the LAC "
                f"{self._last_add_confirmed}"
            )
        if not self.quorum.stores(bookie_index, entry_id):
            raise ProtocolError(f"bookie index {bookie_index} is not in the write set of entry {entry_id}")
        acked = self._acks.setdefault(entry_id, set())
        acked.add(bookie_index)
        if len(acked) >= self.quorum.ack_quorum:
            self._complete.add(entry_id)
        return self._advance()

    def forget_bookie(self, bookie_index: int) -> list[int]:
        """Drop a replaced bookie's acks from unacknowledged entries; return the entries that lost one."""
        self.quorum.check_index(bookie_index)
        lost = sorted(e for e, acked in self._acks.items() if bookie_index in acked)
        for entry_id in lost:
            acked = self._acks[entry_id]
            acked.discard(bookie_index)
            if len(acked) < self.quorum.ack_quorum:
                self._complete.discard(entry_id)
        return lost

    def _advance(self) -> range:
        start = self._last_add_confirmed + 1
        end = start
        while end in self._complete:
            self._complete.discard(end)
            del self._acks[end]
            end += 1
        self._last_add_confirmed = end - 1
        return range(start, end)
