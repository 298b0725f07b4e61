"""BookKeeper's metadata layout, written once on top of store.py (see docs/layout.md).

Every path and value BookKeeper keeps under its root (`zkLedgersRootPath`, default `/ledgers`) is made
here and nowhere else: cluster init, ledger ids and hierarchical metadata paths, ledger metadata
(format v3, CAS on the node version), bookie registration, cookies, under-replication marks and their
locks, auditor election votes, the autorecovery disable flag and lostBookieRecoveryDelay.

Plain blocking code over a MetadataStore (Twisted callers use deferToThread). Readers that walk a
tree never stop at a malformed or foreign node: they hand its path and the reason to `on_problem`
and go on, so one bad znode cannot hide a cluster's worth of ledgers.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from bkctl import limits
from bkctl.errors import (
    BadVersionError,
    ConflictError,
    CorruptDataError,
    NodeExistsError,
    NotEmptyError,
    NotFoundError,
    ProtocolError,
    UsageError,
)
from bkctl.metadata.store import DEFAULT_ROOT, CreateOp, MetadataStore, log, validate_path
from bkctl.model import LedgerMetadata
from bkctl.protocol import metadata_format as mf
from bkctl.protocol.metadata_format import Cookie, LedgerLayout, UnderreplicatedLedger
from bkctl.protocol.quorum import write_set

T = TypeVar("T")
ProblemSink = Callable[[str, str], None]  # (path, why)

# Java's Integer.MAX_VALUE: ids below it use the short hierarchical path and the short id generator.
INT_MAX = (1 << 31) - 1
LEDGER_ID_MAX = (1 << 63) - 1

# Node names under the root (BookKeeperConstants).
AVAILABLE = "available"
READONLY = "readonly"
COOKIES = "cookies"
LAYOUT = "LAYOUT"
INSTANCEID = "INSTANCEID"
IDGEN = "idgen"
IDGEN_LONG = "idgen-long"
UNDERREPLICATION = "underreplication"
# Nodes of the under-replication tree.
UR_LEDGERS = "ledgers"
UR_LOCKS = "locks"
UR_ELECTION = "auditorelection"
UR_DISABLE = "disable"
UR_LOST_BOOKIE_RECOVERY_DELAY = "lostBookieRecoveryDelay"
CHECK_CTIME_NODES = ("checkallledgersctime", "placementpolicycheckctime", "replicascheckctime")
# Children of the root that are not ledger metadata; BookKeeper's ledger iterators skip them too.
SPECIAL_ROOT_NODES = frozenset(
    {AVAILABLE, COOKIES, LAYOUT, INSTANCEID, IDGEN, IDGEN_LONG, UNDERREPLICATION, "ledgers", "bookies"}
)

ID_PREFIX = "ID-"
HOB_PREFIX = "HOB-"
LEDGER_PREFIX = "L"
UR_LEDGER_PREFIX = "urL"
VOTE_PREFIX = "V_"
# Short hierarchical: `%010d` split 2-4-4; long hierarchical: `%019d` split 3-4-4-4-4.
SHORT_LEVELS = (2, 4, 4)
LONG_LEVELS = (3, 4, 4, 4, 4)
# Concurrent metadata reads in flight when walking trees or reading many ledgers.
READ_WINDOW = 32
# CAS retries of a read-modify-write before giving up with ConflictError.
CAS_RETRIES_MAX = 100
# Ids handed out by one id-generation call before it gives up (each failure is a lost race).
ID_ATTEMPTS_MAX = 100
# The cToken Java writes on every metadata update (only the creating write carries a random one).
BLANK_C_TOKEN = 0


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A decoded value with the version of the node it came from (for a later compare-and-swap)."""

    value: T
    version: int


@dataclass(frozen=True)
class UnderreplicatedEntry:
    """A ledger marked under-replicated: the mark, its node version, and who holds its lock (if any)."""

    ledger_id: int
    mark: UnderreplicatedLedger
    version: int
    replication_worker: str | None = None


def log_problem(path: str, why: str) -> None:
    log.warning("%s: %s", path, why)


def now_ms() -> int:
    return int(time.time() * 1000)


# ============================================================================================ paths


def check_ledger_id(ledger_id: int) -> int:
    if not isinstance(ledger_id, int) or not 0 <= ledger_id <= LEDGER_ID_MAX:
        raise UsageError(f"bad ledger id {ledger_id!r}: must be in [0, {LEDGER_ID_MAX}]")
    return ledger_id


def _split(digits: str, widths: Sequence[int]) -> list[str]:
    parts, start = [], 0
    for width in widths:
        parts.append(digits[start : start + width])
        start += width
    return parts


def ledger_subpath(ledger_id: int) -> str:
    """`/00/0000/L0001` (ids below 2^31-1), else the long form `/000/0000/0000/0000/L0001`."""
    check_ledger_id(ledger_id)
    if ledger_id < INT_MAX:
        parts = _split(f"{ledger_id:010d}", SHORT_LEVELS)
    else:
        parts = _split(f"{ledger_id:019d}", LONG_LEVELS)
    parts[-1] = LEDGER_PREFIX + parts[-1]
    return "/" + "/".join(parts)


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


def parse_vote_seq(name: str) -> int | None:
    digits = name[len(VOTE_PREFIX) :]
    ok = name.startswith(VOTE_PREFIX) and digits.isascii() and digits.isdigit()
    return int(digits) if ok else None


def _digits(name: str, width: int) -> bool:
    return len(name) == width and name.isascii() and name.isdigit()


# ============================================================================================ layout


class Layout:
    """BookKeeper's tree under `root` in a MetadataStore (hierarchical ledger manager)."""

    def __init__(self, store: MetadataStore, root: str = DEFAULT_ROOT) -> None:
        self.store = store
        self.root = validate_path(root).rstrip("/") or "/"

    def path(self, *names: str) -> str:
        if not names:
            return self.root
        base = "" if self.root == "/" else self.root
        return base + "".join("/" + name for name in names)

    @property
    def underreplication_path(self) -> str:
        return self.path(UNDERREPLICATION)

    def ur_path(self, *names: str) -> str:
        return self.path(UNDERREPLICATION, *names)

    # --- cluster ------------------------------------------------------------------------------------

    def instance_id(self) -> str | None:
        data = self._data_or_none(self.path(INSTANCEID))
        return None if data is None else mf.decode_instance_id(data)

    def ledger_layout(self) -> LedgerLayout | None:
        data = self._data_or_none(self.path(LAYOUT))
        return None if data is None else mf.decode_ledger_layout(data)

    def check_initialized(self) -> LedgerLayout:
        """The cluster's LAYOUT; NotFoundError if none, UsageError if not a hierarchical manager."""
        try:
            layout = self.ledger_layout()
        except ProtocolError as exc:
            raise CorruptDataError(f"{self.path(LAYOUT)}: {exc}") from exc
        if layout is None:
            raise NotFoundError(f"no BookKeeper cluster at {self.root} ({self.path(LAYOUT)} is missing)")
        if layout.manager_factory_class != mf.HIERARCHICAL_LEDGER_MANAGER:
            raise UsageError(
                f"{self.path(LAYOUT)} names ledger manager {layout.manager_factory_class}; "
                "bkctl only supports HierarchicalLedgerManagerFactory"
            )
        return layout

    def init_cluster(self, *, instance_id: str | None = None, force: bool = False) -> str:
        """Create the cluster's nodes and return its instance id.

        ConflictError if a cluster is already there, unless `force`: then everything under the root
        (ledger metadata included) is deleted first, as BookKeeper's `metaformat -force` does.
        """
        existing = self.instance_id()
        if existing is not None and not force:
            raise ConflictError(f"a cluster is already initialized at {self.root} (instance id {existing})")
        if force and self.root != "/" and self.store.exists(self.root) is not None:
            self.store.delete(self.root, recursive=True)
        instance_id = instance_id or str(uuid.uuid4())
        self.store.ensure_path(self.root)
        ops = [CreateOp(path, data) for path, data in self._init_nodes(instance_id)]
        try:
            self.store.multi(ops)
        except NodeExistsError as exc:
            raise ConflictError(f"cluster init at {self.root} raced with another: {exc}") from exc
        return instance_id

    def _init_nodes(self, instance_id: str) -> list[tuple[str, bytes]]:
        wanted = [
            (self.path(AVAILABLE), b""),
            (self.path(AVAILABLE, READONLY), b""),
            (self.path(COOKIES), b""),
            (self.path(LAYOUT), mf.encode_ledger_layout()),
            (self.ur_path(), b""),
            (self.ur_path(LAYOUT), mf.encode_underreplication_layout()),
            (self.ur_path(UR_LEDGERS), b""),
            (self.ur_path(UR_LOCKS), b""),
        ]
        # INSTANCEID last: its creation is what marks the cluster initialized (and loses a race).
        nodes = [(path, data) for path, data in wanted if self.store.exists(path) is None]
        return [*nodes, (self.path(INSTANCEID), mf.encode_instance_id(instance_id))]

    # --- ledger ids ---------------------------------------------------------------------------------

    def new_ledger_id(self) -> int:
        """A cluster-unique ledger id, as BookKeeper's hierarchical id generator makes them.

        An ephemeral-sequential `idgen/ID-` node is created, its sequence parsed and the node deleted;
        once that sequence passes 2^31-1, ids come from `idgen-long/HOB-<high>/ID-<low>`.
        """
        if self.store.exists(self.path(IDGEN_LONG)) is None:
            seq = self._sequence(self.path(IDGEN))
            if seq is not None:
                return seq
            self.store.ensure_path(self.path(IDGEN_LONG))
        return self._new_long_ledger_id()

    def _sequence(self, parent: str) -> int | None:
        """The sequence of a new ephemeral `parent/ID-` node (deleted at once); None past 2^31-1."""
        created = self.store.create(
            parent + "/" + ID_PREFIX, ephemeral=True, sequential=True, make_parents=True
        )
        with contextlib.suppress(NotFoundError):
            self.store.delete(created)
        digits = created.rsplit("/", 1)[1][len(ID_PREFIX) :]
        try:
            seq = int(digits)
        except ValueError:
            raise CorruptDataError(
                f"id generator node {created}: sequence {digits!r} is not a number"
            ) from None
        return seq if 0 <= seq < INT_MAX else None

    def _new_long_ledger_id(self) -> int:
        for _ in range(ID_ATTEMPTS_MAX):
            highs = [h for h in map(self._hob, self.store.children(self.path(IDGEN_LONG))) if h is not None]
            high = max(highs, default=0)
            if high > 0:
                low = self._sequence(self.path(IDGEN_LONG, f"{HOB_PREFIX}{high:010d}"))
                if low is not None:
                    return check_ledger_id((high << 32) | low)
            if high + 1 > INT_MAX:
                raise ConflictError("ledger ids are exhausted (idgen-long high bits at 2^31-1)")
            with contextlib.suppress(NodeExistsError):
                self.store.create(self.path(IDGEN_LONG, f"{HOB_PREFIX}{high + 1:010d}"))
        raise ConflictError(f"no ledger id after {ID_ATTEMPTS_MAX} attempts")

    @staticmethod
    def _hob(name: str) -> int | None:
        digits = name[len(HOB_PREFIX) :]
        ok = name.startswith(HOB_PREFIX) and digits.isascii() and digits.isdigit() and len(digits) <= 10
        return int(digits) if ok else None

    # --- ledger metadata ----------------------------------------------------------------------------

    def ledger_path(self, ledger_id: int) -> str:
        return self.path() + ledger_subpath(ledger_id)

    def create_ledger(self, metadata: LedgerMetadata, ledger_id: int | None = None) -> tuple[int, int]:
        """Store new ledger metadata (format v3) under a new or given id; return (id, node version).

        As Java's client, a creation token (cToken) is stored unless given: when a create is retried
        after a lost connection and finds the node, the same token proves the node is ours.
        ConflictError if the id already has another ledger's metadata.
        """
        if metadata.c_token is None or metadata.c_token == BLANK_C_TOKEN:
            metadata = replace(metadata, c_token=secrets.randbits(63) or 1)
        data = mf.encode_ledger_metadata(metadata)
        if ledger_id is None:
            ledger_id = self.new_ledger_id()
        path = self.ledger_path(ledger_id)
        try:
            self.store.create(path, data, make_parents=True)
        except NodeExistsError:
            stored, stat = self.store.get(path)
            if stored != data:
                raise ConflictError(f"ledger {ledger_id} already exists ({path})") from None
            return ledger_id, stat.version
        return ledger_id, 0

    def read_ledger(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        """Ledger metadata (v1, v2 or v3) and its version; NotFoundError, CorruptDataError."""
        return self.decode_ledger(ledger_id, self.read_ledger_bytes(ledger_id))

    def read_ledger_bytes(self, ledger_id: int) -> Versioned[bytes]:
        """The stored bytes of a ledger's metadata and their version; NotFoundError."""
        path = self.ledger_path(ledger_id)
        try:
            data, stat = self.store.get(path)
        except NotFoundError:
            raise NotFoundError(f"ledger {ledger_id} does not exist ({path})") from None
        return Versioned(data, stat.version)

    def decode_ledger(self, ledger_id: int, raw: Versioned[bytes]) -> Versioned[LedgerMetadata]:
        try:
            return Versioned(mf.decode_ledger_metadata(raw.value), raw.version)
        except ProtocolError as exc:
            path = self.ledger_path(ledger_id)
            raise CorruptDataError(f"ledger {ledger_id} ({path}): bad metadata: {exc}") from exc

    def write_ledger(self, ledger_id: int, metadata: LedgerMetadata, version: int) -> int:
        """Replace ledger metadata if its node is still at `version`; the new version.

        The cToken is written blank (0), as Java's metadata builder drops it on every update.
        BadVersionError if someone else wrote it first, NotFoundError if it was deleted.
        """
        data = mf.encode_ledger_metadata(replace(metadata, c_token=BLANK_C_TOKEN))
        try:
            return self.store.set(self.ledger_path(ledger_id), data, version).version
        except BadVersionError:
            raise BadVersionError(f"ledger {ledger_id}: metadata changed since version {version}") from None

    def update_ledger(
        self, ledger_id: int, change: Callable[[LedgerMetadata], LedgerMetadata | None]
    ) -> Versioned[LedgerMetadata]:
        """Read-modify-write with CAS, retrying lost races; `change` returns None to leave it as is."""
        for _ in range(CAS_RETRIES_MAX):
            current = self.read_ledger(ledger_id)
            updated = change(current.value)
            if updated is None:
                return current
            updated = replace(updated, c_token=BLANK_C_TOKEN)
            try:
                return Versioned(updated, self.write_ledger(ledger_id, updated, current.version))
            except BadVersionError:
                continue
        raise ConflictError(f"ledger {ledger_id}: {CAS_RETRIES_MAX} concurrent updates won over ours")

    def delete_ledger(self, ledger_id: int, version: int = -1) -> None:
        path = self.ledger_path(ledger_id)
        try:
            self.store.delete(path, version)
        except NotFoundError:
            raise NotFoundError(f"ledger {ledger_id} does not exist ({path})") from None

    def ledger_ids(self, on_problem: ProblemSink = log_problem) -> Iterator[int]:
        """Every ledger id, ascending, by walking the short then the long hierarchical tree."""
        try:
            top = self.store.children(self.path())
        except NotFoundError:
            return
        short = [n for n in top if _digits(n, SHORT_LEVELS[0])]
        long = [n for n in top if _digits(n, LONG_LEVELS[0])]
        for name in top:
            if name not in SPECIAL_ROOT_NODES and name not in short and name not in long:
                log.info("%s: not part of the ledger tree, skipped", self.path(name))
        with ThreadPoolExecutor(READ_WINDOW, thread_name_prefix="bkctl-walk") as pool:
            for name in short:
                yield from self._walk(pool, self.path(name), name, SHORT_LEVELS[1:], on_problem)
            for name in long:
                yield from self._walk(pool, self.path(name), name, LONG_LEVELS[1:], on_problem)

    def _walk(
        self,
        pool: ThreadPoolExecutor,
        path: str,
        digits: str,
        widths: Sequence[int],
        on_problem: ProblemSink,
    ) -> Iterator[int]:
        """Ledger ids below `path`; the last two levels' children are fetched READ_WINDOW at a time."""
        names = self._children_or_none(path)
        if names is None:
            return
        if len(widths) == 1:
            yield from self._leaf_ids(path, digits, names, widths[0], on_problem)
            return
        valid = self._level_names(path, names, widths[0], on_problem)
        if len(widths) == 2:
            paths = [f"{path}/{n}" for n in valid]
            for name, leaves in zip(valid, pool.map(self._children_or_none, paths), strict=True):
                if leaves is not None:
                    yield from self._leaf_ids(f"{path}/{name}", digits + name, leaves, widths[1], on_problem)
            return
        for name in valid:
            yield from self._walk(pool, f"{path}/{name}", digits + name, widths[1:], on_problem)

    @staticmethod
    def _level_names(path: str, names: list[str], width: int, on_problem: ProblemSink) -> list[str]:
        valid = []
        for name in names:
            if _digits(name, width):
                valid.append(name)
            else:
                on_problem(f"{path}/{name}", f"foreign node in the ledger tree (expected {width} digits)")
        return valid

    @staticmethod
    def _leaf_ids(
        path: str, digits: str, names: list[str], width: int, on_problem: ProblemSink
    ) -> Iterator[int]:
        for name in names:
            if name.startswith(LEDGER_PREFIX) and _digits(name[1:], width):
                yield int(digits + name[1:])
            else:
                on_problem(f"{path}/{name}", f"foreign node in the ledger tree (expected L + {width} digits)")

    def read_ledgers(
        self, ledger_ids: Iterable[int], on_problem: ProblemSink = log_problem
    ) -> Iterator[tuple[int, LedgerMetadata]]:
        """(id, metadata) for each id, in order, READ_WINDOW reads in flight; bad or vanished ones skipped."""
        with ThreadPoolExecutor(READ_WINDOW, thread_name_prefix="bkctl-read") as pool:
            batch: list[int] = []
            for ledger_id in ledger_ids:
                batch.append(ledger_id)
                if len(batch) >= READ_WINDOW * 8:
                    yield from self._read_batch(pool, batch, on_problem)
                    batch = []
            yield from self._read_batch(pool, batch, on_problem)

    def _read_batch(
        self, pool: ThreadPoolExecutor, ids: list[int], on_problem: ProblemSink
    ) -> Iterator[tuple[int, LedgerMetadata]]:
        for ledger_id, result in zip(ids, pool.map(self._try_read_ledger, ids), strict=True):
            if isinstance(result, CorruptDataError):
                on_problem(self.ledger_path(ledger_id), str(result).split("): ", 1)[-1])
            elif result is not None:
                yield ledger_id, result

    def _try_read_ledger(self, ledger_id: int) -> LedgerMetadata | CorruptDataError | None:
        try:
            return self.read_ledger(ledger_id).value
        except NotFoundError:
            return None  # deleted since the walk: not a problem
        except CorruptDataError as exc:
            return exc

    # --- bookies ------------------------------------------------------------------------------------

    def bookie_path(self, bookie_id: str, *, readonly: bool = False) -> str:
        _check_bookie_name(bookie_id)
        return self.path(AVAILABLE, READONLY, bookie_id) if readonly else self.path(AVAILABLE, bookie_id)

    def register_bookie(
        self,
        bookie_id: str,
        service_info: mf.BookieServiceInfo | None = None,
        *,
        readonly: bool = False,
    ) -> str:
        """Register a bookie with an ephemeral node of this store's session; return its path.

        Read-only registration removes our read-write node (and the other way round), as Java does.
        ConflictError if another session still holds the node (a previous incarnation whose session
        has not expired yet); idempotent for our own session.
        """
        path = self.bookie_path(bookie_id, readonly=readonly)
        data = mf.encode_bookie_service_info(service_info or mf.BookieServiceInfo())
        self.store.ensure_path(self.path(AVAILABLE, READONLY))
        try:
            self.store.create(path, data, ephemeral=True)
        except NodeExistsError:
            stat = self.store.exists(path)
            if stat is not None and stat.ephemeral_owner != self.store.session_id:
                raise ConflictError(
                    f"bookie {bookie_id} is still registered by session {stat.ephemeral_owner:#x} ({path})"
                ) from None
        self._unregister(self.bookie_path(bookie_id, readonly=not readonly))
        return path

    def unregister_bookie(self, bookie_id: str) -> None:
        """Remove the bookie's read-write and read-only registrations (if ours or not, both)."""
        self._unregister(self.bookie_path(bookie_id))
        self._unregister(self.bookie_path(bookie_id, readonly=True))

    def _unregister(self, path: str) -> None:
        with contextlib.suppress(NotFoundError):
            self.store.delete(path)

    def bookies(self, *, readonly: bool = False) -> list[str]:
        """Registered bookie ids: read-write (children of `available` but `readonly`) or read-only."""
        parent = self.path(AVAILABLE, READONLY) if readonly else self.path(AVAILABLE)
        names = self._children_or_none(parent) or []
        return [n for n in names if readonly or n != READONLY]

    def bookie_service_info(self, bookie_id: str, *, readonly: bool = False) -> mf.BookieServiceInfo:
        data, _ = self.store.get(self.bookie_path(bookie_id, readonly=readonly))
        return mf.decode_bookie_service_info(data)

    # --- cookies ------------------------------------------------------------------------------------

    def cookie_path(self, bookie_id: str) -> str:
        _check_bookie_name(bookie_id)
        return self.path(COOKIES, bookie_id)

    def cookie_bookies(self) -> list[str]:
        """Bookies that have a cookie: BookKeeper's "all bookies"."""
        return self._children_or_none(self.path(COOKIES)) or []

    def read_cookie(self, bookie_id: str) -> Versioned[Cookie] | None:
        path = self.cookie_path(bookie_id)
        try:
            data, stat = self.store.get(path)
        except NotFoundError:
            return None
        try:
            return Versioned(mf.decode_cookie(data), stat.version)
        except ProtocolError as exc:
            raise CorruptDataError(f"cookie {path}: {exc}") from exc

    def write_cookie(self, cookie: Cookie, version: int | None = None) -> int:
        """Create (version None) or CAS-replace the bookie's cookie; the node's new version."""
        path, data = self.cookie_path(cookie.bookie_id), mf.encode_cookie(cookie)
        if version is None:
            try:
                self.store.create(path, data, make_parents=True)
            except NodeExistsError:
                raise ConflictError(f"bookie {cookie.bookie_id} already has a cookie ({path})") from None
            return 0
        return self.store.set(path, data, version).version

    def delete_cookie(self, bookie_id: str, version: int = -1) -> None:
        self.store.delete(self.cookie_path(bookie_id), version)

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
        try:
            return mf.decode_underreplicated_ledger(data)
        except ProtocolError as exc:
            raise CorruptDataError(f"{path}: bad under-replication mark: {exc}") from exc

    def read_underreplicated(self, ledger_id: int) -> Versioned[UnderreplicatedLedger] | None:
        path = self.underreplicated_path(ledger_id)
        try:
            data, stat = self.store.get(path)
        except NotFoundError:
            return None
        return Versioned(self._decode_mark(path, data), stat.version)

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
        if stat is None:
            return None
        data = mf.encode_lock_data(holder if holder is not None else socket.gethostname())
        self.store.ensure_path(self.ur_path(UR_LOCKS))
        try:
            self.store.create(self.lock_path(ledger_id), data, ephemeral=True)
        except NodeExistsError:
            return None
        return stat.version

    def release_lock(self, ledger_id: int) -> None:
        with contextlib.suppress(NotFoundError):
            self.store.delete(self.lock_path(ledger_id))

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

    # --- auditor election ---------------------------------------------------------------------------

    def add_auditor_vote(self, bookie_id: str) -> str:
        """Cast an ephemeral-sequential vote `auditorelection/V_<seq>`; return its path."""
        self.store.ensure_path(self.ur_path(UR_ELECTION))
        return self.store.create(
            self.ur_path(UR_ELECTION, VOTE_PREFIX),
            mf.encode_auditor_vote(bookie_id),
            ephemeral=True,
            sequential=True,
        )

    def auditor_votes(self, on_problem: ProblemSink = log_problem) -> list[tuple[str, str | None]]:
        """(vote node name, bookie id) of every live vote, lowest sequence (the winner) first."""
        names = self._children_or_none(self.ur_path(UR_ELECTION)) or []
        seqs = []
        for name in names:
            seq = parse_vote_seq(name)
            if seq is None:
                on_problem(self.ur_path(UR_ELECTION, name), "not an auditor vote")
            else:
                seqs.append((seq, name))
        votes = []
        for _, name in sorted(seqs):
            data = self._data_or_none(self.ur_path(UR_ELECTION, name))
            if data is None:
                continue
            try:
                votes.append((name, mf.decode_auditor_vote(data)))
            except ProtocolError as exc:
                on_problem(self.ur_path(UR_ELECTION, name), f"bad auditor vote: {exc}")
        return votes

    def current_auditor(self, on_problem: ProblemSink = log_problem) -> str | None:
        """The bookie of the lowest live vote (what Java's whoisauditor reports), or None."""
        votes = self.auditor_votes(on_problem)
        return votes[0][1] if votes else None

    def last_elected_auditor(self) -> str | None:
        """The vote the last winner copied into `auditorelection` (it stays after the auditor stops)."""
        data = self._data_or_none(self.ur_path(UR_ELECTION))
        if not data:
            return None
        try:
            return mf.decode_auditor_vote(data)
        except ProtocolError as exc:
            raise CorruptDataError(f"{self.ur_path(UR_ELECTION)}: {exc}") from exc

    def set_elected_auditor(self, bookie_id: str) -> None:
        """The winner's copy of its vote in the election node itself, as Java's elector writes it."""
        self.store.ensure_path(self.ur_path(UR_ELECTION))
        self.store.set(self.ur_path(UR_ELECTION), mf.encode_auditor_vote(bookie_id))

    # --- flags --------------------------------------------------------------------------------------

    def autorecovery_enabled(self) -> bool:
        """True unless `underreplication/disable` exists."""
        return self.store.exists(self.ur_path(UR_DISABLE)) is None

    def set_autorecovery_enabled(self, enabled: bool) -> bool:
        """Create or delete the disable flag; False if it already was as asked (nothing changed)."""
        path = self.ur_path(UR_DISABLE)
        try:
            if enabled:
                self.store.delete(path)
            else:
                self.store.create(path, b"", make_parents=True)
        except (NotFoundError, NodeExistsError):
            return False
        return True

    def lost_bookie_recovery_delay(self) -> int | None:
        """Seconds an auditor waits before auditing a lost bookie; None if the node is absent."""
        path = self.ur_path(UR_LOST_BOOKIE_RECOVERY_DELAY)
        data = self._data_or_none(path)
        if data is None:
            return None
        try:
            return mf.decode_lost_bookie_recovery_delay(data)
        except ProtocolError as exc:
            raise CorruptDataError(f"{path}: {exc}") from exc

    def set_lost_bookie_recovery_delay(self, delay_s: int) -> None:
        """Write the delay (0 is valid: audit at once); auditors watch the node and reschedule."""
        if not 0 <= delay_s <= INT_MAX:
            raise UsageError(f"lostBookieRecoveryDelay {delay_s} s: must be in [0, {INT_MAX}]")
        path, data = (
            self.ur_path(UR_LOST_BOOKIE_RECOVERY_DELAY),
            mf.encode_lost_bookie_recovery_delay(delay_s),
        )
        try:
            self.store.set(path, data)
        except NotFoundError:
            with contextlib.suppress(NodeExistsError):
                self.store.create(path, data, make_parents=True)
                return
            self.store.set(path, data)

    def check_ctime(self, name: str) -> int | None:
        """One of CHECK_CTIME_NODES: when the auditor last ran that check (ms), or None."""
        if name not in CHECK_CTIME_NODES:
            raise UsageError(f"unknown check {name!r}: one of {', '.join(CHECK_CTIME_NODES)}")
        data = self._data_or_none(self.ur_path(name))
        return None if data is None else mf.decode_check_ctime(data)

    def set_check_ctime(self, name: str, ctime_ms: int) -> None:
        if name not in CHECK_CTIME_NODES:
            raise UsageError(f"unknown check {name!r}: one of {', '.join(CHECK_CTIME_NODES)}")
        path, data = self.ur_path(name), mf.encode_check_ctime(ctime_ms)
        if self.store.exists(path) is None:
            with contextlib.suppress(NodeExistsError):
                self.store.create(path, data, make_parents=True)
                return
        self.store.set(path, data)

    # --- helpers ------------------------------------------------------------------------------------

    def _data_or_none(self, path: str) -> bytes | None:
        try:
            return self.store.get(path)[0]
        except NotFoundError:
            return None

    def _children_or_none(self, path: str) -> list[str] | None:
        try:
            return self.store.children(path)
        except NotFoundError:
            return None


def stores_entries_on(metadata: LedgerMetadata, bookie_id: str) -> bool:
    """Whether any entry of the ledger is (or, while it is not closed, may be) striped onto the bookie.

    BookKeeper's `listledgers -bookieid` rule: membership of an ensemble is not enough, the bookie's
    index must be in the write set of an entry of that segment.
    """
    count = len(metadata.segments)
    for index, segment in enumerate(metadata.segments):
        if bookie_id not in segment.ensemble:
            continue
        if index == count - 1 and not metadata.is_closed:
            return True
        last = metadata.segment_last_entry(index)
        # Write sets repeat every E entries: the first E entries of a segment show every member used.
        end = min(last, segment.first_entry_id + metadata.ensemble_size - 1)
        for entry_id in range(segment.first_entry_id, end + 1):
            members = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
            if any(segment.ensemble[i] == bookie_id for i in members):
                return True
    return False


def _check_bookie_name(bookie_id: str) -> None:
    if not bookie_id or "/" in bookie_id or bookie_id in (".", "..", READONLY):
        raise UsageError(f"bad bookie id {bookie_id!r}")
    if len(bookie_id) > limits.METADATA_PATH_LENGTH_MAX // 4:
        raise UsageError(f"bookie id of {len(bookie_id)} characters is too long")
