"""Under-replication in BookKeeper's layout: marks (`underreplication/ledgers/<4 hex levels>/urL<id>`),
replication locks, marking a ledger replicated (and pruning the empty levels above it).
"""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bkctl.errors import (
    BadVersionError,
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
from bkctl.protocol import metadata_format as mf
from bkctl.protocol.metadata_format import UnderreplicatedLedger

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

    def acquire_replication_lock(self, ledger_id: int, holder: str | None = None) -> bool:
        """Take a ledger's replication lock (ephemeral), marked or not; False if another holds it.

        Besides the replication workers, a bookie's GC takes it (Java's acquireUnderreplicatedLedger)
        while it decides to drop an over-replicated copy, so that no worker makes the bookie a replica
        of that ledger again meanwhile. Released with `release_lock`."""
        data = mf.encode_lock_data(holder if holder is not None else socket.gethostname())
        self.store.ensure_path(self.ur_path(UR_LOCKS))
        try:
            self.store.create(self.lock_path(ledger_id), data, ephemeral=True)
        except NodeExistsError:
            return False
        return True

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

    def mark_replicated(self, ledger_id: int, version: int = -1) -> bool:
        """Delete the mark (if still at `version`), prune its empty parents, release the lock.

        Returns False when the mark changed since `version` (a re-mark: it stays, to be checked again)
        or was already gone.
        """
        path = self.underreplicated_path(ledger_id)
        try:
            self.store.delete(path, version)
        except (NotFoundError, BadVersionError):
            return False
        else:
            self._prune_parents(path)
            return True
        finally:
            self.release_lock(ledger_id)

    def _prune_parents(self, path: str) -> None:
        """Delete the four hex levels above a deleted mark while they are empty."""
        for _ in range(4):
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
