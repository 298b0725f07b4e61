"""Reads of a ledger: entry ranges with replica fallback, the last-add-confirmed read (plain or fencing),
and the one-entry recovery read with its "missing" rule.

Each read walks the entry's write set in order and takes the first good copy: an entry whose digest,
ledger id or entry id does not check out counts as a failed replica, not as data. Callbacks, not
Deferreds, per entry; one Deferred per call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, Protocol

from twisted.internet.defer import Deferred

from bkctl import limits
from bkctl.client.bookie_client import RC_TIMEOUT, RC_UNAUTHENTICATED, RC_UNAVAILABLE, BookieClients, rc_text
from bkctl.errors import (
    AccessDeniedError,
    BkctlError,
    CorruptDataError,
    NotFoundError,
    ProtocolError,
    TimeoutError_,
    UnauthorizedError,
    UnavailableError,
)
from bkctl.model import DigestType
from bkctl.protocol import wire
from bkctl.protocol.entry import digest_matches, parse_entry, verify_entry
from bkctl.protocol.quorum import Quorum, ReadAnswer, answer_for_rc


class _Bookies(Protocol):
    @property
    def bookies(self) -> BookieClients: ...


class ReadHandle(Protocol):
    """What a read needs of a ledger handle (ledger.LedgerHandle is one; typed here, so this module
    imports nothing from ledger.py, which imports it)."""

    @property
    def ledger_id(self) -> int: ...
    @property
    def digest(self) -> DigestType: ...
    @property
    def mac(self) -> bytes | None: ...
    @property
    def master_key(self) -> bytes: ...
    @property
    def quorum(self) -> Quorum: ...
    @property
    def client(self) -> _Bookies: ...
    def replica(self, entry_id: int, position: int) -> str: ...


_EOK = int(wire.ReturnCode.EOK)
_EUA = int(wire.ReturnCode.EUA)
_ABSENT = frozenset({int(wire.ReturnCode.ENOENTRY), int(wire.ReturnCode.ENOLEDGER)})
RC_DIGEST = -1003  # a replica answered with an entry that failed verification

# Recovery reads fence as well (a bookie that missed the fencing read is fenced by them).
RECOVERY_READ_FLAGS = wire.FLAG_DO_FENCING | wire.FLAG_HIGH_PRIORITY


class LedgerEntry(NamedTuple):
    ledger_id: int
    entry_id: int
    payload: bytes
    last_add_confirmed: int
    length: int


def failure_for(ledger_id: int, entry_id: int, answers: Sequence[tuple[str, int]]) -> BkctlError:
    """The error for an entry no replica could give: (bookie, code) per replica tried."""
    what = f"ledger {ledger_id} entry {entry_id}"
    detail = ", ".join(f"{bookie} {rc_text(rc)}" for bookie, rc in answers)
    codes = {rc for _, rc in answers}
    if RC_UNAUTHENTICATED in codes:
        return AccessDeniedError(f"{what}: SASL credentials refused ({detail})")
    if _EUA in codes:
        # EUA also answers a client the bookie did not authenticate (a SASL GSSAPI refusal comes after
        # the client's last token, which it does not wait on: bkctl/kerberos.py).
        return UnauthorizedError(f"{what}: wrong password or client not authenticated ({detail})")
    if codes <= _ABSENT:
        return NotFoundError(f"{what}: no such entry ({detail})")
    if RC_DIGEST in codes:
        return CorruptDataError(f"{what}: digest mismatch on a replica and no good copy ({detail})")
    if codes == {RC_TIMEOUT}:
        return TimeoutError_(f"{what}: no replica answered in time ({detail})")
    return UnavailableError(f"{what}: no replica could serve it ({detail})")


def _verified(handle: ReadHandle, entry_id: int, body: bytes) -> LedgerEntry | None:
    try:
        e = verify_entry(body, handle.digest, handle.ledger_id, entry_id, handle.mac)
    except ProtocolError:
        return None
    return LedgerEntry(e.ledger_id, e.entry_id, e.payload, e.last_add_confirmed, e.length)


class RangeRead:
    """Entries first..last, at most `window` in flight, each from the first replica that has it."""

    def __init__(self, handle: ReadHandle, first: int, last: int) -> None:
        self.handle = handle
        self.first = first
        self.results: list[LedgerEntry | None] = [None] * (last - first + 1)
        self.next_id = first
        self.last = last
        self.remaining = last - first + 1
        self.result: Deferred[list[LedgerEntry]] = Deferred()
        self.finished = False

    def start(self) -> Deferred[list[LedgerEntry]]:
        if self.remaining == 0:
            self.finished = True
            self.result.callback([])
        else:
            self._fill()
        return self.result

    def _fill(self) -> None:
        in_flight = self.next_id - self.first - (len(self.results) - self.remaining)
        while self.next_id <= self.last and in_flight < limits.CLIENT_READS_IN_FLIGHT_MAX:
            self._try(self.next_id, 0, [])
            self.next_id += 1
            in_flight += 1

    def _try(self, entry_id: int, position: int, answers: list[tuple[str, int]]) -> None:
        bookie = self.handle.replica(entry_id, position)
        done = partial(self._answer, entry_id, position, answers, bookie)
        self.handle.client.bookies.get(bookie).read(self.handle.ledger_id, entry_id, done)

    def _answer(
        self, entry_id: int, position: int, answers: list[tuple[str, int]], bookie: str, rc: int, body: bytes
    ) -> None:
        if self.finished:
            return
        if rc == _EOK:
            entry = _verified(self.handle, entry_id, body)
            if entry is not None:
                self.results[entry_id - self.first] = entry
                self.remaining -= 1
                if self.remaining == 0:
                    self.finished = True
                    self.result.callback(self.results)  # type: ignore[arg-type]
                else:
                    self._fill()
                return
            rc = RC_DIGEST
        answers.append((bookie, rc))
        if position + 1 < self.handle.quorum.write_quorum:
            self._try(entry_id, position + 1, answers)
            return
        self.finished = True
        self.result.errback(failure_for(self.handle.ledger_id, entry_id, answers))


@dataclass
class LastConfirmed:
    """What a read of entry -1 on the last ensemble found."""

    last_add_confirmed: int  # -1 when no bookie had an entry
    length: int  # the length field of the entry that carried that LAC (0 when none)
    last_entry_seen: int  # highest entry id any bookie reported as its last one
    answers: dict[int, ReadAnswer]


class LastConfirmedRead:
    """Entry -1 from every bookie of the last ensemble, until the answers cover every write quorum.

    With `fencing`, the reads are fencing reads (DO_FENCING + master key): each bookie answering OK,
    NoSuchEntry or NoSuchLedger is fenced, and coverage means the old writer can no longer reach Qa.
    """

    def __init__(self, handle: ReadHandle, ensemble: Sequence[str], fencing: bool) -> None:
        self.handle = handle
        self.ensemble = list(ensemble)
        self.fencing = fencing
        self.quorum: Quorum = handle.quorum
        self.found = LastConfirmed(-1, 0, -1, {})
        self.pending = len(self.ensemble)
        self.valid = False
        self.codes: list[tuple[str, int]] = []
        self.result: Deferred[LastConfirmed] = Deferred()
        self.finished = False

    def start(self) -> Deferred[LastConfirmed]:
        flags = wire.FLAG_DO_FENCING if self.fencing else wire.FLAG_NONE
        key = self.handle.master_key if self.fencing else None
        for index, bookie in enumerate(self.ensemble):
            done = partial(self._answer, index, bookie)
            self.handle.client.bookies.get(bookie).read(
                self.handle.ledger_id, wire.LAST_ENTRY_ID, done, flags, key
            )
        return self.result

    def _answer(self, index: int, bookie: str, rc: int, body: bytes) -> None:
        if self.finished:
            return
        self.pending -= 1
        self.codes.append((bookie, rc))
        answer = answer_for_rc(rc)
        if rc == _EOK:
            # The reply header says entry -1: the entry's own header says which one it is.
            if not self._take(body):
                answer = ReadAnswer.UNKNOWN
                self.codes[-1] = (bookie, RC_DIGEST)
        elif rc == _EUA:
            why = "wrong password or client not authenticated"
            self._finish(UnauthorizedError(f"ledger {self.handle.ledger_id}: {why} ({bookie} EUA)"))
            return
        self.found.answers[index] = answer
        self.valid = self.valid or answer is not ReadAnswer.UNKNOWN
        if self.valid and self.quorum.is_covered(self.found.answers):
            self._finish(None)
        elif self.pending == 0:
            self._finish(self._not_covered())

    def _take(self, body: bytes) -> bool:
        handle = self.handle
        try:
            entry = parse_entry(body, handle.digest)
        except ProtocolError:
            return False
        if entry.ledger_id != handle.ledger_id or not digest_matches(body, handle.digest, handle.mac):
            return False
        found = self.found
        found.last_entry_seen = max(found.last_entry_seen, entry.entry_id)
        if entry.last_add_confirmed > found.last_add_confirmed:
            found.last_add_confirmed, found.length = entry.last_add_confirmed, entry.length
        return True

    def _not_covered(self) -> BkctlError:
        detail = ", ".join(f"{bookie} {rc_text(rc)}" for bookie, rc in self.codes)
        what = "fence" if self.fencing else "read the last add confirmed of"
        message = f"cannot {what} ledger {self.handle.ledger_id}: too few bookies answered ({detail})"
        if all(rc in (RC_TIMEOUT, _EOK, *_ABSENT) for _, rc in self.codes):
            return TimeoutError_(message)
        if any(rc == RC_UNAUTHENTICATED for _, rc in self.codes):
            return AccessDeniedError(f"{message}: SASL credentials refused")
        return UnavailableError(message)

    def _finish(self, error: BkctlError | None) -> None:
        self.finished = True
        if error is None:
            self.result.callback(self.found)
        else:
            self.result.errback(error)


class RecoveryRead:
    """One entry past the LAC, asked of its write set one bookie after another (fencing, high priority).

    Fires with the entry, or None once Qw - Qa + 1 bookies say it does not exist (then no writer
    could have had it acknowledged). Any other outcome is an error: recovery cannot decide.
    """

    def __init__(self, handle: ReadHandle, ensemble: Sequence[str], entry_id: int) -> None:
        self.handle = handle
        self.entry_id = entry_id
        self.bookies = [ensemble[i] for i in handle.quorum.write_set(entry_id)]
        self.absent = 0
        self.codes: list[tuple[str, int]] = []
        self.result: Deferred[LedgerEntry | None] = Deferred()

    def start(self) -> Deferred[LedgerEntry | None]:
        self._try(0)
        return self.result

    def _try(self, position: int) -> None:
        bookie = self.bookies[position]
        done: Callable[[int, bytes], None] = partial(self._answer, position, bookie)
        client = self.handle.client.bookies.get(bookie)
        client.read(self.handle.ledger_id, self.entry_id, done, RECOVERY_READ_FLAGS, self.handle.master_key)

    def _answer(self, position: int, bookie: str, rc: int, body: bytes) -> None:
        if rc == _EOK:
            entry = _verified(self.handle, self.entry_id, body)
            if entry is not None:
                self.result.callback(entry)
                return
            rc = RC_DIGEST
        self.codes.append((bookie, rc))
        if rc == _EUA:
            self.result.errback(failure_for(self.handle.ledger_id, self.entry_id, self.codes))
            return
        if rc in _ABSENT:
            self.absent += 1
            if self.absent >= self.handle.quorum.answers_needed:
                self.result.callback(None)
                return
        if position + 1 < len(self.bookies):
            self._try(position + 1)
            return
        error = failure_for(self.handle.ledger_id, self.entry_id, self.codes)
        if isinstance(error, NotFoundError):  # absent everywhere asked, but too few to be sure
            error = UnavailableError(f"recovery cannot tell whether entry {self.entry_id} exists: {error}")
        self.result.errback(error)


__all__ = [
    "RC_DIGEST",
    "RC_UNAVAILABLE",
    "LastConfirmed",
    "LastConfirmedRead",
    "LedgerEntry",
    "RangeRead",
    "RecoveryRead",
    "failure_for",
]
