"""The replica audit: what the metadata says each bookie should hold, against what the bookies hold.

The bookies' holdings come as bitmaps, one row per (bookie, ledger, piece of the ledger) rather than one
per entry; one cogroup (a single shuffle) brings each ledger's segments and holdings together and
`compare.py` audits the ledger in an executor, with whole-range arithmetic (a bookie's share of a
segment is a union of residue classes modulo the ensemble size); findings leave it already grouped into
entry ranges, and totals are summed by Spark. The driver gets the findings and a few sums, never
per-entry data.

Open ledgers end where the bookies say: at the highest entry held by at least Qa bookies (an entry that
may have been acknowledged); entries past it are not findings.

A ledger whose metadata node does not decode is not audited at all: its copies are neither `extra` nor
`orphan` (an orphan is reclaimable, and this ledger may well be alive); the result names it in `warnings`.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bkctl.client.placement import Placement
from bkctl.metadata.stores import layout_at
from bkctl.model import LedgerState
from bkctl.pipeline import compare, sources
from bkctl.pipeline.bookie_dirs import BookieDirs
from bkctl.pipeline.inventory import Verify, ledger_record_bytes
from bkctl.pipeline.online import OnlineBookie
from bkctl.pipeline.session import parallelism

# `placement`: entries whose write set spans fewer racks (zones, regions) than the policy asks; judged
# from the metadata on the driver (no bookie is read for it), with the bookies and their racks
KINDS = (*compare.FINDING_KINDS, "placement")
BOOKIE_KINDS = ("missing", "extra", "orphan", "corrupt")  # the kinds that name a bookie
FINDING_SCHEMA = (
    "kind string, ledger_id long, bookie string, first_entry_id long, last_entry_id long, "
    "entries long, bytes long"
)
SEGMENT_FIELDS = (
    "state", "last_entry_id", "ensemble_size", "write_quorum", "ack_quorum", "first_entry_id", "segment_last",
    "ensemble",
)  # fmt: skip
HOLDING_FIELDS = ("bookie", "first_entry_id", "held", "ok", "bad", "crcs", "problem")
RESULT_TYPES = (pa.string(), pa.int64(), pa.string(), pa.int64(), pa.int64(), pa.int64(), pa.string())


@dataclass
class AuditOptions:
    ledgers: tuple[int, int] | None = None  # inclusive range
    verify_digests: bool = False
    sample: float = 1.0
    output_dir: Path | None = None
    placement: Placement | None = None  # judge placement too (`--conf` with an aware policy)
    # directories whose cookie names another cluster, audited anyway (--force): said in the summary
    foreign_dirs: list[str] = field(default_factory=list)


class Finding(TypedDict):
    """One finding of the audit (docs/commands/audit.md): a run of entries of one kind."""

    kind: str  # one of KINDS
    ledger_id: int
    bookie: str | None
    first_entry_id: int
    last_entry_id: int
    entries: int
    bytes: NotRequired[int]  # an orphan ledger's bytes on a bookie whose files were read
    racks: NotRequired[list[str]]  # a placement finding: the write set's racks, and why it breaks the policy
    reason: NotRequired[str]


class AuditSummary(TypedDict):
    ledgers: int
    bookies: int
    entries_expected: int
    replicas_expected: int
    replicas_found: int
    missing: int
    lost: int
    extra: int
    orphan_ledgers: int
    orphan_bytes: int
    corrupt: int
    divergent: int
    unknown: int
    digests_checked: int
    seconds: NotRequired[float]  # set when the audit ends
    placement: NotRequired[int]  # entries whose write set breaks the placement policy (an aware policy)
    placement_ledgers: NotRequired[int]
    foreign_dirs: NotRequired[list[str]]  # --force: directories of another cluster audited anyway


@dataclass
class AuditResult:
    summary: AuditSummary
    findings: list[Finding]
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.findings and not self.errors and not self.warnings

    def as_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "findings": self.findings,
            "errors": self.errors,
            "warnings": self.warnings,
        }


Bookies = Sequence[BookieDirs | OnlineBookie]


def run_audit(spark: SparkSession, uri: str, bookies: Bookies, options: AuditOptions) -> AuditResult:
    """Audit the ledgers against the bookies: BookieDirs are read offline from their files, OnlineBookies
    asked over the network (`--online`); every bookie given is audited, any other is `unknown`."""
    started = time.monotonic()
    sources.register(spark)
    ids, keys = _ledger_ids(uri, options)
    verify = Verify(keys, options.sample) if options.verify_digests else None
    segments = (
        spark.read.format("bkctl_ledger_segments")
        .options(uri=uri, ids=json.dumps(ids), partitions=str(parallelism(spark)))
        .load()
    )
    held = _holdings(spark, bookies, ids, verify)
    if options.ledgers is not None:  # problem rows (ledger -1) name files: they stay
        held = held.where(F.col("ledger_id").between(*options.ledgers) | F.col("problem").isNotNull())
    audited = frozenset(b.bookie_id for b in bookies)
    # One shuffle: segments and holdings meet by ledger; each ledger is audited whole, in an executor.
    result = (
        segments.groupBy("ledger_id")
        .cogroup(held.groupBy("ledger_id"))
        .applyInArrow(functools.partial(_audit_group, audited), compare.RESULT_SCHEMA)
        .cache()
    )
    try:
        rows = result.where(~F.col("kind").isin(*compare.TOTAL_KINDS)).collect()
        sums = result.where(F.col("kind").isin(*compare.TOTAL_KINDS)).groupBy("kind").agg(F.sum("entries"))
        totals = {r[0]: r[1] for r in sums.collect()}
        findings = _findings([r for r in rows if r.kind in KINDS], bookies)
        misplaced = []
        if options.placement is not None and options.placement.aware:
            misplaced = placement_findings(uri, ids, options.placement)
        errors = [r.text for r in rows if r.kind == "error"]
        warnings = [
            f"{r.text} (ledger {r.ledger_id} not audited: its copies are neither extra nor orphan)"
            for r in sorted((r for r in rows if r.kind == "warning"), key=lambda r: r.ledger_id)
        ]
        summary = _summary(totals, findings, len(bookies))
        if options.placement is not None and options.placement.aware:
            summary["placement"] = sum(f["entries"] for f in misplaced)
            summary["placement_ledgers"] = len({f["ledger_id"] for f in misplaced})
        summary["seconds"] = round(time.monotonic() - started, 2)
        summary["foreign_dirs"] = options.foreign_dirs
        if options.output_dir is not None:  # the replica findings' tables (placement is in the JSON)
            _write_output(spark, options.output_dir, result, findings, summary)
        findings += misplaced
    finally:
        result.unpersist()
    return AuditResult(summary, findings, errors, warnings)


def _audit_group(audited: frozenset[str], key: tuple[Any, ...], segments: Any, held: Any) -> Any:
    """The cogroup function (in an executor): one ledger's segment and holding rows (Arrow tables) ->
    its result rows (compare.RESULT_SCHEMA)."""
    rows = segments.to_pylist()
    result = compare.audit_ledger(
        key[0].as_py(),
        [compare.Segment(*(r[c] for c in SEGMENT_FIELDS)) for r in rows if r["problem"] is None],
        [r["problem"] for r in rows if r["problem"] is not None],
        zip(*(held.column(c).to_pylist() for c in HOLDING_FIELDS), strict=True),
        audited,
    )
    columns = list(zip(*result, strict=True)) if result else [()] * len(RESULT_TYPES)
    arrays = [pa.array(list(c), type=t) for c, t in zip(columns, RESULT_TYPES, strict=True)]
    return pa.Table.from_arrays(arrays, names=RESULT_NAMES)


RESULT_NAMES = [column.split()[0] for column in compare.RESULT_SCHEMA.split(", ")]


def _holdings(spark: SparkSession, bookies: Bookies, ids: list[int], verify: Verify | None) -> DataFrame:
    """What the bookies hold: offline ones from their files, online ones by asking them."""
    dirs = [b for b in bookies if isinstance(b, BookieDirs)]
    online = [b for b in bookies if isinstance(b, OnlineBookie)]
    frames = []
    if dirs or not online:
        options = sources.bookie_options(dirs, verify)
        frames.append(spark.read.format("bkctl_bookie_files").options(**options).load())
    if online:
        options = sources.online_options(online, ids, verify)
        frames.append(spark.read.format("bkctl_bookies_online").options(**options).load())
    return frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])


def _ledger_ids(uri: str, options: AuditOptions) -> tuple[list[int], dict[int, Any]]:
    """Ledger ids in range (driver: one listing), and digest keys when digests are checked."""
    with layout_at(uri) as layout:
        ids = list(layout.ledger_ids())
        if options.ledgers is not None:
            ids = [i for i in ids if options.ledgers[0] <= i <= options.ledgers[1]]
        if not options.verify_digests:
            return ids, {}
        digests = [(i, md.digest, md.password) for i, md in layout.read_ledgers(ids)]
    return ids, sources.verify_keys(digests)


def _findings(rows: list[Any], bookies: Bookies) -> list[Finding]:
    findings = merged(
        [
            Finding(
                kind=r["kind"],
                ledger_id=r["ledger_id"],
                bookie=r["bookie"],
                first_entry_id=r["first_entry_id"],
                last_entry_id=r["last_entry_id"],
                entries=r["entries"],
            )
            for r in rows
        ]
    )
    _add_orphan_bytes(findings, bookies)
    return sorted(findings, key=_finding_order)


def placement_findings(uri: str, ids: list[int], policy: Placement) -> list[Finding]:
    """One finding per write set breaking the policy in a segment: its entries (entry e goes to the
    positions from e mod ensemble size, Java's round robin), its bookies and their racks. An open
    ledger's last segment is judged up to nothing: its end is not known yet."""
    found: list[Finding] = []
    with layout_at(uri) as layout:
        for ledger_id, md in layout.read_ledgers(ids):
            for number, segment in enumerate(md.segments):
                first = segment.first_entry_id
                last = _segment_last(md, number)
                where = policy.locations(segment.ensemble)
                for violation in policy.violations(segment.ensemble, md.write_quorum):
                    low, high, count = _entries_of(
                        violation, len(segment.ensemble), md.write_quorum, first, last
                    )
                    if count:
                        found.append(
                            {
                                "kind": "placement",
                                "ledger_id": ledger_id,
                                "bookie": ",".join(violation.bookies),
                                "first_entry_id": low,
                                "last_entry_id": high,
                                "entries": count,
                                "racks": [where[b] for b in violation.bookies],
                                "reason": violation.reason,
                            }
                        )
    return found


def _segment_last(md: Any, number: int) -> int:
    if number + 1 < len(md.segments):
        return int(md.segments[number + 1].first_entry_id) - 1
    return int(md.last_entry_id) if md.state is LedgerState.CLOSED else -1


def _entries_of(violation: Any, size: int, quorum: int, first: int, last: int) -> tuple[int, int, int]:
    """(first, last, how many) of the entries in first..last that go to the violation's write set."""
    if quorum >= size:  # one write set: every entry
        return first, last, max(0, last - first + 1)
    low = first + (violation.first - first) % size
    high = last - (last - violation.first) % size
    return low, high, 0 if high < low else (high - low) // size + 1


def merged(findings: list[Finding]) -> list[Finding]:
    """One row per kind, ledger and bookie: from its first entry to its last, `entries` counting those
    found (a striped ensemble leaves a dead bookie's share as runs of 1-2 entries: a thousand rows for
    one bookie's leftovers of one ledger said nothing more than this one does)."""
    rows: dict[tuple[str, int, str | None], Finding] = {}
    for finding in findings:
        key = (finding["kind"], finding["ledger_id"], finding["bookie"])
        row = rows.get(key)
        if row is None:
            rows[key] = Finding(**finding)
            continue
        row["first_entry_id"] = min(row["first_entry_id"], finding["first_entry_id"])
        row["last_entry_id"] = max(row["last_entry_id"], finding["last_entry_id"])
        row["entries"] += finding["entries"]
    return list(rows.values())


def _finding_order(f: Finding) -> tuple[int, int, str, int]:
    return KINDS.index(f["kind"]), f["ledger_id"], f["bookie"] or "", f["first_entry_id"]


def _add_orphan_bytes(findings: list[Finding], bookies: Bookies) -> None:
    """An orphan ledger's bytes on each bookie (few ledgers: read on the driver, next to the files)."""
    by_id = {b.bookie_id: b for b in bookies if isinstance(b, BookieDirs)}
    for finding in findings:
        if finding["kind"] == "orphan" and finding["bookie"] in by_id:
            finding["bytes"] = ledger_record_bytes(by_id[finding["bookie"]], finding["ledger_id"])


def _summary(totals: dict[str, int], findings: list[Finding], bookies: int) -> AuditSummary:
    total = {kind: sum(f["entries"] for f in findings if f["kind"] == kind) for kind in KINDS}
    orphans = [f for f in findings if f["kind"] == "orphan"]
    return {
        "ledgers": totals.get("ledgers", 0),
        "bookies": bookies,
        "entries_expected": totals.get("entries_expected", 0),
        "replicas_expected": totals.get("replicas_expected", 0),
        "replicas_found": totals.get("replicas_found", 0),
        "missing": total["missing"],
        "lost": total["lost"],
        "extra": total["extra"],
        "orphan_ledgers": len({f["ledger_id"] for f in orphans}),
        "orphan_bytes": sum(f.get("bytes", 0) for f in orphans),
        "corrupt": total["corrupt"],
        "divergent": total["divergent"],
        "unknown": totals.get("unknown", 0),
        "digests_checked": totals.get("digests_checked", 0),
    }


def _write_output(
    spark: SparkSession,
    directory: Path,
    result: DataFrame,
    findings: list[Finding],
    summary: AuditSummary,
) -> None:
    """Parquet of the findings and of per-bookie / per-ledger totals, and summary.json."""
    frame = spark.createDataFrame([_row(f) for f in findings], FINDING_SCHEMA)
    frame.write.mode("overwrite").parquet(str(directory / "findings"))
    per_bookie = _totals(result, frame.where("bookie IS NOT NULL"), "bookie", BOOKIE_KINDS)
    per_bookie.write.mode("overwrite").parquet(str(directory / "per_bookie"))
    per_ledger = _totals(result, frame, "ledger_id", compare.FINDING_KINDS)
    per_ledger.write.mode("overwrite").parquet(str(directory / "per_ledger"))
    (directory / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _totals(result: DataFrame, findings: DataFrame, key: str, kinds: Sequence[str]) -> DataFrame:
    """One row per `key`: replicas_expected, replicas_found (summed in Spark from the per (ledger,
    bookie) totals) and the entries of each finding kind; a key with findings only (an orphan's bookie or
    ledger) has 0 replicas."""
    replicas: list[Any] = ["replicas_expected", "replicas_found"]
    counts = (
        result.where(F.col("kind").isin(*replicas)).groupBy(key).pivot("kind", replicas).agg(F.sum("entries"))
    )
    by_kind = findings.groupBy(key).pivot("kind", list(kinds)).agg(F.sum("entries"))
    table = counts.join(by_kind, key, "full_outer")
    columns = ["replicas_expected", "replicas_found", *kinds]
    return table.select(key, *(F.coalesce(F.col(c), F.lit(0)).cast("long").alias(c) for c in columns))


def _row(f: Finding) -> tuple[Any, ...]:
    return (
        f["kind"],
        f["ledger_id"],
        f["bookie"],
        f["first_entry_id"],
        f["last_entry_id"],
        f["entries"],
        f.get("bytes"),
    )


def mark_underreplicated(uri: str, findings: Iterable[Finding]) -> list[int]:
    """A mark for every ledger with a missing replica (autorecovery repairs it); the ledgers marked."""
    missing: dict[int, set[str]] = {}
    for finding in findings:
        bookie = finding["bookie"]
        if finding["kind"] == "missing" and bookie is not None:  # a missing replica names its bookie
            missing.setdefault(finding["ledger_id"], set()).add(bookie)
    with layout_at(uri) as layout:
        for ledger_id, bookies in sorted(missing.items()):
            layout.mark_underreplicated(ledger_id, sorted(bookies))
    return sorted(missing)
