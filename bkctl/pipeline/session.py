"""The SparkSession of `bkctl audit`: local[*] by default, a cluster with --master, Spark Connect with
--remote; Spark's own logging kept to warnings and errors on stderr (stdout carries the result).

A Spark Connect session has no SparkContext (touching `spark.sparkContext` raises), so the pipeline asks
only what both kinds answer: `is_connect` and `parallelism` below."""

from __future__ import annotations

import os
import sys
from typing import Any

# Partitions of the ledger metadata when the session cannot say how many cores it has (Spark Connect).
CONNECT_PARALLELISM = 8

# Quick JVM start for a job that runs seconds to minutes (docs/commands/audit.md, reference notes).
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_session(master: str | None = None, remote: str | None = None, *, progress: bool = False) -> Any:
    """Get or create the session. The master: --master, else $BKCTL_SPARK_MASTER, else local[*]."""
    from pyspark.sql import SparkSession

    # Executors run this interpreter (the one with bkctl and pyarrow), not whatever `python3` is first.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if remote:
        return SparkSession.builder.remote(remote).getOrCreate()
    master = master or os.environ.get("BKCTL_SPARK_MASTER") or "local[*]"
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else it binds the first interface
    builder = (
        SparkSession.builder.appName("bkctl audit")
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "true" if progress else "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", JAVA_OPTIONS)
    )
    if master.startswith("local"):
        builder = builder.config("spark.sql.shuffle.partitions", str(max(2, (os.cpu_count() or 2) * 2)))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def is_connect(spark: Any) -> bool:
    """A Spark Connect session (pyspark.sql.connect), which must never touch `sparkContext`."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def parallelism(spark: Any) -> int:
    """How many tasks run at once: the SparkContext's default parallelism; on Spark Connect the server's
    `spark.default.parallelism` when it is set, else CONNECT_PARALLELISM."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    try:
        value = spark.conf.get("spark.default.parallelism", None)
    except Exception:  # a server that refuses to show a non-SQL conf: the default will do
        value = None
    return int(value) if value and str(value).isdigit() else CONNECT_PARALLELISM
