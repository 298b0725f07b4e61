"""One bookie's life: metadata store, cookie check, storage replay, listen, register, serve, stop.

Start order (each step can refuse, and then nothing after it runs): open the metadata store; bind the
port (connections are refused until the storage is ready; binding first lets port 0 pick the port the
bookie id names); check the cookies (first start writes them); replay the journal (`Storage.start`);
accept connections; register under `available/` (or `available/readonly/`); admin HTTP. `stop` undoes
it in reverse, unregistering first so clients stop choosing this bookie before it goes away.

Metadata calls block, so they run in the reactor's thread pool; session-lost callbacks arrive on a
store thread and are handed back to the reactor with `callFromThread`. Opening the store is the one
call that can block for minutes (a ZooKeeper that is away), so it runs on a daemon thread of its own: a
stop during it (Ctrl-C) ends the process at once instead of joining the pool's thread at shutdown.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from twisted.internet import defer, task, threads
from twisted.internet.defer import Deferred
from twisted.internet.error import CannotListenError

from bkctl.errors import BkctlError, ConflictError, UnavailableError
from bkctl.metadata.at_stop import within_stop_wait
from bkctl.metadata.layout import Layout
from bkctl.metadata.retry import RetryPolicy
from bkctl.metadata.store import MetadataStore, parse_metadata_uri
from bkctl.metadata.stores import open_store
from bkctl.protocol import metadata_format as mf
from bkctl.sasl import bookie_sasl
from bkctl.server import bookie_status, cookies
from bkctl.server.cert_reload import CertificateReloader
from bkctl.server.config import BookieConfig
from bkctl.server.connection import NetworkMetrics
from bkctl.server.dirlock import DirectoryLocks, holder_text, lock_directories
from bkctl.server.gc import GcSettings
from bkctl.server.gc_dirs import Collector, collector_for
from bkctl.server.protocol import BookieFactory, deliver_durable, deliver_lost
from bkctl.server.replay import ReplayProgress
from bkctl.server.start_checks import check_index_files
from bkctl.server.storage import ReplayReport, Storage, StorageConfig
from bkctl.server.storage_kind import check_storage
from bkctl.tls import server_context

log = logging.getLogger("bkctl.bookie")

# How often a failed registration (e.g. the previous incarnation's session still holds the node) is
# retried, and for how long before the bookie gives up.
REGISTER_RETRY_S = 0.5  # local bound
REGISTER_ATTEMPTS_MAX = 120  # local bound


def storage_config(config: BookieConfig) -> StorageConfig:
    extra: dict[str, Any] = {}
    if config.ledger_cache_pages_max > 0:
        extra["ledger_cache_pages_max"] = config.ledger_cache_pages_max
    if config.write_cache_max_bytes > 0:
        extra["write_cache_max_bytes"] = config.write_cache_max_bytes
    if config.storage == "db" and config.db_write_cache_max_bytes > 0:
        extra["write_cache_max_bytes"] = config.db_write_cache_max_bytes  # Java's key for that engine
    if config.db_read_cache_max_bytes >= 0:
        extra["read_cache_max_bytes"] = config.db_read_cache_max_bytes
    if config.db_read_ahead_batch >= 0:
        extra["read_ahead_batch"] = config.db_read_ahead_batch
    return StorageConfig(
        journal_dirs=config.journal_dirs,
        ledger_dirs=config.ledger_dirs,
        index_dirs=config.index_dirs or (),
        journal_max_group_wait_ms=config.journal_max_group_wait_ms,
        journal_buffered_writes_threshold=config.journal_buffered_writes_threshold,
        journal_buffered_entries_threshold=config.journal_buffered_entries_threshold,
        journal_flush_when_queue_empty=config.journal_flush_when_queue_empty,
        journal_prealloc_size=config.journal_prealloc_size,
        journal_max_size=config.journal_max_size,
        journal_alignment=config.journal_alignment,
        journal_max_backups=config.journal_max_backups,
        journal_sync_data=config.journal_sync_data,
        log_size_limit=config.log_size_limit,
        flush_interval_ms=config.flush_interval_ms,
        disk_usage_threshold=config.disk_usage_threshold,
        disk_usage_lwm_threshold=config.disk_usage_lwm_threshold,
        read_only=config.read_only,
        engine=config.storage,
        rocksdb=config.rocksdb,
        **extra,
    )


def gc_settings(config: BookieConfig) -> GcSettings:
    return GcSettings(
        wait_ms=config.gc_wait_ms,
        minor_threshold=config.minor_compaction_threshold,
        minor_interval_s=config.minor_compaction_interval_s,
        major_threshold=config.major_compaction_threshold,
        major_interval_s=config.major_compaction_interval_s,
        entry_location_interval_s=config.entry_location_compaction_interval_s,
        rate_entries=config.compaction_rate_by_entries,
        rate_bytes=config.compaction_rate_by_bytes,
        throttle_by_bytes=config.throttle_by_bytes,
        verify_metadata=config.verify_metadata_on_gc,
        force_when_full=config.force_gc_when_full,
        overreplicated_wait_ms=config.gc_overreplicated_wait_ms,
    )


def retry_policy(config: BookieConfig) -> RetryPolicy:
    """The bookie's ride through metadata outages: its keys, else the environment's deadline."""
    deadline = config.metadata_retry_deadline_ms
    return RetryPolicy(
        deadline_ms=RetryPolicy.from_env().deadline_ms if deadline is None else deadline,
        backoff_start_ms=config.zk_retry_backoff_start_ms,
        backoff_max_ms=config.zk_retry_backoff_max_ms,
    )


class BookieService:
    """A bookie on the reactor. `start()` fires with the service once it serves; `stop()` is idempotent."""

    def __init__(
        self,
        config: BookieConfig,
        metadata_uri: str,
        reactor: Any = None,
        store_opener: Callable[[str], MetadataStore] | None = None,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.config = config
        self.metadata_uri = metadata_uri
        self._reactor = reactor
        self._store_opener = store_opener or partial(
            open_store,
            session_timeout_ms=config.zk_timeout_ms,
            retry=retry_policy(config),
            wait_for_server=True,  # started while ZooKeeper is away: up when it is back
        )
        self._storage_config = storage_config(config)  # validate before anything starts
        # Before any file is written: a storage bkctl does not serve, in the conf or in the directories.
        check_storage(config.storage, (*config.ledger_dirs, *config.effective_index_dirs))
        self.storage: Storage | None = None
        self.gc: Collector | None = None
        self.factory = BookieFactory(
            _NotReady(),
            config.frame_size_max,
            config.pending_adds_per_connection_max,
            config.tcp_no_delay,
            tls_context=server_context(config.tls) if config.tls else None,  # bad files fail here
            tls_required=config.tls.required if config.tls else False,
            sasl=bookie_sasl(config.sasl) if config.sasl else None,  # the JAAS file is read here
        )
        self.factory.ready = False
        self.store: MetadataStore | None = None
        self.layout: Layout | None = None
        self.bookie_id = ""
        self.port = 0
        self.http_port: int | None = None
        self.extra_metrics: list[Callable[[], Iterator[str]]] = []  # see server/http.py
        # admin HTTP ledger/read and sanity (server/admin_bookie.py): set by whoever runs the bookie
        self.entry_reader: Any = None
        self.sanity_check: Any = None
        self.bookie_infos: Any = None  # list_bookie_info: {bookie: (free, total)} of the writable bookies
        self.state = "starting"
        self.replay: ReplayReport | None = None
        self.replay_progress: ReplayProgress | None = None  # told the journal bytes replayed on start
        self.registered_read_only: bool | None = None
        self._listener: Any = None
        self._http_listener: Any = None
        self._watcher: task.LoopingCall | None = None
        self._reloader: CertificateReloader | None = None  # tlsCertFilesRefreshDurationSeconds
        self._session_sub: Any = None
        self._stopping: Deferred[None] | None = None
        self._locks: DirectoryLocks | None = None

    # --- start ----------------------------------------------------------------------------------

    @defer.inlineCallbacks
    def start(self) -> Any:
        try:
            yield self._start()
        except GeneratorExit:
            raise  # the reactor is gone (a stop during start): nothing is left to wait on
        except BaseException:
            yield self._cleanup_failed_start()
            raise
        return self

    @defer.inlineCallbacks
    def _start(self) -> Any:
        # Before anything reads or writes a directory: a second bookie there loses acknowledged entries.
        self._locks = lock_directories(cookies.labelled_dirs(self.config), holder_text("bkctl bookie start"))
        check_index_files(self.config.effective_index_dirs, self.config.ledger_dirs)
        location = parse_metadata_uri(self.metadata_uri)
        self.store = yield self._in_daemon_thread(self._store_opener, self.metadata_uri)
        if self._stopping is not None:
            self.store.close()  # stopped while the store was opening: go no further
            raise UnavailableError("bookie start: stopped before the metadata store answered")
        self.layout = Layout(self.store, location.root)
        self._listener = self._listen(self.config.port, self.factory)
        self.port = self._listener.getHost().port
        self.bookie_id = self.config.resolved_bookie_id(self.port)
        yield self._in_thread(cookies.check_cookies, self.config, self.layout, self.bookie_id)
        self.storage = Storage(self._storage_config, deliver_durable, self._reactor, deliver_lost)
        self.storage.metrics.rollover(self.config.stats_rollover_s)
        self.factory.metrics.read_latency.window_s = self.config.stats_rollover_s
        self.replay = self.storage.start(self.replay_progress)
        if self.config.persist_bookie_status and not self.config.read_only:
            persisted = yield self._in_thread(bookie_status.read_status, self.config.ledger_dirs)
            if persisted:
                log.warning("bookie %s: read-only, as its operator left it (BOOKIE_STATUS)", self.bookie_id)
                self.storage.set_read_only(True)
        self.factory.storage = self.storage
        self.factory.ready = True
        self.state = "read-only" if self.storage.read_only else "read-write"
        if self.config.http_port is not None:
            self._start_http()  # before registering: the service info names its port
        yield self._register_at_start()
        self._session_sub = self.store.on_session_lost(self._session_lost_from_thread)
        self.gc = collector_for(
            self.storage, self.layout, gc_settings(self.config), self._reactor, self._gc_done, self.bookie_id
        )
        self.gc.start()
        tls = self.config.tls
        if tls is not None and tls.refresh_s > 0:
            self._reloader = CertificateReloader(tls, self._use_tls_context, self._reactor, tls.refresh_s)
            self._reloader.start()
        self._watcher = task.LoopingCall(self._check_read_only)
        self._watcher.clock = self._reactor
        self._watcher.start(self.config.disk_check_interval_ms / 1000.0, now=False).addErrback(
            lambda f: log.error("read-only watcher failed: %s", f.getErrorMessage())
        )

    def _use_tls_context(self, context: Any) -> None:
        self.factory.tls_context = context  # the next START_TLS takes it

    def _start_http(self) -> None:
        from twisted.web.server import Site

        from bkctl.server.http import admin_resource

        assert self.config.http_port is not None
        site_class: Any = Site
        site = site_class(admin_resource(self))
        site.noisy = False
        host = self.config.http_host or self.config.listen_host
        self._http_listener = self._listen(self.config.http_port, site, "admin http ", host)
        self.http_port = self._http_listener.getHost().port

    def _listen(self, port: int, factory: Any, what: str = "", host: str | None = None) -> Any:
        host = host or self.config.listen_host
        try:
            return self._reactor.listenTCP(port, factory, interface=host)
        except CannotListenError as exc:
            reason = exc.socketError.strerror if isinstance(exc.socketError, OSError) else exc.socketError
            raise UnavailableError(f"cannot listen on {what}port {host}:{port}: {reason}") from None

    def _in_thread(self, function: Callable[..., Any], *args: Any) -> Deferred[Any]:
        return threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(), function, *args)

    def _in_daemon_thread(self, function: Callable[..., Any], *args: Any) -> Deferred[Any]:
        """`function(*args)` on a daemon thread: the process may exit while it still blocks."""
        done: Deferred[Any] = Deferred()

        def run() -> None:
            try:
                result = function(*args)
            except BaseException as exc:  # handed to the reactor, which re-raises it in `_start`
                self._reactor.callFromThread(done.errback, exc)
            else:
                self._reactor.callFromThread(done.callback, result)

        threading.Thread(target=run, name="bkctl-store-open", daemon=True).start()
        return done

    # --- registration ---------------------------------------------------------------------------

    def service_info(self) -> mf.BookieServiceInfo:
        host = self.bookie_id.rpartition(":")[0] or self.config.listen_host
        endpoints = [mf.BookieEndpoint("bookie", self.port, host, "bookie-rpc")]
        if self.http_port is not None:
            endpoints.append(mf.BookieEndpoint("http-server", self.http_port, host, "http"))
        return mf.BookieServiceInfo(tuple(endpoints))

    def _register_once(self) -> Deferred[Any]:
        assert self.layout is not None and self.storage is not None
        read_only = self.storage.read_only
        registered = self._in_thread(self._register_blocking, read_only)

        def done(_: object) -> None:
            self.registered_read_only = read_only
            log.info("bookie %s registered %s", self.bookie_id, "read-only" if read_only else "read-write")

        return registered.addCallback(done)

    def _register_blocking(self, read_only: bool) -> None:
        assert self.layout is not None
        self.layout.register_bookie(self.bookie_id, self.service_info(), readonly=read_only)

    @defer.inlineCallbacks
    def _register_at_start(self) -> Any:
        """One attempt; if a previous incarnation's session still holds the node (kill -9), keep
        serving and retry in the background until that session expires."""
        try:
            yield self._register_once()
        except ConflictError as exc:
            log.warning("bookie %s: %s; retrying until that session expires", self.bookie_id, exc)
            self._register().addErrback(self._log_failure, "registration")

    @defer.inlineCallbacks
    def _register(self) -> Any:
        """Register (rw or ro) with an ephemeral node, retrying while another session holds it."""
        for _ in range(REGISTER_ATTEMPTS_MAX):
            if self._stopping is not None:
                return None
            try:
                yield self._register_once()
            except ConflictError:
                yield task.deferLater(self._reactor, REGISTER_RETRY_S, lambda: None)
                continue
            return None
        raise UnavailableError(f"bookie {self.bookie_id}: could not register in the metadata store")

    @staticmethod
    def _log_failure(failure: Any, what: str) -> None:
        log.error("bookie: %s failed: %s", what, failure.getErrorMessage())

    def _session_lost_from_thread(self) -> None:
        self._reactor.callFromThread(self._session_lost)

    def _session_lost(self) -> None:
        if self._stopping is not None:
            return
        log.warning("bookie %s: metadata session lost; registering again", self.bookie_id)
        self._register().addErrback(self._log_failure, "re-registration")

    def _check_read_only(self) -> Deferred[Any] | None:
        """Follow the storage's read-only state (disk full, journal failure, set_read_only)."""
        storage = self.storage
        if storage is None or self._stopping is not None:
            return None
        try:
            storage.check_disk_usage()
        except OSError as exc:
            log.error("bookie %s: disk usage check failed: %s", self.bookie_id, exc)
        read_only = storage.read_only
        self.state = "read-only" if read_only else "read-write"
        if read_only == self.registered_read_only:
            return None
        if read_only and not self.config.read_only_mode_enabled and not self.config.read_only:
            log.error(
                "bookie %s: storage turned read-only and readOnlyModeEnabled=false: stopping", self.bookie_id
            )
            self._reactor.callLater(0, self._reactor.stop)
            return None
        return self._register().addErrback(self._log_failure, "registration")

    def _gc_done(self) -> None:
        """A GC run may have freed enough space to be writable again: check now, not at the next tick."""
        if self._stopping is None:
            self._check_read_only()

    def set_read_only(self, read_only: bool) -> Deferred[Any] | None:
        """Turn the bookie read-only (or back) now, and move its registration."""
        assert self.storage is not None
        self.storage.set_read_only(read_only)
        return self._check_read_only()

    def read_only_forced_by(self) -> str | None:
        """Why the bookie is read-only whatever its operator says (None: it is not, or by choice)."""
        storage = self.storage
        if self.config.read_only:
            return "forceReadOnlyBookie=true in the config"
        if storage is not None and storage.disk_full:
            return "a disk is above diskUsageThreshold"
        if storage is not None and storage.read_only and not storage.manual_read_only:
            return "a journal cannot be written"
        return None

    def switch_read_only(self, read_only: bool, persist: bool = False) -> Deferred[Any]:
        """The operator's switch (admin HTTP): the registration moves before the answer; kept across
        restarts when asked or persistBookieStatusEnabled=true (bookie_status.py)."""
        assert self.storage is not None
        log.warning("bookie %s: %s by its operator", self.bookie_id, "read-only" if read_only else "writable")
        moved = self.set_read_only(read_only)
        done = defer.succeed(None) if moved is None else moved
        if persist or self.config.persist_bookie_status:
            dirs = self.config.ledger_dirs
            done.addCallback(lambda _: self._in_thread(bookie_status.write_status, dirs, read_only))
        return done

    @property
    def ready(self) -> bool:
        """Java's is_ready: the journal is replayed and the bookie registered, and it is not stopping."""
        return self.registered_read_only is not None and self._stopping is None

    # --- stop -----------------------------------------------------------------------------------

    def stop(self) -> Deferred[None]:
        if self._stopping is None:
            self._stopping = defer.ensureDeferred(self._stop())
        return self._stopping

    async def _stop(self) -> None:
        self.state = "stopping"
        if self._watcher is not None and self._watcher.running:
            self._watcher.stop()
        if self._reloader is not None:
            self._reloader.stop()
        if self._session_sub is not None:
            self._session_sub.cancel()
        if self.gc is not None:
            self.gc.stop()
        await self._unregister_at_stop()
        self.factory.ready = False
        for listener in (self._listener, self._http_listener):
            if listener is not None:
                await self._quietly("stop listening", listener.stopListening())
        self.factory.close_all()
        if self.storage is not None:
            await self._quietly("storage stop", self.storage.stop())
        if self.store is not None:
            await self._quietly("metadata close", self._in_thread(self.store.close))
        if self._locks is not None:
            self._locks.release()  # last: the next bookie on these directories may start now
        self.state = "stopped"
        log.info("bookie %s stopped", self.bookie_id or "(not started)")

    async def _unregister_at_stop(self) -> None:
        """Unregister; a metadata store that does not answer does not hold back the journal's drain and
        the last checkpoint (metadata/at_stop.py)."""
        unregistered = self._unregister()
        if unregistered is not None:
            await within_stop_wait(unregistered, "bookie stop: unregister", self._reactor, log)

    def _unregister(self) -> Deferred[Any] | None:
        if self.layout is None or self.registered_read_only is None or not self.bookie_id:
            return None
        return self._in_thread(self.layout.unregister_bookie, self.bookie_id)

    async def _quietly(self, what: str, result: Any) -> None:
        try:
            if isinstance(result, Deferred):
                await result
        except BkctlError as exc:
            log.error("bookie stop: %s failed: %s", what, exc)
        except Exception:
            log.exception("bookie stop: %s failed", what)

    @defer.inlineCallbacks
    def _cleanup_failed_start(self) -> Any:
        try:
            yield self.stop()
        except Exception:
            log.exception("cleanup after a failed start")

    # --- info -----------------------------------------------------------------------------------

    @property
    def network_metrics(self) -> NetworkMetrics:
        return self.factory.metrics

    def info(self) -> dict[str, Any]:
        storage: dict[str, Any] = self.storage.info() if self.storage is not None else {}
        return {
            "id": self.bookie_id,
            "state": self.state,
            "port": self.port,
            "http_port": self.http_port,
            "metadata": self.metadata_uri,
            "registered_read_only": self.registered_read_only,
            "disk_usage": disk_usage(self.config),
            "connections": self.factory.metrics.connections_open,
            "gc_unindexed_kept": list(self.gc.unindexed_kept) if self.gc is not None else [],
            **storage,
        }


def disk_usage(config: BookieConfig) -> dict[str, dict[str, float]]:
    """Per directory: total and free bytes and the used fraction (what the threshold compares)."""
    import shutil

    usage = {}
    for directory in cookies.all_dirs(config):
        try:
            du = shutil.disk_usage(directory)
        except OSError:
            continue
        usage[str(directory)] = {
            "total_bytes": du.total,
            "free_bytes": du.free,
            "used_fraction": round(du.used / du.total, 4) if du.total else 0.0,
        }
    return usage


class _NotReady:
    """The factory's storage before replay finished; never called (the factory refuses connections)."""

    def add(self, *args: object) -> int:
        raise AssertionError("bookie not ready")

    def fence(self, *args: object) -> int:
        raise AssertionError("bookie not ready")

    def read(self, *args: object) -> tuple[int, bytes]:
        raise AssertionError("bookie not ready")

    def entry_availability(self, *args: object) -> Deferred[tuple[int, bytes]]:
        raise AssertionError("bookie not ready")

    # The v3 operations' (server/protocol_v3.py), never called either.
    def explicit_lac(self, *args: object) -> bytes | None:
        raise AssertionError("bookie not ready")

    def is_fenced(self, *args: object) -> bool:
        raise AssertionError("bookie not ready")

    def write_lac(self, *args: object) -> int:
        raise AssertionError("bookie not ready")

    def force_ledger(self, *args: object) -> int:
        raise AssertionError("bookie not ready")

    def last_add_confirmed(self, *args: object) -> tuple[int, int]:
        raise AssertionError("bookie not ready")

    def watch_lac(self, *args: object) -> bool:
        raise AssertionError("bookie not ready")

    def unwatch_lac(self, *args: object) -> None:
        raise AssertionError("bookie not ready")

    def disk_space(self) -> tuple[int, int]:
        raise AssertionError("bookie not ready")
