"""Under-replication in BookKeeper's layout: marks (`underreplication/ledgers/<4 hex levels>/urL<id>`),
replication locks, marking a ledger replicated (and pruning the empty levels above it).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import re
import socket
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from bkctl.errors import (
    BadVersionError,
    BkctlError,
    ConflictError,
    CorruptDataError,
    NodeExistsError,
    NotEmptyError,
    NotFoundError,
    ProtocolError,
)
from bkctl.metadata.nodes import (
    CAS_RETRIES_MAX,
    LEDGER_ID_MAX,
    READ_WINDOW,
    LayoutBase,
    ProblemSink,
    Versioned,
    check_ledger_id,
    decode_node,
    log_problem,
    now_ms,
)
from bkctl.metadata.store import CreateOp, DeleteOp
from bkctl.protocol import metadata_format as mf
from bkctl.protocol.metadata_format import UnderreplicatedLedger

UPPER_LEVELS_TTL_S = 1.0  # local bound: how long the mark tree's upper levels are reused

# Nodes of the under-replication tree.
UR_LEDGERS = "ledgers"
UR_LOCKS = "locks"
UR_LEDGER_PREFIX = "urL"


@dataclass(frozen=True)
class UnderreplicatedEntry:
    """A ledger marked under-replicated: the mark, its node version, and who holds its lock (if any)."""

    ledger_id: int
    mark: UnderreplicatedLedger
    version: int
    replication_worker: str | None = None


@dataclass(frozen=True)
class TakenMark:
    """A mark whose replication lock this session took: the mark's version (what `mark_replicated`
    deletes it with) and replicas, and the session that holds the lock."""

    ledger_id: int
    version: int
    replicas: tuple[str, ...]
    session_id: int


_HEX4 = re.compile(r"[0-9a-f]{4}")


def underreplicated_subpath(ledger_id: int) -> str:
    """`/<%04x>/<%04x>/<%04x>/<%04x>/urL%010d`: four 16-bit groups of the id, high to low."""
    check_ledger_id(ledger_id)
    groups = [(ledger_id >> shift) & 0xFFFF for shift in (48, 32, 16, 0)]
    return "/" + "/".join(f"{g:04x}" for g in groups) + f"/{UR_LEDGER_PREFIX}{ledger_id:010d}"


def parse_underreplicated_name(name: str) -> int | None:
    """The ledger id of a `urL%010d` node name, or None if the name is not one."""
    digits = name[len(UR_LEDGER_PREFIX) :]
    if not name.startswith(UR_LEDGER_PREFIX) or not digits.isascii() or not digits.isdigit():
        return None
    value = int(digits)
    return value if len(digits) <= 19 and value <= LEDGER_ID_MAX else None


class UnderreplicationLayout(LayoutBase):
    """Under-replication marks and the replication workers' locks on them."""

    # --- under-replication --------------------------------------------------------------------------

    def underreplicated_path(self, ledger_id: int) -> str:
        return self.ur_path(UR_LEDGERS) + underreplicated_subpath(ledger_id)

    def lock_path(self, ledger_id: int) -> str:
        return self.ur_path(UR_LOCKS, f"{UR_LEDGER_PREFIX}{check_ledger_id(ledger_id):010d}")

    def mark_underreplicated(
        self, ledger_id: int, missing_replicas: Iterable[str], *, ctime_ms: int | None = -1
    ) -> bool:
        """Mark a ledger under-replicated; re-marking merges new replicas in (CAS) and renews ctime.

        `ctime_ms` -1 means now; None stores no ctime (Java's storeSystemtimeAsLedgerUnderreplicated-
        MarkTime=false). Returns False if the mark already named every replica (nothing written).
        """
        replicas = list(dict.fromkeys(missing_replicas))
        path = self.underreplicated_path(ledger_id)
        first = UnderreplicatedLedger(tuple(replicas), now_ms() if ctime_ms == -1 else ctime_ms)
        if self._create_mark(path, first):
            return True
        for _ in range(CAS_RETRIES_MAX):
            ctime = now_ms() if ctime_ms == -1 else ctime_ms
            try:
                data, stat = self.store.get(path)
            except NotFoundError:
                mark = UnderreplicatedLedger(tuple(replicas), ctime)
                try:
                    self.store.create(path, mf.encode_underreplicated_ledger(mark), make_parents=True)
                    return True
                except NodeExistsError:
                    continue
            existing = self._decode_mark(path, data)
            added = tuple(r for r in replicas if r not in existing.replicas)
            if not added:
                return False
            merged = UnderreplicatedLedger(
                existing.replicas + added, existing.ctime if ctime is None else ctime
            )
            try:
                self.store.set(path, mf.encode_underreplicated_ledger(merged), stat.version)
                return True
            except (BadVersionError, NotFoundError):
                continue
        raise ConflictError(f"ledger {ledger_id}: could not mark it under-replicated (lost every race)")

    def mark_many_underreplicated(self, marks: Sequence[tuple[int, Sequence[str]]]) -> None:
        """`mark_underreplicated` of each (ledger, missing replicas), ctime now: the new marks, each with
        its level, sent together (`store.multi_each`: an audit of thousands of ledgers in a few round
        trips, where one mark at a time held the workers waiting for the audit's last marks); a mark
        that meets one already there (merged) or a missing upper level goes one by one."""
        ctime = now_ms()
        paths = [self.underreplicated_path(ledger_id) for ledger_id, _ in marks]
        for upper in sorted({path.rsplit("/", 2)[0] for path in paths}):
            self.store.ensure_path(upper)  # a few: ids of one range share their upper levels
        batches = []
        for path, (_, missing) in zip(paths, marks, strict=True):
            mark = UnderreplicatedLedger(tuple(dict.fromkeys(missing)), ctime)
            batches.append(
                [CreateOp(path.rsplit("/", 1)[0]), CreateOp(path, mf.encode_underreplicated_ledger(mark))]
            )
        for (ledger_id, missing), answer in zip(marks, self.store.multi_each(batches), strict=True):
            if isinstance(answer, NodeExistsError | NotFoundError):
                self.mark_underreplicated(ledger_id, missing)
            elif isinstance(answer, BkctlError):
                raise answer

    def _create_mark(self, path: str, mark: UnderreplicatedLedger) -> bool:
        """A new mark and its own level (`<%04x>` of the id's low bits: one mark per level node) in one
        request; False when either exists (the caller merges into the mark). The levels above it exist
        once any ledger of that range was marked: when they do not, they are made one by one."""
        data = mf.encode_underreplicated_ledger(mark)
        try:
            self.store.multi([CreateOp(path.rsplit("/", 1)[0]), CreateOp(path, data)])
        except NodeExistsError:
            return False
        except NotFoundError:
            try:
                self.store.create(path, data, make_parents=True)
            except NodeExistsError:
                return False
        return True

    @staticmethod
    def _decode_mark(path: str, data: bytes) -> UnderreplicatedLedger:
        return decode_node(path, data, mf.decode_underreplicated_ledger, "bad under-replication mark: ")

    def read_underreplicated(self, ledger_id: int) -> Versioned[UnderreplicatedLedger] | None:
        path = self.underreplicated_path(ledger_id)
        node = self._node_or_none(path)
        return None if node is None else Versioned(self._decode_mark(path, node[0]), node[1].version)

    def underreplicated_ids(self, on_problem: ProblemSink = log_problem) -> Iterator[int]:
        """Ids of every marked ledger, ascending (the tree is walked level by level, in hex order)."""
        yield from self._ur_walk(self.ur_path(UR_LEDGERS), 0, on_problem)

    def _ur_walk(self, path: str, depth: int, on_problem: ProblemSink) -> Iterator[int]:
        names = self._children_or_none(path) or []
        for name in names:
            child = f"{path}/{name}"
            if depth == 4:
                ledger_id = parse_underreplicated_name(name)
                if ledger_id is None or self.underreplicated_path(ledger_id) != child:
                    on_problem(child, "foreign node in the under-replication tree")
                else:
                    yield ledger_id
            elif len(name) == 4 and re.fullmatch(r"[0-9a-f]{4}", name):
                yield from self._ur_walk(child, depth + 1, on_problem)
            else:
                on_problem(child, "foreign node in the under-replication tree (expected 4 hex digits)")

    def underreplicated_ledgers(
        self, on_problem: ProblemSink = log_problem
    ) -> Iterator[UnderreplicatedEntry]:
        """Every mark with its lock holder; malformed marks are reported and skipped."""
        holders = self._lock_holders(on_problem)
        ids = list(self.underreplicated_ids(on_problem))
        with ThreadPoolExecutor(READ_WINDOW, thread_name_prefix="bkctl-read") as pool:
            for ledger_id, result in zip(ids, pool.map(self._try_read_mark, ids), strict=True):
                if isinstance(result, CorruptDataError):
                    on_problem(self.underreplicated_path(ledger_id), str(result).split(": ", 1)[-1])
                elif result is not None:
                    yield UnderreplicatedEntry(
                        ledger_id, result.value, result.version, holders.get(ledger_id)
                    )

    def _try_read_mark(self, ledger_id: int) -> Versioned[UnderreplicatedLedger] | CorruptDataError | None:
        try:
            return self.read_underreplicated(ledger_id)
        except NotFoundError:
            return None
        except CorruptDataError as exc:
            return exc

    def _lock_holders(self, on_problem: ProblemSink) -> dict[int, str | None]:
        holders: dict[int, str | None] = {}
        for name in self._children_or_none(self.ur_path(UR_LOCKS)) or []:
            ledger_id = parse_underreplicated_name(name)
            path = self.ur_path(UR_LOCKS, name)
            if ledger_id is None:
                on_problem(path, "foreign node among the replication locks")
                continue
            data = self._data_or_none(path)
            if data is None:
                continue
            try:
                holders[ledger_id] = mf.decode_lock_data(data)
            except ProtocolError as exc:
                on_problem(path, f"bad lock data: {exc}")
                holders[ledger_id] = None
        return holders

    def lock_underreplicated(self, ledger_id: int, holder: str | None = None) -> int | None:
        """Take the replication lock of a marked ledger (ephemeral); the mark's version, or None.

        None if the ledger is not marked or another worker holds the lock. The version is what
        `mark_replicated` deletes the mark with, so a re-mark made meanwhile is not lost.
        """
        stat = self.store.exists(self.underreplicated_path(ledger_id))
        if stat is None or not self.acquire_replication_lock(ledger_id, holder):
            return None
        return stat.version

    def take_underreplicated(
        self,
        count: int,
        holder: str | None = None,
        skip: Collection[int] = (),
        rng: random.Random | None = None,
        levels: UpperLevels | None = None,
        *,
        newest_first: bool = False,
    ) -> tuple[list[TakenMark], int]:
        """Lock up to `count` marks that no one holds: (the marks taken, the marks seen on the way).

        Java's getLedgerToRereplicate, batched: the tree is descended along random paths (workers on
        many hosts do not all fight over the same marks) and the first free marks are locked, so a take
        costs a listing per level on the way and two requests per mark taken (the lock, the mark's
        read), not a walk of every mark: that walk made each take cost as many requests as the backlog
        has marks. Marks in `skip` (this worker's own) and locked ones are passed over unread. `levels`
        keeps the listings a moment (a worker's, across its takes): the last level lists up to 65,536
        marks, and listing it for every take of two made a take cost as much as the backlog again. A
        mark in a kept listing that another worker replicated since costs a lock and a read for nothing;
        the random order makes that rare.
        `newest_first`: the highest ids first (ledger ids grow with time: an active topic reads its
        newest ledgers), not random; workers on many hosts then meet on the same marks, and each lock
        lost costs a request."""
        if count <= 0:
            return [], 0
        descent = _Descent(count, set(skip), rng or random.Random(), levels or UpperLevels(0.0), newest_first)
        self._descend(self.ur_path(UR_LEDGERS), 0, 0, descent, holder)
        return descent.taken, descent.seen

    def _descend(self, path: str, depth: int, prefix: int, descent: _Descent, holder: str | None) -> None:
        names = descent.levels.get(path)
        if names is None:
            names = [n for n in self._children_or_none(path) or [] if _HEX4.fullmatch(n)]
            descent.levels.put(path, names)
            if not names and depth:
                self._prune_empty(path)  # its last mark's worker left it (`mark_replicated(prune=False)`)
        ordered = (
            sorted(names, reverse=True) if descent.newest_first else _from_random_start(names, descent.rng)
        )
        if depth == 3:
            descent.seen += len(names)
            if names and not descent.locks_listed:  # once per take, and only when there are marks
                descent.skip |= self._locked_ids()
                descent.locks_listed = True
            self._take_from_level(prefix, ordered, descent, holder)
            return
        for name in ordered:
            if len(descent.taken) >= descent.count:
                return
            self._descend(f"{path}/{name}", depth + 1, (prefix << 16) | int(name, 16), descent, holder)

    def _take_from_level(self, prefix: int, names: list[str], descent: _Descent, holder: str | None) -> None:
        """Lock the first free marks of a last level, as many as the take still wants at a time.

        The candidates' marks are read first, in one request: a kept listing names marks that other
        workers replicated since, and locking those was a lock and its release for nothing (half of
        the locks taken, measured on 2,000 marks and four workers). Then every lock of the batch is
        sent before any answer is waited for. A mark replicated by another worker between the read
        and the lock costs a repair that finds nothing to do; its deletion then finds it gone."""
        ids = ((prefix << 16) | int(name, 16) for name in names)
        free = (i for i in ids if i not in descent.skip and i <= LEDGER_ID_MAX)
        while len(descent.taken) < descent.count:
            batch = list(itertools.islice(free, (descent.count - len(descent.taken)) * 2))
            if not batch:
                return
            marked = self._read_marks(batch)[: descent.count - len(descent.taken)]
            answers = self.acquire_replication_locks([ledger_id for ledger_id, _ in marked], holder)
            session = self.store.session_id
            descent.taken += [
                TakenMark(ledger_id, mark.version, mark.value.replicas, session)
                for (ledger_id, mark), ok in zip(marked, answers, strict=True)
                if ok
            ]

    def _read_marks(self, ledger_ids: list[int]) -> list[tuple[int, Versioned[UnderreplicatedLedger]]]:
        """The marks of these ledgers that are there and readable (`underreplicated` reports the others)."""
        paths = [self.underreplicated_path(i) for i in ledger_ids]
        found = []
        for ledger_id, path, node in zip(ledger_ids, paths, self.store.get_many(paths), strict=True):
            if node is None:
                continue
            try:
                found.append((ledger_id, Versioned(self._decode_mark(path, node[0]), node[1].version)))
            except CorruptDataError:
                continue
        return found

    def _locked_ids(self) -> set[int]:
        names = self._children_or_none(self.ur_path(UR_LOCKS)) or []
        return {i for i in map(parse_underreplicated_name, names) if i is not None}

    def acquire_replication_lock(self, ledger_id: int, holder: str | None = None) -> bool:
        """Take a ledger's replication lock (ephemeral), marked or not; False if another holds it.

        Besides the replication workers, a bookie's GC takes it (Java's acquireUnderreplicatedLedger)
        while it decides to drop an over-replicated copy, so that no worker makes the bookie a replica
        of that ledger again meanwhile. Released with `release_lock`."""
        return self.acquire_replication_locks([ledger_id], holder)[0]

    def acquire_replication_locks(self, ledger_ids: list[int], holder: str | None = None) -> list[bool]:
        """`acquire_replication_lock` of each ledger, the creates sent together (`store.create_each`)."""
        data = mf.encode_lock_data(holder if holder is not None else socket.gethostname())
        nodes = [(self.lock_path(ledger_id), data) for ledger_id in ledger_ids]
        for _ in range(2):
            try:
                return self.store.create_each(nodes, ephemeral=True)
            except NotFoundError:  # the locks' parent is made once, not checked before every lock
                self.store.ensure_path(self.ur_path(UR_LOCKS))
        raise NotFoundError(f"{self.ur_path(UR_LOCKS)} vanished twice while locking {len(nodes)} ledgers")

    def replication_locked(self, ledger_id: int) -> bool:
        """Whether a worker (or a bookie's GC) holds the ledger's replication lock (Java's
        isLedgerBeingReplicated)."""
        return self.store.exists(self.lock_path(ledger_id)) is not None

    def release_lock(self, ledger_id: int) -> None:
        """Delete the lock if this session holds it. A worker whose session expired mid-copy lost its
        lock with it; the lock there now is another worker's (or its own, taken again), and dropping
        another's would let a third worker copy the same ledger at the same time."""
        path = self.lock_path(ledger_id)
        stat = self.store.exists(path)
        if stat is None or stat.ephemeral_owner != self.store.session_id:
            return
        with contextlib.suppress(NotFoundError, BadVersionError):
            self.store.delete(path, stat.version)

    def lock_holder(self, ledger_id: int) -> str | None:
        data = self._data_or_none(self.lock_path(ledger_id))
        return None if data is None else mf.decode_lock_data(data)

    def mark_replicated(
        self, ledger_id: int, version: int = -1, session_id: int | None = None, *, prune: bool = True
    ) -> bool:
        """Delete the mark (if still at `version`), prune its empty parents, release the lock.

        Returns False when the mark changed since `version` (a re-mark: it stays, to be checked again)
        or was already gone. `session_id`: the session that took the lock (`TakenMark`); while it is
        still this store's session the lock is ours, and the mark, its level and the lock go in one
        request. `prune=False`: the levels above are not checked (a worker whose listing shows other
        marks there saves the request; a take that lists a level empty deletes it).
        """
        path = self.underreplicated_path(ledger_id)
        if session_id is not None and session_id == self.store.session_id:
            level = path.rsplit("/", 1)[0]
            try:
                lock = self.lock_path(ledger_id)
                self.store.multi([DeleteOp(path, version), DeleteOp(level), DeleteOp(lock)])
            except (NotFoundError, BadVersionError, NotEmptyError):
                pass  # one by one below: each step says what it found
            else:
                if prune:
                    self._prune_parents(level, levels=3)
                return True
        try:
            self.store.delete(path, version)
        except (NotFoundError, BadVersionError):
            return False
        else:
            self._prune_parents(path)
            return True
        finally:
            self.release_lock(ledger_id)

    def _prune_empty(self, path: str) -> None:
        """Delete a level listed empty, and the empty levels above it."""
        try:
            self.store.delete(path)
        except (NotEmptyError, BadVersionError, NotFoundError):
            return  # marked again meanwhile, or another worker pruned it
        self._prune_parents(path, levels=path.count("/") - self.ur_path(UR_LEDGERS).count("/") - 1)

    def _prune_parents(self, path: str, levels: int = 4) -> None:
        """Delete the `levels` hex levels above a deleted node while they are empty."""
        for _ in range(levels):
            path = path.rsplit("/", 1)[0]
            try:
                stat = self.store.exists(path)
                if stat is None or stat.num_children:
                    return
                self.store.delete(path, stat.version)
            except (NotEmptyError, BadVersionError):
                return  # another ledger was marked in the same subtree meanwhile
            except NotFoundError:
                continue


@dataclass
class _Descent:
    """One take's walk: what it wants, what it passes over, what it took and saw."""

    count: int
    skip: set[int]
    rng: random.Random
    levels: UpperLevels
    newest_first: bool
    taken: list[TakenMark] = field(default_factory=list)
    seen: int = 0
    locks_listed: bool = False


class UpperLevels:
    """Listings of the mark tree's levels, kept `ttl_s` (a worker's, across its takes): a new mark is
    seen at most that late; one gone meanwhile is found gone when locked."""

    def __init__(self, ttl_s: float = UPPER_LEVELS_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._listings: dict[str, tuple[float, list[str]]] = {}

    def get(self, path: str) -> list[str] | None:
        found = self._listings.get(path)
        return found[1] if found is not None and time.monotonic() - found[0] < self.ttl_s else None

    def put(self, path: str, names: list[str]) -> None:
        if self.ttl_s > 0:
            self._listings[path] = (time.monotonic(), names)


def _from_random_start(names: list[str], rng: random.Random) -> list[str]:
    """`names` from a random place round to it again: workers start apart, as with a shuffle, for the
    cost of one copy; a shuffle of a last level's 65,536 kept names was most of a take's CPU."""
    if not names:
        return names
    start = rng.randrange(len(names))
    return names[start:] + names[:start]
