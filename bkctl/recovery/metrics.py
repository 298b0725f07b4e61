"""An autorecovery daemon's Prometheus metrics: on its bookie's `/metrics` (`bookie start
--autorecovery`) or on its own `--http-port` (`autorecovery start`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from twisted.web.resource import Resource

from bkctl.server.http import PROMETHEUS_CONTENT_TYPE, metric

# status() key -> (metric, kind, help)
COUNTERS = (
    (
        "ledgers_replicated",
        "autorecovery_ledgers_replicated_total",
        "counter",
        "Ledgers replicated by this worker.",
    ),
    ("entries_copied", "autorecovery_entries_copied_total", "counter", "Entries copied by this worker."),
    ("bytes_copied", "autorecovery_bytes_copied_total", "counter", "Bytes copied by this worker."),
    ("replication_failures", "autorecovery_replication_failures_total", "counter", "Repairs that failed."),
    ("marks_dropped", "autorecovery_marks_dropped_total", "counter", "Marks of deleted ledgers dropped."),
    ("backlog", "autorecovery_underreplicated_ledgers", "gauge", "Marks seen on the worker's last walk."),
    ("bytes_per_s", "autorecovery_bytes_per_second", "gauge", "Bytes copied per second (5 s window)."),
    (
        "ledgers_per_s",
        "autorecovery_ledgers_per_second",
        "gauge",
        "Ledgers replicated per second (5 s window).",
    ),
    (
        "rate_limit_bytes_per_s",
        "autorecovery_rate_limit_bytes_per_second",
        "gauge",
        "This daemon's share of the cluster's copy budget (absent: no limit).",
    ),
    ("audits", "autorecovery_audits_total", "counter", "Audits of lost bookies (auditor only)."),
    ("ledgers_marked", "autorecovery_ledgers_marked_total", "counter", "Ledgers marked (auditor only)."),
    ("audit_failures", "autorecovery_audit_failures_total", "counter", "Audits that failed (auditor only)."),
)


def daemon_lines(daemon: Any) -> Iterator[str]:
    status = daemon.status()
    yield from metric(
        "autorecovery_auditor", "gauge", "1 while this daemon is the auditor.", int(status["auditor"])
    )
    yield from metric("autorecovery_copying", "gauge", "Ledgers being repaired now.", len(status["copying"]))
    yield from metric(
        "autorecovery_failing", "gauge", "Ledgers backing off after a failure.", len(status["failing"])
    )
    for key, name, kind, help_text in COUNTERS:
        if status.get(key) is not None:
            yield from metric(name, kind, help_text, status[key])


class _Metrics(Resource):
    isLeaf = True

    def __init__(self, daemon: Any) -> None:
        Resource.__init__(self)  # type: ignore[no-untyped-call]
        self.daemon = daemon

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", PROMETHEUS_CONTENT_TYPE)
        return "".join(daemon_lines(self.daemon)).encode()


def metrics_site(daemon: Any) -> Any:
    """`/metrics` of a daemon running alone (typed Any: twisted.web's zope interfaces)."""
    from twisted.web.server import Site

    new_resource: Any = Resource
    new_site: Any = Site
    root = new_resource()
    root.putChild(b"metrics", _Metrics(daemon))
    site = new_site(root)
    site.noisy = False
    return site
