"""Ledgers on Twisted: `LedgerHandle` (add with ordered acks, ensemble change, read, read LAC, close), made
by `client.Client` (create, open with or without recovery, delete). See docs/client.md.

The add path is callbacks over plain objects: one `_Add` per entry (its request item, a bitmask of the
ensemble indexes that acknowledged it, an optional Deferred or plain callback), kept in entry order. An
entry is acknowledged once Qa bookies of its write set have it *and* every earlier entry is
acknowledged. Each entry is packaged, checksummed and framed once into one request item `(key, frame,
_Add)`; the same item goes to every bookie of its write set (and to a replacement bookie after an
ensemble change), in one batch per bookie and reactor tick. A bookie's reply comes back to the reply
function of its ensemble index, made once per ensemble. `add_callback` is the Deferred-free path for
load generators.
Metadata calls block (SQLite, kazoo), so they run in the reactor's thread pool.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Protocol, TypeVar

from twisted.internet import defer
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from bkctl import limits
from bkctl.client.bookie_client import (
    ADD_FLAGS,
    RECOVERY_ADD_FLAGS,
    BookieClient,
    BookieClients,
    Item,
    OnReply,
    add_key,
    error_for,
)
from bkctl.client.placement import Placement
from bkctl.client.reads import LastConfirmed, LastConfirmedRead, LedgerEntry, RangeRead
from bkctl.errors import (
    BadVersionError,
    BkctlError,
    ConflictError,
    FencedError,
    LedgerClosedError,
    NotFoundError,
    UnauthorizedError,
    UnavailableError,
    UsageError,
)
from bkctl.metadata.layout import Layout
from bkctl.model import DigestType, LedgerMetadata, LedgerState, Segment
from bkctl.protocol import wire
from bkctl.protocol.entry import mac_key, master_key
from bkctl.protocol.quorum import Quorum

log = logging.getLogger(__name__)
T = TypeVar("T")

_EOK = int(wire.ReturnCode.EOK)
_EFENCED = int(wire.ReturnCode.EFENCED)
_EUA = int(wire.ReturnCode.EUA)
_REQUEST_REFUSED = frozenset({int(wire.ReturnCode.EBADREQ), int(wire.ReturnCode.EBADVERSION)})


AddCallback = Callable[[int, "BkctlError | None"], None]


class LedgerClient(Protocol):
    """What a handle uses of the `client.Client` that made it (typed here, so this module imports nothing
    above it: client.py -> recovery.py -> ledger.py is a line)."""

    @property
    def layout(self) -> Layout: ...
    @property
    def reactor(self) -> Any: ...
    @property
    def rng(self) -> random.Random: ...
    @property
    def bookies(self) -> BookieClients: ...
    @property
    def closing(self) -> bool: ...
    @property
    def recovery_reads_in_flight(self) -> int: ...
    @property
    def placement(self) -> Placement: ...
    def in_thread(self, function: Callable[..., T], *args: Any) -> Deferred[T]: ...
    def place(self, choose: Callable[..., T], *args: Any) -> Deferred[T]: ...


class _Add:
    """One entry on its way: framed once, resent byte for byte to replacement bookies."""

    __slots__ = ("acks", "callback", "deferred", "entry_id", "frame", "length", "payload")

    def __init__(
        self,
        entry_id: int,
        payload: bytes,
        length: int,
        deferred: Deferred[Any] | None,
        callback: AddCallback | None = None,
    ) -> None:
        self.entry_id = entry_id
        self.payload = payload
        self.length = length  # ledger length including this entry
        self.deferred = deferred
        self.callback = callback  # callback(entry_id, None) on ack, (entry_id, error) on failure
        # The framed ADD_ENTRY request, once sent. Not the request item: the item holds this _Add, and a
        # reference cycle per entry would leave every entry to the cyclic GC (long gen-2 pauses).
        self.frame: bytes | None = None
        self.acks = 0  # bitmask of ensemble indexes


class LedgerHandle:
    """An open ledger. Writable handles come from `Client.create_ledger`; opened ones are read-only."""

    def __init__(
        self,
        client: LedgerClient,
        ledger_id: int,
        metadata: LedgerMetadata,
        version: int,
        password: bytes,
        digest: DigestType,
        *,
        writable: bool,
    ) -> None:
        self.client = client
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.version = version
        self.password = password
        self.digest = digest
        self.mac = mac_key(password) if digest is DigestType.MAC else None
        self.master_key = master_key(password)
        self.quorum = Quorum(metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum)
        self.writable = writable
        self.add_flags = ADD_FLAGS
        closed = metadata.state is LedgerState.CLOSED
        self.last_add_confirmed = metadata.last_entry_id if closed else -1
        self.length = metadata.length if closed else 0
        self._last_pushed = self.last_add_confirmed
        self._length_pushed = self.length
        self._pending: deque[_Add] = deque()  # unacknowledged adds, in entry order
        self._unsent: deque[_Add] = deque()  # the tail of _pending not yet sent
        self._error: BkctlError | None = None
        self._changing = False
        self._failed: dict[int, str] = {}  # ensemble index -> the bookie that failed there
        self._copies_missed: set[str] = set()  # bookies an acknowledged entry did not reach
        self._copies_marked: set[str] = set()  # ... of which the under-replication mark names these
        self._unanswered = 0  # adds sent to a bookie and not answered (nor timed out) yet
        self._answered: list[Deferred[None]] = []  # a close waiting for _unanswered to reach 0
        self._ensemble = list(metadata.segments[-1].ensemble)
        self._targets: list[tuple[BookieClient, OnReply, str]] = []  # per ensemble index, see _bookie_targets
        self._write_sets = [
            tuple(self.quorum.write_set(i)) for i in range(self.quorum.ensemble_size)
        ]  # by entry id modulo E
        self._drained: list[Deferred[None]] = []
        self._send_call: Any = None
        self._closing: Deferred[None] | None = None

    # --- shape ------------------------------------------------------------------------------------

    def adopt_metadata(self, metadata: LedgerMetadata) -> None:
        """Metadata changed by someone else (recovery swapped a bookie): read from the new ensembles."""
        self.metadata = metadata
        self._ensemble = list(metadata.segments[-1].ensemble)
        self._targets = []

    @property
    def error(self) -> BkctlError | None:
        """Why the handle stopped taking adds (a failed add or ensemble change), or None."""
        return self._error

    @property
    def is_closed(self) -> bool:
        return self.metadata.state is LedgerState.CLOSED

    @property
    def ensemble(self) -> list[str]:
        """The ensemble new entries go to (the last segment's)."""
        return list(self._ensemble)

    def replica(self, entry_id: int, position: int) -> str:
        """The bookie at `position` of the write set of `entry_id`, in the segment that stores it."""
        segment = self._segment_ensemble(entry_id)
        return segment[(entry_id + position) % self.quorum.ensemble_size]

    def _segment_ensemble(self, entry_id: int) -> Sequence[str]:
        if entry_id >= self.metadata.segments[-1].first_entry_id:
            return self._ensemble
        return self.metadata.segment_for(entry_id).ensemble

    # --- add --------------------------------------------------------------------------------------

    def add(self, payload: bytes) -> Deferred[int]:
        """Append one entry; fires with its entry id once it and every earlier entry are acknowledged."""
        deferred: Deferred[int] = Deferred()
        self._accept([payload], deferred, single=True)
        return deferred

    def add_callback(self, payload: bytes, callback: AddCallback) -> None:
        """Append one entry without a Deferred: `callback(entry_id, None)` once it and every earlier
        entry are acknowledged, `callback(entry_id, error)` if it fails (the entry id is -1 when the add
        is refused before it gets one). Callbacks fire in entry order."""
        problem = self._add_refusal_one(len(payload))
        if problem is not None:
            callback(-1, problem)
            return
        self._last_pushed += 1
        self._length_pushed += len(payload)
        add = _Add(self._last_pushed, payload, self._length_pushed, None, callback)
        self._pending.append(add)
        self._unsent.append(add)
        self._schedule()

    def _schedule(self) -> None:
        """Acknowledge and send once per reactor tick, after every reply of the tick is counted: the
        adds of a tick then go out in one frame-building loop and one write per bookie."""
        if self._send_call is None:
            self._send_call = self.client.reactor.callLater(0, self._tick)

    def _tick(self) -> None:
        self._send_call = None
        self._advance()

    def add_many(self, payloads: Iterable[bytes]) -> Deferred[list[int]]:
        """Append entries in order; one Deferred, fired with their ids once the last is acknowledged."""
        items = list(payloads)
        deferred: Deferred[list[int]] = Deferred()
        if not items:
            deferred.callback([])
            return deferred
        self._accept(items, deferred, single=False)
        return deferred

    def _accept(self, payloads: list[bytes], deferred: Deferred[Any], single: bool) -> None:
        problem = self._add_refusal(payloads)
        if problem is not None:
            deferred.errback(problem)
            return
        first = self._last_pushed + 1
        if not single:
            ids = list(range(first, first + len(payloads)))
            deferred.addCallback(lambda _: ids)
        last = len(payloads) - 1
        for i, payload in enumerate(payloads):
            self._last_pushed += 1
            self._length_pushed += len(payload)
            add = _Add(self._last_pushed, payload, self._length_pushed, deferred if i == last else None)
            self._pending.append(add)
            self._unsent.append(add)
        self._send_more()

    def _add_refusal(self, payloads: list[bytes]) -> BkctlError | None:
        return self._add_refusal_one(max(map(len, payloads)), len(payloads))

    def _add_refusal_one(self, largest: int, count: int = 1) -> BkctlError | None:
        if self._error is not None:
            return type(self._error)(str(self._error))
        if self.is_closed or self._closing is not None:
            return LedgerClosedError(f"ledger {self.ledger_id} is closed")
        if not self.writable:
            return UsageError(f"ledger {self.ledger_id} was opened for reading")
        if largest > limits.ENTRY_SIZE_MAX:
            return UsageError(f"entry of {largest} bytes is over the {limits.ENTRY_SIZE_MAX}-byte limit")
        if len(self._unsent) + count > limits.CLIENT_ADDS_WAITING_MAX:
            return UnavailableError(
                f"ledger {self.ledger_id}: more than {limits.CLIENT_ADDS_WAITING_MAX} adds waiting to be sent"
            )
        return None

    def start_recovery_at(self, last_add_confirmed: int, length: int) -> None:
        """Recovery fenced the ledger and found its LAC: `recovery_add` goes on from the next entry."""
        self.last_add_confirmed = self._last_pushed = last_add_confirmed
        self.length = self._length_pushed = length

    def recovery_add(self, entry: LedgerEntry) -> Deferred[int]:
        """Write back an entry recovery found, with RECOVERY_ADD (accepted by fenced bookies).

        As BookKeeper does, the entry keeps its own length field and gets the recovering LAC.
        """
        deferred: Deferred[int] = Deferred()
        if self._error is not None:
            deferred.errback(type(self._error)(str(self._error)))
            return deferred
        if entry.entry_id != self._last_pushed + 1:
            raise UnavailableError(
                f"recovery of ledger {self.ledger_id}: entry {entry.entry_id} out of order"
            )
        self._last_pushed = entry.entry_id
        self._length_pushed = entry.length
        add = _Add(entry.entry_id, entry.payload, entry.length, deferred)
        self._pending.append(add)
        self._unsent.append(add)
        self._send_more()
        return deferred

    def _send_more(self) -> None:
        if self._changing or self._error is not None:
            return
        unsent = self._unsent
        window = limits.CLIENT_ADDS_IN_FLIGHT_MAX - (len(self._pending) - len(unsent))
        if not unsent or window <= 0:
            return
        # The hot loop: locals only. One header + CRC + frame per entry, the same item to each copy.
        targets = self._bookie_targets()
        batches: list[list[Item]] = [[] for _ in targets]
        write_sets = self._write_sets
        ensemble_size = len(write_sets)
        digest, ledger_id, lac, mac = self.digest, self.ledger_id, self.last_add_confirmed, self.mac
        head, frame = wire.add_request_head(self.master_key, self.add_flags), wire.frame_add_request
        popleft = unsent.popleft
        for _ in range(min(window, len(unsent))):
            add = popleft()
            entry_id = add.entry_id
            add.frame = framed = frame(head, digest, ledger_id, entry_id, lac, add.length, add.payload, mac)
            item = (add_key(ledger_id, entry_id), framed, add)
            for index in write_sets[entry_id % ensemble_size]:
                batches[index].append(item)
        for (target, on_reply, _), batch in zip(targets, batches, strict=True):
            if batch:
                self._unanswered += len(batch)
                target.send_adds(batch, on_reply)

    def _bookie_targets(self) -> list[tuple[BookieClient, OnReply, str]]:
        """(BookieClient, reply function, bookie id) per index of the current ensemble, made again when it
        changes."""
        ensemble = self._ensemble
        targets = self._targets
        if len(targets) != len(ensemble) or any(t[2] != b for t, b in zip(targets, ensemble, strict=True)):
            pool = self.client.bookies
            targets = self._targets = [
                (pool.get(bookie), partial(self._add_done, index, bookie), bookie)
                for index, bookie in enumerate(ensemble)
            ]
        return targets

    def _send(self, add: _Add, index: int) -> None:
        assert add.frame is not None
        target, on_reply, _ = self._bookie_targets()[index]
        self._unanswered += 1
        target.send_adds([(add_key(self.ledger_id, add.entry_id), add.frame, add)], on_reply)

    def _add_done(self, index: int, bookie: str, add: _Add, rc: int, _: bytes) -> None:
        self._unanswered -= 1
        if not self._unanswered and self._answered:
            self._notify_answered()
        if self._error is not None or self.client.closing:
            return  # a closing client's own disconnects are no bookie's failure
        if add.entry_id <= self.last_add_confirmed:
            if rc != _EOK:
                self._copy_missed(index, bookie)
            return
        if self._ensemble[index] != bookie:
            return  # a bookie replaced since: its answer no longer counts
        if rc == _EOK:
            add.acks |= 1 << index
            if add is self._pending[0] and add.acks.bit_count() >= self.quorum.ack_quorum:
                self._schedule()
            return
        what = f"add of ledger {self.ledger_id} entry {add.entry_id} to {bookie}"
        if rc == _EFENCED:
            self._fail(FencedError(f"{what}: ledger fenced (another client recovered it)"))
        elif rc == _EUA:
            self._fail(UnauthorizedError(f"{what}: wrong password"))
        elif rc in _REQUEST_REFUSED:
            # The request itself is wrong (e.g. an entry larger than the bookie takes): another bookie
            # would refuse it too, so this is no reason to replace one.
            self._fail(wire.error_for_rc(rc, f"{what} refused as a bad request"))
        else:
            log.info("%s failed (%s): replacing the bookie", what, error_for(rc, what))
            self._bookie_failed(index, bookie)

    def _advance(self) -> None:
        """Acknowledge entries in order while the head has Qa acks (not during an ensemble change)."""
        pending = self._pending
        quorum = self.quorum.ack_quorum
        fired: list[_Add] = []
        popleft = pending.popleft
        head = None
        while pending and not self._changing and pending[0].frame is not None:
            if pending[0].acks.bit_count() < quorum:
                break
            head = popleft()
            if head.deferred is not None or head.callback is not None:
                fired.append(head)
        if head is not None:
            self.last_add_confirmed = head.entry_id
            self.length = head.length
        for add in fired:
            if add.callback is not None:
                add.callback(add.entry_id, None)
            else:
                assert add.deferred is not None
                add.deferred.callback(add.entry_id)
        if not pending:
            self._notify_drained()
        self._send_more()

    def _fail(self, error: BkctlError) -> None:
        """The writer cannot go on: every unacknowledged add fails with `error`, and so will new ones."""
        if self._error is not None:
            return
        self._error = error
        failed = [add for add in self._pending if add.deferred is not None or add.callback is not None]
        self._pending.clear()
        self._unsent.clear()
        for add in failed:
            if add.callback is not None:
                add.callback(add.entry_id, type(error)(str(error)))
            else:
                assert add.deferred is not None
                add.deferred.errback(type(error)(str(error)))
        self._notify_drained()

    def wait_answered(self) -> Deferred[None]:
        """Fires when every add sent was answered or timed out; never later than a bound, should a reply
        go astray (the close goes on then, without marks for copies it could not see missed)."""
        if not self._unanswered:
            return defer.succeed(None)
        waiter = _wait_on(self._answered)
        waiter.addTimeout(2 * limits.CLIENT_REQUEST_TIMEOUT_MS / 1000, self.client.reactor)

        def late(failure: Failure) -> None:
            log.warning("ledger %d: %d adds still unanswered at its close", self.ledger_id, self._unanswered)

        return waiter.addErrback(late)

    def _notify_answered(self) -> None:
        waiters, self._answered = self._answered, []
        _release(waiters)

    def _notify_drained(self) -> None:
        waiters, self._drained = self._drained, []
        _release(waiters)

    def wait_drained(self) -> Deferred[None]:
        """Fires when every pending add is acknowledged (or the handle failed: see `error`)."""
        if (not self._pending and not self._changing) or self._error is not None:
            return defer.succeed(None)
        return _wait_on(self._drained)

    # --- copies missed by acknowledged entries ----------------------------------------------------

    def _copy_missed(self, index: int, bookie: str) -> None:
        """An entry acknowledged by the other bookies of its write set failed on `bookie`: the ledger is
        short of that copy. As Java's notifyWriteFailed, later entries go to another bookie (an ensemble
        change); beyond Java, the ledger is then marked under-replicated naming `bookie`, so autorecovery
        copies what is missing instead of waiting for a periodic check to notice."""
        self._copies_missed.add(bookie)
        if self._closing is not None:
            return  # the close marks every bookie that missed a copy, once all have answered
        if self._ensemble[index] == bookie:
            self._bookie_failed(index, bookie)
        elif not self._changing:
            self._mark_missed_copies()

    def _mark_missed_copies(self, *, closed: bool = False) -> Deferred[None]:
        """Mark the ledger for the bookies that missed copies and are out of its last ensemble (an open
        ledger whose last ensemble is marked would be fenced by autorecovery), or all once closed."""
        current = set() if closed else set(self._ensemble)
        bookies = sorted(self._copies_missed - self._copies_marked - current)
        if not bookies:
            return defer.succeed(None)
        self._copies_marked.update(bookies)
        log.warning("ledger %d: copies missed on %s: marked under-replicated", self.ledger_id, bookies)
        marking = self.client.in_thread(self.client.layout.mark_underreplicated, self.ledger_id, bookies)

        def failed(failure: Failure) -> None:  # the audit's periodic check will find it instead
            log.warning("ledger %d: could not mark it under-replicated: %s", self.ledger_id, failure.value)

        return marking.addCallbacks(lambda _: None, failed)

    # --- ensemble change --------------------------------------------------------------------------

    def _bookie_failed(self, index: int, bookie: str) -> None:
        self._failed[index] = bookie
        if not self._changing:
            self._changing = True
            defer.ensureDeferred(self._change_ensemble()).addErrback(self._change_failed)

    def _change_failed(self, failure: Failure) -> None:
        self._fail(_as_bkctl_error(failure.value))

    async def _change_ensemble(self) -> None:
        """Replace failed bookies: new segment at LAC + 1 by CAS, then resend pending entries to them."""
        excluded: set[str] = set()
        changes = 0
        while self._failed and self._error is None:
            changes += 1
            if changes > limits.CLIENT_ENSEMBLE_CHANGES_MAX:
                raise UnavailableError(
                    f"ledger {self.ledger_id}: {limits.CLIENT_ENSEMBLE_CHANGES_MAX} ensemble changes in a row"
                )
            failed = dict(self._failed)
            excluded.update(failed.values())
            available = await self.client.in_thread(self.client.layout.bookies)
            try:
                policy = self.client.placement
                choice = await self.client.place(
                    policy.replace,
                    self._ensemble,
                    list(failed),
                    available,
                    self.metadata.write_quorum,
                    excluded,
                )
                new = choice.bookies
            except UnavailableError as exc:
                raise UnavailableError(
                    f"bookie {', '.join(sorted(failed.values()))} failed and cannot be replaced ({exc})"
                ) from None
            await self._write_segment(new)
            log.info(
                "ledger %d: ensemble %s -> %s at entry %d",
                self.ledger_id,
                failed,
                new,
                self.last_add_confirmed + 1,
            )
            for index in failed:
                del self._failed[index]
            self._ensemble = new
            self._resend(set(failed))
        self._changing = False
        self._mark_missed_copies()
        if self._error is None and self._pending:
            self._advance()
        elif not self._pending:
            self._notify_drained()  # a close waits for a change made after its last add

    async def _write_segment(self, ensemble: list[str]) -> None:
        first = self.last_add_confirmed + 1
        for _ in range(limits.CLIENT_METADATA_CAS_MAX):
            base = self.metadata
            segments = base.segments
            if segments[-1].first_entry_id == first:
                segments = segments[:-1]
            updated = replace(base, segments=(*segments, Segment(first, tuple(ensemble))))
            try:
                self.version = await self.client.in_thread(
                    self.client.layout.write_ledger, self.ledger_id, updated, self.version
                )
            except BadVersionError:
                await self._reload_for_change()
                continue
            self.metadata = updated
            return
        raise ConflictError(
            f"ledger {self.ledger_id}: ensemble change lost {limits.CLIENT_METADATA_CAS_MAX} races"
        )

    async def _reload_for_change(self) -> None:
        current = await self.client.in_thread(self.client.layout.read_ledger, self.ledger_id)
        state = current.value.state
        if state is LedgerState.CLOSED:
            raise LedgerClosedError(f"ledger {self.ledger_id} was closed by another client")
        if state is LedgerState.IN_RECOVERY and self.add_flags != RECOVERY_ADD_FLAGS:
            raise FencedError(f"ledger {self.ledger_id} is being recovered by another client")
        self.metadata, self.version = current.value, current.version

    def _resend(self, indexes: set[int]) -> None:
        """Entries not yet acknowledged must reach the new bookies too; their old acks there are void."""
        for add in self._pending:
            if add.frame is None:
                break  # the rest are unsent: they go to the new ensemble anyway
            for index in self.quorum.write_set(add.entry_id):
                if index in indexes:
                    add.acks &= ~(1 << index)
                    self._send(add, index)

    # --- reads ------------------------------------------------------------------------------------

    def read(self, first: int, last: int | None = None) -> Deferred[list[LedgerEntry]]:
        """Entries first..last (inclusive; default: just `first`), all <= the last add confirmed."""
        last = first if last is None else last
        if first < 0 or last < first:
            return defer.fail(UsageError(f"bad entry range {first}..{last}"))
        if last - first + 1 > limits.CLIENT_READ_RANGE_MAX:
            return defer.fail(
                UsageError(f"read of {last - first + 1} entries: at most {limits.CLIENT_READ_RANGE_MAX}")
            )
        if last > self.last_add_confirmed:
            return defer.fail(
                NotFoundError(
                    f"ledger {self.ledger_id}: entry {last} is past the last add confirmed "
                    f"{self.last_add_confirmed}"
                )
            )
        return RangeRead(self, first, last).start()

    def read_lac(self) -> Deferred[int]:
        """The last add confirmed as the bookies know it (no fencing); the handle's LAC never decreases."""
        if self.is_closed:
            return defer.succeed(self.metadata.last_entry_id)

        def found(result: LastConfirmed) -> int:
            lac = max(self.last_add_confirmed, result.last_add_confirmed)
            if lac > self.last_add_confirmed and not self.writable:
                self.last_add_confirmed = lac
            return lac

        return LastConfirmedRead(self, self._ensemble, fencing=False).start().addCallback(found)

    # --- close ------------------------------------------------------------------------------------

    def close(self) -> Deferred[None]:
        """Wait for pending adds, then CAS the metadata to CLOSED at the last add confirmed."""
        if self._closing is None:
            self._closing = defer.ensureDeferred(self._close())
        return self._closing

    async def _close(self) -> None:
        if not self.writable or self.is_closed:
            return
        await self.wait_drained()
        await self.close_metadata(self.last_add_confirmed, self.length)
        # Acknowledged entries may still be on their way to a slow or hung bookie: wait until every copy
        # answered or timed out (the request timeout bounds it), so a copy missed is marked, not lost
        # from sight when the writer's process ends right after its close.
        await self.wait_answered()
        await self._mark_missed_copies(closed=True)
        if self._error is not None:
            raise type(self._error)(str(self._error))

    async def close_metadata(self, last_entry_id: int, length: int) -> None:
        """CAS to CLOSED; on a lost race follow BookKeeper's rules (see docs/client.md)."""
        for _ in range(limits.CLIENT_METADATA_CAS_MAX):
            closed = replace(
                self.metadata, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length
            )
            try:
                self.version = await self.client.in_thread(
                    self.client.layout.write_ledger, self.ledger_id, closed, self.version
                )
            except BadVersionError:
                if await self._closed_by_other(last_entry_id, length):
                    return
                continue
            self.metadata = closed
            self.last_add_confirmed, self.length = last_entry_id, length
            return
        raise ConflictError(f"ledger {self.ledger_id}: close lost {limits.CLIENT_METADATA_CAS_MAX} races")

    async def _closed_by_other(self, last_entry_id: int, length: int) -> bool:
        """Re-read after a lost close CAS: True if someone else closed it as we would have."""
        current = await self.client.in_thread(self.client.layout.read_ledger, self.ledger_id)
        md = current.value
        if md.state is LedgerState.CLOSED:
            if (md.last_entry_id, md.length) == (
                last_entry_id,
                length,
            ) or self.add_flags == RECOVERY_ADD_FLAGS:
                # A concurrent recovery closed it: every recovery reaches the same end, so take theirs.
                self.metadata, self.version = md, current.version
                self.last_add_confirmed, self.length = md.last_entry_id, md.length
                return True
            raise LedgerClosedError(
                f"ledger {self.ledger_id} was closed by another client at entry {md.last_entry_id}, "
                f"not {last_entry_id}"
            )
        if md.state is LedgerState.IN_RECOVERY and self.add_flags != RECOVERY_ADD_FLAGS:
            raise FencedError(f"ledger {self.ledger_id} is being recovered by another client")
        self.metadata, self.version = md, current.version
        return False


def _wait_on(waiters: list[Deferred[None]]) -> Deferred[None]:
    waiter: Deferred[None] = Deferred()
    waiters.append(waiter)
    return waiter


def _release(waiters: list[Deferred[None]]) -> None:
    """Fire every waiter not already given up on (a bound's timeout). The caller detaches the list
    first: a callback may wait again, and that waiter belongs to the next release, not this one."""
    for waiter in waiters:
        if not waiter.called:
            waiter.callback(None)


def _as_bkctl_error(exc: BaseException | None) -> BkctlError:
    if isinstance(exc, BkctlError):
        return exc
    log.error("ledger client: unexpected %r", exc)
    return UnavailableError(f"unexpected client failure: {exc!r}")
