"""The replica audit: what the metadata says each bookie should hold, against what the bookies hold.

Expected replicas are computed by Spark from the segments (entry e of a segment goes to
`ensemble[(e + i) % E]` for i < Qw), with no per-entry loop on the driver; one full outer join with the
bookies' holdings classifies every replica; findings are grouped into entry ranges (gaps and islands)
before anything reaches the driver.

Open ledgers end where the bookies say: at the highest entry held by at least Qa bookies (an entry that
may have been acknowledged); entries past it are not findings.

A ledger whose metadata node does not decode is not audited at all: its copies are neither `extra` nor
`orphan` (an orphan is reclaimable, and this ledger may well be alive); the result names it in `warnings`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from bkctl.metadata.stores import layout_at
from bkctl.pipeline import sources
from bkctl.pipeline.inventory import BookieDirs, Verify, ledger_record_bytes
from bkctl.pipeline.online import OnlineBookie
from bkctl.pipeline.session import parallelism

KINDS = ("missing", "lost", "extra", "orphan", "corrupt", "divergent")
BOOKIE_KINDS = ("missing", "extra", "orphan", "corrupt")  # the kinds that name a bookie
FINDING_SCHEMA = (
    "kind string, ledger_id long, bookie string, first_entry_id long, last_entry_id long, "
    "entries long, bytes long"
)
LEDGER_COLUMNS = ["ledger_id", "state", "last_entry_id", "ensemble_size", "write_quorum", "ack_quorum"]


@dataclass
class AuditOptions:
    ledgers: tuple[int, int] | None = None  # inclusive range
    verify_digests: bool = False
    sample: float = 1.0
    output_dir: Path | None = None


@dataclass
class AuditResult:
    summary: dict[str, Any]
    findings: list[dict[str, Any]]
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
        .cache()
    )
    held = _holdings(spark, bookies, ids, verify).cache()
    undecodable, warnings = _undecodable(segments)
    errors = [r.problem for r in held.where("problem IS NOT NULL").select("problem").collect()]
    held_ok = held.where("problem IS NULL")
    if options.ledgers is not None:
        held_ok = held_ok.where(F.col("ledger_id").between(*options.ledgers))
    if undecodable:
        held_ok = held_ok.where(~F.col("ledger_id").isin(undecodable))
    by_entry = _holdings_by_entry(held_ok).cache()
    ends = _ledger_ends(segments.where("problem IS NULL"), by_entry).cache()
    entries = _classify(segments.where("problem IS NULL"), by_entry, ends, [b.bookie_id for b in bookies])
    entries = entries.cache()
    findings = _findings(entries, bookies)
    summary = _summary(entries, ends, findings, len(bookies))
    summary["seconds"] = round(time.monotonic() - started, 2)
    if options.output_dir is not None:
        _write_output(spark, options.output_dir, entries, findings, summary)
    for frame in (entries, ends, by_entry, held, segments):
        frame.unpersist()
    return AuditResult(summary, findings, errors, warnings)


def _undecodable(segments: DataFrame) -> tuple[list[int], list[str]]:
    """Ledgers whose metadata node does not decode (ids, to leave their copies out) and a warning each."""
    rows = segments.where("problem IS NOT NULL").select("ledger_id", "problem").collect()
    warnings = [
        f"{r.problem} (ledger {r.ledger_id} not audited: its copies are neither extra nor orphan)"
        for r in rows
    ]
    return sorted({r.ledger_id for r in rows}), warnings


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


def _holdings_by_entry(held: DataFrame) -> DataFrame:
    """One row per (ledger, entry) held anywhere: its holders, the holders of a corrupt copy, and how
    many different payloads the verified copies have, how many copies had their digest checked (one
    shuffle; an entry in both the index and the journal of a bookie counts once, except in `checked`)."""
    return held.groupBy("ledger_id", "entry_id").agg(
        F.collect_set("bookie").alias("holders"),
        F.count("digest_ok").alias("checked"),
        F.collect_set(F.when(~F.col("digest_ok"), F.col("bookie"))).alias("corrupt"),
        F.countDistinct(F.when(F.col("digest_ok"), F.col("payload_crc"))).alias("versions"),
    )


def _ledger_ends(segments: DataFrame, by_entry: DataFrame) -> DataFrame:
    """Ledger columns + `end`: a closed ledger's last entry; an open one's highest entry on >= Qa bookies."""
    ledgers = segments.select(*LEDGER_COLUMNS).distinct()
    open_ledgers = F.broadcast(ledgers.where("state != 'CLOSED'").select("ledger_id", "ack_quorum"))
    open_ends = (
        by_entry.join(open_ledgers, "ledger_id")
        .where(F.size("holders") >= F.col("ack_quorum"))
        .groupBy("ledger_id")
        .agg(F.max("entry_id").alias("open_end"))
    )
    closed = F.col("state") == "CLOSED"
    end = F.when(closed, F.col("last_entry_id")).otherwise(F.coalesce("open_end", F.lit(-1)))
    return ledgers.join(open_ends, "ledger_id", "left").withColumn("end", end).drop("open_end")


def _expected(segments: DataFrame, ends: DataFrame) -> DataFrame:
    """(ledger_id, entry_id, write_set) for every entry the metadata says exists."""
    seg = segments.join(F.broadcast(ends.select("ledger_id", "end")), "ledger_id")
    seg_end = F.when(F.col("segment_last") >= 0, F.least("segment_last", "end")).otherwise(F.col("end"))
    seg = seg.withColumn("seg_end", seg_end).where("seg_end >= first_entry_id")
    entries = seg.select(
        "ledger_id",
        "ensemble",
        "ensemble_size",
        "write_quorum",
        F.explode(F.sequence("first_entry_id", "seg_end")).alias("entry_id"),
    )
    size = F.col("ensemble_size")
    write_set = F.transform(
        F.sequence(F.lit(0), F.col("write_quorum") - 1),
        lambda i: F.element_at("ensemble", ((F.col("entry_id") + i) % size + 1).cast("int")),
    )
    return entries.select("ledger_id", "entry_id", write_set.alias("write_set"))


def _classify(segments: DataFrame, by_entry: DataFrame, ends: DataFrame, audited: list[str]) -> DataFrame:
    """One row per entry expected or held: `missing` (audited bookies of the write set without it),
    `unknown` (bookies of the write set not audited), `extra` (holders outside the write set: `orphan`
    when the ledger is not in the metadata; none past an open ledger's end), `lost`, `corrupt`,
    `divergent`."""
    known = F.array(*[F.lit(b) for b in audited]) if audited else F.array().cast("array<string>")
    joined = _expected(segments, ends).join(by_entry, ["ledger_id", "entry_id"], "full_outer")
    joined = joined.join(F.broadcast(ends.select("ledger_id", "state", "end")), "ledger_id", "left")
    holders = F.coalesce("holders", F.array().cast("array<string>"))
    absent = F.array_except(F.col("write_set"), holders)
    unknown = F.filter(absent, lambda b: ~F.array_contains(known, b))
    missing = F.filter(absent, lambda b: F.array_contains(known, b))
    past_end = (F.col("state") != "CLOSED") & (F.col("entry_id") > F.col("end"))
    outside = F.when(F.col("write_set").isNull() & past_end, F.array().cast("array<string>")).otherwise(
        F.array_except(holders, F.coalesce("write_set", F.array().cast("array<string>")))
    )
    lost = F.col("write_set").isNotNull() & (F.size(holders) == 0) & (F.size(unknown) == 0)
    return joined.select(
        "ledger_id",
        "entry_id",
        F.coalesce("write_set", F.array().cast("array<string>")).alias("write_set"),
        F.array_intersect(F.col("write_set"), holders).alias("found_on"),
        F.coalesce("checked", F.lit(0)).alias("checked"),
        F.col("write_set").isNotNull().alias("expected"),
        F.coalesce(F.size("write_set"), F.lit(0)).alias("wanted"),
        F.size(F.array_intersect(F.col("write_set"), holders)).alias("found"),
        F.when(lost, F.array().cast("array<string>")).otherwise(missing).alias("missing"),
        F.size(unknown).alias("unknown"),
        lost.alias("lost"),
        outside.alias("outside"),
        F.col("state").isNull().alias("orphan"),
        F.coalesce("corrupt", F.array().cast("array<string>")).alias("corrupt"),
        (F.coalesce("versions", F.lit(0)) > 1).alias("divergent"),
    )


def _finding_rows(entries: DataFrame) -> DataFrame:
    """(kind, ledger_id, bookie, entry_id), one per replica (per entry for lost and divergent)."""
    none = F.lit(None).cast("string").alias("bookie")
    kind = F.when(F.col("orphan"), "orphan").otherwise("extra").alias("kind")
    parts = [
        entries.select(
            F.lit("missing").alias("kind"), "ledger_id", F.explode("missing").alias("bookie"), "entry_id"
        ),
        entries.where("lost").select(F.lit("lost").alias("kind"), "ledger_id", none, "entry_id"),
        entries.select(kind, "ledger_id", F.explode("outside").alias("bookie"), "entry_id"),
        entries.select(
            F.lit("corrupt").alias("kind"), "ledger_id", F.explode("corrupt").alias("bookie"), "entry_id"
        ),
        entries.where("divergent").select(F.lit("divergent").alias("kind"), "ledger_id", none, "entry_id"),
    ]
    rows = parts[0]
    for part in parts[1:]:
        rows = rows.unionByName(part)
    return rows


def _ranges(rows: DataFrame) -> DataFrame:
    """(kind, ledger_id, bookie, entry_id) rows -> consecutive runs: first/last entry and count."""
    order = Window.partitionBy("kind", "ledger_id", "bookie").orderBy("entry_id")
    run = F.col("entry_id") - F.row_number().over(order)
    return (
        rows.withColumn("run", run)
        .groupBy("kind", "ledger_id", "bookie", "run")
        .agg(
            F.min("entry_id").alias("first_entry_id"),
            F.max("entry_id").alias("last_entry_id"),
            F.count("*").alias("entries"),
        )
        .drop("run")
    )


def _findings(entries: DataFrame, bookies: Bookies) -> list[dict[str, Any]]:
    rows = _ranges(_finding_rows(entries)).collect()
    findings = [
        {
            "kind": r.kind,
            "ledger_id": r.ledger_id,
            "bookie": r.bookie,
            "first_entry_id": r.first_entry_id,
            "last_entry_id": r.last_entry_id,
            "entries": r.entries,
        }
        for r in rows
    ]
    _add_orphan_bytes(findings, bookies)
    return sorted(findings, key=_finding_order)


def _finding_order(f: dict[str, Any]) -> tuple[int, int, str, int]:
    return KINDS.index(f["kind"]), f["ledger_id"], f["bookie"] or "", f["first_entry_id"]


def _add_orphan_bytes(findings: list[dict[str, Any]], bookies: Bookies) -> None:
    """An orphan ledger's bytes on each bookie (few ledgers: read on the driver, next to the files)."""
    by_id = {b.bookie_id: b for b in bookies if isinstance(b, BookieDirs)}
    for finding in findings:
        if finding["kind"] == "orphan" and finding["bookie"] in by_id:
            finding["bytes"] = ledger_record_bytes(by_id[finding["bookie"]], finding["ledger_id"])


def _summary(
    entries: DataFrame, ends: DataFrame, findings: list[dict[str, Any]], bookies: int
) -> dict[str, Any]:
    totals = entries.agg(
        F.sum(F.col("expected").cast("long")).alias("entries"),
        F.sum("wanted").alias("wanted"),
        F.sum("found").alias("found"),
        F.sum("unknown").alias("unknown"),
        F.sum("checked").alias("checked"),
    ).collect()[0]
    total = {kind: sum(f["entries"] for f in findings if f["kind"] == kind) for kind in KINDS}
    orphans = [f for f in findings if f["kind"] == "orphan"]
    return {
        "ledgers": ends.count(),
        "bookies": bookies,
        "entries_expected": totals["entries"] or 0,
        "replicas_expected": totals["wanted"] or 0,
        "replicas_found": totals["found"] or 0,
        "missing": total["missing"],
        "lost": total["lost"],
        "extra": total["extra"],
        "orphan_ledgers": len({f["ledger_id"] for f in orphans}),
        "orphan_bytes": sum(f.get("bytes", 0) for f in orphans),
        "corrupt": total["corrupt"],
        "divergent": total["divergent"],
        "unknown": totals["unknown"] or 0,
        "digests_checked": totals["checked"] or 0,
    }


def _write_output(
    spark: SparkSession,
    directory: Path,
    entries: DataFrame,
    findings: list[dict[str, Any]],
    summary: dict[str, Any],
) -> None:
    """Parquet of the findings and of per-bookie / per-ledger totals, and summary.json."""
    frame = spark.createDataFrame([_row(f) for f in findings], FINDING_SCHEMA)
    frame.write.mode("overwrite").parquet(str(directory / "findings"))
    per_bookie = _totals(
        entries.select(F.explode("write_set").alias("bookie")),
        entries.select(F.explode("found_on").alias("bookie")),
        frame.where("bookie IS NOT NULL"),
        "bookie",
        BOOKIE_KINDS,
    )
    per_bookie.write.mode("overwrite").parquet(str(directory / "per_bookie"))
    per_ledger = _totals(
        entries.select("ledger_id", F.explode("write_set").alias("bookie")),
        entries.select("ledger_id", F.explode("found_on").alias("bookie")),
        frame,
        "ledger_id",
        KINDS,
    )
    per_ledger.write.mode("overwrite").parquet(str(directory / "per_ledger"))
    (directory / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def _totals(
    expected: DataFrame, found: DataFrame, findings: DataFrame, key: str, kinds: Sequence[str]
) -> DataFrame:
    """One row per `key`: replicas_expected, replicas_found (counted in Spark, per replica) and the
    entries of each finding kind; a key with findings only (an orphan's bookie or ledger) has 0 replicas."""
    counts = expected.groupBy(key).agg(F.count("*").alias("replicas_expected"))
    counts = counts.join(found.groupBy(key).agg(F.count("*").alias("replicas_found")), key, "full_outer")
    by_kind = findings.groupBy(key).pivot("kind", list(kinds)).agg(F.sum("entries"))
    table = counts.join(by_kind, key, "full_outer")
    columns = ["replicas_expected", "replicas_found", *kinds]
    return table.select(key, *(F.coalesce(F.col(c), F.lit(0)).cast("long").alias(c) for c in columns))


def _row(finding: dict[str, Any]) -> tuple[Any, ...]:
    keys = ("kind", "ledger_id", "bookie", "first_entry_id", "last_entry_id", "entries")
    return (*(finding[k] for k in keys), finding.get("bytes"))


def mark_underreplicated(uri: str, findings: Iterable[dict[str, Any]]) -> list[int]:
    """A mark for every ledger with a missing replica (autorecovery repairs it); the ledgers marked."""
    missing: dict[int, set[str]] = {}
    for finding in findings:
        if finding["kind"] == "missing":
            missing.setdefault(finding["ledger_id"], set()).add(finding["bookie"])
    with layout_at(uri) as layout:
        for ledger_id, bookies in sorted(missing.items()):
            layout.mark_underreplicated(ledger_id, sorted(bookies))
    return sorted(missing)
