"""Garbage collection of a db bookie with several ledger directories: one GarbageCollector per directory,
as Java's DbLedgerStorage runs one GarbageCollectorThread per SingleDirectoryDbLedgerStorage.

Each directory counts its own entry log ids (two directories both hold a `0.log`), so one collector
over all of them would confuse their logs. `DirStorage` shows a collector one directory: its entry logs,
its current log, its ledgers; everything else (the write cache, checkpoints, deletes, read-only state)
is the bookie's `Storage`. `GcGroup` runs the collectors one after the other and answers the admin
endpoints and metrics as one collector would (sums, and the last run's reports merged).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from twisted.internet.defer import Deferred, ensureDeferred

from bkctl.metadata.layout import Layout
from bkctl.server.gc import GarbageCollector, GcMetrics, GcReport, GcSettings
from bkctl.server.ledger_dirs import dir_of
from bkctl.server.storage import Storage

T = TypeVar("T")
_SUMMED_METRICS = tuple(
    f.name for f in dataclasses.fields(GcMetrics) if f.name not in ("live_fraction", "runtime")
)


class DirStorage:
    """One ledger directory of a multi-directory storage, as a GarbageCollector sees a storage."""

    def __init__(self, storage: Storage, index: int) -> None:
        self._storage = storage
        self._index = index
        directory = storage.config.ledger_dirs[index]
        self.config = dataclasses.replace(storage.config, ledger_dirs=(directory,), index_dirs=(directory,))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)  # the bookie's: checkpoint, when_idle, delete_ledger, ...

    @property
    def current_log_id(self) -> int:
        return self._storage.store(self._index).writer.log_id

    def entry_logs(self) -> dict[int, Path]:
        return self._storage.store(self._index).entry_logs()

    def retire_entry_log(self, log_id: int) -> None:
        self._storage.retire_entry_log(log_id, self._index)

    def compact_entry_locations(self) -> Deferred[bool] | None:
        return self._storage.compact_entry_locations(self._index)  # this directory's db, as Java's

    def held_elsewhere(self, ledger_id: int) -> bool:
        """A ledger another directory keeps and indexes: its records in this directory's logs (a
        conversion from the interleaved engine leaves them, storage_convert.py) are garbage here, as
        Java's per-directory collector counts them. One that directory does not index (the dirs given in
        another order, a lost db) is not: its records here may be the only ones."""
        return not self._mine(ledger_id) and self._storage.index_path(ledger_id) is not None

    def holds_ledger(self, ledger_id: int) -> bool:
        return self._mine(ledger_id) and self._storage.holds_ledger(ledger_id)

    def _mine(self, ledger_id: int) -> bool:
        return dir_of(ledger_id, self._storage.store_count) == self._index

    def ledger_ids(self) -> Deferred[set[int]]:
        count, index = self._storage.store_count, self._index
        every = self._storage.ledger_ids()
        return every.addCallback(lambda ids: {i for i in ids if dir_of(i, count) == index})


def collector_for(
    storage: Storage,
    layout: Layout | None,
    settings: GcSettings,
    reactor: Any,
    on_run_done: Any = None,
    bookie_id: str = "",
) -> GarbageCollector | GcGroup:
    """The bookie's garbage collection: one collector, or one per ledger dir of a multi-dir db bookie."""
    if storage.store_count == 1:
        return GarbageCollector(storage, layout, settings, reactor, on_run_done, bookie_id)
    members = [
        GarbageCollector(
            cast(Storage, DirStorage(storage, i)), layout, settings, reactor, on_run_done, bookie_id
        )
        for i in range(storage.store_count)
    ]
    return GcGroup(members)


class _OnEveryMember(Generic[T]):
    """A collector attribute the admin endpoints set (settings, suspensions): set on every member,
    read from the first (they are only ever set together)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, group: GcGroup, owner: type | None = None) -> T:
        return cast(T, getattr(group.members[0], self.name))

    def __set__(self, group: GcGroup, value: T) -> None:
        for member in group.members:
            setattr(member, self.name, value)


class GcGroup:
    """Several collectors answering as one (GarbageCollector's public face)."""

    settings: _OnEveryMember[GcSettings] = _OnEveryMember()
    major_suspended: _OnEveryMember[bool] = _OnEveryMember()
    minor_suspended: _OnEveryMember[bool] = _OnEveryMember()

    def __init__(self, members: list[GarbageCollector]) -> None:
        self.members = members  # each runs on its own timer too, and calls on_run_done after each run

    def start(self) -> None:
        for member in self.members:
            member.start()

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def trigger(self, force_major: bool = False, force_minor: bool = False) -> Deferred[GcReport]:
        """Run every directory's GC now, one after the other; fires with the merged report."""
        return ensureDeferred(self._run_all(force_major, force_minor))

    async def _run_all(self, force_major: bool, force_minor: bool) -> GcReport:
        reports = [await member.trigger(force_major, force_minor) for member in self.members]
        return merged_report(reports)

    @property
    def running(self) -> bool:
        return any(member.running for member in self.members)

    @property
    def forced(self) -> bool:
        return any(member.forced for member in self.members)

    @property
    def unindexed_kept(self) -> list[int]:
        return sorted({i for member in self.members for i in member.unindexed_kept})

    @property
    def metrics(self) -> GcMetrics:
        total = GcMetrics()
        for member in self.members:
            for name in _SUMMED_METRICS:
                setattr(total, name, getattr(total, name) + getattr(member.metrics, name))
            total.live_fraction.update(member.metrics.live_fraction)
        total.runs = max(member.metrics.runs for member in self.members)  # a group run is one run
        total.runtime = self.members[0].metrics.runtime  # the dirs' runs go together: the first's times
        return total

    def details(self) -> dict[str, Any]:
        """The first directory's gc_details with the counters summed and the last runs merged."""
        details = self.members[0].details()
        runs = [m.last_run for m in self.members if m.last_run is not None]
        errors = [m.last_error for m in self.members if m.last_error]
        keys = ("forceCompacting", "majorCompacting", "minorCompacting", "running")
        details.update({key: any(m.details()[key] for m in self.members) for key in keys})
        details.update(
            {
                "majorCompactionCounter": self.metrics.major_compactions,
                "minorCompactionCounter": self.metrics.minor_compactions,
                "entryLocationCompactionCounter": self.metrics.entry_location_compactions,
                "last_run": merged_report(runs) if runs else None,
                "last_error": "; ".join(errors) or None,
                "unindexed_kept": self.unindexed_kept,
                "live_fraction": dict(self.metrics.live_fraction),
                "ledger_dirs": len(self.members),
            }
        )
        totals = details["totals"]
        for key in totals:
            totals[key] = sum(m.details()["totals"][key] for m in self.members)
        totals["runs"] = self.metrics.runs
        return details


# The bookie's garbage collection, whichever it is (`collector_for`).
Collector = GarbageCollector | GcGroup


def merged_report(reports: list[GcReport]) -> GcReport:
    """One report of the directories' runs: lists joined, counts summed, the first start."""
    first = reports[0]
    merged: GcReport = {
        "started_ms": min(r["started_ms"] for r in reports),
        "ledgers_deleted": sorted(i for r in reports for i in r["ledgers_deleted"]),
        "overreplicated_deleted": sorted(i for r in reports for i in r["overreplicated_deleted"]),
        "unindexed_kept": sorted(i for r in reports for i in r["unindexed_kept"]),
        "entry_logs_removed": [i for r in reports for i in r["entry_logs_removed"]],
        "entry_logs_compacted": [i for r in reports for i in r["entry_logs_compacted"]],
        "entries_moved": sum(r["entries_moved"] for r in reports),
        "bytes_moved": sum(r["bytes_moved"] for r in reports),
        "bytes_reclaimed": sum(r["bytes_reclaimed"] for r in reports),
        "compaction": next((r["compaction"] for r in reports if r["compaction"]), first["compaction"]),
        "errors": [e for r in reports for e in r["errors"]],
    }
    if all("seconds" in r for r in reports):
        merged["seconds"] = round(sum(r.get("seconds", 0.0) for r in reports), 3)
    return merged
