"""Which fragments of a ledger are under-replicated, read from the bookies themselves.

By default each fragment's first and last entry are read from its bookie (BookKeeper's LedgerChecker
with `auditorLedgerVerificationPercentage` 0) and its bookie's list of the entries it holds is compared
with the fragment's (Java's replicas check); `full` reads every entry. A bookie that is not registered
is `bookie_down` without a read. Answers tell apart `missing` (the bookie says it has no such entry or
ledger), `bookie_down` (no answer, unreachable, timed out) and `digest_mismatch` (a copy that does not
verify).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from twisted.internet import defer
from twisted.internet.defer import Deferred

from bkctl.client.single_bookie import entries_held, read_from_bookie
from bkctl.protocol.entry_availability import Holdings
from bkctl.recovery.fragments import Fragment, fragments

if TYPE_CHECKING:
    from bkctl.client.client import Client
    from bkctl.client.ledger import LedgerHandle
    from bkctl.metadata.nodes import Versioned
    from bkctl.model import LedgerMetadata

T = TypeVar("T")
OK, MISSING, BOOKIE_DOWN, DIGEST_MISMATCH = "ok", "missing", "bookie_down", "digest_mismatch"
_DOWN_ANSWERS = ("timed out", "unavailable", "EIO", "ETOOMANYREQUESTS")


@dataclass
class FragmentState:
    fragment: Fragment
    state: str = OK
    entries: list[int] = field(default_factory=list)  # the entries found bad (read or presumed)

    @property
    def ok(self) -> bool:
        return self.state == OK


@dataclass
class LedgerCheck:
    """One ledger checked: its handle (not fenced), each fragment's state, the registered bookies."""

    handle: LedgerHandle
    states: list[FragmentState]
    registered: set[str]

    def bad_bookies(self) -> list[str]:
        return list(dict.fromkeys(s.fragment.bookie for s in self.states if not s.ok))


async def admin_open(
    client: Client,
    ledger_id: int,
    *,
    recovery: bool,
    password: bytes | None = None,
    known: Versioned[LedgerMetadata] | None = None,
) -> LedgerHandle:
    """Open as an administrator (every operator's command and the daemons open ledgers here): with
    the password and digest the metadata stores (format v3 does), else "" and CRC32 (BookKeeper's
    bookieRecoveryPasswd / bookieRecoveryDigestType defaults). A `password` given by the operator
    replaces the stored one and must match it (exit 9 when it does not)."""
    return await client.open_ledger(ledger_id, password, recovery=recovery, known=known)


async def check_ledger(
    client: Client,
    ledger_id: int,
    *,
    full: bool = False,
    password: bytes | None = None,
    known: Versioned[LedgerMetadata] | None = None,
    registered: set[str] | None = None,
) -> LedgerCheck:
    """Every fragment of the ledger (up to its last entry, or the last add confirmed of an open one),
    checked; bookies registered neither read-write nor read-only count as down without a read.
    `known`: the ledger's metadata already read, `registered`: the registered bookies already listed
    (a sweep of every ledger reads them once, not per ledger)."""
    layout = client.layout
    handle = await admin_open(client, ledger_id, recovery=False, password=password, known=known)
    md = handle.metadata
    last = md.last_entry_id if handle.is_closed else handle.last_add_confirmed
    if registered is None:
        registered = set(await client.in_thread(lambda: [*layout.bookies(), *layout.bookies(readonly=True)]))
    down = {b for segment in md.segments for b in segment.ensemble} - registered
    states = await check_fragments(handle, fragments(ledger_id, md, last), full=full, down=down)
    return LedgerCheck(handle, states, registered)


async def check_fragments(
    handle: LedgerHandle, fragments: Iterable[Fragment], *, full: bool = False, down: Iterable[str] = ()
) -> list[FragmentState]:
    """The state of each fragment; `down` are bookies known to be gone (not registered).

    Besides the first and last entry read, each bookie is asked once which entries it holds (the list
    Java's replicas check uses): a fragment whose first and last entries are there can still lack
    entries in between, as when a writer was killed while a bookie was slow (acknowledged by the ack
    quorum, never sent to the third copy) and nobody but this check can see them. A bookie that cannot
    list them (an older one) is judged by the reads alone. Every bookie's list is asked for at once,
    then every fragment's reads go at once: a check costs two round trips, not two per fragment.
    """
    gone = set(down)
    wanted = [(f, list(f.entries()) if full else f.first_and_last()) for f in fragments]
    asked = sorted({f.bookie for f, entries in wanted if entries and f.bookie not in gone})
    held: dict[str, Holdings | None] = {}
    if not full and asked:
        lists = await _every([entries_held(handle, bookie) for bookie in asked])
        held = dict(zip(asked, lists, strict=True))
    return await _every(
        [defer.ensureDeferred(_check(handle, f, entries, gone, held)) for f, entries in wanted]
    )


async def _every(deferreds: list[Deferred[T]]) -> list[T]:
    """Their results in order; the first failure raised as itself (not wrapped in FirstError)."""
    try:
        return list(await defer.gatherResults(deferreds, consumeErrors=True))
    except defer.FirstError as exc:
        exc.subFailure.raiseException()
        raise


async def _check(
    handle: LedgerHandle,
    fragment: Fragment,
    wanted: list[int],
    gone: set[str],
    held: dict[str, Holdings | None],
) -> FragmentState:
    if not wanted:
        return FragmentState(fragment)
    if fragment.bookie in gone:
        return FragmentState(fragment, BOOKIE_DOWN, wanted)
    _, failures = await read_from_bookie(handle, fragment.bookie, wanted)
    state = _state(fragment, failures)
    holdings = held.get(fragment.bookie)
    if not state.ok or holdings is None:
        return state  # `full` read them all; a bookie that cannot list is judged by the reads
    missing = await handle.client.in_thread(_not_held, fragment, holdings)
    return FragmentState(fragment, MISSING, missing) if missing else state


def _not_held(fragment: Fragment, holdings: Holdings) -> list[int]:
    """The fragment's entries its bookie does not list: a loop per entry (a fragment may have millions),
    so in a pool thread, off the reactor the auditor and the worker share."""
    return [entry_id for entry_id in fragment.entries() if entry_id not in holdings]


def _state(fragment: Fragment, failures: list[tuple[int, str]]) -> FragmentState:
    if not failures:
        return FragmentState(fragment)
    reasons = [why for _, why in failures]
    bad = [entry_id for entry_id, _ in failures]
    if any(why.startswith(_DOWN_ANSWERS) for why in reasons):
        return FragmentState(fragment, BOOKIE_DOWN, bad)
    if any(why.startswith("bad copy") for why in reasons):
        return FragmentState(fragment, DIGEST_MISMATCH, bad)
    return FragmentState(fragment, MISSING, bad)
