"""Recovery of failed bookies and of single ledgers: re-replicate every fragment a failed bookie held.

For each ledger with a segment naming a failed bookie: a closed ledger's fragments on it are copied to
the target (given, or chosen by placement among read-write bookies not in that segment's ensemble) and
the target swapped in; an open ledger whose last segment names a failed bookie is first recovered
(fenced and closed, as a recovery open does) unless asked to skip open ledgers; earlier segments of
open ledgers are copied too. Entries with no surviving copy make the ledger unrecoverable: reported with
their ranges, the ledger's metadata left as it is. Idempotent: a ledger already repaired has nothing
left to do, so running again after an interruption finishes the rest.

A bookie that is alive but lacks entries (`live`: a wiped disk, found by the checker, as `ledger
recover` and the autorecovery worker find it) never gets an open ledger fenced: only the segments where
it was found bad are repaired, moved like a dead bookie's in sealed segments, and copied back to it in
place in an open ledger's last segment (a writer is using that ensemble: it cannot change under it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from twisted.internet import defer
from twisted.internet.defer import Deferred

from bkctl.client.single_bookie import last_entry_on, read_from_bookie
from bkctl.errors import BkctlError, NotFoundError, UnavailableError, UsageError
from bkctl.metadata.nodes import Versioned
from bkctl.model import LedgerMetadata
from bkctl.recovery.checker import admin_open as admin_open  # re-exported: repair and commands use it here
from bkctl.recovery.checker import check_ledger
from bkctl.recovery.fragments import Fragment, fragments
from bkctl.recovery.replicator import (
    CopyStats,
    Throttle,
    UnrecoverableError,
    copy_fragment,
    entry_ranges,
    swap_bookie,
    window_for,
)

if TYPE_CHECKING:
    from bkctl.client.client import Client
    from bkctl.client.ledger import LedgerHandle


@dataclass(frozen=True)
class RecoveryOptions:
    failed: tuple[str, ...]
    target: str | None = None
    dry_run: bool = False
    ledger: int | None = None
    parallel: int = 4
    skip_open: bool = False
    rate_bytes_per_s: float | None = None
    # (bookie, segment index) found bad on a bookie that is alive: only those segments are repaired, and
    # the bookie never gets an open ledger fenced (its bookie is also in `failed`)
    live: frozenset[tuple[str, int]] = frozenset()
    # the operator's password for the ledger (`ledger recover --password`); None: the stored one
    password: bytes | None = None
    # a target that breaks the placement policy is used anyway (else the ledger is refused, with why)
    force: bool = False
    # moving replicas to meet the placement policy (the placement check's marks): a move that cannot
    # meet it is not made (the ledger is skipped and tried again later)
    placement_move: bool = False
    newest_first: bool = False  # highest ledger ids first (an active topic reads its newest ledgers)


@dataclass
class PlanStep:
    ledger_id: int
    segment: int  # index in the ledger's segments
    first_entry_id: int
    last_entry_id: int
    old_ensemble: list[str]
    new_ensemble: list[str]  # the same as old_ensemble when copied back in place
    entries: int
    bytes: int | None  # payload bytes, estimated (see payload_per_entry); None when it cannot be known

    def as_dict(self) -> dict[str, Any]:
        return {
            "ledger_id": self.ledger_id,
            "segment": self.segment,
            "first_entry_id": self.first_entry_id,
            "last_entry_id": self.last_entry_id,
            "old_ensemble": self.old_ensemble,
            "new_ensemble": self.new_ensemble,
            "entries": self.entries,
            "bytes": self.bytes,
        }


class SkippedLedger(TypedDict):
    ledger_id: int
    reason: str  # one line: why this run could not repair it (try again later)


class UnrecoverableLedger(TypedDict):
    ledger_id: int
    entries: list[list[int]]  # [first, last] runs of entries no bookie holds


@dataclass
class RecoveryReport:
    """The JSON contract of `bkctl recover` (docs/commands/recover.md)."""

    failed_bookies: list[str]
    target: str | None
    dry_run: bool
    ledgers_total: int = 0
    ledgers_recovered: int = 0
    ledgers_skipped: list[SkippedLedger] = field(default_factory=list)
    ledgers_unrecoverable: list[UnrecoverableLedger] = field(default_factory=list)
    fragments_copied: int = 0
    plan: list[PlanStep] = field(default_factory=list)
    copied: CopyStats = field(default_factory=CopyStats)
    started: float = field(default_factory=time.monotonic)
    ledgers_done: int = 0
    ledgers_deleted: int = 0  # deleted while the run went on (quietly passed over)
    target_overrides: int = 0  # segments where the target could not go (already there): placement chose
    # segments whose new ensemble could not meet the placement policy (a rack down): the copies are
    # restored anyway, and the placement check moves them once the racks are back
    placement_fallbacks: list[dict[str, Any]] = field(default_factory=list)
    corrupt: list[tuple[int, int, str]] = field(default_factory=list)  # (ledger, entry, bookie) bad copies
    # the fragments being copied now, their counts growing entry by entry (not in the JSON: `copied` has
    # them once done); a progress display reads them between two callbacks, a ledger can be one long copy
    copying: list[CopyStats] = field(default_factory=list)

    def copied_now(self) -> tuple[int, int]:
        """(entries, bytes) copied so far, the fragments under way included."""
        entries = self.copied.entries + sum(stats.entries for stats in self.copying)
        return entries, self.copied.bytes + sum(stats.bytes for stats in self.copying)

    def as_dict(self) -> dict[str, Any]:
        return {
            "failed_bookies": self.failed_bookies,
            "target": self.target,
            "ledgers_total": self.ledgers_total,
            "ledgers_recovered": self.ledgers_recovered,
            "ledgers_skipped": self.ledgers_skipped,
            "ledgers_unrecoverable": self.ledgers_unrecoverable,
            "fragments_copied": self.fragments_copied,
            "entries_copied": self.copied.entries,
            "bytes_copied": self.copied.bytes,
            "corrupt_copies": [{"entry_id": e, "bookie": b, "ledger_id": lid} for lid, e, b in self.corrupt],
            "placement_fallbacks": self.placement_fallbacks,
            "seconds": round(time.monotonic() - self.started, 3),
            "dry_run": self.dry_run,
            "plan": [step.as_dict() for step in self.plan] if self.dry_run else [],
        }


def check_bookie_id(text: str, what: str) -> None:
    """`host:port` with a port in 1..65535, else UsageError (exit 2) naming `what` it was given as."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{what} {text!r} is not a bookie id (host:port)")


async def check_target(client: Client, target: str | None, failed: frozenset[str]) -> None:
    """A given target must be a registered read-write bookie and not one of the failed ones (before any
    work: a bad target is refused even when there would be nothing to repair)."""
    if target is None:
        return
    check_bookie_id(target, "target")
    if target in failed:
        raise UsageError(f"target {target} is one of the failed bookies")
    if target not in await client.in_thread(client.layout.bookies):
        raise UsageError(f"target {target} is not a registered read-write bookie")


def names_any(metadata: LedgerMetadata, bookies: frozenset[str]) -> bool:
    return any(b in bookies for segment in metadata.segments for b in segment.ensemble)


async def ledgers_naming(client: Client, bookies: frozenset[str], only: int | None) -> list[int]:
    """Ledger ids whose ensembles name any of `bookies` (every ledger's metadata is read, in batches)."""
    return [ledger_id for ledger_id, _ in await metadata_naming(client, bookies, only)]


async def metadata_naming(
    client: Client, bookies: frozenset[str], only: int | None
) -> list[tuple[int, Versioned[LedgerMetadata]]]:
    """`ledgers_naming` with each ledger's metadata as read (a recovery opens the ledgers from it)."""
    layout = client.layout

    def scan() -> list[tuple[int, Versioned[LedgerMetadata]]]:
        ids = [only] if only is not None else layout.ledger_ids()
        return [(i, md) for i, md in layout.read_ledgers_versioned(ids) if names_any(md.value, bookies)]

    return await client.in_thread(scan)


BOOKIE_LIST_TTL_S = 1.0  # local bound: how long a read of the registered bookies is reused
KNOWN_MAX = 200_000  # local bound: ledgers whose scanned metadata a recovery keeps (~1 KB each)


class RegisteredBookies:
    """The registered bookies (read-write, read-only), read again at most every `ttl_s`: a recovery of
    thousands of small ledgers asked for them two or three times per ledger. A bookie that went in the
    last second is still a target for a moment: its copy fails and the ledger is tried again."""

    def __init__(self, client: Client, ttl_s: float = BOOKIE_LIST_TTL_S) -> None:
        self._client, self._ttl_s = client, ttl_s
        self._read_at = -ttl_s
        self._lists: tuple[list[str], list[str]] = ([], [])
        self._reading: list[Deferred[None]] | None = None  # the repairs waiting for the read under way

    async def lists(self) -> tuple[list[str], list[str]]:
        now = time.monotonic()
        if now - self._read_at < self._ttl_s:
            return self._lists
        if self._reading is not None:  # one read for every repair that asks meanwhile (16 at once)
            waiting: Deferred[None] = Deferred()
            self._reading.append(waiting)
            await waiting
            return self._lists
        self._reading = []
        layout = self._client.layout
        try:
            self._lists = await self._client.in_thread(
                lambda: (layout.bookies(), layout.bookies(readonly=True))
            )
            self._read_at = now
        finally:
            waiters, self._reading = self._reading, None
            for waiter in waiters:  # a failed read: they answer from the lists read before
                waiter.callback(None)
        return self._lists

    async def writable(self) -> list[str]:
        return (await self.lists())[0]


class BookieRecovery:
    """One run of `bkctl recover`: `run()` fires with the report; `stop()` ends it between metadata
    updates (the ledgers and segments in hand finish their copy)."""

    def __init__(
        self,
        client: Client,
        options: RecoveryOptions,
        progress: Callable[[RecoveryReport], None] = lambda _: None,
        *,
        known: dict[int, Versioned[LedgerMetadata]] | None = None,
        bookies: RegisteredBookies | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        self.client, self.options, self.progress = client, options, progress
        # metadata already read (the scan's, or a worker's of its one ledger): each ledger is opened
        # from it instead of being read again
        self.known = dict(known or {})
        self.bookies = bookies or RegisteredBookies(client)
        self.failed = frozenset(options.failed)
        self.dead = self.failed - {bookie for bookie, _ in options.live}
        self.report = RecoveryReport(list(options.failed), options.target, options.dry_run)
        # a daemon's repairs share its throttle (its share of the cluster's budget)
        self.throttle = throttle or Throttle(
            client.reactor, options.rate_bytes_per_s, window_for(options.parallel)
        )
        self.stopping = False

    def stop(self) -> None:
        self.stopping = True

    async def run(self) -> RecoveryReport:
        await self._check_target()
        only = self.options.ledger
        if only is not None and only in self.known:
            named = [(only, self.known[only])] if names_any(self.known[only].value, self.failed) else []
        else:
            named = await metadata_naming(self.client, self.failed, only)
        if len(named) <= KNOWN_MAX:  # beyond, memory: each ledger is read again when its turn comes
            self.known.update(named)
        ids = [ledger_id for ledger_id, _ in named]
        self.report.ledgers_total = len(ids)
        self.progress(self.report)
        queue = sorted(ids, reverse=not self.options.newest_first)  # popped from the end

        async def worker() -> None:
            while queue and not self.stopping:
                await self._one(queue.pop())

        workers = [defer.ensureDeferred(worker()) for _ in range(max(1, self.options.parallel))]
        await defer.gatherResults(workers, consumeErrors=True)
        # Ledgers ran in parallel: report them in id order, as a script would list them.
        self.report.plan.sort(key=lambda step: (step.ledger_id, step.first_entry_id))
        self.report.ledgers_skipped.sort(key=lambda item: item["ledger_id"])
        self.report.ledgers_unrecoverable.sort(key=lambda item: item["ledger_id"])
        return self.report

    async def _check_target(self) -> None:
        target = self.options.target
        if target is not None and target in await self.bookies.writable():
            return  # a worker's own bookie, registered a moment ago: one read less per ledger repaired
        await check_target(self.client, target, self.failed)

    async def _one(self, ledger_id: int) -> None:
        try:
            await self.recover_ledger(ledger_id)
        except UnrecoverableError as exc:
            entries = [list(run) for run in entry_ranges(exc.entries)]
            self.report.ledgers_unrecoverable.append({"ledger_id": ledger_id, "entries": entries})
        except NotFoundError:
            self.report.ledgers_deleted += 1  # deleted meanwhile: nothing to repair, not a problem
        except BkctlError as exc:
            self._skip(ledger_id, str(exc))
        self.report.ledgers_done += 1
        self.progress(self.report)

    def _skip(self, ledger_id: int, reason: str) -> None:
        self.report.ledgers_skipped.append({"ledger_id": ledger_id, "reason": reason})

    def _names_dead(self, ensemble: Sequence[str]) -> bool:
        return any(b in self.dead for b in ensemble)

    async def recover_ledger(self, ledger_id: int) -> None:
        password = self.options.password
        known = self.known.pop(ledger_id, None)
        handle = await admin_open(self.client, ledger_id, recovery=False, password=password, known=known)
        reopened = False  # the recovery open itself replaced a failed bookie (its re-adds' ensemble change)
        if not handle.is_closed and self._names_dead(handle.metadata.segments[-1].ensemble):
            if self.options.skip_open:
                self._skip(ledger_id, "open, and its last ensemble has a failed bookie (--skip-open-ledgers)")
                return
            if not self.options.dry_run:  # fence and close it, as a recovery open does
                before = handle.metadata.segments
                handle = await admin_open(self.client, ledger_id, recovery=True, password=password)
                reopened = handle.metadata.segments != before
        steps = await self._plan(handle)
        if self.options.dry_run:
            self.report.plan.extend(step for step, _ in steps)
            return
        for step, moves in steps:
            if self.stopping:
                return  # Ctrl-C: every metadata update so far is whole; running again finishes the rest
            for fragment, target in moves:
                await self._move(handle, fragment, target)
            self.report.plan.append(step)
        if steps or reopened:  # a ledger repaired by someone else meanwhile is not this run's to claim
            self.report.ledgers_recovered += 1

    async def _move(self, handle: LedgerHandle, fragment: Fragment, target: str) -> None:
        """Copy the fragment to `target`, then swap it in (nothing to swap when copied back in place)."""
        stats = CopyStats()
        self.report.copying.append(stats)
        try:
            await copy_fragment(
                handle, fragment, target, failed=set(self.failed), throttle=self.throttle, stats=stats
            )
        finally:
            self.report.copying = [other for other in self.report.copying if other is not stats]
            self._count(handle.ledger_id, stats)
            self.progress(self.report)
        if target != fragment.bookie:
            await swap_bookie(handle, fragment, target)
        self.report.fragments_copied += 1

    def _count(self, ledger_id: int, stats: CopyStats) -> None:
        self.report.copied.entries += stats.entries
        self.report.copied.bytes += stats.bytes
        self.report.corrupt += [(ledger_id, entry_id, bookie) for entry_id, bookie in stats.corrupt]

    def _repairs(self, fragment: Fragment) -> bool:
        return fragment.bookie in self.dead or (fragment.bookie, fragment.segment) in self.options.live

    async def _plan(self, handle: LedgerHandle) -> list[tuple[PlanStep, list[tuple[Fragment, str]]]]:
        """Per segment to repair: the new ensemble and (fragment, target) moves. An open ledger's last
        segment is in the plan when the ledger is to be fenced first (a dead bookie there: a dry run
        shows it, up to the last entry a survivor holds); else only live bookies' entries are copied
        back there, up to the last add confirmed."""
        md = handle.metadata
        survivors = [b for b in md.segments[-1].ensemble if b not in self.failed]
        to_close = handle.is_closed or self._names_dead(md.segments[-1].ensemble)
        open_tail = None if to_close else len(md.segments) - 1
        last = await last_entry(handle, survivors if to_close else [])
        bad = [f for f in fragments(handle.ledger_id, md, last) if self._repairs(f)]
        bad = [f for f in bad if f.segment != open_tail or f.entry_count() > 0]
        if not bad:
            return []
        per_entry = await payload_per_entry(handle, last, survivors)
        available = await self.bookies.writable()
        steps = []
        for number in sorted({f.segment for f in bad}):
            moves = [f for f in bad if f.segment == number]
            old = list(md.segments[number].ensemble)
            in_place = number == open_tail  # a writer's ensemble: its bookies get their entries back
            if in_place:
                targets = [f.bookie for f in moves]
            else:
                targets = await self._targets_or_back(handle.ledger_id, number, md, moves, available)
            new = list(old)
            for fragment, target in zip(moves, targets, strict=True):
                new[fragment.index] = target
            entries = sum(f.entry_count() for f in moves)
            size = None if per_entry is None else round(per_entry * entries)
            first, end = moves[0].first_entry_id, moves[0].last_entry_id
            step = PlanStep(handle.ledger_id, number, first, end, old, new, entries, size)
            steps.append((step, list(zip(moves, targets, strict=True))))
        return steps

    async def _targets_or_back(
        self, ledger_id: int, number: int, md: LedgerMetadata, moves: list[Fragment], available: list[str]
    ) -> list[str]:
        """Placement's targets; when no other bookie can take the copies and every bookie to repair is
        alive (back empty, or lacking entries), the copies go back to those bookies in place: the
        ensemble stays as it is (a cluster of as many bookies as the ensemble has no other)."""
        try:
            return await self._targets(ledger_id, number, md, [f.index for f in moves], available)
        except UnavailableError:
            if any(f.bookie in self.dead for f in moves):
                raise
            return [f.bookie for f in moves]

    async def _targets(
        self, ledger_id: int, number: int, md: LedgerMetadata, indexes: list[int], available: list[str]
    ) -> list[str]:
        """The target for each failed place: the given one where it fits (not already in the ensemble,
        once per segment), placement for the rest (said on stderr by the command: `target_overrides`).
        A given target that breaks the placement policy refuses the ledger, unless `force`."""
        ensemble = md.segments[number].ensemble
        target = self.options.target
        keep = {indexes[0]: target} if target is not None and target not in ensemble else {}
        if target is not None and len(keep) < len(indexes):
            self.report.target_overrides += 1
        policy = self.client.placement
        # Dead bookies are never targets; a live one that lacks entries elsewhere may take these.
        choice = await self.client.place(
            policy.replace, ensemble, indexes, available, md.write_quorum, self.dead, keep
        )
        if not choice.adheres and self.options.placement_move:
            raise UnavailableError(
                f"segment {number}: no bookie can take a replica within the policy ({choice.reason})"
            )
        if not choice.adheres:
            own = [v for v in choice.violations if keep and indexes[0] in v.positions]
            if own and not self.options.force:
                raise UsageError(
                    f"target {target} breaks the placement policy in segment {number} "
                    f"({own[0].reason}: {', '.join(own[0].bookies)} in {', '.join(own[0].domains)}); "
                    "--force to use it anyway"
                )
            self.report.placement_fallbacks.append(
                {
                    "ledger_id": ledger_id,
                    "segment": number,
                    "ensemble": choice.bookies,
                    "reason": choice.reason,
                }
            )
        return [choice.bookies[i] for i in indexes]


async def last_entry(handle: LedgerHandle, probe: Sequence[str]) -> int:
    """The closed ledger's last entry; an open one's last add confirmed, or, asked `probe` bookies
    (a dry run of a ledger to be fenced), the last entry any of them holds: where fencing will close it
    when the entry is readable."""
    if handle.is_closed:
        return handle.metadata.last_entry_id
    ends = [await last_entry_on(handle, bookie) for bookie in probe]
    return max([handle.last_add_confirmed, *ends])


async def payload_per_entry(handle: LedgerHandle, last_entry_id: int, bookies: Sequence[str]) -> float | None:
    """Average payload bytes of the ledger's entries up to `last_entry_id`, for the plan's estimate: a
    closed ledger's length over its entries; an open one's from the length field of that entry as the
    first of `bookies` holding it has it (each entry carries the ledger's length up to itself); None if
    none has it."""
    if last_entry_id < 0:
        return 0.0
    if handle.is_closed:
        return handle.metadata.length / (last_entry_id + 1)
    for bookie in bookies:
        found, _ = await read_from_bookie(handle, bookie, [last_entry_id])
        if found:
            return found[0].length / (last_entry_id + 1)
    return None


async def recover_ledger_replicas(
    client: Client,
    ledger_id: int,
    *,
    target: str | None = None,
    full: bool = False,
    password: bytes | None = None,
    force: bool = False,
    progress: Callable[[RecoveryReport], None] = lambda _: None,
) -> RecoveryReport:
    """`bkctl ledger recover`: the fragments the checker finds bad, repaired. A bookie that is not
    registered is dead (its fragments move; an open ledger whose last ensemble has it is fenced first);
    a registered one only lacks entries: the segments where it does are repaired (`live`), never fencing."""
    await check_target(client, target, frozenset())
    check = await check_ledger(client, ledger_id, full=full, password=password)
    bad = [s.fragment for s in check.states if not s.ok]
    if not bad:
        return RecoveryReport([], target, False)
    live = frozenset((f.bookie, f.segment) for f in bad if f.bookie in check.registered)
    failed = tuple(dict.fromkeys(f.bookie for f in bad))
    options = RecoveryOptions(failed, target, ledger=ledger_id, live=live, password=password, force=force)
    return await BookieRecovery(client, options, progress).run()
