"""The SparkSession of `bkctl audit`: local[*] by default, a cluster with --master, Spark Connect with
--remote; Spark's own logging kept to warnings and errors on stderr (stdout carries the result).

A Spark Connect session has no SparkContext (touching `spark.sparkContext` raises), so the pipeline asks
only what both kinds answer: `is_connect` and `parallelism` below."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from typing import Any

from bkctl.errors import UnavailableError, UsageError

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


# --- the session's URLs, checked before Spark starts ----------------------------------------------

# What `--master` may be (Spark's own forms): a typo used to start a JVM that died with a stack trace.
MASTER_FORMS = re.compile(
    r"^(local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|spark://[^/\s]+|yarn|k8s://\S+|mesos://\S+)$"
)
CONNECT_PROBE_S = 10.0  # local bound: a Spark Connect server answers a connection's first bytes at once
CONNECT_TOLD_S = 2.0  # local bound: past this, the wait is said on stderr
# An HTTP/2 client preface and an empty SETTINGS frame: a gRPC server answers with its own SETTINGS.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def check_master(master: str | None) -> None:
    """UsageError (exit 2) for a --master (or $BKCTL_SPARK_MASTER) that is none of Spark's forms."""
    chosen = master or os.environ.get("BKCTL_SPARK_MASTER")
    if chosen and not MASTER_FORMS.match(chosen):
        where = "--master" if master else "BKCTL_SPARK_MASTER"
        raise UsageError(
            f"{where} {chosen!r} is not a Spark master URL (local[*], local[N], spark://host:port, yarn, "
            "k8s://..., mesos://...)"
        )


def connect_address(remote: str) -> tuple[str, int, bool]:
    """(host, port, TLS) of an `sc://host[:port][/;param=value...]` URL; UsageError otherwise."""
    from urllib.parse import urlsplit

    parts = urlsplit(remote)
    params = parts.path.lower()
    try:
        port = parts.port or 15002  # Spark Connect's default port
    except ValueError:
        port = -1
    if parts.scheme != "sc" or not parts.hostname or not 0 < port < 65536:
        raise UsageError(f"--remote {remote!r} is not a Spark Connect URL (sc://host:port)")
    return parts.hostname, port, "use_ssl=true" in params


def probe_connect(remote: str, told: Callable[[str], None]) -> None:
    """Whether a Spark Connect server answers at `remote`, within CONNECT_PROBE_S: UnavailableError
    (exit 6) for a refused or silent one. The Spark Connect client itself waits for ever on a server
    that accepts and never answers."""
    import socket
    import time

    host, port, tls = connect_address(remote)
    deadline = time.monotonic() + CONNECT_PROBE_S
    try:
        with socket.create_connection((host, port), timeout=CONNECT_PROBE_S) as connection:
            if tls:
                return  # the TLS handshake is the client's to make; the server is listening
            connection.sendall(HTTP2_PREFACE)
            connection.settimeout(CONNECT_TOLD_S)
            try:
                answer = connection.recv(9)
            except TimeoutError:
                told(f"waiting for the Spark Connect server at {remote} (up to {CONNECT_PROBE_S:g} s)")
                connection.settimeout(max(0.1, deadline - time.monotonic()))
                answer = connection.recv(9)
    except TimeoutError:
        raise UnavailableError(
            f"the Spark Connect server at {remote} did not answer within {CONNECT_PROBE_S:g} s"
        ) from None
    except OSError as exc:
        raise UnavailableError(f"no Spark Connect server at {remote}: {exc.strerror or exc}") from None
    if len(answer) < 9 or answer[3] != 4:  # the frame type of SETTINGS
        raise UnavailableError(f"{remote} does not answer as a Spark Connect (gRPC) server")


def spark_error(exc: BaseException) -> str | None:
    """One line for an error raised by PySpark or its Java side (None: not Spark's): its first line,
    without the JVM's stack trace."""
    module = type(exc).__module__
    if not module.startswith(("pyspark", "py4j", "grpc")):
        return None
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return text if len(text) <= 300 else text[:297] + "..."
