"""The bookie's admin HTTP endpoint (twisted.web): /heartbeat, /api/v1/bookie/info, /metrics, and Java's
garbage collection endpoints /api/v1/bookie/gc (PUT triggers, GET says whether one runs) and
/api/v1/bookie/gc_details, and /api/v1/bookie/list_disk_file.

/metrics is Prometheus text format 0.0.4. Everything is read from plain counters on the reactor
thread (StorageMetrics, NetworkMetrics), so a scrape costs the bookie a few microseconds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from twisted.internet import threads
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from bkctl.protocol.wire import rc_name
from bkctl.server.config import BookieConfig
from bkctl.server.connection import NetworkMetrics
from bkctl.server.gc import GarbageCollector
from bkctl.server.metrics import FSYNC_BUCKETS_MS
from bkctl.server.storage import Storage

PROMETHEUS_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class BookieView(Protocol):
    """What the endpoint reads of a BookieService."""

    bookie_id: str
    state: str
    config: BookieConfig
    storage: Storage | None
    gc: GarbageCollector | None
    # More metrics from what runs in the same process (the autorecovery daemon of `--autorecovery`).
    extra_metrics: list[Callable[[], Iterator[str]]]

    def info(self) -> dict[str, Any]: ...

    @property
    def network_metrics(self) -> NetworkMetrics: ...


class _Leaf(Resource):
    isLeaf = True

    def __init__(self, bookie: BookieView) -> None:
        Resource.__init__(self)  # type: ignore[no-untyped-call]
        self.bookie = bookie


class Heartbeat(_Leaf):
    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        return b"OK\n"


class Info(_Leaf):
    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(self.bookie.info(), indent=2, sort_keys=True).encode() + b"\n"


class Metrics(_Leaf):
    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", PROMETHEUS_CONTENT_TYPE)
        extra = (line for lines in self.bookie.extra_metrics for line in lines())
        return "".join([*prometheus_lines(self.bookie), *extra]).encode()


def _json(request: Any, value: object, code: int = 200) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json")
    return json.dumps(value, indent=2, sort_keys=True).encode() + b"\n"


def _answer_when_done(request: Any, result: Deferred[Any]) -> Any:
    """Answer with `result`'s JSON when it fires (500 with its error if it fails); NOT_DONE_YET now."""
    gone: list[object] = []  # the client went away: nothing to answer
    request.notifyFinish().addErrback(gone.append)

    def answer(value: object) -> None:
        if gone:
            return
        if isinstance(value, Failure):
            request.write(_json(request, {"error": value.getErrorMessage()}, 500))
        else:
            request.write(_json(request, value))
        request.finish()

    result.addBoth(answer)
    return NOT_DONE_YET


class Gc(_Leaf):
    """PUT triggers a run (body `{"forceMajor": true}` / `{"forceMinor": true}`, as Java's); with
    `?wait=true` (bkctl) the answer is the run's report once it is done. GET: `{"is_in_force_gc": ...}`."""

    def render_GET(self, request: Any) -> bytes:
        gc = self.bookie.gc
        if gc is None:
            return _json(request, {"error": "the bookie is not serving yet"}, 503)
        return _json(request, {"is_in_force_gc": str(gc.running and gc.forced).lower()})

    def render_PUT(self, request: Any) -> Any:
        gc = self.bookie.gc
        if gc is None:
            return _json(request, {"error": "the bookie is not serving yet"}, 503)
        try:
            body = request.content.read() or b"{}"
            options = json.loads(body)
            if not isinstance(options, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as exc:
            return _json(request, {"error": f"bad request body: {exc}"}, 400)
        major, minor = bool(options.get("forceMajor")), bool(options.get("forceMinor"))
        run = gc.trigger(force_major=major, force_minor=minor)
        if request.args.get(b"wait", [b"false"])[0].lower() not in (b"true", b"1"):
            run.addErrback(lambda failure: None)  # logged by the collector
            return _json(request, f"Triggered GC on BookieServer: {self.bookie.bookie_id}")

        return _answer_when_done(request, run)


class GcDetails(_Leaf):
    """Java's list of GarbageCollectionStatus (one ledger storage), with bkctl's fields added."""

    def render_GET(self, request: Any) -> bytes:
        gc = self.bookie.gc
        if gc is None:
            return _json(request, {"error": "the bookie is not serving yet"}, 503)
        return _json(request, [gc.details()])


# Java's list_disk_file: file_type -> (answer key, file suffix).
DISK_FILE_KINDS = {
    "journal": ("journal files", ".txn"),
    "entrylog": ("entrylog files", ".log"),
    "index": ("index files", ".idx"),
}


class ListDiskFiles(_Leaf):
    """Java's `{"journal files": "name\t...", "entrylog files": ..., "index files": ...}`, or one of them
    with `?file_type=journal|entrylog|index`; the directory walk runs in a pool thread."""

    def render_GET(self, request: Any) -> Any:
        wanted = request.args.get(b"file_type", [b""])[0].decode(errors="replace")
        kinds = [wanted] if wanted in DISK_FILE_KINDS else list(DISK_FILE_KINDS)
        config = self.bookie.config
        dirs = {
            "journal": config.journal_dirs,
            "entrylog": config.ledger_dirs,
            "index": config.effective_index_dirs,
        }
        listed = threads.deferToThread(lambda: {DISK_FILE_KINDS[k][0]: disk_files(dirs[k], k) for k in kinds})
        return _answer_when_done(request, listed)


def disk_files(directories: Iterable[Path], kind: str) -> str:
    """The names of a kind's files under the directories (recursively), sorted, tab-terminated as Java's."""
    suffix = DISK_FILE_KINDS[kind][1]
    names = []
    for directory in directories:
        for _root, _dirs, files in os.walk(directory):
            names += [name for name in files if name.endswith(suffix)]
    return "".join(f"{name}\t" for name in sorted(names))


def admin_resource(bookie: BookieView) -> Any:
    """The resource tree; typed Any because twisted.web's zope interfaces do not type-check."""
    new_resource: Any = Resource
    root, api, v1, bookie_node = new_resource(), new_resource(), new_resource(), new_resource()
    root.putChild(b"heartbeat", Heartbeat(bookie))
    root.putChild(b"metrics", Metrics(bookie))
    root.putChild(b"api", api)
    api.putChild(b"v1", v1)
    v1.putChild(b"bookie", bookie_node)
    bookie_node.putChild(b"info", Info(bookie))
    bookie_node.putChild(b"gc", Gc(bookie))
    bookie_node.putChild(b"gc_details", GcDetails(bookie))
    bookie_node.putChild(b"list_disk_file", ListDiskFiles(bookie))
    return root


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric(name: str, kind: str, help_text: str, value: float, labels: str = "") -> Iterator[str]:
    yield f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{name}{labels} {_number(value)}\n"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def prometheus_lines(bookie: BookieView) -> Iterator[str]:
    """Every metric of the bookie, in Prometheus text format."""
    net = bookie.network_metrics
    read_only = 1 if bookie.state == "read-only" else 0
    yield from metric("bookie_info", "gauge", "Bookie identity.", 1, f'{{id="{_label(bookie.bookie_id)}"}}')
    yield from metric("bookie_read_only", "gauge", "1 when the bookie refuses adds.", read_only)
    yield from metric("bookie_connections", "gauge", "Open client connections.", net.connections_open)
    yield from metric(
        "bookie_connections_total", "counter", "Client connections accepted.", net.connections_total
    )
    yield from metric(
        "bookie_frames_rejected_total",
        "counter",
        "Connections closed for an unframeable input.",
        net.frames_rejected,
    )
    yield from metric("bookie_bad_requests_total", "counter", "Requests answered EBADREQ.", net.bad_requests)
    yield from metric(
        "bookie_tls_handshakes_total", "counter", "Connections switched to TLS.", net.tls_handshakes
    )
    yield from metric(
        "bookie_tls_handshake_failures_total",
        "counter",
        "TLS handshakes that failed (logged with the peer).",
        net.tls_handshake_failures,
    )
    yield from metric(
        "bookie_tls_required_refusals_total",
        "counter",
        "Requests answered EUA before the TLS handshake (tlsRequired).",
        net.tls_required_refusals,
    )
    yield from metric(
        "bookie_read_pauses_total",
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
    ("bookie_gc_runs_total", "counter", "Garbage collection runs.", "runs"),
    (
        "bookie_gc_ledgers_deleted_total",
        "counter",
        "Ledgers deleted (not in metadata).",
        "ledgers_deleted",
    ),
    (
        "bookie_gc_overreplicated_ledgers_deleted_total",
        "counter",
        "Over-replicated ledgers deleted (metadata names another bookie).",
        "overreplicated_deleted",
    ),
    (
        "bookie_gc_entry_logs_removed_total",
        "counter",
        "Entry logs removed (no live entry).",
        "logs_removed",
    ),
    ("bookie_gc_entry_logs_compacted_total", "counter", "Entry logs compacted.", "logs_compacted"),
    ("bookie_gc_entries_moved_total", "counter", "Live entries copied by compaction.", "entries_moved"),
    (
        "bookie_gc_bytes_reclaimed_total",
        "counter",
        "Disk bytes freed by GC.",
        "bytes_reclaimed",
    ),
    ("bookie_gc_seconds_total", "counter", "Time spent in GC runs.", "seconds_total"),
    ("bookie_gc_last_run_seconds", "gauge", "Duration of the last GC run.", "last_seconds"),
    (
        "bookie_gc_unindexed_ledgers_kept",
        "gauge",
        "Ledgers whose entry log records GC kept though no index names them (last run).",
        "unindexed_kept",
    ),
)


def _gc_lines(gc: GarbageCollector) -> Iterator[str]:
    for name, kind, help_text, attribute in _GC_METRICS:
        yield from metric(name, kind, help_text, getattr(gc.metrics, attribute))
    name = "bookie_gc_live_fraction"
    yield f"# HELP {name} Live share of the entry logs per ledger dir (last run).\n# TYPE {name} gauge\n"
    for directory, fraction in sorted(gc.metrics.live_fraction.items()):
        yield f'{name}{{dir="{_label(directory)}"}} {_number(fraction)}\n'


def _storage_lines(storage: Storage) -> Iterator[str]:
    m = storage.metrics
    yield from metric("bookie_adds_total", "counter", "Adds accepted into the journal.", m.adds)
    yield from metric("bookie_reads_total", "counter", "Read requests.", m.reads)
    yield from metric("bookie_fences_total", "counter", "Fencing requests.", m.fences)
    yield from metric(
        "bookie_bytes_written_total", "counter", "Entry bytes of accepted adds.", m.bytes_written
    )
    yield from metric("bookie_journal_fsyncs_total", "counter", "Journal fdatasyncs.", m.fsyncs)
    yield from metric(
        "bookie_journal_synced_entries_total",
        "counter",
        "Entries made durable (divide by fsyncs).",
        m.entries_per_fsync,
    )
    yield from metric(
        "bookie_journal_queue_depth", "gauge", "Entries written, waiting for fsync.", m.journal_queue_depth
    )
    yield from metric("bookie_checkpoints_total", "counter", "Checkpoints completed.", m.checkpoints)
    yield from metric(
        "bookie_ledgers", "gauge", "Ledgers known to the bookie.", _int_info(storage, "ledgers")
    )
    yield "# HELP bookie_errors_total Requests answered with an error, by return code.\n"
    yield "# TYPE bookie_errors_total counter\n"
    for rc, count in sorted(m.errors_by_rc.items()):
        yield f'bookie_errors_total{{rc="{rc_name(rc)}"}} {count}\n'
    yield from _fsync_histogram(m.fsync_latency_buckets, m.fsync_latency_sum_ms)


def _int_info(storage: Storage, key: str) -> int:
    value = storage.info().get(key, 0)
    return value if isinstance(value, int) else 0


def _fsync_histogram(buckets: list[int], sum_ms: float) -> Iterator[str]:
    name = "bookie_journal_fsync_latency_seconds"
    yield f"# HELP {name} Journal fdatasync latency.\n# TYPE {name} histogram\n"
    cumulative = 0
    for bound_ms, count in zip(FSYNC_BUCKETS_MS, buckets, strict=False):
        cumulative += count
        yield f'{name}_bucket{{le="{bound_ms / 1000:g}"}} {cumulative}\n'
    cumulative += buckets[-1]
    yield f'{name}_bucket{{le="+Inf"}} {cumulative}\n'
    yield f"{name}_sum {sum_ms / 1000:.6f}\n"
    yield f"{name}_count {cumulative}\n"
