"""The metadata store on one SQLite file, shared safely by any number of processes on one machine.

Nodes, sessions and a change log are tables (schema in docs/metadata.md). Every read-then-write runs
in `BEGIN IMMEDIATE`, so concurrent writers queue on SQLite's write lock (busy timeout) instead of
failing or losing updates. Sessions are leases: a heartbeat thread extends ours; any connected process
reaps expired sessions and their ephemeral nodes. Watches poll `PRAGMA data_version` and then read the
change log, which every write appends to in the same transaction.

Threads per store: the caller's (operations, serialized by a lock), `bkctl-sqlite-session` (heartbeat,
reaper, change-log pruning) and `bkctl-sqlite-events` (watch polling; runs every callback). Each has
its own connection: `data_version` only moves for commits made by *other* connections.
"""

from __future__ import annotations

import os
import queue
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from bkctl import limits
from bkctl.errors import (
    BadVersionError,
    EphemeralParentError,
    NodeExistsError,
    NotEmptyError,
    NotFoundError,
    SessionExpiredError,
    UnavailableError,
    UsageError,
)
from bkctl.metadata.retry import RetryPolicy
from bkctl.metadata.store import (
    SEQUENTIAL_FORMAT,
    CallbackSet,
    ChildrenCallback,
    CreateOp,
    DataCallback,
    DeleteOp,
    MetadataStore,
    Op,
    OpResult,
    SessionCallback,
    SetOp,
    Stat,
    Subscription,
    ancestors,
    check_data,
    check_ops,
    check_session_timeout,
    check_version,
    log,
    name_of,
    parent_of,
    run_callback,
    validate_path,
)

if TYPE_CHECKING:
    import sqlite_utils  # imported where used (`_sqlite_utils`): only the SQLite store needs it

T = TypeVar("T")
SCHEMA_VERSION = 1
# sqlite-utils imports these when they are installed (the spark extra brings both), for column types
# bkctl never stores: 0.7 s of CPU in every process that opens a SQLite store.
SQLITE_UTILS_SKIPS = ("pandas", "numpy")
STAT_COLUMNS = (
    "version, cversion, ctime_ms, mtime_ms, ephemeral_owner, length(data), num_children, czxid, mzxid"
)
# Change-log kinds: a node was created, its data set, or it was deleted.
CREATED, CHANGED, DELETED = "created", "changed", "deleted"
CHANGELOG_BATCH = 10_000


def now_ms() -> int:
    # Wall clock on purpose: leases are compared across processes, which share no monotonic clock.
    return int(time.time() * 1000)


def _stat(row: Sequence[Any]) -> Stat:
    return Stat(*(int(v) for v in row))


@contextmanager
def db_errors(path: Path) -> Iterator[None]:
    """Any SQLite failure (locked too long, not a database, unreadable) -> one-line UnavailableError."""
    try:
        yield
    except sqlite3.Error as exc:
        raise UnavailableError(f"metadata database {path}: {exc}") from exc


def connect(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    """A connection in autocommit mode (we issue BEGIN ourselves), WAL, NORMAL sync, busy timeout."""
    with db_errors(path):
        # isolation_level=None: no implicit deferred BEGIN, whose lock upgrade fails at once when busy.
        conn = sqlite3.connect(
            path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            conn.execute("PRAGMA journal_mode=WAL").fetchone()
            conn.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction that takes the write lock up front (waiting up to the busy timeout)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextmanager
def snapshot(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A read transaction: several SELECTs see one consistent state."""
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


def _sqlite_utils() -> ModuleType:
    """sqlite_utils, imported (the first time) without SQLITE_UTILS_SKIPS unless they are already loaded:
    a None in sys.modules makes their import fail, which sqlite-utils takes as "not installed"."""
    if "sqlite_utils" not in sys.modules:
        hidden = [name for name in SQLITE_UTILS_SKIPS if name not in sys.modules]
        for name in hidden:
            sys.modules[name] = None  # type: ignore[assignment]
        try:
            import sqlite_utils  # noqa: F401
        finally:
            for name in hidden:
                if sys.modules.get(name, 0) is None:
                    del sys.modules[name]
    return sys.modules["sqlite_utils"]


def init_schema(conn: sqlite3.Connection) -> None:
    """Create the tables and the root node if missing (idempotent, safe against racing processes)."""
    db = _sqlite_utils().Database(conn)
    with immediate(conn):
        db.table("meta").create({"key": str, "value": str}, pk="key", if_not_exists=True)
        db.table("nodes").create(
            {
                "path": str,
                "parent": str,  # "" for the root, so the children index never lists the root itself
                "name": str,
                "data": bytes,
                "version": int,
                "cversion": int,
                "seq": int,  # children ever created: ZooKeeper's sequential counter (deletes don't count)
                "num_children": int,
                "ctime_ms": int,
                "mtime_ms": int,
                "czxid": int,
                "mzxid": int,
                "pzxid": int,
                "ephemeral_owner": int,
            },
            pk="path",
            not_null=[
                "parent",
                "name",
                "data",
                "version",
                "cversion",
                "seq",
                "num_children",
                "ephemeral_owner",
            ],
            defaults={
                "data": b"",
                "version": 0,
                "cversion": 0,
                "seq": 0,
                "num_children": 0,
                "ephemeral_owner": 0,
            },
            if_not_exists=True,
        )
        db.table("nodes").create_index(["parent", "name"], index_name="nodes_by_parent", if_not_exists=True)
        # Plain SQL where sqlite-utils has no public way to say it: a partial index (WHERE), and the
        # AUTOINCREMENT of the two tables below.
        conn.execute(
            "CREATE INDEX IF NOT EXISTS nodes_by_owner ON nodes(ephemeral_owner) WHERE ephemeral_owner != 0"
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS sessions (id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " timeout_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL,"
            " created_ms INTEGER NOT NULL, owner TEXT NOT NULL)"
        )
        # AUTOINCREMENT: a zxid is never reused, even after pruning, so pollers can trust their cursor.
        conn.execute(
            "CREATE TABLE IF NOT EXISTS changelog (zxid INTEGER PRIMARY KEY AUTOINCREMENT,"
            " path TEXT NOT NULL, kind TEXT NOT NULL, time_ms INTEGER NOT NULL)"
        )
        db.table("changelog").create_index(["time_ms"], index_name="changelog_by_time", if_not_exists=True)
        _check_schema_version(db)
        now = now_ms()
        root = {"path": "/", "parent": "", "name": "", "data": b"", "ctime_ms": now, "mtime_ms": now}
        db.table("nodes").insert({**root, "czxid": 0, "mzxid": 0, "pzxid": 0}, ignore=True)


def _check_schema_version(db: sqlite_utils.Database) -> None:
    row = next(db.table("meta").rows_where("key = ?", ["schema_version"], select="value"), None)
    if row is None:
        db.table("meta").insert({"key": "schema_version", "value": str(SCHEMA_VERSION)})
    elif row["value"] != str(SCHEMA_VERSION):
        raise UnavailableError(
            f"metadata database schema version {row['value']}, this bkctl reads {SCHEMA_VERSION}"
        )


def inspect_database(path: Path) -> dict[str, object]:
    """Row counts per table, the schema version and the sessions (for `bkctl metadata` commands)."""
    if not path.is_file():
        raise NotFoundError(f"metadata database {path} does not exist")
    with db_errors(path):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
        try:
            db = _sqlite_utils().Database(conn)
            return {
                "path": str(path),
                "tables": {name: db.table(name).count for name in db.table_names()},
                "schema_version": next(db.table("meta").rows_where("key = ?", ["schema_version"]))["value"],
                "sessions": list(db.table("sessions").rows_where(order_by="id")),
            }
        finally:
            conn.close()


# --- the node operations, each inside a caller's BEGIN IMMEDIATE --------------------------------------


# The node operations stay plain SQL: each runs on every metadata write, where sqlite-utils would read
# the table's schema (PRAGMA table_info) per insert; the updates are compare-and-set (WHERE version = ?).
def _log(conn: sqlite3.Connection, path: str, kind: str, now: int) -> int:
    cursor = conn.execute("INSERT INTO changelog(path, kind, time_ms) VALUES (?, ?, ?)", (path, kind, now))
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _create(
    conn: sqlite3.Connection, path: str, data: bytes, *, ephemeral_owner: int, sequential: bool
) -> str:
    parent = parent_of(path)
    row = conn.execute("SELECT seq, ephemeral_owner FROM nodes WHERE path = ?", (parent,)).fetchone()
    if row is None:
        raise NotFoundError(f"metadata node {parent} (parent of {path}) does not exist")
    if sequential:
        path = path + SEQUENTIAL_FORMAT % row[0]
    if path == "/" or conn.execute("SELECT 1 FROM nodes WHERE path = ?", (path,)).fetchone():
        raise NodeExistsError(f"metadata node {path} already exists")
    if row[1]:
        raise EphemeralParentError(f"metadata node {parent} is ephemeral: it cannot have children")
    now = now_ms()
    zxid = _log(conn, path, CREATED, now)
    conn.execute(
        "INSERT INTO nodes(path, parent, name, data, ctime_ms, mtime_ms, czxid, mzxid, pzxid,"
        " ephemeral_owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (path, parent, name_of(path), data, now, now, zxid, zxid, zxid, ephemeral_owner),
    )
    _touch_parent(conn, parent, +1, zxid)
    return path


def _touch_parent(conn: sqlite3.Connection, parent: str, delta: int, zxid: int) -> None:
    # cversion counts creations and deletions; seq (the sequential counter) creations only, as
    # ZooKeeper 3.8 does (measured: after create+delete the next sequential suffix is 1, cversion 2).
    conn.execute(
        "UPDATE nodes SET cversion = cversion + 1, seq = seq + ?, num_children = num_children + ?,"
        " pzxid = ? WHERE path = ?",
        (max(delta, 0), delta, zxid, parent),
    )


def _versioned(
    conn: sqlite3.Connection, path: str, version: int, columns: str = "version"
) -> tuple[Any, ...]:
    row = conn.execute(f"SELECT {columns} FROM nodes WHERE path = ?", (path,)).fetchone()
    if row is None:
        raise NotFoundError(f"metadata node {path} does not exist")
    if version != -1 and row[0] != version:
        raise BadVersionError(f"metadata node {path} is at version {row[0]}, not {version}")
    return tuple(row)


def _set(conn: sqlite3.Connection, path: str, data: bytes, version: int) -> Stat:
    now = now_ms()
    # Log first (the update needs the zxid), then a conditional update: the common case is two
    # statements. On failure the caller's transaction rolls the log row back.
    zxid = _log(conn, path, CHANGED, now)
    row = conn.execute(
        f"UPDATE nodes SET data = ?, version = version + 1, mtime_ms = ?, mzxid = ?"
        f" WHERE path = ? AND (? = -1 OR version = ?) RETURNING {STAT_COLUMNS}",
        (data, now, zxid, path, version, version),
    ).fetchone()
    if row is None:
        _versioned(conn, path, version)  # raises NotFoundError or BadVersionError
        raise AssertionError(f"update of {path} matched no row")
    return _stat(row)


def _delete(conn: sqlite3.Connection, path: str, version: int) -> None:
    _, num_children = _versioned(conn, path, version, "version, num_children")
    if num_children:
        raise NotEmptyError(f"metadata node {path} has {num_children} children")
    _delete_node(conn, path)


def _delete_node(conn: sqlite3.Connection, path: str) -> None:
    zxid = _log(conn, path, DELETED, now_ms())
    conn.execute("DELETE FROM nodes WHERE path = ?", (path,))
    _touch_parent(conn, parent_of(path), -1, zxid)


def _delete_tree(conn: sqlite3.Connection, path: str, version: int) -> None:
    _versioned(conn, path, version)
    # Descendants sort between "<path>/" and "<path>0" ("0" follows "/"): a range scan of the key.
    low, high = (path + "/", path + "0") if path != "/" else ("/", "0")
    count = conn.execute("SELECT count(*) FROM nodes WHERE path > ? AND path < ?", (low, high)).fetchone()[0]
    if count > limits.METADATA_RECURSIVE_DELETE_MAX:
        raise UsageError(f"{path} has {count} descendants, more than {limits.METADATA_RECURSIVE_DELETE_MAX}")
    now = now_ms()
    # Deepest first, as ZooKeeper would delete them one by one, so watches see leaves go first.
    conn.execute(
        "INSERT INTO changelog(path, kind, time_ms) SELECT path, ?, ? FROM nodes"
        " WHERE path > ? AND path < ? ORDER BY length(path) - length(replace(path, '/', '')) DESC, path",
        (DELETED, now, low, high),
    )
    conn.execute("DELETE FROM nodes WHERE path > ? AND path < ?", (low, high))
    _delete_node(conn, path)


def _check(conn: sqlite3.Connection, path: str, version: int) -> None:
    _versioned(conn, path, version)


def _read_stat(conn: sqlite3.Connection, path: str) -> Stat | None:
    row = conn.execute(f"SELECT {STAT_COLUMNS} FROM nodes WHERE path = ?", (path,)).fetchone()
    return None if row is None else _stat(row)


def _read_node(conn: sqlite3.Connection, path: str) -> tuple[bytes, Stat] | None:
    row = conn.execute(f"SELECT data, {STAT_COLUMNS} FROM nodes WHERE path = ?", (path,)).fetchone()
    return None if row is None else (bytes(row[0]), _stat(row[1:]))


def _read_nodes(conn: sqlite3.Connection, paths: Sequence[str]) -> dict[str, tuple[bytes, Stat]]:
    """The nodes that exist among `paths` (at most SQLITE_GET_MANY_CHUNK), in one query."""
    marks = ",".join("?" * len(paths))
    rows = conn.execute(f"SELECT path, data, {STAT_COLUMNS} FROM nodes WHERE path IN ({marks})", tuple(paths))
    return {row[0]: (bytes(row[1]), _stat(row[2:])) for row in rows}


def _read_children(conn: sqlite3.Connection, path: str) -> list[str] | None:
    names = [r[0] for r in conn.execute("SELECT name FROM nodes WHERE parent = ? ORDER BY name", (path,))]
    if not names and conn.execute("SELECT 1 FROM nodes WHERE path = ?", (path,)).fetchone() is None:
        return None
    return names


def _drop_session(conn: sqlite3.Connection, session_id: int) -> int:
    """Delete a session and its ephemeral nodes (they have no children); return how many nodes."""
    paths = [r[0] for r in conn.execute("SELECT path FROM nodes WHERE ephemeral_owner = ?", (session_id,))]
    for path in paths:
        _delete_node(conn, path)
    conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
    return len(paths)


def _new_session(conn: sqlite3.Connection, timeout_ms: int) -> int:
    now = now_ms()
    owner = f"{socket.gethostname()}:{os.getpid()}"
    sessions = _sqlite_utils().Database(conn).table("sessions")
    row = {"timeout_ms": timeout_ms, "expires_at_ms": now + timeout_ms, "created_ms": now, "owner": owner}
    sessions.insert(row)
    assert sessions.last_pk is not None
    return int(sessions.last_pk)


def reap_expired_sessions(conn: sqlite3.Connection) -> list[int]:
    """Drop every session whose lease ran out; any process may do this. Returns the session ids."""
    now = now_ms()
    # A cheap read first, so idle processes do not take the write lock every tick.
    if conn.execute("SELECT 1 FROM sessions WHERE expires_at_ms < ? LIMIT 1", (now,)).fetchone() is None:
        return []
    with immediate(conn):
        expired = [r[0] for r in conn.execute("SELECT id FROM sessions WHERE expires_at_ms < ?", (now,))]
        for session_id in expired:
            _drop_session(conn, session_id)
    return expired


# --- watches --------------------------------------------------------------------------------------


_UNSEEN = object()


@dataclass(eq=False)
class _Watch:
    kind: str  # "data" or "children"
    path: str
    callback: Callable[..., None]
    start_zxid: int  # change-log rows up to this one are already reflected in the first call
    subscription: Subscription
    last_seen: object = _UNSEEN  # data watches: (czxid, mzxid) or None (absent) last reported


class _Events:
    """The event thread: polls the change log and calls watch and session callbacks, one at a time."""

    def __init__(self, store: SqliteStore, poll_ms: int) -> None:
        self._store = store
        self._poll_s = poll_ms / 1000
        self._conn = connect(store.path, store.busy_timeout_ms)
        # Held while a watch is registered or dispatched: no change slips between a watch's first
        # read and its start cursor, and callbacks never overlap.
        self.lock = threading.RLock()
        self._watches: list[_Watch] = []
        self._cursor = 0
        self._data_version = -1
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bkctl-sqlite-events", daemon=True)
        self._thread.start()

    def call_soon(self, func: Callable[[], None]) -> None:
        self._calls.put(func)

    def add(self, kind: str, path: str, callback: Callable[..., None]) -> Subscription:
        with self.lock, db_errors(self._store.path):
            with snapshot(self._conn):
                start = self._conn.execute("SELECT coalesce(max(zxid), 0) FROM changelog").fetchone()[0]
                first = _read_node(self._conn, path) if kind == "data" else _read_children(self._conn, path)
            if kind == "children" and first is None:
                raise NotFoundError(f"metadata node {path} does not exist")
            watch = _Watch(kind, path, callback, start, Subscription(self._remove))
            self._watches.append(watch)
            if len(self._watches) == 1:
                # Nobody polled meanwhile: start reading after this snapshot. Otherwise keep the cursor
                # (other watches still need those rows); start_zxid filters them for this watch.
                self._cursor = start
            self._deliver(watch, first)
            return watch.subscription

    def _remove(self, sub: Subscription) -> None:
        with self.lock:
            self._watches = [w for w in self._watches if w.subscription is not sub]

    def stop(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        self._conn.close()

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self._run_calls()
                if self._watches:
                    self._poll()
            except (sqlite3.Error, UnavailableError) as exc:
                if not self._stop.is_set():
                    log.warning("metadata watch poll failed: %s", exc)
                    self._stop.wait(limits.SQLITE_REAP_INTERVAL_MS / 1000)

    def _run_calls(self) -> None:
        while not self._calls.empty():
            func = self._calls.get_nowait()
            with self.lock:
                run_callback(func)

    def _poll(self) -> None:
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if version == self._data_version:
            return
        self._data_version = version
        with self.lock:
            while not self._stop.is_set():
                rows = self._conn.execute(
                    "SELECT zxid, path, kind FROM changelog WHERE zxid > ? ORDER BY zxid LIMIT ?",
                    (self._cursor, CHANGELOG_BATCH),
                ).fetchall()
                if not rows:
                    return
                gap = rows[0][0] > self._cursor + 1 and self._pruned_past_cursor()
                self._cursor = rows[-1][0]
                self._dispatch(rows, refresh_all=gap)
                if len(rows) < CHANGELOG_BATCH:
                    return

    def _pruned_past_cursor(self) -> bool:
        # Rows we never saw were pruned: we cannot know what changed, so every watch re-reads.
        low = self._conn.execute("SELECT min(zxid) FROM changelog").fetchone()[0]
        return low is not None and low > self._cursor + 1

    def _dispatch(self, rows: list[tuple[int, str, str]], *, refresh_all: bool) -> None:
        changed: dict[str, int] = {}  # path -> newest zxid of a change to the node itself
        child_changed: dict[str, int] = {}  # parent path -> newest zxid of a child create/delete
        for zxid, path, kind in rows:
            changed[path] = zxid
            if kind != CHANGED:
                child_changed[parent_of(path)] = zxid
        for watch in list(self._watches):
            if not watch.subscription.active:
                continue
            if watch.kind == "data":
                newest = changed.get(watch.path, 0)
            else:
                newest = max(child_changed.get(watch.path, 0), changed.get(watch.path, 0))
            if refresh_all or newest > watch.start_zxid:
                self._refresh(watch)

    def _refresh(self, watch: _Watch) -> None:
        if watch.kind == "data":
            self._deliver(watch, _read_node(self._conn, watch.path))
        else:
            self._deliver(watch, _read_children(self._conn, watch.path))

    def _deliver(self, watch: _Watch, state: Any) -> None:
        if watch.kind == "data":
            node: tuple[bytes, Stat] | None = state
            key = None if node is None else (node[1].czxid, node[1].mzxid)
            if key == watch.last_seen:
                return  # a child change or a re-read: the node itself did not change
            watch.last_seen = key
            run_callback(watch.callback, *(node if node is not None else (None, None)))
        else:
            run_callback(watch.callback, state)
            if state is None:
                watch.subscription.cancel()


class SqliteStore(MetadataStore):
    """MetadataStore on a SQLite file (created if missing; its directory must exist unless create_dirs)."""

    def __init__(
        self,
        path: Path | str,
        *,
        session_timeout_ms: int = limits.METADATA_SESSION_TIMEOUT_MS,
        connect_timeout_ms: int = limits.METADATA_CONNECT_TIMEOUT_MS,
        create_dirs: bool = False,
        watch_poll_ms: int = limits.SQLITE_WATCH_POLL_MS,
        reap_interval_ms: int = limits.SQLITE_REAP_INTERVAL_MS,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.path = Path(path)
        self.session_timeout_ms = check_session_timeout(session_timeout_ms)
        # The busy timeout bounds how long one operation waits for another process's write lock: the
        # metadata retry deadline, as a ZooKeeper outage (bkctl.metadata.retry), never less than connecting.
        self.busy_timeout_ms = max(
            connect_timeout_ms, (retry or RetryPolicy.from_env(session_timeout_ms)).deadline_ms, 1
        )
        self._open_file(create_dirs)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._session_lost = CallbackSet()
        self._renew = threading.Event()
        self._conn = connect(self.path, self.busy_timeout_ms)
        try:
            with db_errors(self.path):
                init_schema(self._conn)
                with immediate(self._conn):
                    self._session_id = _new_session(self._conn, self.session_timeout_ms)
            self._events = _Events(self, watch_poll_ms)
        except BaseException:
            self._conn.close()
            raise
        self._tick_s = min(reap_interval_ms, self.session_timeout_ms // 4) / 1000
        self._session_thread = threading.Thread(
            target=self._session_loop, name="bkctl-sqlite-session", daemon=True
        )
        self._session_thread.start()

    def _open_file(self, create_dirs: bool) -> None:
        if create_dirs:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UnavailableError(f"metadata database {self.path}: {exc.strerror}") from exc
        if self.path.is_dir():
            raise UnavailableError(f"metadata database {self.path}: is a directory")
        if not self.path.parent.is_dir():
            raise UnavailableError(
                f"metadata database {self.path}: directory {self.path.parent} does not exist"
            )

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r}, session={self._session_id})"

    @property
    def session_id(self) -> int:
        return self._session_id

    # --- operations ---

    def _write(self, func: Callable[[sqlite3.Connection], T]) -> T:
        self._check_open()
        with self._lock, db_errors(self.path), immediate(self._conn):
            return func(self._conn)

    def _read(self, func: Callable[[sqlite3.Connection], T]) -> T:
        self._check_open()
        with self._lock, db_errors(self.path):
            return func(self._conn)

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise UnavailableError(f"metadata store {self.path} is closed")

    def _owner(self, conn: sqlite3.Connection, ephemeral: bool) -> int:
        """Our session id for a new ephemeral node, checked against the lease inside the transaction."""
        if not ephemeral:
            return 0
        row = conn.execute("SELECT expires_at_ms FROM sessions WHERE id = ?", (self._session_id,)).fetchone()
        if row is None or row[0] < now_ms():
            self._renew.set()
            raise SessionExpiredError(f"metadata session {self._session_id} expired")
        return self._session_id

    def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> str:
        validate_path(path)
        data = check_data(data)

        def run(conn: sqlite3.Connection) -> str:
            owner = self._owner(conn, ephemeral)
            if make_parents:
                self._make_parents(conn, path)
            return _create(conn, path, data, ephemeral_owner=owner, sequential=sequential)

        return self._write(run)

    def _make_parents(self, conn: sqlite3.Connection, path: str) -> None:
        for ancestor in ancestors(path):
            if conn.execute("SELECT 1 FROM nodes WHERE path = ?", (ancestor,)).fetchone() is None:
                _create(conn, ancestor, b"", ephemeral_owner=0, sequential=False)

    def get(self, path: str) -> tuple[bytes, Stat]:
        validate_path(path)
        node = self._read(lambda conn: _read_node(conn, path))
        if node is None:
            raise NotFoundError(f"metadata node {path} does not exist")
        return node

    def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, Stat] | None]:
        for path in paths:
            validate_path(path)
        self._check_open()
        found: dict[str, tuple[bytes, Stat]] = {}
        for start in range(0, len(paths), limits.SQLITE_GET_MANY_CHUNK):
            # One query per chunk, the store's lock released in between so other threads get a turn.
            found.update(self._read_chunk(paths[start : start + limits.SQLITE_GET_MANY_CHUNK]))
        return [found.get(path) for path in paths]

    def _read_chunk(self, paths: Sequence[str]) -> dict[str, tuple[bytes, Stat]]:
        return self._read(lambda conn: _read_nodes(conn, paths))

    def exists(self, path: str) -> Stat | None:
        validate_path(path)
        return self._read(lambda conn: _read_stat(conn, path))

    def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        validate_path(path)
        data, version = check_data(data), check_version(version)
        return self._write(lambda conn: _set(conn, path, data, version))

    def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        validate_path(path)
        check_version(version)
        if path == "/":
            raise UsageError("the root node cannot be deleted")
        if recursive:
            self._write(lambda conn: _delete_tree(conn, path, version))
        else:
            self._write(lambda conn: _delete(conn, path, version))

    def children(self, path: str) -> list[str]:
        validate_path(path)
        names = self._read(lambda conn: _read_children(conn, path))
        if names is None:
            raise NotFoundError(f"metadata node {path} does not exist")
        return names

    def multi(self, ops: Sequence[Op]) -> list[OpResult]:
        checked = check_ops(ops)
        return self._write(lambda conn: [self._apply(conn, op) for op in checked])

    def _apply(self, conn: sqlite3.Connection, op: Op) -> OpResult:
        if isinstance(op, CreateOp):
            owner = self._owner(conn, op.ephemeral)
            return _create(conn, op.path, op.data, ephemeral_owner=owner, sequential=op.sequential)
        if isinstance(op, SetOp):
            return _set(conn, op.path, op.data, op.version)
        if isinstance(op, DeleteOp):
            _delete(conn, op.path, op.version)
            return None
        _check(conn, op.path, op.version)
        return None

    # --- watches and sessions ---

    def watch_data(self, path: str, callback: DataCallback) -> Subscription:
        validate_path(path)
        self._check_open()
        return self._events.add("data", path, callback)

    def watch_children(self, path: str, callback: ChildrenCallback) -> Subscription:
        validate_path(path)
        self._check_open()
        return self._events.add("children", path, callback)

    def on_session_lost(self, callback: SessionCallback) -> Subscription:
        return self._session_lost.add(callback)

    def _session_loop(self) -> None:
        try:
            conn = connect(self.path, self.busy_timeout_ms)
        except UnavailableError as exc:
            log.error("metadata session upkeep cannot start: %s", exc)
            return
        heartbeat_s = self.session_timeout_ms / 3000
        next_heartbeat = time.monotonic() + heartbeat_s
        next_prune = time.monotonic()
        try:
            while not self._closed.wait(self._tick_s):
                try:
                    if self._renew.is_set() or time.monotonic() >= next_heartbeat:
                        next_heartbeat = time.monotonic() + heartbeat_s
                        self._heartbeat(conn)
                    reap_expired_sessions(conn)
                    if time.monotonic() >= next_prune:
                        next_prune = time.monotonic() + limits.SQLITE_CHANGELOG_RETENTION_MS / 6000
                        self._prune(conn)
                except sqlite3.Error as exc:
                    if not self._closed.is_set():
                        log.warning("metadata session upkeep on %s failed: %s", self.path, exc)
        finally:
            conn.close()

    def _heartbeat(self, conn: sqlite3.Connection) -> None:
        now = now_ms()
        cursor = conn.execute(
            "UPDATE sessions SET expires_at_ms = ? WHERE id = ? AND expires_at_ms >= ?",
            (now + self.session_timeout_ms, self._session_id, now),
        )
        if cursor.rowcount == 0 and not self._closed.is_set():
            self._replace_session(conn)

    def _replace_session(self, conn: sqlite3.Connection) -> None:
        """Our lease ran out (we were paused, or reaped): drop what is left of it and start a new one."""
        with immediate(conn):
            old = self._session_id
            _drop_session(conn, old)
            self._session_id = _new_session(conn, self.session_timeout_ms)
        self._renew.clear()
        log.warning("metadata session %d expired; new session %d", old, self._session_id)
        self._events.call_soon(self._session_lost.call_all)

    def _prune(self, conn: sqlite3.Connection) -> None:
        cutoff = now_ms() - limits.SQLITE_CHANGELOG_RETENTION_MS
        if conn.execute("SELECT 1 FROM changelog WHERE time_ms < ? LIMIT 1", (cutoff,)).fetchone():
            conn.execute("DELETE FROM changelog WHERE time_ms < ?", (cutoff,))

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if threading.current_thread() is not self._session_thread:
            self._session_thread.join(timeout=5)
        self._events.stop()
        with self._lock:
            try:
                with db_errors(self.path), immediate(self._conn):
                    _drop_session(self._conn, self._session_id)
            except UnavailableError as exc:
                log.warning("closing metadata store: %s", exc)
            finally:
                self._conn.close()
