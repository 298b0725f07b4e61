"""An autorecovery daemon's Prometheus metrics: on its bookie's `/metrics` (`bookie start
--autorecovery`) or on its own `--http-port` (`autorecovery start`), which also serves /heartbeat and
Java's /api/v1/autorecovery/* (admin/autorecovery.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bkctl.admin.autorecovery import autorecovery_resource
from bkctl.admin.http_endpoint import Endpoint, Heartbeat, PathNode, path_node, put
from bkctl.metadata.layout import Layout
from bkctl.protocol.prometheus import CONTENT_TYPE, metric, summary

# status() key -> (metric, kind, help)
COUNTERS = (
    (
        "ledgers_replicated",
        "bkctl_autorecovery_ledgers_replicated_total",
        "counter",
        "Ledgers replicated by this worker.",
    ),
    (
        "entries_copied",
        "bkctl_autorecovery_entries_copied_total",
        "counter",
        "Entries copied by this worker.",
    ),
    ("bytes_copied", "bkctl_autorecovery_bytes_copied_total", "counter", "Bytes copied by this worker."),
    (
        "replication_failures",
        "bkctl_autorecovery_replication_failures_total",
        "counter",
        "Repairs that failed.",
    ),
    (
        "marks_dropped",
        "bkctl_autorecovery_marks_dropped_total",
        "counter",
        "Marks of deleted ledgers dropped.",
    ),
    (
        "backlog",
        "bkctl_autorecovery_underreplicated_ledgers",
        "gauge",
        "Marks seen on the worker's last walk.",
    ),
    ("audits", "bkctl_autorecovery_audits_total", "counter", "Audits of lost bookies (auditor only)."),
    (
        "ledgers_marked",
        "bkctl_autorecovery_ledgers_marked_total",
        "counter",
        "Ledgers marked (auditor only).",
    ),
    (
        "audit_failures",
        "bkctl_autorecovery_audit_failures_total",
        "counter",
        "Audits that failed (auditor only).",
    ),
    ("bytes_per_s", "bkctl_autorecovery_bytes_per_second", "gauge", "Bytes copied per second (5 s window)."),
    (
        "ledgers_per_s",
        "bkctl_autorecovery_ledgers_per_second",
        "gauge",
        "Ledgers replicated per second (5 s window).",
    ),
    (
        "rate_limit_bytes_per_s",
        "bkctl_autorecovery_rate_limit_bytes_per_second",
        "gauge",
        "This daemon's share of the cluster's copy budget (absent: no limit).",
    ),
)


def daemon_lines(daemon: Any, scope: str = "") -> Iterator[str]:
    """Java's names (`scope` "replication_" when the daemon runs inside a bookie, as Java's), then bkctl's."""
    status = daemon.status()
    yield from autorecovery_lines(status, scope)
    yield from metric(
        "bkctl_autorecovery_auditor", "gauge", "1 while this daemon is the auditor.", int(status["auditor"])
    )
    yield from metric(
        "bkctl_autorecovery_copying", "gauge", "Ledgers being repaired now.", len(status["copying"])
    )
    yield from metric(
        "bkctl_autorecovery_failing", "gauge", "Ledgers backing off after a failure.", len(status["failing"])
    )
    for key, name, kind, help_text in COUNTERS:
        if status.get(key) is not None:
            yield from metric(name, kind, help_text, status[key])


class _Metrics(Endpoint):
    wrong_method, wrong_method_code = "Forbidden. Should be GET method", 403

    def __init__(self, daemon: Any) -> None:
        Endpoint.__init__(self)
        self.daemon = daemon

    def on_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", CONTENT_TYPE)
        return "".join(daemon_lines(self.daemon)).encode()


def metrics_site(daemon: Any, layout: Layout, admin_enabled: bool = False, recoveries: Any = None) -> Any:
    """The HTTP site of a daemon running alone (typed Any: twisted.web's zope interfaces)."""
    from twisted.web.server import Site

    new_site: Any = Site
    root = PathNode()
    put(root, b"metrics", _Metrics(daemon))
    put(root, b"heartbeat", Heartbeat())
    v1 = path_node(root, b"api", b"v1")
    node = autorecovery_resource(lambda: layout, lambda: admin_enabled, lambda: recoveries)
    put(v1, b"autorecovery", node)
    site = new_site(root)
    site.noisy = False
    return site


def autorecovery_lines(status: dict[str, Any], scope: str = "") -> Iterator[str]:
    """A daemon's, under AutoRecoveryMain's names (`scope` "replication_" inside a bookie, as Java's)."""
    if "audits" in status:
        yield from summary(
            f"{scope}auditor_NUM_UNDER_REPLICATED_LEDGERS",
            "Audits of lost bookies (sum: ledgers marked).",
            status["audits"],
            status.get("ledgers_marked", 0),
        )
    for key, what in (
        ("NUM_LEDGERS_NOT_ADHERING_TO_PLACEMENT_POLICY", "breaking"),
        ("NUM_LEDGERS_SOFTLY_ADHERING_TO_PLACEMENT_POLICY", "softly adhering to"),
    ):
        if key in status:
            help_text = f"Closed ledgers {what} the placement policy at the last placement check."
            yield from metric(f"{scope}auditor_{key}", "gauge", help_text, status[key])
    if "ledgers_replicated" in status:
        replicated = status["ledgers_replicated"]
        yield from metric(
            f"{scope}replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED",
            "counter",
            "Ledgers re-replicated.",
            replicated,
        )
        yield from summary(
            f"{scope}replication_worker_rereplicate",
            "Re-replications (success label).",
            replicated,
            failed=status.get("replication_failures", 0),
        )
