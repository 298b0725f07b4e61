"""The replica audit: what the metadata says each bookie should hold, against what the bookies hold.

Expected replicas are computed by Spark from the segments (entry e of a segment goes to
`ensemble[(e + i) % E]` for i < Qw), with no per-entry loop on the driver; one full outer join with the
bookies' holdings classifies every replica; findings are grouped into entry ranges (gaps and islands)
before anything reaches the driver.

Open ledgers end where the bookies say: at the highest entry held by at least Qa bookies (an entry that
may have been acknowledged); entries past it are not findings.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from bkctl.metadata.stores import layout_at
from bkctl.pipeline import sources
from bkctl.pipeline.inventory import BookieDirs, Verify, ledger_record_bytes

KINDS = ("missing", "lost", "extra", "orphan", "corrupt", "divergent")
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

    @property
    def clean(self) -> bool:
        return not self.findings and not self.errors

    def as_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "findings": self.findings, "errors": self.errors}


def run_audit(spark: SparkSession, uri: str, bookies: list[BookieDirs], options: AuditOptions) -> AuditResult:
    started = time.monotonic()
    sources.register(spark)
    ids, keys = _ledger_ids(uri, options)
    verify = Verify(keys, options.sample) if options.verify_digests else None
    segments = (
        spark.read.format("bkctl_ledger_segments")
        .options(uri=uri, ids=json.dumps(ids), partitions=str(spark.sparkContext.defaultParallelism))
        .load()
        .cache()
    )
    held_all = (
        spark.read.format("bkctl_bookie_files").options(**sources.bookie_options(bookies, verify)).load()
    )
    held_all = held_all.cache()
    errors = [r.problem for r in segments.where("problem IS NOT NULL").select("problem").collect()]
    errors += [r.problem for r in held_all.where("problem IS NOT NULL").select("problem").collect()]
    segments = segments.where("problem IS NULL")
    held = held_all.where("problem IS NULL").dropDuplicates(["bookie", "ledger_id", "entry_id"])
    if options.ledgers is not None:
        first, last = options.ledgers
        held = held.where(F.col("ledger_id").between(first, last))
    result = _classify(segments, held, [b.bookie_id for b in bookies])
    findings = _findings(result, held, bookies)
    summary = _summary(segments, result, findings, len(bookies))
    summary["seconds"] = round(time.monotonic() - started, 2)
    if options.output_dir is not None:
        _write_output(spark, options.output_dir, findings, summary)
    held_all.unpersist()
    segments.unpersist()
    return AuditResult(summary, findings, errors)


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


def _ledger_ends(segments: DataFrame, held: DataFrame) -> DataFrame:
    """ledger columns + `end`: a closed ledger's last entry; an open one's highest entry on >= Qa bookies."""
    ledgers = segments.select(*LEDGER_COLUMNS).distinct()
    copies = held.groupBy("ledger_id", "entry_id").agg(F.count("*").alias("copies"))
    open_ends = (
        copies.join(ledgers.where("state != 'CLOSED'"), "ledger_id")
        .where("copies >= ack_quorum")
        .groupBy("ledger_id")
        .agg(F.max("entry_id").alias("open_end"))
    )
    end = F.when(F.col("state") == "CLOSED", F.col("last_entry_id")).otherwise(
        F.coalesce("open_end", F.lit(-1))
    )
    return ledgers.join(open_ends, "ledger_id", "left").withColumn("end", end).drop("open_end")


def _expected(segments: DataFrame, ends: DataFrame) -> DataFrame:
    """(ledger_id, entry_id, bookie) for every replica the metadata asks for."""
    seg = segments.join(ends.select("ledger_id", "end"), "ledger_id")
    seg_end = F.when(F.col("segment_last") >= 0, F.least("segment_last", "end")).otherwise(F.col("end"))
    seg = seg.withColumn("seg_end", seg_end).where("seg_end >= first_entry_id")
    entries = seg.select(
        "ledger_id",
        "ensemble",
        "ensemble_size",
        "write_quorum",
        F.explode(F.sequence("first_entry_id", "seg_end")).alias("entry_id"),
    )
    replicas = entries.select(
        "ledger_id",
        "entry_id",
        "ensemble",
        "ensemble_size",
        F.explode(F.sequence(F.lit(0), F.col("write_quorum") - 1)).alias("i"),
    )
    bookie = F.element_at(
        "ensemble", ((F.col("entry_id") + F.col("i")) % F.col("ensemble_size") + 1).cast("int")
    )
    return replicas.select("ledger_id", "entry_id", bookie.alias("bookie"))


def _classify(segments: DataFrame, held: DataFrame, audited: list[str]) -> DataFrame:
    """Every replica expected or held, with `status`: found, missing, unknown (a bookie whose files were
    not given), extra, orphan or past_end (an open ledger's unconfirmed tail: ignored)."""
    ends = _ledger_ends(segments, held)
    expected = _expected(segments, ends).withColumn("expected", F.lit(True))
    present = held.select("ledger_id", "entry_id", "bookie", "digest_ok", "payload_crc").withColumn(
        "held", F.lit(True)
    )
    joined = expected.join(present, ["ledger_id", "entry_id", "bookie"], "full_outer").join(
        ends.select("ledger_id", "state", "end"), "ledger_id", "left"
    )
    status = (
        F.when(F.col("expected") & F.col("held"), "found")
        .when(F.col("expected") & ~F.col("bookie").isin(audited), "unknown")
        .when(F.col("expected"), "missing")
        .when(F.col("state").isNull(), "orphan")
        .when((F.col("state") != "CLOSED") & (F.col("entry_id") > F.col("end")), "past_end")
        .otherwise("extra")
    )
    return joined.withColumn("status", status).drop("state", "end").cache()


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


def _finding_rows(result: DataFrame, held: DataFrame) -> DataFrame:
    # An entry is lost when no bookie holds it and every bookie of its write set was audited.
    elsewhere = result.where("held OR status = 'unknown'").select("ledger_id", "entry_id").distinct()
    missing = result.where("status = 'missing'").join(
        elsewhere.withColumn("elsewhere", F.lit(True)), ["ledger_id", "entry_id"], "left"
    )
    lost = (
        missing.where("elsewhere IS NULL")
        .select(
            F.lit("lost").alias("kind"), "ledger_id", F.lit(None).cast("string").alias("bookie"), "entry_id"
        )
        .distinct()
    )
    short = missing.where("elsewhere").select(
        F.lit("missing").alias("kind"), "ledger_id", "bookie", "entry_id"
    )
    other = result.where("status IN ('extra', 'orphan')").select(
        F.col("status").alias("kind"), "ledger_id", "bookie", "entry_id"
    )
    corrupt = held.where("digest_ok = false").select(
        F.lit("corrupt").alias("kind"), "ledger_id", "bookie", "entry_id"
    )
    divergent = (
        held.where("digest_ok")
        .groupBy("ledger_id", "entry_id")
        .agg(F.countDistinct("payload_crc").alias("versions"))
        .where("versions > 1")
        .select(
            F.lit("divergent").alias("kind"),
            "ledger_id",
            F.lit(None).cast("string").alias("bookie"),
            "entry_id",
        )
    )
    return short.unionByName(lost).unionByName(other).unionByName(corrupt).unionByName(divergent)


def _findings(result: DataFrame, held: DataFrame, bookies: list[BookieDirs]) -> list[dict[str, Any]]:
    rows = (
        _ranges(_finding_rows(result, held))
        .orderBy("kind", "ledger_id", "bookie", "first_entry_id")
        .collect()
    )
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
    return sorted(
        findings,
        key=lambda f: (KINDS.index(f["kind"]), f["ledger_id"], f["bookie"] or "", f["first_entry_id"]),
    )


def _add_orphan_bytes(findings: list[dict[str, Any]], bookies: list[BookieDirs]) -> None:
    """An orphan ledger's bytes on each bookie (few ledgers: read on the driver, next to the files)."""
    by_id = {b.bookie_id: b for b in bookies}
    for finding in findings:
        if finding["kind"] == "orphan" and finding["bookie"] in by_id:
            finding["bytes"] = ledger_record_bytes(by_id[finding["bookie"]], finding["ledger_id"])


def _summary(
    segments: DataFrame, result: DataFrame, findings: list[dict[str, Any]], bookies: int
) -> dict[str, Any]:
    counts = {r.status: r["count"] for r in result.groupBy("status").count().collect()}
    expected = counts.get("found", 0) + counts.get("missing", 0) + counts.get("unknown", 0)
    entries = result.where("expected").select("ledger_id", "entry_id").distinct().count()
    total = {kind: sum(f["entries"] for f in findings if f["kind"] == kind) for kind in KINDS}
    orphans = [f for f in findings if f["kind"] == "orphan"]
    return {
        "ledgers": segments.select("ledger_id").distinct().count(),
        "bookies": bookies,
        "entries_expected": entries,
        "replicas_expected": expected,
        "replicas_found": counts.get("found", 0),
        "missing": total["missing"],
        "lost": total["lost"],
        "extra": total["extra"],
        "orphan_ledgers": len({f["ledger_id"] for f in orphans}),
        "orphan_bytes": sum(f.get("bytes", 0) for f in orphans),
        "corrupt": total["corrupt"],
        "divergent": total["divergent"],
        "unknown": counts.get("unknown", 0),
    }


def _write_output(
    spark: SparkSession, directory: Path, findings: list[dict[str, Any]], summary: dict[str, Any]
) -> None:
    """Parquet of the findings and of per-bookie / per-ledger totals, and summary.json."""
    frame = spark.createDataFrame([_row(f) for f in findings], FINDING_SCHEMA)
    frame.write.mode("overwrite").parquet(str(directory / "findings"))
    frame.groupBy("bookie", "kind").agg(F.sum("entries").alias("entries")).write.mode("overwrite").parquet(
        str(directory / "per_bookie")
    )
    frame.groupBy("ledger_id", "kind").agg(F.sum("entries").alias("entries")).write.mode("overwrite").parquet(
        str(directory / "per_ledger")
    )
    (directory / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


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
