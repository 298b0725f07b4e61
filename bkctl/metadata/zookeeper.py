"""The metadata store on a real ZooKeeper, through kazoo's threading handler.

Every call is kazoo's async form with a bounded wait, so a ZooKeeper that stops answering gives an
UnavailableError instead of a hang. kazoo's exceptions become bkctl's (`_map_error`). Watches are our
own small loop over kazoo's one-shot watches (re-read, re-arm, report), so deletion, re-creation and
session loss behave exactly as the SQLite backend; their callbacks run on kazoo's single callback
thread. When a session expires kazoo connects again with a new one; only then do the session-lost
callbacks run (on that thread), so they can re-create ephemeral nodes at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    EXCEPTIONS,
    AuthFailedError,
    BadArgumentsError,
    ConnectionClosedError,
    InvalidACLError,
    KazooException,
    NoAuthError,
    NoChildrenForEphemeralsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
    UnimplementedError,
)
from kazoo.exceptions import BadVersionError as ZkBadVersionError
from kazoo.exceptions import NodeExistsError as ZkNodeExistsError
from kazoo.exceptions import NotEmptyError as ZkNotEmptyError
from kazoo.exceptions import SessionExpiredError as ZkSessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import Callback, EventType, WatchedEvent, ZnodeStat
from kazoo.retry import KazooRetry

from bkctl import limits
from bkctl.errors import (
    AccessDeniedError,
    BadVersionError,
    BkctlError,
    EphemeralParentError,
    NodeExistsError,
    NotEmptyError,
    NotFoundError,
    SessionExpiredError,
    UnavailableError,
    UsageError,
)
from bkctl.metadata.retry import RetryPolicy, retrying
from bkctl.metadata.store import (
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
    check_data,
    check_ops,
    check_session_timeout,
    check_version,
    join,
    log,
    name_of,
    parent_of,
    run_callback,
    validate_path,
)
from bkctl.metadata.zk_auth import ZkAuth, sasl_failure, zk_auth_from_env
from bkctl.metadata.zk_multiread import Answer, MultiRead, MultiReadError
from bkctl.metadata.zk_poll import PollHandler

# Pipelined requests in flight at once during a recursive delete.
DELETE_WINDOW = 1000
# Paths per multiRead request: a few hundred small nodes make a response of some 100 KiB.
MULTI_READ_PATHS = 250
# Reads of a get_many that falls back to gets, and the pause between looks at the connection.
FALLBACK_ATTEMPTS = 3  # local bound
FALLBACK_PAUSE_S = 0.05  # local bound
T = TypeVar("T")


def quiet_kazoo_logging() -> None:
    """Keep kazoo's connection chatter off stderr unless the application configured logging.

    A NullHandler stops Python's last-resort stderr handler; records still propagate to any handler
    the application (a bookie's log file, `-v`) installs on the root logger.
    """
    logger = logging.getLogger("kazoo")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


def _stat(zstat: ZnodeStat) -> Stat:
    return Stat(
        version=zstat.version,
        cversion=zstat.cversion,
        ctime_ms=zstat.ctime,
        mtime_ms=zstat.mtime,
        ephemeral_owner=zstat.ephemeralOwner,
        data_length=zstat.dataLength,
        num_children=zstat.numChildren,
        czxid=zstat.czxid,
        mzxid=zstat.mzxid,
    )


def _map_error(exc: BaseException, path: str, *, creating: bool = False) -> BkctlError:
    """kazoo's exception for an operation on `path` -> the bkctl error of the same meaning."""
    if isinstance(exc, NoNodeError):
        if creating:
            return NotFoundError(f"metadata node {parent_of(path)} (parent of {path}) does not exist")
        return NotFoundError(f"metadata node {path} does not exist")
    if isinstance(exc, ZkNodeExistsError):
        return NodeExistsError(f"metadata node {path} already exists")
    if isinstance(exc, ZkBadVersionError):
        return BadVersionError(f"metadata node {path}: version mismatch")
    if isinstance(exc, ZkNotEmptyError):
        return NotEmptyError(f"metadata node {path} has children")
    if isinstance(exc, NoChildrenForEphemeralsError):
        return EphemeralParentError(f"metadata node {parent_of(path)} is ephemeral: it cannot have children")
    if isinstance(exc, ZkSessionExpiredError):
        return SessionExpiredError("ZooKeeper session expired")
    if isinstance(exc, NoAuthError):
        return AccessDeniedError(
            f"ZooKeeper refused access to {path} (NoAuth): its ACL does not admit this client's credentials "
            "(--jaas FILE with a Client section)"
        )
    if isinstance(exc, AuthFailedError):
        why = sasl_failure()  # a Kerberos login or ticket the KDC refused says why
        return AccessDeniedError(
            "ZooKeeper refused this client's credentials (SASL authentication failed"
            + (f": {why})" if why else ")")
        )
    if isinstance(exc, InvalidACLError):
        return AccessDeniedError(
            f"ZooKeeper refused the ACL of {path} (InvalidACL): creator-only ACLs (zkEnableSecurity) "
            "need an authenticated client"
        )
    if isinstance(exc, BadArgumentsError):
        return UsageError(f"ZooKeeper refused the arguments for {path}")
    if isinstance(exc, ConnectionClosedError):
        return UnavailableError("metadata store is closed")
    if isinstance(exc, KazooTimeoutError):
        return UnavailableError(f"ZooKeeper did not answer in time ({path})")
    return UnavailableError(f"ZooKeeper: {type(exc).__name__} on {path}")


def _op_result(op: Op, result: Any) -> OpResult:
    if isinstance(op, CreateOp):
        return str(result)
    if isinstance(op, SetOp):
        return _stat(result)
    return None


class _NoMultiRead(Exception):
    """The server does not know multiRead (ZooKeeper < 3.6 answers UNIMPLEMENTED)."""


def _node_or_none(path: str, answer: Answer) -> tuple[bytes, Stat] | None:
    """One multiRead answer: the node, None if it does not exist, or the read's error raised."""
    if not isinstance(answer, int):
        return answer
    if answer == NoNodeError.code:
        return None
    error_type = EXCEPTIONS.get(answer)
    raise _map_error(error_type() if error_type else KazooException(f"error {answer}"), path)


_UNSEEN = object()


class _Watch:
    """One data or children watch: read with a one-shot ZooKeeper watch, report, re-arm on the event."""

    def __init__(self, store: ZooKeeperStore, kind: str, path: str, callback: Callable[..., None]) -> None:
        self.store, self.kind, self.path, self.callback = store, kind, path, callback
        self.subscription = Subscription(store._forget)
        self._lock = threading.Lock()
        self._last_seen: object = _UNSEEN

    def on_event(self, event: WatchedEvent) -> None:
        # NONE events are session state changes; after a new session every watch is refreshed anyway.
        if event.type != EventType.NONE:
            self.refresh()

    def refresh(self, *, first: bool = False) -> None:
        with self._lock:
            if not self.subscription.active:
                return
            try:
                state = self._read_data() if self.kind == "data" else self._read_children()
            except (UnavailableError, SessionExpiredError):
                if first:
                    raise
                return  # connection trouble: re-read when the session is back
            self._deliver(state, first)

    def _read_data(self) -> tuple[bytes, Stat] | None:
        client = self.store._client
        for _ in range(limits.METADATA_MULTI_OPS_MAX):  # bounded: the node flips between absent and present
            try:
                data, zstat = self.store._wait(client.get_async(self.path, watch=self.on_event), self.path)
                return bytes(data), _stat(zstat)
            except NotFoundError:
                zstat = self.store._wait(client.exists_async(self.path, watch=self.on_event), self.path)
                if zstat is None:
                    return None
        raise UnavailableError(f"metadata node {self.path} changes too fast to watch")

    def _read_children(self) -> list[str] | None:
        client = self.store._client
        try:
            return sorted(
                self.store._wait(client.get_children_async(self.path, watch=self.on_event), self.path)
            )
        except NotFoundError:
            return None

    def _deliver(self, state: Any, first: bool) -> None:
        if self.kind == "data":
            key = None if state is None else (state[1].czxid, state[1].mzxid)
            if key == self._last_seen:
                return
            self._last_seen = key
            run_callback(self.callback, *(state if state is not None else (None, None)))
            return
        if state is None:
            self.subscription.cancel()
            if first:
                raise NotFoundError(f"metadata node {self.path} does not exist")
        run_callback(self.callback, state)


class ZooKeeperStore(MetadataStore):
    """MetadataStore on ZooKeeper. `hosts` is a kazoo connect string (`h:p,h:p[/chroot]`)."""

    def __init__(
        self,
        hosts: str,
        *,
        session_timeout_ms: int = limits.METADATA_SESSION_TIMEOUT_MS,
        connect_timeout_ms: int = limits.METADATA_CONNECT_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        wait_for_server: bool = False,
        auth: ZkAuth | None = None,
    ) -> None:
        """`wait_for_server`: a daemon started while ZooKeeper is away waits for it up to the retry
        deadline (as an operation rides through an outage) instead of failing after the connect
        timeout; requests keep their own timeout either way. `auth`: credentials and the ACL of
        created nodes (default: from `--conf` / `--jaas`, bkctl.metadata.zk_auth)."""
        quiet_kazoo_logging()
        self.hosts = hosts
        self.auth = zk_auth_from_env() if auth is None else auth
        self.auth.check()
        self.retry = retry or RetryPolicy.from_env(session_timeout_ms)
        check_session_timeout(session_timeout_ms)
        # A request waits through a reconnection within the session, not longer.
        self._op_timeout_s = (session_timeout_ms + connect_timeout_ms) / 1000
        self._closed = False
        self._lost = False
        self._multi_read = True  # until the server says it has none
        self._session_lost = CallbackSet()
        self._watches_lock = threading.Lock()
        self._watches: dict[Subscription, _Watch] = {}
        try:
            self._client = KazooClient(
                hosts=hosts,
                timeout=session_timeout_ms / 1000,
                handler=PollHandler(),
                # Reconnect forever (a bookie outlives ZooKeeper restarts), backing off to 1 s.
                connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=1.0),
                **self.auth.kazoo_kwargs(),
            )
        except (ValueError, KazooException) as exc:
            raise UsageError(f"bad ZooKeeper connect string {hosts!r}: {exc}") from exc
        self._client.add_listener(self._on_state)
        self._start(max(connect_timeout_ms, self.retry.deadline_ms if wait_for_server else 0))

    def _start(self, connect_timeout_ms: int) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # kazoo warns about a missing chroot; we raise instead
                self._client.start(timeout=connect_timeout_ms / 1000)
        except (KazooTimeoutError, KazooException, OSError) as exc:
            self._closed = True
            self._client.close()
            raise UnavailableError(
                f"ZooKeeper {self.hosts} not reachable within {connect_timeout_ms} ms"
            ) from exc
        try:
            # Also where refused credentials show: SASL runs right after the session is made.
            root_missing = (self._client.chroot or self.auth.has_credentials) and self.exists("/") is None
        except BkctlError:
            self.close()
            raise
        if root_missing:
            self.close()
            raise NotFoundError(f"ZooKeeper chroot {self._client.chroot} does not exist")

    def __repr__(self) -> str:
        return f"ZooKeeperStore({self.hosts!r}, session={self.session_id:#x})"

    @property
    def session_id(self) -> int:
        client_id = self._client.client_id
        return int(client_id[0]) if client_id else 0

    def _wait(self, async_result: Any, path: str, *, creating: bool = False) -> Any:
        try:
            return async_result.get(timeout=self._op_timeout_s)
        except (KazooException, KazooTimeoutError) as exc:
            raise _map_error(exc, path, creating=creating) from None

    def _check_open(self) -> None:
        if self._closed:
            raise UnavailableError("metadata store is closed")

    # --- operations ---

    def _retrying(
        self, what: str, attempt: Callable[[], T], applied: Callable[[], T | None] | None = None
    ) -> T:
        """Ride through a lost connection or session (bkctl.metadata.retry)."""
        return retrying(what, attempt, self.retry, is_closed=lambda: self._closed, applied=applied)

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
        self._check_open()
        tried = [False]

        def attempt() -> str:
            if tried[0] and sequential and ephemeral:
                mine = self._my_sequential(path, data)
                if mine is not None:  # the try before the outage reached the server
                    return mine
            tried[0] = True
            result = self._client.create_async(
                path, data, ephemeral=ephemeral, sequence=sequential, makepath=make_parents
            )
            return str(self._wait(result, path, creating=True))

        if sequential and not ephemeral:
            # Not retried: a retry could create a second node and nothing can tell ours (no session owns
            # it); nothing in bkctl creates them.
            return attempt()
        applied = None if sequential else lambda: self._created(path, data, ephemeral)
        return self._retrying(f"create {path}", attempt, applied)

    def create_each(self, nodes: Sequence[tuple[str, bytes]], *, ephemeral: bool = False) -> list[bool]:
        """Every create sent before any answer is waited for (at most METADATA_GET_MANY_WINDOW in
        flight): many replication locks in one round trip. One that meets an outage is done again
        alone, through the outage, as `create` is."""
        checked = [(validate_path(path), check_data(data)) for path, data in nodes]
        self._check_open()
        window = max(1, limits.METADATA_GET_MANY_WINDOW)
        created: list[bool] = []
        pending: deque[tuple[str, bytes, Any]] = deque()
        for path, data in checked:
            if len(pending) >= window:
                created.append(self._create_answer(*pending.popleft(), ephemeral))
            pending.append((path, data, self._client.create_async(path, data, ephemeral=ephemeral)))
        while pending:
            created.append(self._create_answer(*pending.popleft(), ephemeral))
        return created

    def _create_answer(self, path: str, data: bytes, async_result: Any, ephemeral: bool) -> bool:
        try:
            self._wait(async_result, path, creating=True)
        except NodeExistsError:
            return False
        except (UnavailableError, SessionExpiredError):
            try:
                self.create(path, data, ephemeral=ephemeral)
            except NodeExistsError:  # ours, if the first try reached the server before the drop
                return self._created(path, data, ephemeral) is not None
        return True

    def _created(self, path: str, data: bytes, ephemeral: bool) -> str | None:
        """`path` if it is the node a create of `data` (ephemeral: by this session) would have made."""
        return None if self._node_if_mine(path, data, ephemeral) is None else path

    def _set_applied(self, path: str, data: bytes, version: int) -> Stat | None:
        """The node's Stat if it is what a set of `data` at `version` would have left."""
        stat = self._node_if_mine(path, data, ephemeral=False)
        return stat if stat is not None and version in (-1, stat.version - 1) else None

    def _node_if_mine(self, path: str, data: bytes, ephemeral: bool) -> Stat | None:
        """The node's Stat if it holds `data` (and, when ephemeral, belongs to this session)."""
        try:
            found, stat = self.get(path)
        except NotFoundError:
            return None
        if found != data or (ephemeral and stat.ephemeral_owner != self.session_id):
            return None
        return stat

    def _my_sequential(self, path: str, data: bytes) -> str | None:
        """An ephemeral-sequential node of this session created from `path` with `data`, if any."""
        parent, prefix = parent_of(path), name_of(path)
        try:
            names = [n for n in self.children(parent) if n.startswith(prefix)]
        except NotFoundError:
            return None
        for name in names:
            if self._node_if_mine(join(parent, name), data, ephemeral=True) is not None:
                return join(parent, name)
        return None

    def get(self, path: str) -> tuple[bytes, Stat]:
        validate_path(path)
        self._check_open()

        def attempt() -> tuple[bytes, Stat]:
            data, zstat = self._wait(self._client.get_async(path), path)
            return bytes(data), _stat(zstat)

        return self._retrying(f"get {path}", attempt)

    def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, Stat] | None]:
        """multiRead requests of MULTI_READ_PATHS paths, pipelined; pipelined gets on ZooKeeper < 3.6.

        Either way at most METADATA_GET_MANY_WINDOW reads are in flight. One get per round trip is
        ~1,800 nodes/s, pipelined gets ~6,000/s (kazoo's connection thread handles one request per
        loop); a multiRead answers hundreds of reads with one response. An outage keeps the answers
        already in and retries the rest (bkctl.metadata.retry), as every read.
        """
        for path in paths:
            validate_path(path)
        self._check_open()
        done: list[tuple[bytes, Stat] | None] = []

        def attempt() -> list[tuple[bytes, Stat] | None]:
            self._read_many(paths, done)
            return done

        return self._retrying(f"get_many of {len(paths)} nodes", attempt)

    def _read_many(self, paths: Sequence[str], done: list[tuple[bytes, Stat] | None]) -> None:
        """Append the answers for paths[len(done):] to `done`, in order, as they come in."""
        rest = paths[len(done) :]
        if not self._multi_read:
            self._pipeline(rest, self._client.get_async, self._get_answer, done)
            return
        batches = [rest[i : i + MULTI_READ_PATHS] for i in range(0, len(rest), MULTI_READ_PATHS)]
        try:
            self._pipeline(batches, self._send_multi_read, self._multi_read_answers, done, MULTI_READ_PATHS)
        except _NoMultiRead:
            log.info("ZooKeeper %s has no multiRead (< 3.6): reading nodes one by one", self.hosts)
            self._multi_read = False
            self._gets_after_unimplemented(paths, done)

    def _gets_after_unimplemented(self, paths: Sequence[str], done: list[tuple[bytes, Stat] | None]) -> None:
        """Pipelined gets, once the connection is back.

        ZooKeeper drops the connection after answering an unknown request (kazoo reconnects within
        the session), so the first gets may meet a ConnectionLoss: wait for the reconnection, retry.
        This is part of the fallback, not an outage: it happens with a deadline of 0 too.
        """
        for _ in range(FALLBACK_ATTEMPTS - 1):
            self._wait_connected()
            try:
                self._pipeline(paths[len(done) :], self._client.get_async, self._get_answer, done)
                return
            except UnavailableError as exc:
                log.info("reading again after a dropped connection: %s", exc)
                time.sleep(FALLBACK_PAUSE_S)  # let kazoo notice the drop before we look at the state
        self._wait_connected()
        self._pipeline(paths[len(done) :], self._client.get_async, self._get_answer, done)

    def _wait_connected(self) -> None:
        deadline = time.monotonic() + self._op_timeout_s
        while not self._client.connected and not self._closed and time.monotonic() < deadline:
            time.sleep(FALLBACK_PAUSE_S)

    def _pipeline(
        self,
        units: Sequence[T],
        send: Callable[[T], Any],
        receive: Callable[[T, Any], list[tuple[bytes, Stat] | None]],
        results: list[tuple[bytes, Stat] | None],
        paths_per_unit: int = 1,
    ) -> None:
        """Send every unit, keeping at most METADATA_GET_MANY_WINDOW paths in flight; append the answers
        to `results` in order, each unit's as soon as it is in (so a retry can start after them)."""
        window = max(1, limits.METADATA_GET_MANY_WINDOW // paths_per_unit)
        pending: deque[tuple[T, Any]] = deque()
        for unit in units:
            if len(pending) >= window:
                results.extend(receive(*pending.popleft()))
            pending.append((unit, send(unit)))
        while pending:
            results.extend(receive(*pending.popleft()))

    def _get_answer(self, path: str, async_result: Any) -> list[tuple[bytes, Stat] | None]:
        try:
            data, zstat = self._wait(async_result, path)
        except NotFoundError:
            return [None]
        return [(bytes(data), _stat(zstat))]

    def _send_multi_read(self, batch: Sequence[str]) -> Any:
        # kazoo adds the chroot in its own calls; a raw request needs it added here.
        chroot = self._client.chroot
        async_result = self._client.handler.async_result()
        self._client._call(MultiRead([(chroot + p).rstrip("/") or "/" for p in batch]), async_result)
        return async_result

    def _multi_read_answers(self, batch: Sequence[str], async_result: Any) -> list[tuple[bytes, Stat] | None]:
        try:
            answers = async_result.get(timeout=self._op_timeout_s)
        except UnimplementedError:
            raise _NoMultiRead from None
        except (KazooException, KazooTimeoutError) as exc:
            raise _map_error(exc, batch[0]) from None
        except MultiReadError as exc:
            raise UnavailableError(f"ZooKeeper sent a bad multiRead response: {exc}") from None
        return [_node_or_none(path, answer) for path, answer in zip(batch, answers, strict=True)]

    def exists(self, path: str) -> Stat | None:
        validate_path(path)
        self._check_open()

        def attempt() -> Stat | None:
            zstat = self._wait(self._client.exists_async(path), path)
            return None if zstat is None else _stat(zstat)

        return self._retrying(f"exists {path}", attempt)

    def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        validate_path(path)
        data, version = check_data(data), check_version(version)
        self._check_open()

        def attempt() -> Stat:
            return _stat(self._wait(self._client.set_async(path, data, version), path))

        return self._retrying(f"set {path}", attempt, lambda: self._set_applied(path, data, version))

    def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        validate_path(path)
        check_version(version)
        if path == "/":
            raise UsageError("the root node cannot be deleted")
        self._check_open()
        if recursive:
            stat = self.exists(path)
            if stat is None:
                raise NotFoundError(f"metadata node {path} does not exist")
            if version not in (-1, stat.version):
                raise BadVersionError(f"metadata node {path} is at version {stat.version}, not {version}")
            self._delete_descendants(path)

        def attempt() -> bool:
            self._wait(self._client.delete_async(path, version), path)
            return True

        # After an outage, a node gone is our own delete that reached the server before it.
        self._retrying(f"delete {path}", attempt, lambda: True if self.exists(path) is None else None)

    def _delete_descendants(self, path: str) -> None:
        """Delete everything below `path`, deepest level first, pipelining each level."""
        levels: list[list[str]] = []
        frontier = [path]
        count = 0
        while frontier:
            level = [join(parent, name) for parent in frontier for name in self._children_or_empty(parent)]
            count += len(level)
            if count > limits.METADATA_RECURSIVE_DELETE_MAX:
                raise UsageError(f"{path} has more than {limits.METADATA_RECURSIVE_DELETE_MAX} descendants")
            if level:
                levels.append(level)
            frontier = level
        for level in reversed(levels):
            for start in range(0, len(level), DELETE_WINDOW):
                batch = [(p, self._client.delete_async(p)) for p in level[start : start + DELETE_WINDOW]]
                for node, result in batch:
                    with contextlib.suppress(NotFoundError):  # deleted by someone else meanwhile: fine
                        self._wait(result, node)

    def _children_or_empty(self, path: str) -> list[str]:
        try:
            return self.children(path)
        except NotFoundError:
            return []

    def children(self, path: str) -> list[str]:
        validate_path(path)
        self._check_open()
        attempt = lambda: sorted(self._wait(self._client.get_children_async(path), path))  # noqa: E731
        return self._retrying(f"children {path}", attempt)

    def multi(self, ops: Sequence[Op]) -> list[OpResult]:
        """All or nothing; retried through an outage like the single operations. A conflict after a
        retry is our own earlier try when every op's effect is there (`_multi_applied`)."""
        checked = check_ops(ops)
        self._check_open()
        if not checked:
            return []
        return self._retrying(
            f"multi of {len(checked)} ops on {checked[0].path}",
            lambda: self._multi_once(checked),
            lambda: self._multi_applied(checked),
        )

    def multi_each(self, batches: Sequence[Sequence[Op]]) -> list[list[OpResult] | BkctlError]:
        """Every multi sent before any answer is waited for (at most METADATA_GET_MANY_WINDOW in
        flight): an audit's thousands of marks in a few round trips. One that meets an outage is done
        again alone, through the outage, as `multi` is."""
        checked = [check_ops(ops) for ops in batches]
        self._check_open()
        window = max(1, limits.METADATA_GET_MANY_WINDOW)
        answers: list[list[OpResult] | BkctlError] = []
        pending: deque[tuple[list[Op], Any]] = deque()
        for ops in checked:
            if len(pending) >= window:
                answers.append(self._multi_answer(*pending.popleft()))
            pending.append((ops, self._send_multi(ops) if ops else None))
        while pending:
            answers.append(self._multi_answer(*pending.popleft()))
        return answers

    def _multi_answer(self, ops: list[Op], async_result: Any) -> list[OpResult] | BkctlError:
        if async_result is None:
            return []
        try:
            return self._multi_results(ops, self._wait(async_result, ops[0].path))
        except (UnavailableError, SessionExpiredError):
            pass
        except BkctlError as exc:
            return exc
        try:
            return self.multi(ops)  # alone, through the outage
        except (UnavailableError, SessionExpiredError):
            raise
        except BkctlError as exc:
            return exc

    def _send_multi(self, checked: Sequence[Op]) -> Any:
        transaction = self._client.transaction()
        for op in checked:
            if isinstance(op, CreateOp):
                transaction.create(op.path, op.data, ephemeral=op.ephemeral, sequence=op.sequential)
            elif isinstance(op, SetOp):
                transaction.set_data(op.path, op.data, op.version)
            elif isinstance(op, DeleteOp):
                transaction.delete(op.path, op.version)
            else:
                transaction.check(op.path, op.version)
        return transaction.commit_async()

    def _multi_once(self, checked: Sequence[Op]) -> list[OpResult]:
        return self._multi_results(checked, self._wait(self._send_multi(checked), checked[0].path))

    def _multi_results(self, checked: Sequence[Op], results: list[Any]) -> list[OpResult]:
        for op, result in zip(checked, results, strict=True):
            # The failing op carries its real error; the others only say they were rolled back.
            if isinstance(result, Exception) and not isinstance(
                result, RolledBackError | RuntimeInconsistency
            ):
                raise _map_error(result, op.path, creating=isinstance(op, CreateOp))
        if any(isinstance(result, Exception) for result in results):
            raise UnavailableError(f"ZooKeeper rolled back a multi of {len(checked)} ops without a cause")
        return [_op_result(op, result) for op, result in zip(checked, results, strict=True)]

    def _multi_applied(self, checked: Sequence[Op]) -> list[OpResult] | None:
        """The results of a multi that reached the server before the connection dropped, or None.

        Told only when each op's path is its own (a later op could have undone an earlier one's
        effect) and no create is sequential (its name is unknown): every create's node holds our data,
        every set's node our data at version + 1, every delete's node is gone, every check's node is
        at its version.
        """
        if len({op.path for op in checked}) < len(checked):
            return None
        results: list[OpResult] = []
        for op in checked:
            result: OpResult | bool
            if isinstance(op, CreateOp):
                result = None if op.sequential else self._created(op.path, op.data, op.ephemeral)
            elif isinstance(op, SetOp):
                result = self._set_applied(op.path, op.data, op.version)
            elif isinstance(op, DeleteOp):
                result = self.exists(op.path) is None
            else:
                stat = self.exists(op.path)
                result = stat is not None and op.version in (-1, stat.version)
            if result is None or result is False:
                return None
            results.append(None if result is True else result)
        return results

    # --- watches and sessions ---

    def watch_data(self, path: str, callback: DataCallback) -> Subscription:
        return self._watch("data", path, callback)

    def watch_children(self, path: str, callback: ChildrenCallback) -> Subscription:
        return self._watch("children", path, callback)

    def _watch(self, kind: str, path: str, callback: Callable[..., None]) -> Subscription:
        validate_path(path)
        self._check_open()
        watch = _Watch(self, kind, path, callback)
        with self._watches_lock:
            self._watches[watch.subscription] = watch
        try:
            watch.refresh(first=True)
        except BaseException:
            watch.subscription.cancel()
            raise
        return watch.subscription

    def _forget(self, subscription: Subscription) -> None:
        with self._watches_lock:
            self._watches.pop(subscription, None)

    def on_session_lost(self, callback: SessionCallback) -> Subscription:
        return self._session_lost.add(callback)

    def _on_state(self, state: str) -> None:
        # On kazoo's connection thread, which must not block: hand the work to the callback thread.
        if state == KazooState.LOST:
            self._lost = True
        elif state == KazooState.CONNECTED and self._lost and not self._closed:
            self._lost = False
            self._client.handler.dispatch_callback(Callback("session", self._after_session_lost, ()))

    def _after_session_lost(self) -> None:
        log.warning("ZooKeeper session expired; new session %#x", self.session_id)
        with self._watches_lock:
            watches = list(self._watches.values())
        for watch in watches:  # the old session's watches died with it: read and arm again
            watch.refresh()
        self._session_lost.call_all()

    def close(self) -> None:
        """End the session. Do not call it from a store callback (kazoo joins that thread)."""
        if self._closed:
            return
        self._closed = True
        with self._watches_lock:
            subscriptions = list(self._watches)
        for subscription in subscriptions:
            subscription.cancel()
        try:
            self._client.stop()
            self._client.close()
        except (KazooException, OSError) as exc:
            log.warning("closing ZooKeeper client: %s", exc)
