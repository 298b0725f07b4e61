"""BookKeeper's metadata layout, written once on top of store.py (see docs/layout.md).

Every path and value BookKeeper keeps under its root (`zkLedgersRootPath`, default `/ledgers`) is made
in this package and nowhere else, one module per domain, composed here into `Layout`:

- nodes.py: node names under the root, id bounds, `LayoutBase` (store, root, paths), `Versioned`;
- ledgers.py: ledger ids, hierarchical metadata paths, ledger metadata (format v3, CAS on the node
  version), listing and bulk reads;
- bookies.py: bookie registration (read-write, read-only, service info) and cookies;
- underreplication.py: under-replication marks, their locks, mark-replicated and pruning;
- autorecovery.py: auditor election votes, the disable flag, lostBookieRecoveryDelay, check ctimes;
- this module: cluster init, the instance id and the LAYOUT node.

Plain blocking code over a MetadataStore (Twisted callers use deferToThread). Readers that walk a
tree never stop at a malformed or foreign node: they hand its path and the reason to `on_problem`
and go on, so one bad znode cannot hide a cluster's worth of ledgers. Every name the layout ever
exported is still importable from here.
"""

from __future__ import annotations

import uuid

from bkctl.errors import (
    ConflictError,
    NodeExistsError,
    NotFoundError,
    UsageError,
)
from bkctl.metadata import nodes
from bkctl.metadata.autorecovery import (
    CHECK_CTIME_NODES,
    UR_DISABLE,
    UR_ELECTION,
    UR_LOST_BOOKIE_RECOVERY_DELAY,
    VOTE_PREFIX,
    AutorecoveryLayout,
    parse_vote_seq,
)
from bkctl.metadata.bookies import BookiesLayout
from bkctl.metadata.ledgers import (
    BLANK_C_TOKEN,
    HOB_PREFIX,
    ID_ATTEMPTS_MAX,
    ID_PREFIX,
    LEDGER_PREFIX,
    LONG_LEVELS,
    SHORT_LEVELS,
    LedgersLayout,
    ledger_subpath,
    stores_entries_on,
)
from bkctl.metadata.nodes import (
    AVAILABLE,
    CAS_RETRIES_MAX,
    COOKIES,
    IDGEN,
    IDGEN_LONG,
    INSTANCEID,
    INT_MAX,
    LAYOUT,
    LEDGER_ID_MAX,
    READ_WINDOW,
    READONLY,
    SPECIAL_ROOT_NODES,
    UNDERREPLICATION,
    ProblemSink,
    Versioned,
    check_ledger_id,
    log_problem,
    now_ms,
)
from bkctl.metadata.store import CreateOp
from bkctl.metadata.underreplication import (
    UR_LEDGER_PREFIX,
    UR_LEDGERS,
    UR_LOCKS,
    UnderreplicatedEntry,
    UnderreplicationLayout,
    parse_underreplicated_name,
    underreplicated_subpath,
)
from bkctl.protocol import metadata_format as mf
from bkctl.protocol.metadata_format import LedgerLayout

__all__ = [
    "AVAILABLE",
    "BLANK_C_TOKEN",
    "CAS_RETRIES_MAX",
    "CHECK_CTIME_NODES",
    "COOKIES",
    "HOB_PREFIX",
    "IDGEN",
    "IDGEN_LONG",
    "ID_ATTEMPTS_MAX",
    "ID_PREFIX",
    "INSTANCEID",
    "INT_MAX",
    "LAYOUT",
    "LEDGER_ID_MAX",
    "LEDGER_PREFIX",
    "LONG_LEVELS",
    "READONLY",
    "READ_WINDOW",
    "SHORT_LEVELS",
    "SPECIAL_ROOT_NODES",
    "UNDERREPLICATION",
    "UR_DISABLE",
    "UR_ELECTION",
    "UR_LEDGERS",
    "UR_LEDGER_PREFIX",
    "UR_LOCKS",
    "UR_LOST_BOOKIE_RECOVERY_DELAY",
    "VOTE_PREFIX",
    "Layout",
    "ProblemSink",
    "UnderreplicatedEntry",
    "Versioned",
    "check_ledger_id",
    "ledger_subpath",
    "log_problem",
    "now_ms",
    "parse_underreplicated_name",
    "parse_vote_seq",
    "stores_entries_on",
    "underreplicated_subpath",
]


class Layout(LedgersLayout, BookiesLayout, UnderreplicationLayout, AutorecoveryLayout):
    """BookKeeper's tree under `root` in a MetadataStore (hierarchical ledger manager)."""

    # --- cluster ------------------------------------------------------------------------------------

    def instance_id(self) -> str | None:
        data = self._data_or_none(self.path(INSTANCEID))
        return None if data is None else mf.decode_instance_id(data)

    def ledger_layout(self) -> LedgerLayout | None:
        data = self._data_or_none(self.path(LAYOUT))
        return None if data is None else mf.decode_ledger_layout(data)

    def check_initialized(self) -> LedgerLayout:
        """The cluster's LAYOUT; NotFoundError if none, UsageError if not a hierarchical manager."""
        data = self._data_or_none(self.path(LAYOUT))
        layout = None if data is None else nodes.decode_node(self.path(LAYOUT), data, mf.decode_ledger_layout)
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
