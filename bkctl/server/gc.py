"""Garbage collection of deleted ledgers and compaction of entry logs (Java's GarbageCollectorThread).

Every `gcWaitTime` and on demand (admin HTTP `PUT /api/v1/bookie/gc`), one run on the reactor:

1. Ledgers: the bookie's ledgers are listed FIRST (memory + index files), then the metadata store's.
   A ledger the bookie holds and the listing lacks is read directly (`verifyMetadataOnGC`, on by
   default here) and only a definite "no such ledger" deletes its index. A ledger created after the
   bookie's list was taken is not in it, so it is never a candidate; a metadata store that cannot be
   read deletes nothing. Once per `gcOverreplicatedLedgerWaitTime`, closed ledgers whose metadata no
   longer names this bookie go too, under their replication lock (gc_overreplicated.py).
2. Entry logs: each log's bytes per ledger come from its ledgers map (or a scan of a log without one,
   cached); a log whose ledgers are all gone is removed. "Gone" is the metadata's answer, never the
   local index's: a ledger with records in a log but no index file here (removed, or never written by
   a checkpoint) is gone only when the metadata store lacks it (the listing, then a direct read with
   `verifyMetadataOnGC`) or no longer names this bookie in any ensemble. Otherwise its records are
   kept, reported (`unindexed_kept`, a metric, `bkctl doctor`) and no log holding them is compacted
   (compaction copies only what an index names) until `bkctl index rebuild` gives it an index. The
   current log is never touched, nor is one that appeared after the run took its snapshot (ids at or
   above the current one).
3. Compaction, when due (`minorCompactionInterval`, `majorCompactionInterval`) or forced: logs whose
   live share is under the threshold, least live first (each frees the most for what it copies). The
   live records (slot still pointing at them; found from the index files by a child process,
   gc_scan.py and live_records.py, so that its work does not take the reactor's GIL; the bookie reads
   the records it names from the old log) are copied by the next checkpoints, which fsync the new log
   before the index names it (moves.py); the old log goes once every batch is durable. A `<log>.compacting`
   marker beside the log, written first and removed last, makes a run killed half-way compact that log
   again next time whatever its usage (the copied entries are then no longer live in it).

Changes to the storage (ledger deletion, the decision to remove a log) happen synchronously on the
reactor while no checkpoint runs (`Storage.when_idle`); unlinks go to a pool thread. See docs/bookie.md,
"Garbage collection and compaction".
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NotRequired, TypedDict

from twisted.internet import task, threads
from twisted.internet.defer import Deferred, DeferredLock, ensureDeferred

from bkctl.errors import NotFoundError
from bkctl.files.entrylog import ledger_sizes, open_entry_log
from bkctl.metadata.layout import Layout
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol.op_stats import OpStat
from bkctl.server.faults import fault_point
from bkctl.server.fileio import remove_gradually, write_durably
from bkctl.server.gc_overreplicated import OverReplication
from bkctl.server.gc_scan import ScanChild
from bkctl.server.storage import Storage

log = logging.getLogger("bkctl.bookie")

MARKER_SUFFIX: Final = ".compacting"
# Live records handed to one checkpoint. Its entry log writes and fsync delay the journal's fdatasync on
# a shared disk, and its copies take a core from the reactor: small batches keep each delay short.
# benchmarks/gc.py (0f6e285, 2026-11-27: the scan in numpy, the bookie reading the records): 4 MiB
# 172-187 MB/s with a concurrent writer's p99 3.8-5.7 ms; 1 MiB 171-191 MB/s, 2.1-6.0 ms; 512 KiB
# 142-164 MB/s, 2.2-2.6 ms (alone: 1.5-2.1 ms); 256 KiB 127-148 MB/s, no better.
BATCH_BYTES: Final = 512 * 1024  # local bound
# The GIL switch interval while compaction copies (see _short_gil_slices).
COMPACTION_SWITCH_INTERVAL_S: Final = 0.0005  # local bound


class GcReport(TypedDict):
    """One run's report: the JSON of `bookie gc --wait` and of gc_details' `last_run`, keys in this order."""

    started_ms: int
    ledgers_deleted: list[int]
    overreplicated_deleted: list[int]
    unindexed_kept: list[int]  # ledgers whose records no index names, kept: the metadata still names them
    entry_logs_removed: list[int]
    entry_logs_compacted: list[int]
    entries_moved: int
    bytes_moved: int
    bytes_reclaimed: int
    compaction: str | None  # "major", "minor", "resume" or None
    errors: list[str]
    seconds: NotRequired[float]  # set when the run ends


@dataclass(frozen=True)
class GcSettings:
    """bk_server.conf keys in the comments; defaults are Java's unless said otherwise."""

    wait_ms: int = 600_000  # gcWaitTime; 0 = no periodic run (bkctl: on demand only)
    minor_threshold: float = 0.2  # minorCompactionThreshold (<= 0: minor compaction off)
    minor_interval_s: int = 3600  # minorCompactionInterval (<= 0: off)
    major_threshold: float = 0.8  # majorCompactionThreshold
    major_interval_s: int = 86_400  # majorCompactionInterval
    entry_location_interval_s: int = -1  # entryLocationCompactionInterval (db engine; <= 0: off)
    rate_entries: int = 100_000  # compactionRateByEntries (Java: 1000); 0 = unthrottled
    rate_bytes: int = 1_000_000  # compactionRateByBytes; 0 = unthrottled
    throttle_by_bytes: bool = False  # isThrottleByBytes
    verify_metadata: bool = True  # verifyMetadataOnGC (Java: false)
    force_when_full: bool = True  # isForceGCAllowWhenNoSpace (Java: false): compact even on a full disk
    overreplicated_wait_ms: int = 86_400_000  # gcOverreplicatedLedgerWaitTime; 0 = off (gc_overreplicated.py)


@dataclass
class GcMetrics:
    runs: int = 0
    ledgers_deleted: int = 0
    overreplicated_deleted: int = 0  # of ledgers_deleted: over-replicated copies (metadata still exists)
    logs_removed: int = 0
    logs_compacted: int = 0
    entries_moved: int = 0
    bytes_moved: int = 0
    bytes_reclaimed: int = 0
    bytes_reclaimed_by_compaction: int = 0  # of bytes_reclaimed (the rest: logs removed whole)
    major_compactions: int = 0
    minor_compactions: int = 0
    entry_location_compactions: int = 0
    seconds_total: float = 0.0
    last_seconds: float = 0.0
    runtime: OpStat = field(default_factory=OpStat)  # Java's THREAD_RUNTIME: each run's ms, with quantiles
    live_fraction: dict[str, float] = field(default_factory=dict)  # per ledger dir, at the last run
    unindexed_kept: int = 0  # ledgers with records in entry logs, no index, still in the metadata (last run)


# --- pure parts -------------------------------------------------------------------------------------


def collectable(held: Iterable[int], listed: set[int]) -> list[int]:
    """The ledgers the bookie holds that the metadata listing lacks, ascending."""
    return sorted(ledger_id for ledger_id in set(held) if ledger_id not in listed)


@dataclass(frozen=True)
class LogUsage:
    log_id: int
    path: Path
    total: int  # bytes of every ledger's records in the log
    live: int  # bytes of ledgers the bookie still holds

    @property
    def fraction(self) -> float:
        return self.live / self.total if self.total else 0.0


def log_usage(log_id: int, path: Path, sizes: dict[int, int], held: Callable[[int], bool]) -> LogUsage:
    live = sum(size for ledger_id, size in sizes.items() if held(ledger_id))
    return LogUsage(log_id, path, sum(sizes.values()), live)


def compaction_order(usages: Iterable[LogUsage], threshold: float) -> list[LogUsage]:
    """Logs with live data under `threshold`, least live first: each frees the most per byte copied,
    which is what a nearly full disk needs first (Java sorts by bytes freed)."""
    chosen = [u for u in usages if u.live > 0 and u.fraction < threshold]
    return sorted(chosen, key=lambda u: (u.fraction, u.log_id))


class Throttle:
    """How long to wait so that `done` units stay under `rate` per second since the start (0 = no limit)."""

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._start = clock()
        self._done = 0

    def delay(self, amount: int) -> float:
        self._done += amount
        if self.rate <= 0:
            return 0.0
        return max(0.0, self._done / self.rate - (self._clock() - self._start))


def marker_path(log_path: Path) -> Path:
    return log_path.with_name(log_path.name + MARKER_SUFFIX)


def _sizes_of(path: Path) -> tuple[dict[int, int], bool]:
    """Bytes per ledger of one log (ledgers map, else a scan) and whether they are complete."""
    sizes = ledger_sizes(open_entry_log(path))
    return sizes.sizes, sizes.stop is None or sizes.stop.read_all_valid


def _write_marker(path: Path) -> None:
    write_durably(path, b"")


# --- the collector ---------------------------------------------------------------------------------


class GarbageCollector:
    """One bookie's GC: periodic and triggered runs, one at a time, on the reactor."""

    def __init__(
        self,
        storage: Storage,
        layout: Layout | None,
        settings: GcSettings,
        reactor: Any,
        on_run_done: Callable[[], object] | None = None,
        bookie_id: str = "",
    ) -> None:
        self.storage = storage
        self.layout = layout
        self._over: OverReplication | None = None
        if layout is not None and bookie_id and settings.overreplicated_wait_ms > 0:
            self._over = OverReplication(layout, bookie_id, settings.overreplicated_wait_ms)
        self.settings = settings
        self.bookie_id = bookie_id
        self.metrics = GcMetrics()
        self.unindexed_kept: list[int] = []  # see the module docstring, at the last run
        self._listed: set[int] | None = None  # the metadata listing of this run (None: unreadable)
        self._gone: set[int] = set()  # unindexed ledgers the metadata lacks: never asked again
        self._reactor = reactor
        self._on_run_done = on_run_done
        self._compacting = ""  # "major", "minor" or "resume" while compacting
        self._scan = ScanChild()  # compaction's scans run in a child process (see gc_scan.py)
        self._lock = DeferredLock()
        self._loop: task.LoopingCall | None = None
        self._stopped = False
        self._sizes: dict[int, tuple[dict[int, int], bool]] = {}  # per old log: immutable once written
        now = time.time()
        self.last_major = self.last_minor = self.last_entry_location = now
        # Java waits the interval plus a random part of it: bookies started together compact apart.
        self._entry_location_delay = random.uniform(0, max(settings.entry_location_interval_s, 0))
        self.phase = "idle"
        self.last_run: GcReport | None = None
        self.last_error: str | None = None
        self.forced = False
        # Java's gc/suspend_compaction: a suspended kind is skipped by every run, forced ones too.
        self.major_suspended = False
        self.minor_suspended = False

    def start(self) -> None:
        if self.settings.wait_ms <= 0:
            log.info("garbage collection: no periodic run (gcWaitTime=0); on demand only")
            return
        self._loop = task.LoopingCall(self._periodic)
        self._loop.clock = self._reactor
        self._loop.start(self.settings.wait_ms / 1000.0, now=False).addErrback(
            lambda f: log.error("garbage collection timer failed: %s", f.getErrorMessage())
        )

    def stop(self) -> None:
        """No new step starts; a run in progress ends at its next step, its old logs left as they are."""
        self._stopped = True
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._scan.close()

    def _periodic(self) -> None:
        if not self._lock.locked:
            self.trigger().addErrback(
                lambda f: log.error("garbage collection failed: %s", f.getErrorMessage())
            )

    def trigger(self, force_major: bool = False, force_minor: bool = False) -> Deferred[GcReport]:
        """Run GC now (after a run in progress); fires with the run's report."""
        return self._lock.run(lambda: ensureDeferred(self._run(force_major, force_minor)))

    @property
    def running(self) -> bool:
        return self._lock.locked

    def details(self) -> dict[str, Any]:
        """Java's gc_details fields plus bkctl's: what runs now and what the last run did."""
        m = self.metrics
        return {
            "forceCompacting": self.forced and self.phase == "compacting",
            "majorCompacting": self.phase == "compacting" and self._compacting == "major",
            "minorCompacting": self.phase == "compacting" and self._compacting == "minor",
            "lastMajorCompactionTime": int(self.last_major * 1000),
            "lastMinorCompactionTime": int(self.last_minor * 1000),
            "lastEntryLocationCompactionTime": int(self.last_entry_location * 1000),
            "majorCompactionCounter": m.major_compactions,
            "minorCompactionCounter": m.minor_compactions,
            "entryLocationCompactionCounter": m.entry_location_compactions,
            "running": self.running,
            "phase": self.phase,
            "isMajorGcSuspended": self.major_suspended,
            "isMinorGcSuspended": self.minor_suspended,
            "last_run": self.last_run,
            "last_error": self.last_error,
            "totals": {
                "runs": m.runs,
                "ledgers_deleted": m.ledgers_deleted,
                "overreplicated_deleted": m.overreplicated_deleted,
                "entry_logs_removed": m.logs_removed,
                "entry_logs_compacted": m.logs_compacted,
                "entries_moved": m.entries_moved,
                "bytes_moved": m.bytes_moved,
                "bytes_reclaimed": m.bytes_reclaimed,
                "seconds": round(m.seconds_total, 3),
            },
            "unindexed_kept": list(self.unindexed_kept),
            "live_fraction": dict(m.live_fraction),
        }

    # --- one run ------------------------------------------------------------------------------------

    async def _run(self, force_major: bool, force_minor: bool) -> GcReport:
        started = time.monotonic()
        report: GcReport = {
            "started_ms": int(time.time() * 1000),
            "ledgers_deleted": [],
            "overreplicated_deleted": [],
            "unindexed_kept": [],
            "entry_logs_removed": [],
            "entry_logs_compacted": [],
            "entries_moved": 0,
            "bytes_moved": 0,
            "bytes_reclaimed": 0,
            "compaction": None,
            "errors": [],
        }
        self.forced = force_major or force_minor
        try:
            if not self._halted():
                self.phase = "ledgers"
                await self._collect_ledgers(report)
            if not self._halted():
                self.phase = "entry-logs"
                await self._collect_logs(report, force_major, force_minor)
            if not self._halted():
                await self._compact_entry_locations_when_due()
        finally:
            self.phase = "idle"
            self._compacting = ""
            seconds = time.monotonic() - started
            report["seconds"] = round(seconds, 3)
            self.metrics.runs += 1
            self.metrics.seconds_total += seconds
            self.metrics.last_seconds = seconds
            self.metrics.runtime.observe(not report["errors"], seconds * 1000)
            self.last_run = report
            self.last_error = "; ".join(report["errors"]) or None
            if self._on_run_done is not None:
                self._on_run_done()
        log.info(
            "garbage collection: %d ledgers deleted, %d entry logs removed, %d compacted "
            "(%d entries moved), %.1f MB reclaimed in %.2f s",
            len(report["ledgers_deleted"]),
            len(report["entry_logs_removed"]),
            len(report["entry_logs_compacted"]),
            report["entries_moved"],
            report["bytes_reclaimed"] / 1e6,
            seconds,
        )
        return report

    async def _compact_entry_locations_when_due(self) -> None:
        """Java's periodic entry location compaction (entryLocationCompactionInterval): the db engine's
        locations dbs compacted in RocksDB (the admin endpoint's PUT, on a timer); nothing on the
        interleaved engine."""
        interval = self.settings.entry_location_interval_s
        if interval <= 0 or time.time() - self.last_entry_location <= interval + self._entry_location_delay:
            return
        run = self.storage.compact_entry_locations()
        if run is None:
            return
        self.phase = "entry-locations"
        if await run:  # False: one was already running (started by the endpoint)
            self.metrics.entry_location_compactions += 1
        self.last_entry_location = time.time()
        self._entry_location_delay = random.uniform(0, interval)

    def _halted(self) -> bool:
        return self._stopped or self.storage.stopping

    def _in_thread(self, function: Callable[..., Any], *args: Any) -> Deferred[Any]:
        return threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(), function, *args)

    async def _collect_ledgers(self, report: GcReport) -> None:
        if self.layout is None:
            return
        held = await self.storage.ledger_ids()  # before the listing: see the module docstring
        self._listed = None
        try:
            listed = self._listed = await self._in_thread(self._listed_ledgers)
        except Exception as exc:
            self._error(report, f"metadata store not readable, no ledger deleted: {exc}")
            return
        doomed = await self._missing_from_metadata(report, collectable(held, listed))
        over = await self._locked_over_replicated(held & listed)
        try:
            if doomed or over:
                await self._delete_ledgers(report, doomed, over)
        finally:
            if over:
                assert self._over is not None
                await self._in_thread(self._over.release, over)

    async def _missing_from_metadata(self, report: GcReport, candidates: list[int]) -> list[int]:
        doomed = []
        for ledger_id in candidates:
            if self.settings.verify_metadata:
                try:
                    exists = await self._in_thread(self._ledger_exists, ledger_id)
                except Exception as exc:
                    self._error(report, f"ledger {ledger_id} kept: its metadata cannot be read: {exc}")
                    continue
                if exists:
                    log.warning("ledger %d is missing from the metadata listing but exists: kept", ledger_id)
                    continue
            doomed.append(ledger_id)
        return doomed

    async def _locked_over_replicated(self, listed_held: set[int]) -> list[int]:
        """Over-replicated ledgers to delete when that check is due, their replication locks held."""
        if self._over is None or not self._over.due():
            return []
        unflushed = self.storage.unflushed_ledgers()
        ledgers = [(i, self.storage.index_path(i)) for i in sorted(listed_held - unflushed)]
        try:
            return list(await self._in_thread(self._over.locked_candidates, ledgers))
        finally:
            self._over.checked()

    async def _delete_ledgers(self, report: GcReport, doomed: list[int], over: list[int]) -> None:
        await self.storage.when_idle()
        if self._halted():
            return
        for ledger_id in doomed:  # synchronous: no checkpoint starts in between
            if self.storage.delete_ledger(ledger_id):
                report["ledgers_deleted"].append(ledger_id)
        unflushed = self.storage.unflushed_ledgers()  # written since the check: kept
        for ledger_id in over:
            if ledger_id not in unflushed and self.storage.delete_ledger(ledger_id):
                report["ledgers_deleted"].append(ledger_id)
                report["overreplicated_deleted"].append(ledger_id)
        self._gone.update(report["ledgers_deleted"])  # their records: collectable without asking again
        self.metrics.ledgers_deleted += len(report["ledgers_deleted"])
        self.metrics.overreplicated_deleted += len(report["overreplicated_deleted"])
        log.info(
            "garbage collection deleted ledgers %s (over-replicated: %s)",
            report["ledgers_deleted"],
            report["overreplicated_deleted"],
        )
        # Move lastMark past their journal records, so a restart does not bring them back.
        self.storage.checkpoint().addErrback(lambda f: None)

    def _listed_ledgers(self) -> set[int]:
        assert self.layout is not None
        self.layout.check_initialized()  # an empty or missing tree must never read as "no ledgers"
        return set(self.layout.ledger_ids())

    def _ledger_exists(self, ledger_id: int) -> bool:
        assert self.layout is not None
        try:
            self.layout.read_ledger_bytes(ledger_id)
        except NotFoundError:
            return False
        return True

    def _error(self, report: GcReport, message: str) -> None:
        log.error("garbage collection: %s", message)
        report["errors"].append(message)

    async def _collect_logs(self, report: GcReport, force_major: bool, force_minor: bool) -> None:
        await self.storage.when_idle()
        current = self.storage.current_log_id  # every older log is fully indexed now
        logs = await self._in_thread(self.storage.entry_logs)
        old = {log_id: path for log_id, path in logs.items() if log_id < current}
        await self._in_thread(self._load_sizes, old)
        for log_id in [i for i in self._sizes if i not in old]:
            del self._sizes[log_id]
        dirs = [d / "current" for d in self.storage.config.ledger_dirs]
        markers = await self._in_thread(_markers, dirs, old, logs)
        kept = await self._unindexed_kept(report)
        usages = self._usages(old, kept)
        await self._remove_empty(report, usages, kept)
        compaction = self._due(force_major, force_minor)
        # Compaction copies only what an index names: a log holding kept records stays as it is.
        compactable = [u for u in usages.values() if not kept.intersection(self._sizes[u.log_id][0])]
        pending = [u for u in compactable if u.log_id in markers and u.live > 0]
        chosen = pending + [
            u for u in compaction_order(compactable, compaction[1]) if u.log_id not in markers
        ]
        if compaction[0] == "" and not pending:
            return
        report["compaction"] = compaction[0] or "resume"
        self.phase, self._compacting = "compacting", compaction[0] or "resume"
        for usage in chosen:
            if self._halted():
                return
            try:
                await self._compact(report, usage)
            except Exception as exc:
                self._error(report, f"compaction of entry log {usage.log_id} stopped: {exc}")
                return
        if compaction[0] == "major":
            self.last_major = self.last_minor = time.time()
            self.metrics.major_compactions += 1
        elif compaction[0] == "minor":
            self.last_minor = time.time()
            self.metrics.minor_compactions += 1

    def _load_sizes(self, logs: dict[int, Path]) -> None:
        for log_id, path in logs.items():
            if log_id not in self._sizes:
                try:
                    self._sizes[log_id] = _sizes_of(path)
                except OSError as exc:
                    log.error("garbage collection: %s: %s", path, exc)

    async def _unindexed_kept(self, report: GcReport) -> set[int]:
        """Ledgers with records in the old logs and no index here that the metadata still names this
        bookie for (or cannot tell): their records stay (see the module docstring)."""
        in_logs: set[int] = set().union(*(sizes.keys() for sizes, _ in self._sizes.values()))
        # A ledger held again (re-created with the same id) is no longer known gone.
        self._gone = {i for i in self._gone & in_logs if not self.storage.holds_ledger(i)}
        unindexed = sorted(
            i
            for i in in_logs - self._gone
            if not self.storage.holds_ledger(i) and not self.storage.held_elsewhere(i)
        )
        kept = set()
        for ledger_id in unindexed:
            try:
                named = await self._in_thread(self._names_this_bookie, ledger_id)
            except Exception as exc:
                self._error(report, f"ledger {ledger_id}: entry log records kept, metadata unreadable: {exc}")
                named = True
            if named:
                kept.add(ledger_id)
            else:
                self._gone.add(ledger_id)
        self.unindexed_kept = report["unindexed_kept"] = sorted(kept)
        self.metrics.unindexed_kept = len(kept)
        if kept:
            log.warning(
                "garbage collection: ledgers %s have entry log records but no index here and the metadata "
                "still names this bookie: kept; stop the bookie and run `bkctl index rebuild --ledger ...`",
                ",".join(map(str, sorted(kept))),
            )
        return kept

    def _names_this_bookie(self, ledger_id: int) -> bool:
        """Whether the metadata still has the ledger with this bookie in an ensemble; True when it cannot
        tell (no store, no listing this run)."""
        if self.layout is None or self._listed is None:
            return True
        if ledger_id not in self._listed and not self.settings.verify_metadata:
            return False
        try:  # listed, or missing from the listing but verifyMetadataOnGC: the second read decides
            metadata = self.layout.read_ledger(ledger_id).value
        except NotFoundError:
            return False
        if not self.bookie_id:
            return True
        return any(self.bookie_id in segment.ensemble for segment in metadata.segments)

    def _usages(self, logs: dict[int, Path], kept: set[int]) -> dict[int, LogUsage]:
        """Live bytes per log now (reactor thread); logs whose sizes are incomplete are left out."""
        usages = {}
        per_dir: dict[str, list[int]] = {}
        for log_id, path in logs.items():
            sizes, complete = self._sizes.get(log_id, ({}, False))
            if not complete:
                continue
            usage = usages[log_id] = log_usage(
                log_id, path, sizes, lambda i: i in kept or self.storage.holds_ledger(i)
            )
            totals = per_dir.setdefault(str(path.parent.parent), [0, 0])
            totals[0] += usage.live
            totals[1] += usage.total
        self.metrics.live_fraction = {d: round(t[0] / t[1], 4) if t[1] else 1.0 for d, t in per_dir.items()}
        return usages

    async def _remove_empty(self, report: GcReport, usages: dict[int, LogUsage], kept: set[int]) -> None:
        empty = [u for u in usages.values() if u.live == 0]
        if not empty:
            return
        await self.storage.when_idle()
        if self._halted():
            return
        retired = []
        for usage in empty:  # liveness checked again now (a ledger re-created since holds the log)
            sizes = self._sizes[usage.log_id][0]
            if any(i in kept or self.storage.holds_ledger(i) for i in sizes):
                continue
            self.storage.retire_entry_log(usage.log_id)
            del self._sizes[usage.log_id]
            usages.pop(usage.log_id)
            retired.append(usage)
        freed = await self._in_thread(_remove_files, [u.path for u in retired])
        report["entry_logs_removed"] += [u.log_id for u in retired]
        report["bytes_reclaimed"] += freed
        self.metrics.logs_removed += len(retired)
        self.metrics.bytes_reclaimed += freed
        await self._in_thread(_remove_files, [marker_path(u.path) for u in empty])

    def _due(self, force_major: bool, force_minor: bool) -> tuple[str, float]:
        """("major" | "minor" | "", threshold) for this run."""
        s, now = self.settings, time.time()
        major_on = s.major_interval_s > 0 and s.major_threshold > 0
        minor_on = s.minor_interval_s > 0 and s.minor_threshold > 0
        full = self.storage.disk_full
        if full and not s.force_when_full:
            return "", 0.0
        major_due = force_major or (major_on and not full and now - self.last_major > s.major_interval_s)
        if major_due and not self.major_suspended:
            return "major", s.major_threshold
        minor_due = force_minor or (minor_on and now - self.last_minor > s.minor_interval_s)
        if minor_due and not self.minor_suspended:
            return "minor", s.minor_threshold
        return "", 0.0

    async def _compact(self, report: GcReport, usage: LogUsage) -> None:
        marker = marker_path(usage.path)
        await self._in_thread(_write_marker, marker)
        fault_point("compaction-marked")
        await self.storage.when_idle()  # every slot naming this log is committed now
        await self._in_thread(self.storage.persist_indexes)  # and durable, where the scan reads it
        index_paths = {}
        for ledger_id in self._sizes[usage.log_id][0]:
            path = self.storage.index_path(ledger_id)
            if path is not None:
                index_paths[ledger_id] = path
        scan = self._scan
        try:
            engine = self.storage.config.engine
            await self._in_thread(scan.start, usage.log_id, usage.path, index_paths, BATCH_BYTES, engine)
            with _short_gil_slices():
                moved, moved_bytes = await self._copy(scan)
        except BaseException:
            scan.close()  # its answers for this log may still be coming
            raise
        if self._halted():
            scan.close()
            return
        if scan.error is not None:
            raise OSError(scan.error)
        await self.storage.when_idle()  # the last batch's slots are written
        await self._in_thread(self.storage.sync_relocated)
        if self._halted():
            return
        fault_point("compaction-before-remove")
        self.storage.retire_entry_log(usage.log_id)
        self._sizes.pop(usage.log_id, None)
        freed = await self._in_thread(_remove_files, [usage.path])
        fault_point("compaction-removed")
        await self._in_thread(_remove_files, [marker])
        reclaimed = max(0, freed - moved_bytes)
        report["entry_logs_compacted"].append(usage.log_id)
        report["entries_moved"] += moved
        report["bytes_moved"] += moved_bytes
        report["bytes_reclaimed"] += reclaimed
        m = self.metrics
        m.logs_compacted += 1
        m.entries_moved += moved
        m.bytes_moved += moved_bytes
        m.bytes_reclaimed += reclaimed
        m.bytes_reclaimed_by_compaction += reclaimed

    async def _copy(self, records: ScanChild) -> tuple[int, int]:
        """Every live record of the log into the current one, batch by batch through the checkpoint
        (throttled); (entries, bytes) copied."""
        by_bytes = self.settings.throttle_by_bytes
        limit = Throttle(self.settings.rate_bytes if by_bytes else self.settings.rate_entries)
        moved = moved_bytes = 0
        while True:
            batch = await self._in_thread(records.next_batch)
            if batch is None or self._halted():
                return moved, moved_bytes
            await self.storage.relocate(batch)
            moved += len(batch)
            moved_bytes += len(batch.records)
            delay = limit.delay(len(batch.records) if by_bytes else len(batch))
            if delay > 0:
                await task.deferLater(self._reactor, delay, lambda: None)


@contextmanager
def _short_gil_slices() -> Iterator[None]:
    """While compaction's threads run Python loops, the reactor thread waits for the GIL up to the
    switch interval (5 ms) at each wake-up, several per add: shorter slices keep add latency down."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, COMPACTION_SWITCH_INTERVAL_S))
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def _markers(directories: list[Path], old: dict[int, Path], logs: dict[int, Path]) -> set[int]:
    """Logs a killed compaction left marked; markers of logs already gone are removed."""
    marked = set()
    for directory in directories:
        for marker in directory.glob(f"*.log{MARKER_SUFFIX}"):
            log_id = ef.parse_log_file_name(marker.name[: -len(MARKER_SUFFIX)])
            if log_id is None:
                continue
            if log_id in logs:
                if log_id in old:
                    marked.add(log_id)
            else:
                marker.unlink(missing_ok=True)
    return marked


def _remove_files(paths: list[Path]) -> int:
    """Remove each file (gone already is fine); the bytes they held."""
    freed = 0
    for path in paths:
        try:
            freed += remove_gradually(path)
        except FileNotFoundError:
            continue
    return freed
