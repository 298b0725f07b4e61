"""Recovery open: make sure an open ledger's old writer can no longer be acknowledged, find its last
entry and close it there.

1. CAS the metadata to IN_RECOVERY (a ledger already IN_RECOVERY is recovered again: recovery is
   idempotent, and a crashed recoverer leaves it so).
2. Fencing reads of entry -1 to every bookie of the last ensemble, until every write quorum has
   Qw - Qa + 1 answers (OK / NoSuchEntry / NoSuchLedger). Those bookies refuse the writer's adds from
   now on, so no write quorum can give it Qa acks again. LAC = max(highest LAC carried by the entries
   returned, first entry of the last segment - 1).
3. Read forward from LAC + 1 (recovery reads: fencing, high priority), each entry through its write
   set, with a window of `Client.recovery_reads_in_flight` entries in flight, until an entry is
   missing (Qw - Qa + 1 bookies say it does not exist); results are taken in entry order, and each
   entry found is written back with RECOVERY_ADD (pipelined, in order) so Qa bookies have it. Reads
   past the first missing entry are ignored (and never written back), so the window changes only
   how fast recovery goes, not where it ends.
4. CAS to CLOSED at the last entry found. A concurrent recovery that closed it first wins: both reach
   the same last entry, so we take its metadata.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from twisted.internet import defer
from twisted.python.failure import Failure

from bkctl import limits
from bkctl.client.bookie_client import RECOVERY_ADD_FLAGS
from bkctl.client.ledger import LedgerHandle
from bkctl.client.reads import LastConfirmedRead, LedgerEntry, RecoveryRead
from bkctl.errors import BadVersionError, BkctlError, ConflictError, UnavailableError
from bkctl.model import LedgerState

log = logging.getLogger(__name__)


async def recover(handle: LedgerHandle) -> None:
    """Fence, recover and close `handle`'s ledger (no-op when it is closed)."""

    if not await _mark_in_recovery(handle):
        return
    handle.add_flags = RECOVERY_ADD_FLAGS
    ensemble = handle.ensemble  # entries past the LAC live here, whatever ensemble changes follow
    found = await LastConfirmedRead(handle, ensemble, fencing=True).start()
    segment_first = handle.metadata.segments[-1].first_entry_id
    lac = max(found.last_add_confirmed, segment_first - 1)
    handle.start_recovery_at(lac, found.length)
    log.info("ledger %d: fenced; LAC %d, reading forward", handle.ledger_id, lac)
    written = await _read_forward(handle, ensemble, lac + 1)
    if written:
        await defer.gatherResults(written, consumeErrors=True).addErrback(_first_error)
    elif lac >= 0:
        handle.length = await _length_at(handle, lac, found.length)
    await handle.wait_drained()
    if (error := handle.error) is not None:
        raise type(error)(str(error))
    await handle.close_metadata(handle.last_add_confirmed, handle.length)
    log.info("ledger %d: recovered, closed at entry %d", handle.ledger_id, handle.last_add_confirmed)


async def _mark_in_recovery(handle: LedgerHandle) -> bool:
    """CAS to IN_RECOVERY; False when the ledger turns out to be closed already."""
    client = handle.client
    for _ in range(limits.CLIENT_METADATA_CAS_MAX):
        md = handle.metadata
        if md.state is LedgerState.CLOSED:
            handle.last_add_confirmed, handle.length = md.last_entry_id, md.length
            return False
        if md.state is LedgerState.IN_RECOVERY:
            return True
        marked = replace(md, state=LedgerState.IN_RECOVERY)
        try:
            handle.version = await client.in_thread(
                client.layout.write_ledger, handle.ledger_id, marked, handle.version
            )
            handle.metadata = marked
            return True
        except BadVersionError:
            current = await client.in_thread(client.layout.read_ledger, handle.ledger_id)
            handle.adopt_metadata(current.value)  # nothing sent yet: only the ensemble follows it
            handle.version = current.version
    raise ConflictError(f"ledger {handle.ledger_id}: marking it in recovery lost too many races")


async def _read_forward(handle: LedgerHandle, ensemble: list[str], first: int) -> list[defer.Deferred[int]]:
    """Recovery-read from `first` until an entry is missing; write back each one found, in order."""
    window = max(1, min(handle.client.recovery_reads_in_flight, limits.CLIENT_RECOVERY_READS_IN_FLIGHT_MAX))
    return await _ForwardReader(handle, ensemble, first, window).run()


class _ForwardReader:
    """Keeps `window` RecoveryReads in flight and consumes their results strictly in entry order.

    With a window of 1 the frames are those of a one-at-a-time reader: the next read goes out before
    the write-back of the entry just found, as BookKeeper orders them.
    """

    def __init__(self, handle: LedgerHandle, ensemble: list[str], first: int, window: int) -> None:
        self.handle, self.ensemble, self.window = handle, ensemble, window
        self.next_read = first  # next entry id to ask for
        self.next_take = first  # next entry id to consume
        self.results: dict[int, LedgerEntry | Failure | None] = {}
        self.written: list[defer.Deferred[int]] = []
        self.done: defer.Deferred[list[defer.Deferred[int]]] = defer.Deferred()
        self.stopped = False
        self.limit = first + limits.CLIENT_RECOVERY_ENTRIES_MAX

    def run(self) -> defer.Deferred[list[defer.Deferred[int]]]:
        self._fill()
        return self.done

    def _fill(self) -> None:
        while not self.stopped and self.next_read - self.next_take < self.window:
            if self.next_read >= self.limit:
                if self.next_take >= self.limit:
                    self._stop(
                        UnavailableError(
                            f"ledger {self.handle.ledger_id}: more than "
                            f"{limits.CLIENT_RECOVERY_ENTRIES_MAX} entries past the LAC"
                        )
                    )
                return
            entry_id = self.next_read
            self.next_read += 1
            RecoveryRead(self.handle, self.ensemble, entry_id).start().addBoth(self._arrived, entry_id)

    def _arrived(self, result: LedgerEntry | Failure | None, entry_id: int) -> None:
        if self.stopped:
            return  # past the end (or after a failure): ignored, as a sequential reader never asked
        self.results[entry_id] = result
        while not self.stopped and self.next_take in self.results:
            taken = self.results.pop(self.next_take)
            if taken is None:
                self._stop(None)
                return
            if isinstance(taken, Failure):
                self._stop(taken)
                return
            self.next_take += 1
            self._fill()  # the next read goes out before this entry's write-back
            self.written.append(self.handle.recovery_add(taken))
        self._fill()

    def _stop(self, error: BaseException | Failure | None) -> None:
        self.stopped = True
        self.results.clear()
        if error is None:
            self.done.callback(self.written)
            return
        for written in self.written:
            written.addErrback(lambda _: None)
        self.done.errback(error)


async def _length_at(handle: LedgerHandle, entry_id: int, fallback: int) -> int:
    """The ledger length at `entry_id` (nothing was found past it): that entry's own length field.

    BookKeeper keeps the length carried next to the highest LAC, which belongs to a later entry; when
    that later entry was not recovered (a tail gap) the entry at the LAC is the right source.
    """
    try:
        (entry,) = await handle.read(entry_id)
    except BkctlError as exc:
        log.warning(
            "ledger %d: cannot read entry %d for its length (%s); using %d",
            handle.ledger_id,
            entry_id,
            exc,
            fallback,
        )
        return fallback
    return entry.length


def _first_error(failure: Failure) -> None:
    """gatherResults wraps the first failure: raise the write-back's own error."""
    error = failure.value
    if isinstance(error, defer.FirstError):
        error.subFailure.raiseException()
    raise UnavailableError(f"recovery write-back failed: {error!r}")
