"""The checks of `bkctl doctor`: each reads the metadata store (and the bookies' admin HTTP info) and
says ok, problem or unknown with one line of detail. See docs/commands/doctor.md.

Only reads: nothing here writes to the store or to a bookie.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from bkctl.errors import BkctlError

if TYPE_CHECKING:
    from bkctl.client.placement import Placement
    from bkctl.metadata.layout import Layout

OK: Final = "ok"
PROBLEM: Final = "problem"
UNKNOWN: Final = "unknown"

# Java's diskUsageWarnThreshold default: a bookie warns at 90% and turns read-only at 95%.
DISK_WARN_FRACTION: Final = 0.90
HTTP_TIMEOUT_S: Final = 2.0  # local bound
HTTP_PARALLEL: Final = 8
MARKS_SHOWN: Final = 10  # under-replicated ledger ids named in the detail line


@dataclass
class Check:
    check: str
    state: str  # OK, PROBLEM or UNKNOWN
    detail: str


@dataclass
class BookieHealth:
    bookie_id: str
    state: str  # rw, ro or down (a cookie but no registration)
    cookie: bool
    http: str | None = None  # host:port of its admin HTTP endpoint, when it registers one
    disk_used_fraction: float | None = None  # the fullest of its directories; None: unknown
    disk_detail: str = UNKNOWN
    unindexed_kept: list[int] = field(default_factory=list)  # from its info: records GC keeps, no index

    def as_dict(self) -> dict[str, Any]:
        return {
            "bookie_id": self.bookie_id,
            "state": self.state,
            "cookie": self.cookie,
            "disk_used_fraction": self.disk_used_fraction,
            "disk": self.disk_detail,
        }


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    bookies: list[BookieHealth] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, check: str, state: str, detail: str) -> None:
        self.checks.append(Check(check, state, detail))

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.state == PROBLEM]


def run_checks(layout: Layout, disk_warn: float = DISK_WARN_FRACTION) -> Report:
    """Every check, in the order an operator would look (store, identity, bookies, repairs)."""
    report = Report()
    check_identity(layout, report)
    bookies = check_bookies(layout, report)
    check_disks(bookies, report, disk_warn)
    check_indexes(bookies, report)
    check_underreplicated(layout, report)
    check_autorecovery(layout, report)
    check_last_audit(layout, report)
    report.bookies = bookies
    return report


# --- identity: layout, instance id, cookies --------------------------------------------------------------


def check_identity(layout: Layout, report: Report) -> None:
    """LAYOUT names the hierarchical manager (open_layout checked it), INSTANCEID is there, and every
    cookie names that instance (a bookie formatted for another cluster will refuse to start)."""
    manager = layout.check_initialized()
    instance = layout.instance_id()
    report.facts.update(
        instance_id=instance,
        layout=f"{manager.manager_factory_class}:{manager.manager_version}",
        root=layout.root,
    )
    report.add("metadata", OK, f"reachable, cluster at {layout.root}")
    if instance is None:
        report.add("instance_id", PROBLEM, f"{layout.path('INSTANCEID')} is missing")
        return
    foreign = []
    for bookie_id in layout.cookie_bookies():
        try:
            cookie = layout.read_cookie(bookie_id)
        except BkctlError as exc:
            foreign.append(f"{bookie_id} (cookie does not decode: {exc})")
            continue
        if cookie is not None and cookie.value.instance_id not in (None, instance):
            foreign.append(f"{bookie_id} (cookie of instance {cookie.value.instance_id})")
    if foreign:
        report.add("instance_id", PROBLEM, f"{instance}; cookies of another cluster: {', '.join(foreign)}")
    else:
        report.add("instance_id", OK, f"{instance}, layout {report.facts['layout']}")


# --- bookies ------------------------------------------------------------------------------------------


def check_bookies(layout: Layout, report: Report) -> list[BookieHealth]:
    """Registered (rw / ro) against the cookies: a cookie without a registration is a bookie that is
    down (or retired without `bookie decommission`); a registration without a cookie is not BookKeeper's."""
    rw, ro, cookies = layout.bookies(), layout.bookies(readonly=True), set(layout.cookie_bookies())
    states = {**{b: "down" for b in cookies}, **{b: "ro" for b in ro}, **{b: "rw" for b in rw}}
    bookies = [BookieHealth(b, states[b], b in cookies, _http_endpoint(layout, b)) for b in sorted(states)]
    down = [b.bookie_id for b in bookies if b.state == "down"]
    no_cookie = [b.bookie_id for b in bookies if not b.cookie]
    counts = f"{len(rw)} read-write, {len(ro)} read-only, {len(down)} down (of {len(cookies)} with a cookie)"
    report.facts.update(bookies_rw=len(rw), bookies_ro=len(ro), bookies_down=len(down))
    problems = []
    if down:
        problems.append(f"down: {', '.join(down)}")
    if ro:
        problems.append(f"read-only: {', '.join(sorted(ro))}")
    if no_cookie:
        problems.append(f"registered without a cookie: {', '.join(no_cookie)}")
    if not rw:
        problems.append("no read-write bookie: nothing can be written")
    report.add("bookies", PROBLEM if problems else OK, "; ".join([counts, *problems]))
    return bookies


def _http_endpoint(layout: Layout, bookie_id: str) -> str | None:
    address = layout.bookie_endpoint(bookie_id, "http")
    return None if address is None else f"{address[0]}:{address[1]}"


def check_disks(bookies: list[BookieHealth], report: Report, warn: float) -> None:
    """Disk usage from each live bookie's /api/v1/bookie/info (fetched in parallel, bounded waits)."""
    reachable = [b for b in bookies if b.state != "down" and b.http is not None]
    for b in bookies:
        if b.state == "down":
            b.disk_detail = "unknown (down)"
        elif b.http is None:
            b.disk_detail = "unknown (no admin HTTP endpoint registered)"
    with ThreadPoolExecutor(max_workers=HTTP_PARALLEL) as pool:
        for b, answer in zip(reachable, pool.map(_bookie_info, reachable), strict=True):
            take_disk(b, answer)
    full = [b for b in bookies if b.disk_used_fraction is not None and b.disk_used_fraction >= warn]
    known = [b for b in bookies if b.disk_used_fraction is not None]
    if full:
        shown = ", ".join(f"{b.bookie_id} {b.disk_used_fraction:.0%}" for b in full)
        report.add("disk", PROBLEM, f"at or above {warn:.0%} used: {shown}")
    elif not known:
        report.add("disk", UNKNOWN, "no bookie's admin HTTP info reachable (start bookies with --http-port)")
    else:
        fullest = max(known, key=lambda b: b.disk_used_fraction or 0.0)
        unknown = len(bookies) - len(known)
        report.add(
            "disk",
            OK,
            f"fullest {fullest.bookie_id} {fullest.disk_used_fraction:.0%}"
            + (f"; {unknown} bookie(s) unknown" if unknown else ""),
        )


def _bookie_info(bookie: BookieHealth) -> dict[str, Any] | str:
    url = f"http://{bookie.http}/api/v1/bookie/info"
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as answer:
            document = json.loads(answer.read())
    except (OSError, ValueError) as exc:
        return f"unknown ({url}: {getattr(exc, 'reason', exc)})"
    return document if isinstance(document, dict) else f"unknown ({url}: not a JSON object)"


def take_disk(bookie: BookieHealth, answer: dict[str, Any] | str) -> None:
    """The disk usage of a bookie's info answer: bkctl's per-directory `disk_usage` (the fullest
    directory counts: it turns the bookie read-only), or Java's `freeSpace` / `totalSpace` (the sum over
    its ledger directories: the best a Java bookie says)."""
    if isinstance(answer, str):
        bookie.disk_detail = answer
        return
    kept = answer.get("gc_unindexed_kept")
    bookie.unindexed_kept = [int(i) for i in kept if isinstance(i, int)] if isinstance(kept, list) else []
    usage = answer.get("disk_usage")
    fractions = [
        float(d["used_fraction"])
        for d in (usage.values() if isinstance(usage, dict) else ())
        if isinstance(d, dict) and isinstance(d.get("used_fraction"), int | float)
    ]
    free, total = answer.get("freeSpace"), answer.get("totalSpace")
    if fractions:
        bookie.disk_used_fraction = max(fractions)
        shown = f"fullest of {len(fractions)} directories"
    elif isinstance(free, int) and isinstance(total, int) and 0 <= free <= total and total > 0:
        bookie.disk_used_fraction = round(1 - free / total, 4)
        shown = "all ledger directories together"
    else:
        bookie.disk_detail = "unknown (the bookie reports no disk usage)"
        return
    bookie.disk_detail = f"{bookie.disk_used_fraction:.0%} used ({shown})"


def check_indexes(bookies: list[BookieHealth], report: Report) -> None:
    """Ledgers a bookie's GC keeps because their records have no index there (from the info fetched
    by check_disks): each needs `bkctl index rebuild` on that bookie, stopped."""
    damaged = [b for b in bookies if b.unindexed_kept]
    if not damaged:
        reachable = any(b.disk_used_fraction is not None for b in bookies)
        report.add("indexes", OK if reachable else UNKNOWN, "no bookie reports a ledger without its index")
        return
    shown = "; ".join(f"{b.bookie_id} ledgers {','.join(map(str, b.unindexed_kept))}" for b in damaged)
    report.add(
        "indexes",
        PROBLEM,
        f"entry log records without an index (kept by GC): {shown}; stop that bookie, "
        "`bkctl bookie check --ledger-dir D`, `bkctl index rebuild --ledger-dir D --ledger L`, start it",
    )


# --- repairs: marks, autorecovery, audits --------------------------------------------------------------


def check_underreplicated(layout: Layout, report: Report) -> None:
    problems: list[str] = []
    ids = list(layout.underreplicated_ids(lambda path, why: problems.append(f"{path}: {why}")))
    report.facts["underreplicated_count"] = len(ids)
    if ids:
        shown = ", ".join(str(i) for i in ids[:MARKS_SHOWN]) + (", ..." if len(ids) > MARKS_SHOWN else "")
        report.add("underreplicated", PROBLEM, f"{len(ids)} ledger(s) marked: {shown}")
    elif problems:
        report.add("underreplicated", PROBLEM, f"malformed marks: {'; '.join(problems)}")
    else:
        report.add("underreplicated", OK, "no ledger marked")


def check_placement(layout: Layout, report: Report, policy: Placement) -> None:
    """Closed ledgers whose write sets span fewer racks (zones, regions) than the policy asks."""
    from bkctl.recovery.placement_check import check_placement as judge

    if not policy.aware:
        return
    found = judge(layout, policy)
    ids = sorted(found.not_adhering)
    report.facts.update(placement_checked=found.closed_audited, placement_not_adhering=len(ids))
    if ids:
        shown = ", ".join(str(i) for i in ids[:MARKS_SHOWN]) + (", ..." if len(ids) > MARKS_SHOWN else "")
        report.add(
            "placement",
            PROBLEM,
            f"{len(ids)} of {found.closed_audited} closed ledger(s) break the policy "
            f"({policy.settings.describe()}): {shown}",
        )
    else:
        report.add(
            "placement", OK, f"{found.closed_audited} closed ledger(s) within {policy.settings.describe()}"
        )


def check_autorecovery(layout: Layout, report: Report) -> None:
    enabled = layout.autorecovery_enabled()
    auditor = layout.current_auditor(lambda path, why: None)
    report.facts.update(autorecovery_enabled=enabled, auditor=auditor, auditor_running=auditor is not None)
    if not enabled:
        report.add("autorecovery", PROBLEM, "disabled: dead bookies' ledgers are not re-replicated")
    else:
        report.add("autorecovery", OK, "enabled")
    if auditor is None:
        report.add("auditor", PROBLEM, "no auditor elected: no autorecovery daemon is running")
    else:
        report.add("auditor", OK, f"{auditor} is the auditor")


def check_last_audit(layout: Layout, report: Report, now_ms: int | None = None) -> None:
    """When the auditor last looked for lost bookies (bkctl daemons publish it) and last checked every
    ledger (`checkallledgersctime`, written by Java's auditors too). Information, never a problem."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    audits = [d.get("last_audit_ms") for d in _daemon_statuses(layout)]
    last_audit = max((a for a in audits if isinstance(a, int)), default=None)
    last_check = layout.check_ctime("checkallledgersctime")
    report.facts.update(last_audit_ms=last_audit, last_check_all_ledgers_ms=last_check)
    if last_audit is None and last_check is None:
        report.add("last_audit", UNKNOWN, "no audit and no check of all ledgers recorded")
        return
    parts = [
        f"{what} {_ago(ms, now_ms)}"
        for what, ms in (("lost-bookie audit", last_audit), ("check of all ledgers", last_check))
        if ms is not None
    ]
    report.add("last_audit", OK, "; ".join(parts))


def _daemon_statuses(layout: Layout) -> Iterable[dict[str, Any]]:
    for data in layout.daemon_statuses().values():
        try:
            document = json.loads(data)
        except ValueError:
            continue
        if isinstance(document, dict):
            yield document


def _ago(ms: int, now_ms: int) -> str:
    when = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    seconds = max(0, (now_ms - ms) // 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{when} ({seconds // size} {unit} ago)"
    return f"{when} ({seconds} s ago)"


def unreachable(error: BkctlError) -> Report:
    """The report when the metadata store cannot be read: that one problem, every other check unknown."""
    report = Report()
    report.add("metadata", PROBLEM, str(error))
    for name in (
        "instance_id",
        "bookies",
        "disk",
        "underreplicated",
        "autorecovery",
        "auditor",
        "last_audit",
    ):
        report.add(name, UNKNOWN, "metadata store not readable")
    return report
