"""The bookie's admin HTTP server (twisted.web) on Java's HttpRouter paths: /heartbeat, /metrics,
/api/v1/bookie/info, Java's garbage collection endpoints /api/v1/bookie/gc (PUT triggers, GET says
whether one runs), gc_details and list_disk_file here; the others in server/admin_bookie.py and
admin/autorecovery.py, on the shared rules of admin/http_endpoint.py.

/metrics is Prometheus text format 0.0.4. Everything is read from plain counters on the reactor
thread (StorageMetrics, NetworkMetrics), so a scrape costs the bookie a few microseconds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from twisted.internet import threads

from bkctl.admin.autorecovery import autorecovery_resource
from bkctl.admin.http_endpoint import (
    Endpoint,
    Heartbeat,
    PathNode,
    answer_when_done,
    json_answer,
    json_body,
    param,
    path_node,
    put,
    text,
)
from bkctl.protocol.prometheus import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from bkctl.protocol.prometheus import label as _label
from bkctl.protocol.prometheus import metric
from bkctl.protocol.prometheus import number as _number
from bkctl.protocol.wire import rc_name
from bkctl.server import admin_bookie as ab
from bkctl.server.admin_bookie import NOT_SERVING, AdminView
from bkctl.server.connection import NetworkMetrics
from bkctl.server.gc_dirs import Collector
from bkctl.server.java_metrics import bookie_lines
from bkctl.server.metrics import FSYNC_BUCKETS_MS
from bkctl.server.storage import Storage


class BookieView(AdminView, Protocol):
    """What the endpoints read of a BookieService."""

    # More metrics from what runs in the same process (the autorecovery daemon of `--autorecovery`).
    extra_metrics: list[Callable[[], Iterator[str]]]

    def info(self) -> dict[str, Any]: ...

    @property
    def network_metrics(self) -> NetworkMetrics: ...


class _Leaf(Endpoint):
    def __init__(self, bookie: BookieView) -> None:
        Endpoint.__init__(self)
        self.bookie = bookie


class Info(_Leaf):
    """Java's `{"freeSpace": ..., "totalSpace": ...}` (the ledger disks), with bkctl's fields added."""

    wrong_method = "Only GET is supported."

    def on_GET(self, request: Any) -> bytes:
        info = self.bookie.info()
        storage = self.bookie.storage
        if storage is not None:
            total, free = storage.disk_space()
            info = {"freeSpace": free, "totalSpace": total, **info}
        return json_answer(request, info)


class Metrics(_Leaf):
    wrong_method, wrong_method_code = "Forbidden. Should be GET method", 403

    def on_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", PROMETHEUS_CONTENT_TYPE)
        extra = (line for lines in self.bookie.extra_metrics for line in lines())
        return "".join([*prometheus_lines(self.bookie), *extra]).encode()


class Gc(_Leaf):
    """PUT triggers a run (body `{"forceMajor": true}` / `{"forceMinor": true}`, as Java's); with
    `?wait=true` (bkctl) the answer is the run's report once it is done. GET: `{"is_in_force_gc": ...}`.
    Its sub-paths are Java's suspend_compaction and resume_compaction, and nothing else."""

    wrong_method = "Not found method. Should be PUT to trigger GC, Or GET to get Force GC state."

    def on_GET(self, request: Any) -> bytes:
        gc = self.bookie.gc
        if gc is None:
            return text(request, NOT_SERVING, 503)
        return json_answer(request, {"is_in_force_gc": str(gc.running and gc.forced).lower()})

    def on_PUT(self, request: Any) -> Any:
        gc = self.bookie.gc
        if gc is None:
            return text(request, NOT_SERVING, 503)
        try:
            options = json_body(request) or {}
            if not isinstance(options, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as exc:
            return text(request, f"bad request body: {exc}", 400)
        major, minor = bool(options.get("forceMajor")), bool(options.get("forceMinor"))
        run = gc.trigger(force_major=major, force_minor=minor)
        if param(request, "wait") not in ("true", "1"):
            run.addErrback(lambda failure: None)  # logged by the collector
            return json_answer(request, f"Triggered GC on BookieServer: {self.bookie.bookie_id}")
        return answer_when_done(request, run)


class EntryLocationCompact(_Leaf):
    """Java's entry location compaction (DbLedgerStorage): PUT with `{"entryLocationRocksDBCompact": true}`
    compacts the locations db (`?wait=true`: answers when done); GET: `{ledger dir: compacting}`."""

    wrong_method = (
        "Not found method. Should be PUT to trigger entry location compaction, or GET to get its state."
    )

    def on_GET(self, request: Any) -> bytes:
        storage = self.bookie.storage
        if storage is None:
            return text(request, NOT_SERVING, 503)
        return json_answer(request, storage.entry_locations_compacting())

    def on_PUT(self, request: Any) -> Any:
        storage = self.bookie.storage
        if storage is None:
            return text(request, NOT_SERVING, 503)
        try:
            options = json_body(request) or {}
            if not isinstance(options, dict) or options.get("entryLocationRocksDBCompact") is not True:
                raise ValueError('expected {"entryLocationRocksDBCompact": true}')
        except ValueError as exc:
            return text(request, f"bad request body: {exc}", 400)
        run = storage.compact_entry_locations()
        if run is None:
            return text(request, "entry location compaction needs db storage (DbLedgerStorage)", 400)
        if param(request, "wait") in ("true", "1"):
            return answer_when_done(request, run.addCallback(lambda started: {"compacted": started}))
        run.addErrback(lambda failure: None)  # the index logs a failed compaction
        return json_answer(
            request, f"Triggered entry location compaction on BookieServer: {self.bookie.bookie_id}"
        )


class GcDetails(_Leaf):
    """Java's list of GarbageCollectionStatus (one ledger storage), with bkctl's fields added."""

    wrong_method = (
        "Only support GET method to retrieve GC details."
        " If you want to trigger gc, send a POST to gc endpoint."
    )

    def on_GET(self, request: Any) -> bytes:
        gc = self.bookie.gc
        if gc is None:
            return text(request, NOT_SERVING, 503)
        return json_answer(request, [gc.details()])


# Java's list_disk_file: file_type -> (answer key, file suffix).
DISK_FILE_KINDS = {
    "journal": ("journal files", ".txn"),
    "entrylog": ("entrylog files", ".log"),
    "index": ("index files", ".idx"),
}


class ListDiskFiles(_Leaf):
    """Java's `{"journal files": "name\t...", "entrylog files": ..., "index files": ...}`, or one of them
    with `?file_type=journal|entrylog|index`; the directory walk runs in a pool thread."""

    def on_GET(self, request: Any) -> Any:
        wanted = param(request, "file_type") or ""
        kinds = [wanted] if wanted in DISK_FILE_KINDS else list(DISK_FILE_KINDS)
        config = self.bookie.config
        dirs = {
            "journal": config.journal_dirs,
            "entrylog": config.ledger_dirs,
            "index": config.effective_index_dirs,
        }
        listed = threads.deferToThread(lambda: {DISK_FILE_KINDS[k][0]: disk_files(dirs[k], k) for k in kinds})
        return answer_when_done(request, listed)


def disk_files(directories: Iterable[Path], kind: str) -> str:
    """The names of a kind's files under the directories (recursively), sorted, tab-terminated as Java's."""
    suffix = DISK_FILE_KINDS[kind][1]
    names = []
    for directory in directories:
        for _root, _dirs, files in os.walk(directory):
            names += [name for name in files if name.endswith(suffix)]
    return "".join(f"{name}\t" for name in sorted(names))


def admin_resource(bookie: BookieView) -> Any:
    """The resource tree (Java's HttpRouter paths); typed Any because twisted.web's zope interfaces do
    not type-check."""
    admin = lambda: bookie.config.http_admin_enabled  # noqa: E731
    root = PathNode()
    put(root, b"heartbeat", Heartbeat())
    put(root, b"metrics", Metrics(bookie))
    v1 = path_node(root, b"api", b"v1")
    config = path_node(v1, b"config")
    put(config, b"server_config", ab.ServerConfig(bookie))
    ledger = path_node(v1, b"ledger")
    put(ledger, b"delete", ab.DeleteLedger(bookie))
    put(ledger, b"list", ab.ListLedgers(bookie))
    put(ledger, b"metadata", ab.LedgerMetadataEndpoint(bookie))
    put(ledger, b"read", ab.ReadLedgerEntries(bookie))
    node = path_node(v1, b"bookie")
    gc = Gc(bookie)
    put(gc, b"suspend_compaction", ab.SuspendCompaction(bookie))
    put(gc, b"resume_compaction", ab.ResumeCompaction(bookie))
    state = ab.State(bookie)
    put(state, b"readonly", ab.ReadOnly(bookie))
    children = {
        b"info": Info(bookie),
        b"gc": gc,
        b"gc_details": GcDetails(bookie),
        b"entry_location_compact": EntryLocationCompact(bookie),
        b"list_disk_file": ListDiskFiles(bookie),
        b"list_bookies": ab.ListBookies(bookie),
        b"last_log_mark": ab.LastLogMark(bookie),
        b"state": state,
        b"is_ready": ab.IsReady(bookie),
        b"sanity": ab.Sanity(bookie),
        b"cluster_info": ab.ClusterInfo(bookie),
        b"list_bookie_info": ab.ListBookieInfo(bookie),
        b"expand_storage": ab.ExpandStorage(bookie),
    }
    for name, child in children.items():
        put(node, name, child)
    recoveries: Any = lambda: bookie.entry_reader  # noqa: E731  (the same ledger client: bookie_server.py)
    put(v1, b"autorecovery", autorecovery_resource(lambda: bookie.layout, admin, recoveries))
    for endpoint in _walk(root):
        endpoint.admin_enabled = admin
    return root


def _walk(node: Any) -> Iterator[Any]:
    yield node
    for child in node.children.values():
        yield from _walk(child)


def prometheus_lines(bookie: BookieView) -> Iterator[str]:
    """Every metric of the bookie, in Prometheus text format: Java's names, then bkctl's own."""
    net = bookie.network_metrics
    yield from bookie_lines(bookie.state == "read-write", bookie.storage, bookie.gc, net)
    read_only = 1 if bookie.state == "read-only" else 0
    yield from metric(
        "bkctl_bookie_info", "gauge", "Bookie identity.", 1, f'{{id="{_label(bookie.bookie_id)}"}}'
    )
    yield from metric("bkctl_bookie_read_only", "gauge", "1 when the bookie refuses adds.", read_only)
    yield from metric("bkctl_bookie_connections", "gauge", "Open client connections.", net.connections_open)
    yield from metric(
        "bkctl_bookie_connections_total", "counter", "Client connections accepted.", net.connections_total
    )
    yield from metric(
        "bkctl_bookie_frames_rejected_total",
        "counter",
        "Connections closed for an unframeable input.",
        net.frames_rejected,
    )
    yield from metric(
        "bkctl_bookie_bad_requests_total", "counter", "Requests answered EBADREQ.", net.bad_requests
    )
    yield from metric(
        "bkctl_bookie_tls_handshakes_total", "counter", "Connections switched to TLS.", net.tls_handshakes
    )
    yield from metric(
        "bkctl_bookie_tls_handshake_failures_total",
        "counter",
        "TLS handshakes that failed (logged with the peer).",
        net.tls_handshake_failures,
    )
    yield from metric(
        "bkctl_bookie_tls_required_refusals_total",
        "counter",
        "Requests answered EUA before the TLS handshake (tlsRequired).",
        net.tls_required_refusals,
    )
    yield from metric(
        "bkctl_bookie_sasl_refusals_total",
        "counter",
        "Connections refused by SASL authentication (logged with the peer and why).",
        net.sasl_refusals,
    )
    yield from metric(
        "bkctl_bookie_sasl_unauthenticated_requests_total",
        "counter",
        "Requests answered EUA before the client authenticated (SASL on).",
        net.sasl_unauthenticated_requests,
    )
    yield from metric(
        "bkctl_bookie_read_pauses_total",
        "counter",
        "Times a connection stopped being read (backpressure).",
        net.read_pauses,
    )
    storage = bookie.storage
    if storage is not None:
        yield from _storage_lines(storage)
    if bookie.gc is not None:
        yield from _gc_lines(bookie.gc)


# name, kind, help, GcMetrics attribute
_GC_METRICS = (
    ("bkctl_bookie_gc_runs_total", "counter", "Garbage collection runs.", "runs"),
    (
        "bkctl_bookie_gc_ledgers_deleted_total",
        "counter",
        "Ledgers deleted (not in metadata).",
        "ledgers_deleted",
    ),
    (
        "bkctl_bookie_gc_overreplicated_ledgers_deleted_total",
        "counter",
        "Over-replicated ledgers deleted (metadata names another bookie).",
        "overreplicated_deleted",
    ),
    (
        "bkctl_bookie_gc_entry_logs_removed_total",
        "counter",
        "Entry logs removed (no live entry).",
        "logs_removed",
    ),
    ("bkctl_bookie_gc_entry_logs_compacted_total", "counter", "Entry logs compacted.", "logs_compacted"),
    ("bkctl_bookie_gc_entries_moved_total", "counter", "Live entries copied by compaction.", "entries_moved"),
    (
        "bkctl_bookie_gc_bytes_reclaimed_total",
        "counter",
        "Disk bytes freed by GC.",
        "bytes_reclaimed",
    ),
    ("bkctl_bookie_gc_seconds_total", "counter", "Time spent in GC runs.", "seconds_total"),
    ("bkctl_bookie_gc_last_run_seconds", "gauge", "Duration of the last GC run.", "last_seconds"),
    (
        "bkctl_bookie_gc_unindexed_ledgers_kept",
        "gauge",
        "Ledgers whose entry log records GC kept though no index names them (last run).",
        "unindexed_kept",
    ),
)


def _gc_lines(gc: Collector) -> Iterator[str]:
    for name, kind, help_text, attribute in _GC_METRICS:
        yield from metric(name, kind, help_text, getattr(gc.metrics, attribute))
    name = "bkctl_bookie_gc_live_fraction"
    yield f"# HELP {name} Live share of the entry logs per ledger dir (last run).\n# TYPE {name} gauge\n"
    for directory, fraction in sorted(gc.metrics.live_fraction.items()):
        yield f'{name}{{dir="{_label(directory)}"}} {_number(fraction)}\n'


def _storage_lines(storage: Storage) -> Iterator[str]:
    m = storage.metrics
    yield from metric("bkctl_bookie_adds_total", "counter", "Adds accepted into the journal.", m.adds)
    yield from metric("bkctl_bookie_reads_total", "counter", "Read requests.", m.reads)
    yield from metric("bkctl_bookie_fences_total", "counter", "Fencing requests.", m.fences)
    yield from metric(
        "bkctl_bookie_bytes_written_total", "counter", "Entry bytes of accepted adds.", m.bytes_written
    )
    yield from metric("bkctl_bookie_journal_fsyncs_total", "counter", "Journal fdatasyncs.", m.fsyncs)
    yield from metric(
        "bkctl_bookie_journal_synced_entries_total",
        "counter",
        "Entries made durable (divide by fsyncs).",
        m.entries_per_fsync,
    )
    yield from metric(
        "bkctl_bookie_journal_queue_depth",
        "gauge",
        "Entries written, waiting for fsync.",
        m.journal_queue_depth,
    )
    yield from metric("bkctl_bookie_checkpoints_total", "counter", "Checkpoints completed.", m.checkpoints)
    yield from metric(
        "bkctl_bookie_ledgers", "gauge", "Ledgers known to the bookie.", _int_info(storage, "ledgers")
    )
    yield "# HELP bkctl_bookie_errors_total Requests answered with an error, by return code.\n"
    yield "# TYPE bkctl_bookie_errors_total counter\n"
    for rc, count in sorted(m.errors_by_rc.items()):
        yield f'bkctl_bookie_errors_total{{rc="{rc_name(rc)}"}} {count}\n'
    yield from _fsync_histogram(m.fsync_latency_buckets, m.fsync_latency_sum_ms)


def _int_info(storage: Storage, key: str) -> int:
    value = storage.info().get(key, 0)
    return value if isinstance(value, int) else 0


def _fsync_histogram(buckets: list[int], sum_ms: float) -> Iterator[str]:
    name = "bkctl_bookie_journal_fsync_latency_seconds"
    yield f"# HELP {name} Journal fdatasync latency.\n# TYPE {name} histogram\n"
    cumulative = 0
    for bound_ms, count in zip(FSYNC_BUCKETS_MS, buckets, strict=False):
        cumulative += count
        yield f'{name}_bucket{{le="{bound_ms / 1000:g}"}} {cumulative}\n'
    cumulative += buckets[-1]
    yield f'{name}_bucket{{le="+Inf"}} {cumulative}\n'
    yield f"{name}_sum {sum_ms / 1000:.6f}\n"
    yield f"{name}_count {cumulative}\n"
