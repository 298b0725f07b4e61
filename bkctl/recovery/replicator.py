"""Copy a fragment to a target bookie, then swap the target into that segment's ensemble.

Each entry is read from the surviving replicas of its write set in write-set order: the first one is
asked, the next only when it has no copy that verifies (an error, no answer, a bad digest): one read
per entry while replicas are healthy. It is written to the target with RECOVERY_ADD exactly as stored:
same bytes, same digest, nothing re-packed (BookKeeper re-packages with the handle's LAC; a copy is a
copy). Reads and adds are pipelined with a bound on entries and bytes in flight (BookKeeper copies 10
entries at a time), and an optional rate limit in bytes/s. Then the fragment's bookie is replaced in its
segment's ensemble by one compare-and-set on the ledger's metadata per fragment: on a concurrent change
it re-reads and re-applies (a live writer's new segment is kept), and if the bookie is no longer at that
place someone else already did the swap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from twisted.internet import task
from twisted.internet.defer import Deferred

from bkctl.client.bookie_client import RECOVERY_ADD_FLAGS
from bkctl.errors import BadVersionError, BkctlError, ProtocolError, UnavailableError
from bkctl.metadata.nodes import Versioned
from bkctl.model import LedgerMetadata, Segment
from bkctl.protocol import wire
from bkctl.protocol.entry import verify_entry
from bkctl.recovery.fragments import Fragment

if TYPE_CHECKING:
    from bkctl.client.ledger import LedgerHandle

_EOK = int(wire.ReturnCode.EOK)
WINDOW_ENTRIES = 512
# entries in flight for all the copies of a run or a daemon together: each of `parallel` copies gets
# its share as its window (`window_for`), so many small ledgers at once hold no more than 4 did
IN_FLIGHT_ENTRIES = 2048  # local bound
WINDOW_ENTRIES_MIN = 16  # local bound
WINDOW_BYTES = 16 * 1024 * 1024  # local bound
SWAP_CAS_MAX = 20  # local bound


class UnrecoverableError(BkctlError):
    """Some entries have no readable copy on any surviving bookie of their write set."""

    def __init__(self, ledger_id: int, entries: list[int]) -> None:
        self.ledger_id, self.entries = ledger_id, sorted(entries)
        super().__init__(f"ledger {ledger_id}: no surviving copy of entries {format_ranges(self.entries)}")


def format_ranges(entries: list[int]) -> str:
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in entry_ranges(entries))


def entry_ranges(entries: list[int]) -> list[tuple[int, int]]:
    """Sorted entry ids as [first, last] runs."""
    runs: list[tuple[int, int]] = []
    for entry_id in sorted(entries):
        if runs and entry_id == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], entry_id)
        else:
            runs.append((entry_id, entry_id))
    return runs


@dataclass
class CopyStats:
    entries: int = 0
    bytes: int = 0
    corrupt: list[tuple[int, str]] = field(default_factory=list)  # (entry, bookie) copies that failed digest


class Throttle:
    """At most `bytes_per_s` on average (None: no limit); waits on the reactor, never blocks it.

    Shared by every copy of a run (or of a daemon), and changeable while they go (`set_rate`: the
    cluster-wide budget's share of this daemon moves with `autorecovery set-rate` and with the number
    of daemons). Each byte is due `1 / rate` s after the previous one; time left idle is credited for
    at most BURST_S, so a pause is not followed by an unbounded burst."""

    def __init__(self, reactor: Any, bytes_per_s: float | None, window_entries: int = WINDOW_ENTRIES) -> None:
        self._reactor, self._rate = reactor, bytes_per_s or None
        self.window_entries = window_entries  # entries in flight per copy sharing this throttle
        self._due: float = reactor.seconds()  # when the bytes counted so far are all sent, at the rate

    @property
    def rate(self) -> float | None:
        return self._rate

    def set_rate(self, bytes_per_s: float | None) -> None:
        self._rate = bytes_per_s or None

    def wait_s(self) -> float:
        """How long until the bytes counted so far are due (0: none ahead, or no limit)."""
        if not self._rate:
            return 0.0
        ahead: float = self._due - self._reactor.seconds()
        return max(0.0, ahead)

    def delay_after(self, size: int) -> float:
        if not self._rate:
            return 0.0
        now: float = self._reactor.seconds()
        self._due = max(self._due, now - BURST_S) + size / self._rate
        return max(0.0, self._due - now)


BURST_S = 0.25  # local bound: how much of the rate a copier may take at once


def window_for(parallel: int) -> int:
    """Each copy's window when `parallel` copies go at once."""
    return max(WINDOW_ENTRIES_MIN, min(WINDOW_ENTRIES, IN_FLIGHT_ENTRIES // max(1, parallel)))


class FragmentCopy:
    """One fragment's entries from the survivors to `target`; `run()` fires with CopyStats."""

    def __init__(
        self,
        handle: LedgerHandle,
        fragment: Fragment,
        target: str,
        failed: set[str],
        throttle: Throttle,
        stats: CopyStats,
    ) -> None:
        self.handle, self.fragment, self.target = handle, fragment, target
        self.excluded = failed | {fragment.bookie, target}
        self.throttle, self.stats = throttle, stats
        self.queue = list(reversed(list(fragment.entries())))
        self.in_flight = 0
        self.bytes_in_flight = 0
        self.lost: list[int] = []
        self.error: BkctlError | None = None
        self.done: Deferred[CopyStats] = Deferred()
        self.paused = False

    def run(self) -> Deferred[CopyStats]:
        self._fill()
        return self.done

    def _fill(self) -> None:
        wait = self.throttle.wait_s()
        if wait > 0 and self.queue and not self.paused and self.error is None:
            # The budget is spent ahead (other copies of this daemon, a ledger before this one): no
            # new reads until it is due, or each new small ledger would send a whole window at once.
            self.paused = True
            task.deferLater(self.handle.client.reactor, wait, self._resume)
        while (
            self.queue
            and not self.paused
            and self.error is None
            and self.in_flight < self.throttle.window_entries
            and self.bytes_in_flight < WINDOW_BYTES
        ):
            entry_id = self.queue.pop()
            self.in_flight += 1
            self._read(entry_id, self._sources(entry_id), [])
        if self.in_flight == 0 and (not self.queue or self.error is not None) and not self.done.called:
            self._finish()

    def _finish(self) -> None:
        if self.error is not None:
            self.done.errback(self.error)
        elif self.lost:
            self.done.errback(UnrecoverableError(self.handle.ledger_id, self.lost))
        else:
            self.done.callback(self.stats)

    def _sources(self, entry_id: int) -> list[str]:
        ensemble = self.handle.metadata.segments[self.fragment.segment].ensemble
        size, quorum = self.fragment.ensemble_size, self.fragment.write_quorum
        write_set = [ensemble[(entry_id + i) % size] for i in range(quorum)]
        return [b for b in write_set if b not in self.excluded]

    def _read(self, entry_id: int, sources: list[str], tried: list[str]) -> None:
        if not sources:
            self.lost.append(entry_id)
            self._entry_done(0)
            return
        bookie = sources[0]
        answer = self._answer_from(entry_id, sources[1:], [*tried, bookie])
        self.handle.client.bookies.get(bookie).read(self.handle.ledger_id, entry_id, answer)

    def _answer_from(self, entry_id: int, rest: list[str], tried: list[str]) -> Callable[[int, bytes], None]:
        def answer(rc: int, body: bytes) -> None:
            if rc == _EOK and self._verifies(entry_id, body):
                self._write(entry_id, body)
                return
            if rc == _EOK:  # a copy that does not verify: never copied, reported, the next replica asked
                self.stats.corrupt.append((entry_id, tried[-1]))
            self._read(entry_id, rest, tried)

        return answer

    def _verifies(self, entry_id: int, body: bytes) -> bool:
        try:
            verify_entry(body, self.handle.digest, self.handle.ledger_id, entry_id, self.handle.mac)
        except ProtocolError:
            return False
        return True

    def _write(self, entry_id: int, body: bytes) -> None:
        self.bytes_in_flight += len(body)

        def added(rc: int, _: bytes) -> None:
            self.bytes_in_flight -= len(body)
            if rc != _EOK and self.error is None:
                self.error = UnavailableError(
                    f"ledger {self.handle.ledger_id}: copy of entry {entry_id} to {self.target} "
                    f"failed: {wire.rc_name(rc) if rc >= 0 else 'unavailable'}"
                )
            else:
                self.stats.entries += 1
                self.stats.bytes += len(body)
            self._entry_done(len(body))

        connection = self.handle.client.bookies.get(self.target)
        connection.add(
            body, self.handle.master_key, RECOVERY_ADD_FLAGS, self.handle.ledger_id, entry_id, added
        )

    def _entry_done(self, size: int) -> None:
        self.in_flight -= 1
        delay = self.throttle.delay_after(size)
        if delay > 0 and not self.paused:
            self.paused = True
            task.deferLater(self.handle.client.reactor, delay, self._resume)
        else:
            self._fill()

    def _resume(self) -> None:
        self.paused = False
        self._fill()


def copy_fragment(
    handle: LedgerHandle,
    fragment: Fragment,
    target: str,
    *,
    failed: set[str] | frozenset[str] = frozenset(),
    throttle: Throttle | None = None,
    stats: CopyStats | None = None,
) -> Deferred[CopyStats]:
    """Copy the fragment's entries to `target` (UnrecoverableError naming entries with no copy left)."""
    throttle = throttle or Throttle(handle.client.reactor, None)
    return FragmentCopy(handle, fragment, target, set(failed), throttle, stats or CopyStats()).run()


async def swap_bookie(handle: LedgerHandle, fragment: Fragment, target: str) -> bool:
    """Put `target` in place of the fragment's bookie in its segment (found by first entry id), by CAS.

    False if the bookie is no longer there (someone else swapped it): nothing written.
    """
    client = handle.client
    # First from the handle's metadata (read when opened, or just written by the previous swap): a
    # ledger nobody else changes costs one write, not a read and a write; a stale one fails the CAS.
    current = Versioned(handle.metadata, handle.version)
    for attempt in range(SWAP_CAS_MAX):
        if attempt:
            current = await client.in_thread(client.layout.read_ledger, handle.ledger_id)
        updated = swapped(current.value, fragment, target)
        if updated is None and not attempt:
            continue  # the handle's copy may be stale: judged on a fresh read
        if updated is None:
            return False
        try:
            handle.version = await client.in_thread(
                client.layout.write_ledger, handle.ledger_id, updated, current.version
            )
        except BadVersionError:
            continue  # a writer or another recovery changed it: read again, apply again
        handle.adopt_metadata(updated)
        return True
    raise UnavailableError(f"ledger {handle.ledger_id}: ensemble swap lost {SWAP_CAS_MAX} races in a row")


def swapped(metadata: LedgerMetadata, fragment: Fragment, target: str) -> LedgerMetadata | None:
    """The metadata with `target` at the fragment's place, or None if that place no longer holds the
    fragment's bookie (or `target` is already in that ensemble)."""
    segments = list(metadata.segments)
    for number, segment in enumerate(segments):
        if segment.first_entry_id != fragment.first_entry_id:
            continue
        ensemble = list(segment.ensemble)
        if ensemble[fragment.index] != fragment.bookie or target in ensemble:
            return None
        ensemble[fragment.index] = target
        segments[number] = Segment(segment.first_entry_id, tuple(ensemble))
        return replace(metadata, segments=tuple(segments))
    return None
