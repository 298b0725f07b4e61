"""A bookie's configuration: BookKeeper's bk_server.conf keys, overridden by command-line flags.

Pure: `load_config` (over `bkctl.properties`' parsed text) turns key/value pairs into a validated
`BookieConfig`. Keys bkctl does not know are kept in `unused_keys` (`bookie start` lists them once at
WARNING), so an operator can point `--conf` at the file a Java bookie used; keys whose value would change
what happens to data or who may connect, where bkctl cannot honour it, refuse (REFUSED_KEYS). Every bad
value raises UsageError naming the key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Final

from bkctl import limits
from bkctl.errors import UsageError
from bkctl.model import BookieId
from bkctl.protocol.properties import bool_key as _bool
from bkctl.protocol.properties import float_key as _float
from bkctl.protocol.properties import int_key as _int
from bkctl.sasl import SERVER_KEYS as SASL_KEYS
from bkctl.sasl import BookieSaslKeys, bookie_sasl_keys
from bkctl.server.rocksdb_settings import DEFAULT as DEFAULT_ROCKSDB
from bkctl.server.rocksdb_settings import KEYS as ROCKSDB_KEYS
from bkctl.server.rocksdb_settings import RocksDbSettings, rocksdb_settings
from bkctl.server.storage_kind import configured_kind
from bkctl.tls import SERVER_KEYS as TLS_KEYS
from bkctl.tls import TlsSettings, server_settings

log = logging.getLogger("bkctl.bookie")

MIB: Final = 1024 * 1024
DEFAULT_PORT: Final = 3181
DEFAULT_HOST: Final = "127.0.0.1"


@dataclass(frozen=True)
class BookieConfig:
    """Every setting of one bookie, in bkctl's units (ms, bytes); see docs/bookie.md for the keys."""

    port: int = DEFAULT_PORT
    bind_address: str | None = None  # None: 127.0.0.1, or all interfaces when an address is advertised
    advertised_address: str | None = None
    bookie_id: str | None = None
    metadata_uri: str | None = None  # None: --metadata / $BKCTL_METADATA / the embedded SQLite store
    http_port: int | None = None  # None: no admin HTTP endpoint
    http_host: str | None = None  # httpServerHost; None: the bookie's own listen address
    http_admin_enabled: bool = False  # httpServerAdminEnabled (bkctl): the endpoints that change things
    persist_bookie_status: bool = False  # persistBookieStatusEnabled: the operator's switch survives restarts
    stats_rollover_s: int = 60  # prometheusStatsLatencyRolloverSeconds: the op stats' quantile window
    journal_dirs: tuple[Path, ...] = (Path("/tmp/bk-txn"),)
    ledger_dirs: tuple[Path, ...] = (Path("/tmp/bk-data"),)
    index_dirs: tuple[Path, ...] | None = None  # None: the ledger directories
    storage: str = "interleaved"  # ledgerStorageClass: "interleaved" or "db" (server/ledger_storage.py)
    journal_max_group_wait_ms: float = 2.0
    journal_buffered_writes_threshold: int = 512 * 1024
    journal_buffered_entries_threshold: int = 0
    journal_flush_when_queue_empty: bool = True  # BookKeeper: false; see docs/bookie.md "group commit"
    journal_prealloc_size: int = 16 * MIB
    journal_max_size: int = 2048 * MIB
    journal_alignment: int = 512
    journal_max_backups: int = 5
    journal_sync_data: bool = True
    log_size_limit: int = 1024 * MIB
    flush_interval_ms: int = 10_000
    ledger_cache_pages_max: int = -1  # -1: the storage engine's default
    write_cache_max_bytes: int = -1  # -1: the storage engine's default
    db_write_cache_max_bytes: int = -1  # dbStorage_writeCacheMaxSizeMb: the db engine's, over the above
    db_read_cache_max_bytes: int = -1  # dbStorage_readAheadCacheMaxSizeMb (-1: the engine's default)
    db_read_ahead_batch: int = -1  # dbStorage_readAheadCacheBatchSize (-1: the engine's default)
    rocksdb: RocksDbSettings = DEFAULT_ROCKSDB  # dbStorage_rocksDB_*: the db engine's RocksDB tuning
    read_only: bool = False  # start (and stay) read-only
    read_only_mode_enabled: bool = True  # go read-only when the disks fill up (else stop the bookie)
    disk_usage_threshold: float = 0.95
    disk_usage_lwm_threshold: float = 0.90
    disk_check_interval_ms: int = 10_000
    frame_size_max: int = limits.FRAME_SIZE_MAX
    pending_adds_per_connection_max: int = limits.BOOKIE_PENDING_ADDS_PER_CONNECTION_MAX
    tcp_no_delay: bool = True  # Nagle off on client connections, as BookKeeper's serverTcpNoDelay
    zk_timeout_ms: int = limits.METADATA_SESSION_TIMEOUT_MS  # zkTimeout: the metadata session timeout
    zk_retry_backoff_start_ms: int = limits.METADATA_RETRY_BACKOFF_START_MS
    zk_retry_backoff_max_ms: int = limits.METADATA_RETRY_BACKOFF_MAX_MS
    metadata_retry_deadline_ms: int | None = None  # None: BKCTL_METADATA_TIMEOUT_MS, else the default
    # Garbage collection and compaction (server/gc.py; Java's defaults unless said otherwise).
    gc_wait_ms: int = 600_000  # 0: no periodic run (bkctl)
    minor_compaction_threshold: float = 0.2
    minor_compaction_interval_s: int = 3600
    major_compaction_threshold: float = 0.8
    major_compaction_interval_s: int = 86_400
    entry_location_compaction_interval_s: int = -1  # db engine; <= 0: off (Java's default)
    compaction_rate_by_entries: int = 100_000  # Java: 1000; 0 = unthrottled
    compaction_rate_by_bytes: int = 1_000_000
    throttle_by_bytes: bool = False
    verify_metadata_on_gc: bool = True  # Java: false
    force_gc_when_full: bool = True  # isForceGCAllowWhenNoSpace; Java: false
    gc_overreplicated_wait_ms: int = 86_400_000  # gcOverreplicatedLedgerWaitTime; 0: off
    tls: TlsSettings | None = None  # START_TLS (bkctl/tls.py): None answers it EBADREQ, as Java
    unused_keys: tuple[str, ...] = ()  # keys of the conf bkctl does not implement (warned at start)
    properties: tuple[tuple[str, str], ...] = ()  # the keys given, as given (admin HTTP server_config)

    def as_properties(self) -> dict[str, str]:
        """The keys given (conf file, then flags), secrets masked: Java's `conf.asJson()`."""
        return {key: "****" if "password" in key.lower() else value for key, value in self.properties}

    sasl: BookieSaslKeys | None = None  # SASL clients only (bkctl/sasl.py); None: any client is served

    @property
    def effective_index_dirs(self) -> tuple[Path, ...]:
        return self.index_dirs or self.ledger_dirs

    @property
    def listen_host(self) -> str:
        if self.bind_address:
            return self.bind_address
        return "0.0.0.0" if self.advertised_address else DEFAULT_HOST

    def resolved_bookie_id(self, port: int | None = None) -> str:
        """--bookie-id, else `<advertised address or 127.0.0.1>:<port>` (the port actually bound if given)."""
        if self.bookie_id:
            return self.bookie_id
        return f"{self.advertised_address or DEFAULT_HOST}:{self.port if port is None else port}"


# --- values -----------------------------------------------------------------------------------------


def _dirs(key: str, value: str) -> tuple[Path, ...]:
    """A comma-separated directory list (BookKeeper's list syntax); at least one, no duplicates."""
    parts = [p.strip() for p in value.split(",")]
    if not all(parts):
        raise UsageError(f"config key {key}: empty directory in {value!r}")
    paths = tuple(Path(p).expanduser() for p in parts)
    if len(set(paths)) != len(paths):
        raise UsageError(f"config key {key}: a directory is listed twice in {value!r}")
    return paths


bool_key = _bool


def _text(key: str, value: str) -> str:
    text = value.strip()
    if not text:
        raise UsageError(f"config key {key}: empty value")
    return text


def _port(key: str, value: str) -> int:
    return _int(key, value, 0, 65535)


def _mib(key: str, value: str) -> int:
    return _int(key, value, 1, 1 << 20) * MIB


Setter = Callable[[str, str], dict[str, Any]]


def _field(name: str, convert: Callable[[str, str], Any]) -> Setter:
    return lambda key, value: {name: convert(key, value)}


def _bookie_id(key: str, value: str) -> str:
    text = _text(key, value)
    try:
        BookieId.check_name(text)
    except UsageError as exc:
        raise UsageError(f"config key {key}: {exc}") from None
    return text


def _frame_size(key: str, value: str) -> int:
    size = _int(key, value, 1024, 1 << 30)
    if size > limits.FRAME_SIZE_MAX:
        # Java's default is 5 MiB + 10 KiB; a conf copied from a Java bookie must still start.
        log.info("config key %s: %d lowered to bkctl's frame limit %d", key, size, limits.FRAME_SIZE_MAX)
    return min(size, limits.FRAME_SIZE_MAX)


def _zk_servers(key: str, value: str) -> dict[str, Any]:
    hosts = ",".join(h.strip() for h in value.split(",") if h.strip())
    if not hosts:
        raise UsageError(f"config key {key}: empty value")
    return {"_zk_servers": hosts}


def _http_enabled(key: str, value: str) -> dict[str, Any]:
    return {"_http_enabled": _bool(key, value)}


# bk_server.conf key -> what it sets. Keys are case-sensitive, as in BookKeeper.
KEYS: Final[Mapping[str, Setter]] = {
    "bookiePort": _field("port", _port),
    "bindAddress": _field("bind_address", _text),
    "advertisedAddress": _field("advertised_address", _text),
    "bookieId": _field("bookie_id", _bookie_id),
    "metadataServiceUri": _field("metadata_uri", _text),
    "zkServers": _zk_servers,
    "zkLedgersRootPath": lambda key, value: {"_zk_root": _text(key, value)},
    "httpServerEnabled": _http_enabled,
    "httpServerPort": _field("http_port", _port),
    "httpServerHost": _field("http_host", _text),
    "httpServerAdminEnabled": _field("http_admin_enabled", _bool),
    "persistBookieStatusEnabled": _field("persist_bookie_status", _bool),
    "prometheusStatsLatencyRolloverSeconds": _field("stats_rollover_s", lambda k, v: _int(k, v, 1, 86_400)),
    "journalDirectories": _field("journal_dirs", _dirs),
    "journalDirectory": _field("journal_dirs", _dirs),
    "ledgerDirectories": _field("ledger_dirs", _dirs),
    "indexDirectories": _field("index_dirs", _dirs),
    "ledgerStorageClass": _field("storage", lambda k, v: configured_kind(_text(k, v))),
    "journalMaxGroupWaitMSec": _field("journal_max_group_wait_ms", lambda k, v: _float(k, v, 0, 60_000)),
    "journalBufferedWritesThreshold": _field(
        "journal_buffered_writes_threshold", lambda k, v: _int(k, v, 0, 1 << 30)
    ),
    "journalBufferedEntriesThreshold": _field(
        "journal_buffered_entries_threshold", lambda k, v: _int(k, v, 0, 1 << 30)
    ),
    "journalFlushWhenQueueEmpty": _field("journal_flush_when_queue_empty", _bool),
    "journalPreAllocSizeMB": _field("journal_prealloc_size", _mib),
    "journalMaxSizeMB": _field("journal_max_size", _mib),
    "journalAlignmentSize": _field("journal_alignment", lambda k, v: _alignment(k, v)),
    "journalMaxBackups": _field("journal_max_backups", lambda k, v: _int(k, v, 0, 1_000_000)),
    "journalSyncData": _field("journal_sync_data", _bool),
    "logSizeLimit": _field("log_size_limit", lambda k, v: _int(k, v, 1024 * 1024, (1 << 31) - 1)),
    "flushInterval": _field("flush_interval_ms", lambda k, v: _int(k, v, 1, 86_400_000)),
    "pageLimit": _field("ledger_cache_pages_max", lambda k, v: _int(k, v, -1, 1 << 30)),
    "skipListSizeLimit": _field("write_cache_max_bytes", lambda k, v: _int(k, v, 1024 * 1024, 1 << 40)),
    "dbStorage_writeCacheMaxSizeMb": _field("db_write_cache_max_bytes", _mib),
    "dbStorage_readAheadCacheMaxSizeMb": _field(
        "db_read_cache_max_bytes", lambda k, v: _int(k, v, 0, 1 << 20) * MIB
    ),
    "dbStorage_readAheadCacheBatchSize": _field("db_read_ahead_batch", lambda k, v: _int(k, v, 0, 1 << 20)),
    "forceReadOnlyBookie": _field("read_only", _bool),
    "readOnlyModeEnabled": _field("read_only_mode_enabled", _bool),
    "diskUsageThreshold": _field("disk_usage_threshold", lambda k, v: _float(k, v, 0.0, 1.0)),
    "diskUsageLwmThreshold": _field("disk_usage_lwm_threshold", lambda k, v: _float(k, v, 0.0, 1.0)),
    "diskCheckInterval": _field("disk_check_interval_ms", lambda k, v: _int(k, v, 10, 86_400_000)),
    "nettyMaxFrameSizeBytes": _field("frame_size_max", _frame_size),
    "serverTcpNoDelay": _field("tcp_no_delay", _bool),
    "zkTimeout": _field(
        "zk_timeout_ms",
        lambda k, v: _int(
            k, v, limits.METADATA_SESSION_TIMEOUT_MS_MIN, limits.METADATA_SESSION_TIMEOUT_MS_MAX
        ),
    ),
    "zkRetryBackoffStartMs": _field("zk_retry_backoff_start_ms", lambda k, v: _int(k, v, 1, 60_000)),
    "zkRetryBackoffMaxMs": _field("zk_retry_backoff_max_ms", lambda k, v: _int(k, v, 1, 600_000)),
    "metadataRetryDeadlineMs": _field(
        "metadata_retry_deadline_ms", lambda k, v: _int(k, v, 0, limits.METADATA_RETRY_DEADLINE_MS_MAX)
    ),
    "gcWaitTime": _field("gc_wait_ms", lambda k, v: _int(k, v, 0, 1 << 40)),
    "minorCompactionThreshold": _field("minor_compaction_threshold", lambda k, v: _float(k, v, -1.0, 1.0)),
    "minorCompactionInterval": _field("minor_compaction_interval_s", lambda k, v: _int(k, v, -1, 1 << 32)),
    "majorCompactionThreshold": _field("major_compaction_threshold", lambda k, v: _float(k, v, -1.0, 1.0)),
    "majorCompactionInterval": _field("major_compaction_interval_s", lambda k, v: _int(k, v, -1, 1 << 32)),
    "entryLocationCompactionInterval": _field(
        "entry_location_compaction_interval_s", lambda k, v: _int(k, v, -1, 1 << 32)
    ),
    "compactionRate": lambda k, v: {"_compaction_rate": _int(k, v, 0, 1 << 31)},
    "compactionRateByEntries": _field("compaction_rate_by_entries", lambda k, v: _int(k, v, 0, 1 << 31)),
    "compactionRateByBytes": _field("compaction_rate_by_bytes", lambda k, v: _int(k, v, 0, 1 << 40)),
    "isThrottleByBytes": _field("throttle_by_bytes", _bool),
    "verifyMetadataOnGC": _field("verify_metadata_on_gc", _bool),
    "isForceGCAllowWhenNoSpace": _field("force_gc_when_full", _bool),
    "gcOverreplicatedLedgerWaitTime": _field(
        "gc_overreplicated_wait_ms", lambda k, v: _int(k, v, 0, 1 << 40)
    ),
    "maxPendingAddsPerConnection": _field(
        "pending_adds_per_connection_max", lambda k, v: _int(k, v, 1, 1_000_000)
    ),
    # TLS keys are read together once all are known (bkctl.tls.server_settings checks them as a set).
    **{key: (lambda k, v: {f"_tls:{k}": v}) for key in TLS_KEYS},
    **{key: (lambda k, v: {f"_sasl:{k}": v}) for key in SASL_KEYS},
    **{key: (lambda k, v: {f"_rocksdb:{k}": v}) for key in ROCKSDB_KEYS},
}


def _alignment(key: str, value: str) -> int:
    size = _int(key, value, 512, 1 << 20)
    if size & (size - 1):
        raise UsageError(f"config key {key}: {size} is not a power of two")
    return size


# Keys whose value bkctl cannot honour and whose absence changes who may connect or where data goes:
# key -> the values that mean what bkctl does anyway. Any other non-empty value refuses the start.
REFUSED_KEYS: Final[Mapping[str, frozenset[str]]] = {
    "ensemblePlacementPolicy": frozenset(
        {
            "org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy",
            "org.apache.bookkeeper.client.RegionAwareEnsemblePlacementPolicy",
            "org.apache.bookkeeper.client.ZoneawareEnsemblePlacementPolicy",
            "org.apache.bookkeeper.client.DefaultEnsemblePlacementPolicy",
        }
    ),
}


def _refuse(key: str, value: str) -> None:
    accepted = REFUSED_KEYS[key]
    if value.strip() and value.strip() not in accepted:
        also = f" (bkctl does what {', '.join(sorted(accepted))} does)" if accepted else ""
        raise UsageError(
            f"config key {key}={value}: not implemented by bkctl{also}; refusing to start rather "
            "than change who may connect or where entries go; remove the key or run Java BookKeeper"
        )


def load_config(
    properties: Mapping[str, str] | None = None, overrides: Mapping[str, str] | None = None
) -> BookieConfig:
    """A validated config from bk_server.conf pairs, then `overrides` (same keys, from the flags)."""
    values: dict[str, Any] = {}
    unused: list[str] = []
    given: dict[str, str] = {}
    for source in (properties or {}, overrides or {}):
        for key, value in source.items():
            if key in REFUSED_KEYS:
                _refuse(key, value)
                continue
            given[key] = value
            setter = KEYS.get(key)
            if setter is None:
                unused.append(key)
                continue
            values.update(setter(key, value))
    values["unused_keys"] = tuple(sorted(set(unused)))
    values["properties"] = tuple(given.items())
    return _finish(values)


def _finish(values: dict[str, Any]) -> BookieConfig:
    zk_servers = values.pop("_zk_servers", None)
    zk_root = values.pop("_zk_root", "/ledgers")
    http_enabled = values.pop("_http_enabled", None)
    compaction_rate = values.pop("_compaction_rate", None)
    tls_keys = {key[5:]: values.pop(key) for key in list(values) if key.startswith("_tls:")}
    values["tls"] = server_settings(tls_keys)
    values["sasl"] = bookie_sasl_keys(
        {key[6:]: values.pop(key) for key in list(values) if key.startswith("_sasl:")}
    )
    values["rocksdb"] = rocksdb_settings(
        {key[9:]: values.pop(key) for key in list(values) if key.startswith("_rocksdb:")}
    )
    if compaction_rate is not None and "compaction_rate_by_entries" not in values:
        values["compaction_rate_by_entries"] = compaction_rate  # Java: the older key, when the newer is unset
    if values.get("metadata_uri") is None and zk_servers:
        # Older confs name ZooKeeper with zkServers + zkLedgersRootPath instead of metadataServiceUri.
        values["metadata_uri"] = f"zk://{zk_servers}/{zk_root.strip('/')}"
    if http_enabled is False:
        values["http_port"] = None
    elif http_enabled and "http_port" not in values:
        values["http_port"] = 8080  # BookKeeper's httpServerPort default
    if "disk_usage_lwm_threshold" not in values and "disk_usage_threshold" in values:
        values["disk_usage_lwm_threshold"] = min(
            BookieConfig.disk_usage_lwm_threshold, values["disk_usage_threshold"]
        )
    config = BookieConfig(**{f.name: values[f.name] for f in fields(BookieConfig) if f.name in values})
    return _validate(config)


def _validate(config: BookieConfig) -> BookieConfig:
    if config.disk_usage_lwm_threshold > config.disk_usage_threshold:
        raise UsageError(
            f"config key diskUsageLwmThreshold: {config.disk_usage_lwm_threshold} is above "
            f"diskUsageThreshold {config.disk_usage_threshold}"
        )
    if len(config.journal_dirs) > limits.JOURNAL_DIRS_MAX:
        raise UsageError(f"config key journalDirectories: more than {limits.JOURNAL_DIRS_MAX} directories")
    all_dirs = [*config.journal_dirs, *config.ledger_dirs]
    if len(set(all_dirs)) != len(all_dirs):
        raise UsageError("config keys journalDirectories and ledgerDirectories share a directory")
    if config.journal_prealloc_size % config.journal_alignment:
        raise UsageError("config key journalPreAllocSizeMB: not a multiple of journalAlignmentSize")
    elc_s = config.entry_location_compaction_interval_s
    if 0 < elc_s * 1000 < config.gc_wait_ms:  # Java refuses it too: the GC run is what checks it
        raise UsageError(
            f"config key entryLocationCompactionInterval: {elc_s} s is shorter than gcWaitTime "
            f"{config.gc_wait_ms} ms"
        )
    if config.bookie_id is None and config.advertised_address is not None:
        BookieId.parse(config.resolved_bookie_id())
    return config


def with_port(config: BookieConfig, port: int) -> BookieConfig:
    """The config with the port actually bound (after listening on port 0)."""
    return replace(config, port=port)
