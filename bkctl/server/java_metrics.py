"""The bookie's counters under Java BookKeeper's Prometheus names (what its PrometheusMetricsProvider
writes: scopes joined with `_`, an OpStatsLogger as a summary with `success="false"|"true"` series of
quantiles, `_count` and `_sum`, sums in milliseconds), so the dashboards and alert rules written for
Java bookies work.

Timed (protocol/op_stats.py, quantiles of the last 60 s window or `prometheusStatsLatencyRolloverSeconds`):
adds from journal append to durable (every entry of a journal batch at the batch's oldest wait, an upper
bound), plain reads, fdatasyncs and entries per fdatasync, GC runs. A summary bkctl only counts has NaN
quantiles (Java's value for a window without data) and a NaN `_sum`.
tests/data/java_metrics.txt lists Java's names and types (scripts/java-metric-names); bkctl's own metrics
are prefixed `bkctl_` (server/http.py). docs/bookie.md maps each to what it counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bkctl.protocol.op_stats import op_stat_lines
from bkctl.protocol.prometheus import metric, summary
from bkctl.server.connection import NetworkMetrics
from bkctl.server.gc_dirs import Collector
from bkctl.server.storage import Storage
from bkctl.server.storage_kind import DB


def bookie_lines(
    writable: bool, storage: Storage | None, gc: Collector | None, network: NetworkMetrics
) -> Iterator[str]:
    yield from metric("bookie_SERVER_STATUS", "gauge", "1 writable, 0 read-only.", 1 if writable else 0)
    reads = network.read_latency
    yield from op_stat_lines("bookie_BOOKIE_READ_ENTRY", "Reads of the storage (ms).", reads)
    yield from op_stat_lines("bookkeeper_server_READ_ENTRY_REQUEST", "Read requests (ms).", reads)
    if storage is not None:
        yield from _storage_lines(storage)
    if gc is not None:
        yield from _gc_lines(gc)


def _storage_lines(storage: Storage) -> Iterator[str]:
    m = storage.metrics
    writable_dirs = 0 if storage.disk_full else len(storage.config.ledger_dirs)
    yield from metric("bookie_ledger_writable_dirs", "gauge", "Ledger directories not full.", writable_dirs)
    yield from metric("bookie_WRITE_BYTES", "counter", "Entry bytes of accepted adds.", m.bytes_written)
    yield from summary("bookie_BOOKIE_ADD_ENTRY", "Adds accepted by the storage (not timed).", m.adds)
    adds = m.add_latency
    yield from op_stat_lines("bookkeeper_server_ADD_ENTRY_REQUEST", "Adds, request to durable (ms).", adds)
    yield from op_stat_lines(
        "bookie_journal_JOURNAL_ADD_ENTRY", "Journal records, append to durable (ms).", m.journal_add_latency
    )
    yield from summary("bookkeeper_server_READ_ENTRY_FENCE_REQUEST", "Fencing reads (not timed).", m.fences)
    yield from op_stat_lines("bookie_journal_JOURNAL_SYNC", "Journal fdatasyncs (ms).", m.fsync_latency)
    yield from op_stat_lines(
        "bookie_journal_JOURNAL_FORCE_WRITE_BATCH_ENTRIES",
        "Entries made durable per fdatasync.",
        m.fsync_entries,
    )
    yield from metric(
        "bookie_journal_JOURNAL_QUEUE_SIZE",
        "counter",
        "Entries written, waiting for fsync.",
        m.journal_queue_depth,
    )
    yield from metric(
        "bookie_journal_JOURNAL_WRITE_BYTES", "counter", "Entry bytes journalled.", m.bytes_written
    )
    ledgers: Any = storage.info().get("ledgers", 0)
    yield from metric("bookie_gc_ACTIVE_LEDGER_COUNT", "gauge", "Ledgers the bookie holds.", ledgers)
    if storage.config.engine == DB:
        yield from _read_cache_lines(storage)


def _read_cache_lines(storage: Storage) -> Iterator[str]:
    """DbLedgerStorageStats' read cache counters (bookie scope), summed over the ledger dirs."""
    m = storage.read_cache_metrics
    yield from summary("bookie_read_cache_hits", "Reads answered from a write or read cache.", m.hits)
    yield from summary("bookie_read_cache_misses", "Reads from the entry logs.", m.misses)
    yield from summary(
        "bookie_readahead_batch_count", "Entries per read-ahead (sum).", m.batches, m.batch_entries
    )
    yield from summary("bookie_readahead_batch_size", "Bytes per read-ahead (sum).", m.batches, m.batch_bytes)
    caches = [c for c in (storage.store(i).read_cache for i in range(storage.store_count)) if c is not None]
    size, count = sum(c.size_bytes for c in caches), sum(len(c) for c in caches)
    yield from metric("bookie_read_cache_size", "gauge", "Bytes in the read caches.", size)
    yield from metric("bookie_read_cache_count", "gauge", "Entries in the read caches.", count)


def _gc_lines(gc: Collector) -> Iterator[str]:
    m = gc.metrics
    yield from metric(
        "bookie_gc_MAJOR_COMPACTION_COUNT", "counter", "Major compactions.", m.major_compactions
    )
    yield from metric(
        "bookie_gc_MINOR_COMPACTION_COUNT", "counter", "Minor compactions.", m.minor_compactions
    )
    yield from metric(  # Java 4.18's ENTRY_LOCATION_COMPACTION_TOTAL; not in 4.14.8, so bkctl's name
        "bkctl_bookie_gc_entry_location_compactions",
        "counter",
        "Entry location compactions (entryLocationCompactionInterval).",
        m.entry_location_compactions,
    )
    yield from metric(
        "bookie_gc_DELETED_LEDGER_COUNT", "counter", "Ledgers deleted by GC.", m.ledgers_deleted
    )
    by_compaction = m.bytes_reclaimed_by_compaction
    yield from metric(
        "bookie_gc_RECLAIMED_DELETION_SPACE_BYTES",
        "counter",
        "Bytes freed by removing entry logs.",
        m.bytes_reclaimed - by_compaction,
    )
    yield from metric(
        "bookie_gc_RECLAIMED_COMPACTION_SPACE_BYTES", "counter", "Bytes freed by compaction.", by_compaction
    )
    yield from op_stat_lines("bookie_gc_THREAD_RUNTIME", "GC runs (ms).", m.runtime)
