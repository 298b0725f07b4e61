"""What every part of BookKeeper's layout shares: node names under the root, the id bounds, the
`LayoutBase` (a store, a root and path building) and the small types the readers return.

The domain parts (ledgers.py, bookies.py, underreplication.py, autorecovery.py) are mixins of
`LayoutBase`; layout.py composes them into `Layout`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from bkctl.errors import CorruptDataError, NotFoundError, ProtocolError, UsageError
from bkctl.metadata.store import DEFAULT_ROOT, MetadataStore, Stat, log, validate_path

T = TypeVar("T")
ProblemSink = Callable[[str, str], None]  # (path, why)

# Java's Integer.MAX_VALUE: ids below it use the short hierarchical path and the short id generator.
INT_MAX = (1 << 31) - 1  # format fact
LEDGER_ID_MAX = (1 << 63) - 1  # format fact

# Node names under the root (BookKeeperConstants).
AVAILABLE = "available"
READONLY = "readonly"
COOKIES = "cookies"
LAYOUT = "LAYOUT"
INSTANCEID = "INSTANCEID"
IDGEN = "idgen"
IDGEN_LONG = "idgen-long"
UNDERREPLICATION = "underreplication"
# Children of the root that are not ledger metadata; BookKeeper's ledger iterators skip them too.
SPECIAL_ROOT_NODES = frozenset(
    {AVAILABLE, COOKIES, LAYOUT, INSTANCEID, IDGEN, IDGEN_LONG, UNDERREPLICATION, "ledgers", "bookies"}
)

# Concurrent metadata reads in flight when walking trees or reading many marks.
READ_WINDOW = 32
# CAS retries of a read-modify-write before giving up with ConflictError.
CAS_RETRIES_MAX = 100  # local bound


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A decoded value with the version of the node it came from (for a later compare-and-swap)."""

    value: T
    version: int


def log_problem(path: str, why: str) -> None:
    log.warning("%s: %s", path, why)


def now_ms() -> int:
    return int(time.time() * 1000)


def decode_node(path: str, data: bytes, decode: Callable[[bytes], T], what: str = "") -> T:
    """`decode(data)`, a codec's ProtocolError turned into CorruptDataError naming the node."""
    try:
        return decode(data)
    except ProtocolError as exc:
        raise CorruptDataError(f"{path}: {what}{exc}") from exc


def check_ledger_id(ledger_id: int) -> int:
    if not isinstance(ledger_id, int) or not 0 <= ledger_id <= LEDGER_ID_MAX:
        raise UsageError(f"bad ledger id {ledger_id!r}: must be in [0, {LEDGER_ID_MAX}]")
    return ledger_id


class LayoutBase:
    """BookKeeper's tree under `root` in a MetadataStore: paths, and reads that allow a missing node."""

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

    def _node_or_none(self, path: str) -> tuple[bytes, Stat] | None:
        try:
            return self.store.get(path)
        except NotFoundError:
            return None

    def _data_or_none(self, path: str) -> bytes | None:
        node = self._node_or_none(path)
        return None if node is None else node[0]

    def _children_or_none(self, path: str) -> list[str] | None:
        try:
            return self.store.children(path)
        except NotFoundError:
            return None
