"""`bkctl audit`: the Spark replica audit of every entry against the bookies' files (bkctl/pipeline)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from bkctl.commands import progress
from bkctl.commands.options import (
    MetadataOption,
    PlacementConfOption,
    PlacementKeysOption,
    check_output_dir,
    metadata_choice,
    placement_keys,
)
from bkctl.commands.output import (
    Column,
    OutputFormat,
    OutputOption,
    message,
    resolve,
    write_json,
    write_mapping,
    write_rows,
    write_title,
)
from bkctl.errors import ConflictError, ExitCode, ProblemsFound, UnavailableError, UsageError

FIRST_PER_KIND = 10
STAGE_POLL_S = 0.25  # local bound
FINDING_COLUMNS = [
    Column("kind", "KIND"),
    Column("ledger_id", "LEDGER", numeric=True),
    Column("bookie", "BOOKIE"),
    Column("first_entry_id", "FIRST", numeric=True),
    Column("last_entry_id", "LAST", numeric=True),
    Column("entries", "ENTRIES", numeric=True),
]
SPARK_MISSING = "pyspark is not installed: pip install 'bkctl[spark]' (needs Java 17+)"
CONNECT_MISSING = "--remote needs the Spark Connect client: pip install 'bkctl[spark]'"


def register(root: typer.Typer) -> None:
    root.command("audit")(audit)


def audit(
    bookie_dir: Annotated[
        list[str] | None,
        typer.Option(
            "--bookie-dir",
            help="[ID=]DIR: a bookie's journal or ledger directory, or its root (repeatable); the bookie "
            "is named by the directory's cookie unless ID= is given.",
        ),
    ] = None,
    online: Annotated[
        bool,
        typer.Option(
            "--online", help="Ask every registered bookie what it holds (GET_LIST_OF_ENTRIES_OF_LEDGER)."
        ),
    ] = False,
    verify_digests: Annotated[
        bool, typer.Option("--verify-digests", help="Check the digest of every stored copy.")
    ] = False,
    sample: Annotated[
        float,
        typer.Option("--sample", min=0.0001, max=1.0, help="With --verify-digests: check this fraction."),
    ] = 1.0,
    ledgers: Annotated[str | None, typer.Option("--ledgers", help="Only ledgers A-B (inclusive).")] = None,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", help="Write Parquet findings and totals to this directory.")
    ] = None,
    mark: Annotated[
        bool,
        typer.Option(
            "--mark-underreplicated", help="Mark ledgers missing a replica (autorecovery repairs them)."
        ),
    ] = False,
    master: Annotated[
        str | None, typer.Option("--master", help="Spark master URL (default $BKCTL_SPARK_MASTER, local[*]).")
    ] = None,
    remote: Annotated[str | None, typer.Option("--remote", help="Spark Connect URL, sc://host:port.")] = None,
    conf: PlacementConfOption = None,
    placement: PlacementKeysOption = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Audit a --bookie-dir whose cookie names another cluster (said in the summary)."
        ),
    ] = False,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Check every entry's replicas: what the metadata says each bookie holds against its files.

    Findings: missing, lost, extra, orphan, corrupt, divergent (docs/commands/audit.md). Exit 0 when
    clean, 3 when anything was found or a file could not be read, 10 when a --bookie-dir belongs to
    another cluster (its cookie's instance id; --force audits it anyway).
    """
    from bkctl.pipeline import session

    fmt = resolve(output)
    uri = metadata_choice(metadata)
    ledger_range = _ledger_range(ledgers)
    if sample < 1.0 and not verify_digests:
        raise UsageError("--sample goes with --verify-digests")
    if bool(bookie_dir) == online:
        raise UsageError("give --bookie-dir (offline, from the files) or --online (asking the bookies)")
    if remote is not None:
        session.connect_address(remote)
    else:
        session.check_master(master)
    if output_dir is not None and remote is None:  # a Spark Connect server writes it where it runs
        check_output_dir(output_dir, "--output-dir")
    # Arguments first (exit 2 whether or not pyspark is there), then the pipeline, which imports pyspark.
    try:
        from bkctl.pipeline.audit import AuditOptions, mark_underreplicated
        from bkctl.pipeline.inventory import resolve_bookie_dirs
        from bkctl.pipeline.online import registered_bookies
    except ImportError as exc:
        if (exc.name or "").split(".")[0] in ("pyspark", "pyarrow") or "pyspark" in str(exc):
            raise UnavailableError(SPARK_MISSING) from None
        raise
    options = AuditOptions(ledger_range, verify_digests, sample, output_dir)
    rack_store = None
    if conf is not None or placement:  # the rack source stays open (a watch) while the audit runs
        from bkctl.commands.running import placement_policy
        from bkctl.metadata.layout import Layout
        from bkctl.metadata.stores import open_store

        rack_store = open_store(uri)
        options.placement = placement_policy(Layout(rack_store), conf, placement_keys(placement))
    problems: list[str] = []
    bookies: list[Any] = []
    if online:
        bookies, problems = registered_bookies(uri, lambda text: message(f"bkctl: {text}"))
    else:
        bookies = resolve_bookie_dirs(bookie_dir or [])
        options.foreign_dirs = _foreign_dirs(uri, bookies, force)
    if remote is not None:
        session.probe_connect(remote, lambda text: message(f"bkctl: {text}"))
    try:
        with _spark_errors(), _interrupt_at_once(remote is not None):
            result = _audited(master, remote, uri, bookies, options)
    finally:
        if rack_store is not None:
            rack_store.close()
    result.errors[:0] = problems
    if mark:
        marked = mark_underreplicated(uri, result.findings)
        message(f"marked {len(marked)} ledger(s) under-replicated")
    _render(result.as_dict(), fmt)
    for warning in result.warnings:
        message(f"bkctl: warning: {warning}")
    for error in result.errors:
        message(f"bkctl: error: {error}")
    if not result.clean:
        raise ProblemsFound(
            f"{len(result.findings)} finding(s), {len(result.errors)} unreadable file(s) or bookie(s), "
            f"{len(result.warnings)} undecodable ledger(s)"
        )


def _audited(master: str | None, remote: str | None, uri: str, bookies: list[Any], options: Any) -> Any:
    from bkctl.pipeline.audit import run_audit
    from bkctl.pipeline.session import spark_session

    try:
        spark = spark_session(master, remote)  # Spark's own console bar off: ours shows its stages
    except ImportError as exc:  # --remote without the Spark Connect client's packages (grpcio, pandas...)
        raise UnavailableError(f"{CONNECT_MISSING} ({exc})") from None
    try:
        with _stages_shown(spark):
            return run_audit(spark, uri, bookies, options)
    finally:
        spark.stop()


def _foreign_dirs(uri: str, bookies: list[Any], force: bool) -> list[str]:
    """Directories whose cookie names another cluster: ConflictError (exit 10) unless --force, then
    said on stderr and in the summary (their copies would all be `extra` here)."""
    from bkctl.commands.options import open_layout
    from bkctl.pipeline.inventory import foreign_cookies

    with open_layout(uri) as layout:  # no cluster there: exit 4 now, not after Spark started
        instance_id = layout.instance_id()
    foreign = foreign_cookies(bookies, instance_id)
    if foreign and not force:
        raise ConflictError(
            f"--bookie-dir {'; '.join(foreign)}: another cluster's bookie (this cluster's instance id is "
            f"{instance_id}); --force audits it anyway"
        )
    for directory in foreign:
        message(f"bkctl: warning: --force: auditing {directory}, another cluster's bookie")
    return foreign


@contextlib.contextmanager
def _spark_errors() -> Iterator[None]:
    """An error of Spark or its JVM as one line (exit 6), never a Python or Java stack trace."""
    from bkctl.pipeline.session import spark_error

    try:
        yield
    except Exception as exc:
        said = spark_error(exc)
        if said is None:
            raise
        raise UnavailableError(f"Spark: {said}") from None


@contextlib.contextmanager
def _interrupt_at_once(connect: bool) -> Iterator[None]:
    """Over a Spark Connect session, Ctrl-C ends the process at once (exit 130): a KeyboardInterrupt
    between two of the client's calls leaves its exit hook waiting for ever on the server."""
    if not connect:
        yield
        return

    def on_sigint(_signum: int, _frame: object) -> None:
        message("bkctl: interrupted")
        os._exit(ExitCode.INTERRUPTED)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _stages_shown(spark: Any) -> Iterator[None]:
    """Spark's tasks on a bar while the block runs: its status tracker, asked every STAGE_POLL_S by a
    thread. A Spark Connect session has no tracker (nor SparkContext): no bar then."""
    from bkctl.pipeline.session import is_connect

    if not progress.wanted() or is_connect(spark):
        yield
        return
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    with progress.bar("audit", None, "tasks") as shown:
        poller = threading.Thread(
            target=_poll_stages, args=(tracker, shown, stop), name="bkctl-audit-progress", daemon=True
        )
        poller.start()
        try:
            yield
        finally:
            stop.set()
            poller.join(timeout=STAGE_POLL_S * 4)


def _poll_stages(tracker: Any, shown: progress.Bar, stop: threading.Event) -> None:
    """Tasks done of the tasks of every stage seen so far (the total grows as the audit's jobs start;
    a stage no longer active counts whole); the text names the stage running last."""
    stages: dict[int, tuple[int, int]] = {}  # stage id -> (tasks done, tasks)
    while not stop.wait(STAGE_POLL_S):
        try:
            infos = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
        except Exception:  # the session is stopping under us: the bar ends with the block
            return
        infos = [info for info in infos if info is not None]
        active = {info.stageId for info in infos}
        for stage_id, (_, tasks) in stages.items():  # ended between two looks: count it whole
            if stage_id not in active:
                stages[stage_id] = (tasks, tasks)
        for info in infos:
            stages[info.stageId] = (info.numCompletedTasks, info.numTasks)
        if infos:
            last = max(infos, key=lambda info: info.stageId)
            done, total = (sum(counts) for counts in zip(*stages.values(), strict=True))
            shown.update(done, total, info=f"stage {last.stageId}: {_short(last.name)}")


def _short(stage_name: str) -> str:
    """`collect at /long/path/audit.py:230` -> `collect at audit.py:230`."""
    operation, _, where = stage_name.partition(" at ")
    return f"{operation} at {where.rsplit('/', 1)[-1]}" if where else operation


def _ledger_range(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    first, sep, last = text.partition("-")
    if not sep or not first.isdigit() or not last.isdigit() or int(first) > int(last):
        raise UsageError(f"--ledgers {text!r}: expected A-B with A <= B, e.g. 0-999")
    return int(first), int(last)


def _render(document: dict[str, Any], fmt: OutputFormat) -> None:
    if fmt is OutputFormat.json:
        write_json(document)
        return
    write_mapping(document["summary"], fmt)
    findings = document["findings"]
    if not findings:
        return
    write_title("\nfindings (the first of each kind; -o json lists all):", fmt)
    shown: dict[str, int] = {}
    rows = []
    for finding in findings:
        shown[finding["kind"]] = shown.get(finding["kind"], 0) + 1
        if shown[finding["kind"]] <= FIRST_PER_KIND:
            rows.append(finding)
    write_rows(rows, FINDING_COLUMNS, fmt)
