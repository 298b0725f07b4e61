"""The metadata store API: a small ZooKeeper-like tree of nodes, with two backends.

`MetadataStore` is what the bookie, the client, recovery and the admin commands use;
`bkctl.metadata.stores.open_store(uri)` picks the backend from a metadata URI (`zk://…`, a bare
ZooKeeper connect string, `sqlite:///…`). This module knows no backend: they build on it.
Both backends follow ZooKeeper's semantics exactly (tests/metadata runs one contract suite on both):

- paths are absolute (`/a/b`), without a trailing slash, `.`/`..` or empty components;
- a new node has version 0; every `set` adds 1; `set`/`delete` with `version=-1` skip the check;
- `cversion` counts child creations and deletions; a sequential node is named after its parent's
  cversion, `%010d` appended to the requested path (`/ledgers/idgen/ID-` -> `…/ID-0000000007`);
- ephemeral nodes belong to the store's session, vanish when it ends and may have no children;
- a node with children cannot be deleted (unless `recursive=True`);
- `children()` returns names (not paths), sorted.

All methods block; Twisted code calls them through `deferToThread`. Watch and session callbacks run
on the store's single event thread (ZooKeeper: kazoo's callback thread; SQLite: the store's poller
thread), one at a time, except a watch's first call, which runs on the caller's thread before
`watch_*` returns. Callbacks may call the store, but should be quick: they delay every other callback.
From Twisted, hand them to the reactor with `reactor.callFromThread`.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

from bkctl import limits
from bkctl.errors import (
    BkctlError,
    NodeExistsError,
    NotFoundError,
    SessionExpiredError,
    UnavailableError,
    UsageError,
)

log = logging.getLogger("bkctl.metadata")

SEQUENTIAL_FORMAT = "%010d"
# ZooKeeper's PathUtils rejects these: NUL and control characters, surrogates and private use, specials.
BAD_PATH_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\uffff]")
DEFAULT_ROOT = "/ledgers"
DEFAULT_ZK_PORT = 2181


@dataclass(frozen=True)
class Stat:
    """A node's metadata, as ZooKeeper's Stat (ids are the backend's change counters)."""

    version: int
    cversion: int
    ctime_ms: int
    mtime_ms: int
    ephemeral_owner: int  # the owning session id; 0 for a persistent node
    data_length: int
    num_children: int
    czxid: int  # change id of the creation
    mzxid: int  # change id of the last data change (czxid until the first set)


@dataclass(frozen=True)
class CreateOp:
    """multi(): create a node (parents must exist, or be created earlier in the same multi)."""

    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequential: bool = False


@dataclass(frozen=True)
class SetOp:
    """multi(): set a node's data if its version matches (-1: any)."""

    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True)
class DeleteOp:
    """multi(): delete a childless node if its version matches (-1: any)."""

    path: str
    version: int = -1


@dataclass(frozen=True)
class CheckOp:
    """multi(): fail the whole multi unless the node exists with this version."""

    path: str
    version: int


Op = CreateOp | SetOp | DeleteOp | CheckOp
# multi() results, one per op: the created path, the new Stat, or None (delete, check).
OpResult = str | Stat | None
DataCallback = Callable[[bytes | None, Stat | None], None]
ChildrenCallback = Callable[[list[str] | None], None]
SessionCallback = Callable[[], None]


class Subscription:
    """A registered watch or session-lost callback; `cancel()` stops further calls (idempotent)."""

    def __init__(self, on_cancel: Callable[[Subscription], None] | None = None) -> None:
        self._active = True
        self._on_cancel = on_cancel

    @property
    def active(self) -> bool:
        return self._active

    def cancel(self) -> None:
        if self._active:
            self._active = False
            if self._on_cancel is not None:
                self._on_cancel(self)


class MetadataStore(abc.ABC):
    """A ZooKeeper-like tree of nodes with versions, ephemeral and sequential nodes, and watches.

    Errors: NotFoundError (no such node, or parent missing), NodeExistsError, BadVersionError,
    NotEmptyError, EphemeralParentError, UsageError (bad path, data too large),
    SessionExpiredError / UnavailableError (store unreachable, closed or session lost).
    """

    @property
    @abc.abstractmethod
    def session_id(self) -> int:
        """The current session's id: the `ephemeral_owner` of the ephemeral nodes created now."""

    @abc.abstractmethod
    def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> str:
        """Create a node; return its path (with the sequence suffix if sequential).

        make_parents creates missing ancestors as empty persistent nodes first.
        """

    @abc.abstractmethod
    def get(self, path: str) -> tuple[bytes, Stat]:
        """A node's data and Stat; NotFoundError if absent."""

    def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, Stat] | None]:
        """Each node's data and Stat, in the order of `paths`; None where a node is absent.

        The reads are not one snapshot: each is as of its own moment, as separate `get`s would be.
        Backends override this to batch (SQLite) or pipeline (ZooKeeper) the reads; this default
        reads one node after another. UsageError for a bad path, before anything is read.
        """
        for path in paths:
            validate_path(path)
        return [self._get_or_none(path) for path in paths]

    def create_each(self, nodes: Sequence[tuple[str, bytes]], *, ephemeral: bool = False) -> list[bool]:
        """Create each node on its own (not all or nothing: one that exists fails only itself); True
        where created, False where a node was there already. Other errors (a missing parent) raise.

        ZooKeeper overrides this to send every create before waiting for any (many locks taken in
        one round trip); this default creates one node after another.
        """
        for path, _ in nodes:
            validate_path(path)
        created = []
        for path, data in nodes:
            try:
                self.create(path, data, ephemeral=ephemeral)
            except NodeExistsError:
                created.append(False)
            else:
                created.append(True)
        return created

    def _get_or_none(self, path: str) -> tuple[bytes, Stat] | None:
        try:
            return self.get(path)
        except NotFoundError:
            return None

    @abc.abstractmethod
    def exists(self, path: str) -> Stat | None:
        """A node's Stat, or None if absent."""

    @abc.abstractmethod
    def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        """Replace a node's data if its version is `version` (-1: any); return the new Stat."""

    @abc.abstractmethod
    def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        """Delete a node if its version matches (-1: any).

        recursive deletes the subtree first (not atomically: children created meanwhile make it fail
        with NotEmptyError, as with ZooKeeper); the version applies to `path` itself.
        """

    @abc.abstractmethod
    def children(self, path: str) -> list[str]:
        """The names of a node's children, sorted; NotFoundError if the node is absent."""

    @abc.abstractmethod
    def multi(self, ops: Sequence[Op]) -> list[OpResult]:
        """Apply ops all-or-nothing, in order (later ops see earlier ones).

        On failure nothing is applied and the first failing op's error is raised.
        """

    def multi_each(self, batches: Sequence[Sequence[Op]]) -> list[list[OpResult] | BkctlError]:
        """Each batch applied as one `multi`, each on its own: its results, or the error it failed
        with (a conflict, a missing node) in its place. Errors of the store itself (closed, an outage
        that outlasts the retries) raise.

        ZooKeeper overrides this to send every multi before waiting for any; this default applies one
        after another."""
        answers: list[list[OpResult] | BkctlError] = []
        for ops in batches:
            try:
                answers.append(self.multi(ops))
            except (UnavailableError, SessionExpiredError):
                raise
            except BkctlError as exc:
                answers.append(exc)
        return answers

    @abc.abstractmethod
    def watch_data(self, path: str, callback: DataCallback) -> Subscription:
        """Call callback(data, stat) now, then after every change of the node (create, set, delete).

        An absent node gives (None, None); the watch survives deletion and re-creation. Changes in
        quick succession may be reported once, with the latest state (as with ZooKeeper).
        """

    @abc.abstractmethod
    def watch_children(self, path: str, callback: ChildrenCallback) -> Subscription:
        """Call callback(children) now, then after every child creation or deletion.

        NotFoundError if the node is absent. When the node is deleted, callback(None) is called once
        and the watch ends.
        """

    @abc.abstractmethod
    def on_session_lost(self, callback: SessionCallback) -> Subscription:
        """Call callback() each time the session expired and a new one took its place.

        The old session's ephemeral nodes are gone by then; the callback re-creates what it owns.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """End the session (its ephemeral nodes go at once) and release everything; idempotent."""

    def ensure_path(self, path: str) -> None:
        """Create `path` and its missing ancestors as persistent nodes; no error if it exists."""
        if self.exists(path) is None:
            with contextlib.suppress(NodeExistsError):
                self.create(path, make_parents=True)

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --- paths ---------------------------------------------------------------------------------------


def validate_path(path: str) -> str:
    """Return `path` if ZooKeeper would accept it, else raise UsageError."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise UsageError(f"metadata path must start with '/': {path!r}")
    if len(path) > limits.METADATA_PATH_LENGTH_MAX:
        raise UsageError(f"metadata path longer than {limits.METADATA_PATH_LENGTH_MAX}: {path[:80]!r}…")
    if path == "/":
        return path
    for name in path[1:].split("/"):
        if name in ("", ".", ".."):
            raise UsageError(f"bad metadata path {path!r}: empty, '.' or '..' component")
    if BAD_PATH_CHARS.search(path):
        raise UsageError(f"bad metadata path {path!r}: control or reserved character")
    return path


def parent_of(path: str) -> str:
    """The parent path ("/" for a top-level node)."""
    head = path.rsplit("/", 1)[0]
    return head or "/"


def name_of(path: str) -> str:
    return path.rsplit("/", 1)[1]


def join(parent: str, name: str) -> str:
    return parent + name if parent.endswith("/") else f"{parent}/{name}"


def ancestors(path: str) -> list[str]:
    """Proper ancestors of `path` below the root, outermost first: /a/b/c -> [/a, /a/b]."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def check_data(data: bytes) -> bytes:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise UsageError(f"metadata node data must be bytes, not {type(data).__name__}")
    if len(data) > limits.METADATA_DATA_SIZE_MAX:
        raise UsageError(f"metadata node data of {len(data)} bytes exceeds {limits.METADATA_DATA_SIZE_MAX}")
    return bytes(data)


def check_version(version: int) -> int:
    if not isinstance(version, int) or version < -1:
        raise UsageError(f"bad expected version {version!r} (-1 means any)")
    return version


def check_op(op: Op) -> Op:
    if isinstance(op, CreateOp):
        validate_path(op.path)
        check_data(op.data)
    elif isinstance(op, SetOp):
        validate_path(op.path)
        check_data(op.data)
        check_version(op.version)
    elif isinstance(op, DeleteOp | CheckOp):
        validate_path(op.path)
        check_version(op.version)
        if isinstance(op, DeleteOp) and op.path == "/":
            raise UsageError("the root node cannot be deleted")
    else:
        raise UsageError(f"not a metadata op: {op!r}")
    return op


def check_ops(ops: Sequence[Op]) -> list[Op]:
    if len(ops) > limits.METADATA_MULTI_OPS_MAX:
        raise UsageError(f"multi of {len(ops)} ops exceeds {limits.METADATA_MULTI_OPS_MAX}")
    return [check_op(op) for op in ops]


def check_session_timeout(session_timeout_ms: int) -> int:
    low, high = limits.METADATA_SESSION_TIMEOUT_MS_MIN, limits.METADATA_SESSION_TIMEOUT_MS_MAX
    if not low <= session_timeout_ms <= high:
        raise UsageError(f"session timeout {session_timeout_ms} ms outside [{low}, {high}]")
    return session_timeout_ms


# --- callbacks -----------------------------------------------------------------------------------


class CallbackSet:
    """Session-lost callbacks, thread-safe; a failing callback is logged and does not stop the others."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[Subscription, SessionCallback] = {}

    def add(self, callback: SessionCallback) -> Subscription:
        sub = Subscription(self._remove)
        with self._lock:
            self._subs[sub] = callback
        return sub

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.pop(sub, None)

    def call_all(self) -> None:
        with self._lock:
            items = list(self._subs.items())
        for sub, callback in items:
            if sub.active:
                run_callback(callback)


def run_callback(callback: Callable[..., None], *args: object) -> None:
    """Run a user callback on a store thread: an exception is logged, never kills the thread."""
    try:
        callback(*args)
    except Exception:
        log.exception("metadata callback %r failed", callback)


# --- URIs ----------------------------------------------------------------------------------------

Backend = Literal["zookeeper", "sqlite"]


@dataclass(frozen=True)
class MetadataLocation:
    """A parsed metadata URI.

    zookeeper: `hosts` is the kazoo connect string (a bare connect string keeps its own `/chroot`);
    sqlite: `path` is the database file. `root` is BookKeeper's ledgers root path in the store
    (zkLedgersRootPath); `layout` the ledger manager named by a `zk+<layout>://` URI, if any.
    """

    backend: Backend
    root: str = DEFAULT_ROOT
    hosts: str = ""
    path: Path | None = None
    layout: str | None = None


def default_sqlite_path(env: Mapping[str, str] | None = None) -> Path:
    """$BKCTL_HOME/metadata.db, else $XDG_DATA_HOME/bkctl/metadata.db, else ~/.local/share/bkctl/…"""
    env = os.environ if env is None else env
    if env.get("BKCTL_HOME"):
        return Path(env["BKCTL_HOME"]).expanduser() / "metadata.db"
    data_home = Path(env["XDG_DATA_HOME"]) if env.get("XDG_DATA_HOME") else Path.home() / ".local/share"
    return data_home.expanduser() / "bkctl" / "metadata.db"


def default_metadata_uri(env: Mapping[str, str] | None = None) -> str:
    """The URI used when neither --metadata nor BKCTL_METADATA is given."""
    return "sqlite://" + default_sqlite_path(env).as_posix()


def resolve_metadata_uri(option: str | None, env: Mapping[str, str] | None = None) -> str:
    """--metadata, else $BKCTL_METADATA, else the default embedded SQLite store."""
    env = os.environ if env is None else env
    return option or env.get("BKCTL_METADATA") or default_metadata_uri(env)


def parse_metadata_uri(uri: str) -> MetadataLocation:
    """Parse a metadata URI; UsageError if it is none of the documented forms (docs/metadata.md).

    - `zk://h:p[,h:p]/ledgers`, BookKeeper's `zk+hierarchical://h:p;h:p/ledgers` (also `zk+flat`,
      `zk+longhierarchical`, `zk+null`): ZooKeeper, no chroot; the path is the ledgers root.
    - `h:p[,h:p][/chroot]`: a bare ZooKeeper connect string, handed to the client unchanged, root /ledgers.
    - `sqlite:///abs/metadata.db`, `sqlite://rel/metadata.db` (relative to the working directory),
      `sqlite://` (the default file); `?root=/path` sets the ledgers root.
    """
    uri = uri.strip()
    if not uri:
        raise UsageError("empty metadata URI")
    scheme, sep, _ = uri.partition("://")
    if not sep:
        return _parse_connect_string(uri)
    scheme = scheme.lower()
    if scheme == "sqlite":
        return _parse_sqlite(uri)
    if scheme == "zk" or scheme.startswith("zk+"):
        return _parse_zk(uri, scheme)
    raise UsageError(f"unknown metadata URI scheme {scheme!r} in {uri!r} (zk://, zk+<layout>://, sqlite://)")


def _parse_connect_string(uri: str) -> MetadataLocation:
    hosts, _, chroot = uri.partition("/")
    _check_hosts(hosts.split(","), uri)
    if chroot:
        validate_path("/" + chroot)
    return MetadataLocation("zookeeper", hosts=uri)


def _parse_zk(uri: str, scheme: str) -> MetadataLocation:
    rest = uri.split("://", 1)[1]
    netloc, slash, path = rest.partition("/")
    if "?" in path or "#" in path:
        raise UsageError(f"metadata URI {uri!r}: query or fragment not supported")
    hosts = [h for h in netloc.replace(";", ",").split(",") if h]
    _check_hosts(hosts, uri)
    root = "/" + path.rstrip("/") if slash and path.strip("/") else DEFAULT_ROOT
    validate_path(root)
    layout = scheme[3:] if scheme.startswith("zk+") else None
    if layout == "null":
        layout = None
    return MetadataLocation("zookeeper", root=root, hosts=",".join(hosts), layout=layout)


def _check_hosts(hosts: list[str], uri: str) -> None:
    if not hosts:
        raise UsageError(f"metadata URI {uri!r} names no ZooKeeper host")
    for host in hosts:
        name, colon, port = host.rpartition(":")
        if not colon:
            name, port = host, str(DEFAULT_ZK_PORT)
        if not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"metadata URI {uri!r}: bad ZooKeeper host {host!r} (host:port)")


def _parse_sqlite(uri: str) -> MetadataLocation:
    parts = urlsplit(uri)
    query = parse_qs(parts.query)
    unknown = set(query) - {"root"}
    if unknown or parts.fragment:
        raise UsageError(f"metadata URI {uri!r}: unknown option(s) {sorted(unknown)}")
    root = query.get("root", [DEFAULT_ROOT])[-1]
    validate_path(root)
    text = unquote(parts.netloc + parts.path)
    path = Path(text).expanduser() if text else default_sqlite_path()
    return MetadataLocation("sqlite", root=root, path=path)
