"""Plain counters of the storage engine, read by the bookie's /metrics endpoint.

Counters are updated on the reactor thread only (the fsync thread hands its timings back with the
batch), so they need no lock; one add costs a few integer increments, not a histogram observation: the
adds' latencies are observed once per journal batch (every entry of it at the batch's oldest wait), and
reads one by one (server/protocol*.py), into the op stats Java's Prometheus provider writes
(protocol/op_stats.py).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Final

from bkctl.protocol.op_stats import OpStat

# Upper bounds (ms) of the fsync latency buckets; one more bucket counts everything slower (+Inf).
FSYNC_BUCKETS_MS: Final = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0)


@dataclass
class StorageMetrics:
    adds: int = 0
    reads: int = 0
    fences: int = 0
    bytes_written: int = 0  # journal bytes of accepted adds
    fsyncs: int = 0
    entries_per_fsync: int = 0  # sum over fsyncs: divide by `fsyncs` for the mean group size
    journal_queue_depth: int = 0  # entries written to the journal, not yet durable
    checkpoints: int = 0
    errors_by_rc: dict[int, int] = field(default_factory=dict)
    fsync_latency_buckets: list[int] = field(default_factory=lambda: [0] * (len(FSYNC_BUCKETS_MS) + 1))
    fsync_latency_sum_ms: float = 0.0
    # Java's op stats, from journal append to durable: the acknowledgements (adds, and the few fences
    # and forceLedgers: ADD_ENTRY_REQUEST) and the records (JOURNAL_ADD_ENTRY, ledger keys included);
    # fdatasyncs (JOURNAL_SYNC) and records per fdatasync (JOURNAL_FORCE_WRITE_BATCH_ENTRIES).
    add_latency: OpStat = field(default_factory=OpStat)
    journal_add_latency: OpStat = field(default_factory=OpStat)
    fsync_latency: OpStat = field(default_factory=OpStat)
    fsync_entries: OpStat = field(default_factory=OpStat)

    def rollover(self, seconds: float) -> None:
        """Quantile windows of `seconds` (Java's prometheusStatsLatencyRolloverSeconds)."""
        for stat in (self.add_latency, self.journal_add_latency, self.fsync_latency, self.fsync_entries):
            stat.window_s = seconds

    def error(self, rc: int) -> int:
        """Count an error answer and return its rc (so callers can `return metrics.error(rc)`)."""
        self.errors_by_rc[rc] = self.errors_by_rc.get(rc, 0) + 1
        return rc

    def observe_fsync(self, latency_ms: float, entries: int, waited_ms: float = 0.0, acks: int = 0) -> None:
        """One fdatasync of `entries` records delivering `acks` tokens, the oldest record appended
        `waited_ms` before (each counted at that wait: an upper bound, one sketch update per batch)."""
        self.fsync_latency.observe(True, latency_ms)
        self.fsync_entries.observe(True, entries)
        if entries:
            self.journal_add_latency.observe(True, waited_ms, entries)
        if acks:
            self.add_latency.observe(True, waited_ms, acks)
        self.fsyncs += 1
        self.entries_per_fsync += entries
        self.journal_queue_depth -= entries
        self.fsync_latency_sum_ms += latency_ms
        self.fsync_latency_buckets[bisect.bisect_left(FSYNC_BUCKETS_MS, latency_ms)] += 1

    def as_dict(self) -> dict[str, object]:
        return {
            "adds": self.adds,
            "reads": self.reads,
            "fences": self.fences,
            "bytes_written": self.bytes_written,
            "fsyncs": self.fsyncs,
            "entries_per_fsync": self.entries_per_fsync,
            "journal_queue_depth": self.journal_queue_depth,
            "checkpoints": self.checkpoints,
            "errors_by_rc": dict(self.errors_by_rc),
            "fsync_latency_buckets_ms": list(FSYNC_BUCKETS_MS),
            "fsync_latency_counts": list(self.fsync_latency_buckets),
            "fsync_latency_sum_ms": self.fsync_latency_sum_ms,
        }
