"""Ledgers in BookKeeper's layout: ledger ids (the hierarchical id generator), hierarchical metadata
paths, ledger metadata (format v3; create, read, CAS update, delete) and listing every ledger.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from bkctl import limits
from bkctl.errors import (
    BadVersionError,
    ConflictError,
    CorruptDataError,
    NodeExistsError,
    NotFoundError,
    ProtocolError,
)
from bkctl.metadata.nodes import (
    CAS_RETRIES_MAX,
    IDGEN,
    IDGEN_LONG,
    INT_MAX,
    READ_WINDOW,
    SPECIAL_ROOT_NODES,
    LayoutBase,
    ProblemSink,
    Versioned,
    check_ledger_id,
    log_problem,
)
from bkctl.metadata.store import log
from bkctl.model import LedgerMetadata
from bkctl.protocol import metadata_format as mf
from bkctl.protocol.quorum import write_set

ID_PREFIX = "ID-"
HOB_PREFIX = "HOB-"
LEDGER_PREFIX = "L"
# Short hierarchical: `%010d` split 2-4-4; long hierarchical: `%019d` split 3-4-4-4-4.
SHORT_LEVELS = (2, 4, 4)
LONG_LEVELS = (3, 4, 4, 4, 4)
# Ids handed out by one id-generation call before it gives up (each failure is a lost race).
ID_ATTEMPTS_MAX = 100  # local bound
# Ledger metadata read with one get_many: bounds memory; several ZooKeeper windows per call keep the
# pipeline full between batches.
READ_BATCH = 10_000
# The cToken Java writes on every metadata update (only the creating write carries a random one).
BLANK_C_TOKEN = 0


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


def _digits(name: str, width: int) -> bool:
    return len(name) == width and name.isascii() and name.isdigit()


class LedgersLayout(LayoutBase):
    """Ledger ids, ledger metadata and the ledger tree under the root."""

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
        if ledger_id is not None:
            return self._create_ledger_node(ledger_id, data)
        # A generated id whose node exists (ledgers created under explicit ids, or imported, which the
        # id generator never saw) is skipped for the next one, as Java's LedgerCreateOp does.
        for _ in range(limits.LEDGER_ID_SKIPS_MAX):
            try:
                return self._create_ledger_node(self.new_ledger_id(), data)
            except ConflictError:
                continue
        raise ConflictError(f"no free ledger id after {limits.LEDGER_ID_SKIPS_MAX} generated ids were taken")

    def _create_ledger_node(self, ledger_id: int, data: bytes) -> tuple[int, int]:
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
        """(id, metadata) for each id, in order; vanished ones skipped, malformed ones reported and skipped.

        READ_BATCH ids at a time go to one `store.get_many` (pipelined on ZooKeeper, a query per chunk
        on SQLite), so memory stays bounded however many ids come.
        """
        for ledger_id, versioned in self.read_ledgers_versioned(ledger_ids, on_problem):
            yield ledger_id, versioned.value

    def read_ledgers_versioned(
        self, ledger_ids: Iterable[int], on_problem: ProblemSink = log_problem
    ) -> Iterator[tuple[int, Versioned[LedgerMetadata]]]:
        """`read_ledgers` with each node's version: a recovery that scanned them opens and updates
        them from these, without reading each one again."""
        batch: list[int] = []
        for ledger_id in ledger_ids:
            batch.append(ledger_id)
            if len(batch) >= READ_BATCH:
                yield from self._read_batch(batch, on_problem)
                batch = []
        yield from self._read_batch(batch, on_problem)

    def _read_batch(
        self, ids: list[int], on_problem: ProblemSink
    ) -> Iterator[tuple[int, Versioned[LedgerMetadata]]]:
        paths = [self.ledger_path(ledger_id) for ledger_id in ids]
        for ledger_id, path, node in zip(ids, paths, self.store.get_many(paths), strict=True):
            if node is None:
                continue  # deleted since the walk: not a problem
            try:
                yield ledger_id, Versioned(mf.decode_ledger_metadata(node[0]), node[1].version)
            except ProtocolError as exc:
                on_problem(path, f"bad metadata: {exc}")


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
