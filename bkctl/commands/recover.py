"""`bkctl recover <metadata> <failed-bookie>[,<failed-bookie>...] [target]`, `ledger check`, `ledger recover`.

The operator's repair after a bookie died for good: every fragment the failed bookies held is copied to
a live bookie and swapped into its ensemble (bkctl.recovery.bookie_recovery). Made for scripts: it never
reads stdin unless stdin is a terminal (and --yes was not given), stdout holds only the report, the exit
code says what happened, Ctrl-C stops between metadata updates (exit 130, the report so far on stdout)
and running it again finishes the rest. See docs/commands/recover.md.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bkctl.commands.bookie import app as bookie_app
from bkctl.commands.ledger import app as ledger_app
from bkctl.commands.ledger_options import AdminPasswordOption, admin_password
from bkctl.commands.options import (
    MetadataOption,
    PlacementConfOption,
    PlacementKeysOption,
    check_output_file,
    confirm,
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
)
from bkctl.commands.progress import Bar, bar
from bkctl.commands.running import interruptible, run_client
from bkctl.errors import ConflictError, Interrupted, ProblemsFound, ReadOnlyError, UsageError

if TYPE_CHECKING:
    from bkctl.client.client import Client
    from bkctl.recovery.bookie_recovery import RecoveryReport, SkippedLedger, UnrecoverableLedger

RECOVERY_LOOK_S = 0.5  # local bound: how often a progress bar looks at the copies under way
LOCK_LOOK_S = 1.0  # local bound: how often `recover --wait` looks whether the other run's lock is gone
LOCK_WAIT_MAX_S = 86_400  # local bound: the longest `recover --wait` waits for another run

PLAN_COLUMNS = (
    Column("ledger_id", "LEDGER", numeric=True),
    Column("segment", "SEGMENT", numeric=True),
    Column("first_entry_id", "FIRST", numeric=True),
    Column("last_entry_id", "LAST", numeric=True),
    Column("entries", "ENTRIES", numeric=True),
    Column("bytes", "BYTES", numeric=True),
    Column("old_ensemble", "OLD ENSEMBLE"),
    Column("new_ensemble", "NEW ENSEMBLE"),
)


def register(root: typer.Typer) -> None:
    root.command("recover")(recover)


def recover(
    metadata: Annotated[
        str, typer.Argument(help="ZooKeeper connect string (host:port[,host:port][/root]) or a metadata URI.")
    ],
    failed: Annotated[str, typer.Argument(help="The failed bookie(s): host:port[,host:port...].")],
    target: Annotated[
        str | None, typer.Argument(help="Bookie to copy everything to (default: chosen per segment).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; change nothing.")] = False,
    ledger: Annotated[int | None, typer.Option("--ledger", "-l", min=0, help="Only this ledger.")] = None,
    parallel: Annotated[int, typer.Option("--parallel", min=1, max=64, help="Ledgers at a time.")] = 4,
    skip_open: Annotated[
        bool, typer.Option("--skip-open-ledgers", help="Leave open ledgers alone (no fencing).")
    ] = False,
    skip_unrecoverable: Annotated[
        bool,
        typer.Option(
            "--skip-unrecoverable", help="Exit 0 even if some ledgers have entries with no copy left."
        ),
    ] = False,
    delete_cookie: Annotated[
        bool,
        typer.Option("--delete-cookie", help="Delete the failed bookies' cookies once nothing names them."),
    ] = False,
    rate_mb_s: Annotated[
        float | None, typer.Option("--rate", min=0.1, help="Copy at most this many MB/s.")
    ] = None,
    newest_first: Annotated[
        bool,
        typer.Option("--newest-first", help="Recover the highest (newest) ledger ids first, not the lowest."),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Recover a bookie that is still registered; copy to a target breaking the placement policy.",
        ),
    ] = False,
    conf: PlacementConfOption = None,
    placement: PlacementKeysOption = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask for confirmation on a terminal.")
    ] = False,
    plan_out: Annotated[
        Path | None, typer.Option("--plan-out", help="Also write the plan (JSON) to this file.")
    ] = None,
    wait_s: Annotated[
        float,
        typer.Option(
            "--wait",
            min=0,
            max=LOCK_WAIT_MAX_S,
            help="When another recover of the same bookie runs, wait up to this many seconds for it "
            "(default 0: refuse, exit 15).",
        ),
    ] = 0.0,
    output: OutputOption = None,
) -> None:
    """Re-replicate every ledger fragment held by failed bookies; open ledgers are fenced first.

    Exit 0: everything recovered (or only --skip-open-ledgers / --skip-unrecoverable skips); 3: some
    ledgers have entries with no surviving copy, or could not be recovered (listed on stderr and in the
    report); 15: another recover of the same bookie is running; 130: interrupted (run it again to finish).
    """
    from bkctl.recovery.bookie_recovery import RecoveryOptions, check_bookie_id

    fmt = resolve(output)
    bookies = tuple(dict.fromkeys(b.strip() for b in failed.split(",") if b.strip()))
    if not bookies:
        raise UsageError("name at least one failed bookie (host:port)")
    for bookie in bookies:
        check_bookie_id(bookie, "failed bookie")
    if target is not None:
        check_bookie_id(target, "target")
    if plan_out is not None:
        check_output_file(plan_out, "--plan-out")
    options = RecoveryOptions(
        bookies,
        target,
        dry_run,
        ledger,
        parallel,
        skip_open,
        None if rate_mb_s is None else rate_mb_s * 1e6,
        force=force,
        newest_first=newest_first,
    )
    if not (yes or dry_run) and sys.stdin.isatty():
        confirm(
            f"Re-replicate the ledgers of {', '.join(bookies)}"
            + (f" onto {target}" if target else "")
            + " (open ledgers are fenced)?",
            declined="nothing recovered",
            needs_yes="recover",
        )
    report = run_client(
        metadata,
        lambda client: _run(client, options, force, delete_cookie, fmt, wait_s),
        conf=conf,
        placement=placement,
    )
    _say_fallbacks(report)
    if report.target_overrides:
        message(
            f"bkctl: {report.target_overrides} segment(s) already had {target} in their ensemble: "
            "another bookie was chosen there"
        )
    _render(report.as_dict(), fmt)
    if plan_out is not None:
        _write_plan(plan_out, report)
    _raise_for(report, skip_unrecoverable)


def _write_plan(path: Path, report: RecoveryReport) -> None:
    """The plan file, after the report: checked up front, so only a disk that changed meanwhile fails
    here, and the report the work earned is printed first."""
    try:
        path.write_text(json.dumps([step.as_dict() for step in report.plan], indent=1) + "\n")
    except OSError as exc:
        raise ReadOnlyError(
            f"--plan-out {path}: {exc.strerror or exc} (the report above is complete)"
        ) from None


def _say_fallbacks(report: RecoveryReport) -> None:
    """Loudly: copies restored outside the placement policy (a rack down); the placement check moves
    them once the racks are back (docs/runbooks/rack-down.md)."""
    for fallback in report.placement_fallbacks:
        message(
            f"bkctl: warning: ledger {fallback['ledger_id']} segment {fallback['segment']}: copies restored "
            f"outside the placement policy ({fallback['reason']}); the placement check moves them later"
        )


async def _run(
    client: Client, options: Any, force: bool, delete_cookie: bool, fmt: OutputFormat, wait_s: float = 0.0
) -> RecoveryReport:
    from bkctl.recovery import recover_lock

    if options.ledger is not None:  # a ledger that does not exist is a typo, not "nothing to do"
        await client.in_thread(client.layout.read_ledger_bytes, options.ledger)
    if options.dry_run:
        return await _recover(client, options, force, delete_cookie, fmt)
    await _lock(client, options.failed, wait_s)
    try:
        return await _recover(client, options, force, delete_cookie, fmt)
    finally:
        await client.in_thread(recover_lock.release, client.layout, options.failed)


async def _lock(client: Client, bookies: tuple[str, ...], wait_s: float) -> None:
    """Each failed bookie's recover lock; with `wait_s`, polled for that long while another run holds
    one (said on stderr), else RecoveryBusyError (exit 15) at once."""
    from twisted.internet import task

    from bkctl.errors import RecoveryBusyError
    from bkctl.recovery import recover_lock

    deadline = time.monotonic() + wait_s
    told = False
    while True:
        try:
            await client.in_thread(recover_lock.take, client.layout, bookies)
            return
        except RecoveryBusyError as exc:
            if time.monotonic() + LOCK_LOOK_S > deadline:
                raise RecoveryBusyError(str(exc) + (f"; waited {wait_s:g} s" if wait_s else "")) from None
            if not told:
                message(
                    f"bkctl: another recover of {', '.join(bookies)} is running: waiting for it to end "
                    f"(up to {wait_s:g} s)"
                )
                told = True
        await task.deferLater(client.reactor, LOCK_LOOK_S, lambda: None)


async def _recover(
    client: Client, options: Any, force: bool, delete_cookie: bool, fmt: OutputFormat
) -> RecoveryReport:
    from bkctl.recovery.bookie_recovery import BookieRecovery, ledgers_naming

    registered, known = await client.in_thread(lambda: (_registered(client), _known(client)))
    unknown = [b for b in options.failed if b not in known]
    if unknown:
        from bkctl.errors import NotFoundError

        named = await ledgers_naming(client, frozenset(unknown), options.ledger)
        if not named:
            raise NotFoundError(
                f"no cookie and no ledger names bookie {', '.join(unknown)}: nothing to recover"
            )
    alive = [b for b in options.failed if b in registered]
    if alive and not force:
        raise ConflictError(
            f"bookie {', '.join(alive)} is registered: it is alive (stop it first, or --force to copy its "
            "ledgers anyway)"
        )
    with (
        bar("recover", None, "ledgers") as shown,
        _RecoveryShown(shown, client.reactor) as told,
        interruptible(client.reactor) as stop,
    ):
        run = BookieRecovery(client, options, told)
        client.reactor.callLater(0, _watch_stop, client.reactor, stop, run)
        report = await run.run()
    if run.stopping:  # what was done so far, in the format asked for: a script learns how far it got
        _render(report.as_dict(), fmt)
        raise Interrupted(
            f"interrupted after {report.ledgers_done} of {report.ledgers_total} ledgers: run again"
        )
    if delete_cookie and not options.dry_run:
        await client.in_thread(_delete_cookies, client, options.failed)
    return report


def _watch_stop(reactor: Any, stop: Any, run: Any) -> None:
    if stop():
        run.stop()
    elif not run.stopping:
        reactor.callLater(0.1, _watch_stop, reactor, stop, run)


def _known(client: Client) -> set[str]:
    return set(client.layout.cookie_bookies())


def _registered(client: Client) -> set[str]:
    return set(client.layout.bookies()) | set(client.layout.bookies(readonly=True))


def _delete_cookies(client: Client, bookies: tuple[str, ...]) -> None:
    from bkctl.errors import NotFoundError
    from bkctl.recovery.bookie_recovery import names_any

    layout = client.layout
    ledgers = layout.read_ledgers(layout.ledger_ids())
    still = {b for _, md in ledgers for b in bookies if names_any(md, frozenset({b}))}
    for bookie in bookies:
        if bookie in still:
            message(f"bkctl: cookie of {bookie} kept: some ledger still names it")
            continue
        try:
            layout.delete_cookie(bookie)
            message(f"cookie of {bookie} deleted")
        except NotFoundError:
            pass


class _RecoveryShown:
    """The recovery's progress callback, and a look every RECOVERY_LOOK_S at the report it was last
    given (the fragments under way grow between two callbacks): ledgers done of total on the bar,
    fragments, entries, MB copied and MB/s beside it."""

    def __init__(self, shown: Bar, reactor: Any) -> None:
        from twisted.internet.task import LoopingCall

        self.shown = shown
        self.report: RecoveryReport | None = None
        self.looks = LoopingCall(self.look)
        self.looks.clock = reactor

    def __enter__(self) -> _RecoveryShown:
        if self.shown.shows:
            self.looks.start(RECOVERY_LOOK_S, now=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.looks.running:
            self.looks.stop()

    def __call__(self, report: RecoveryReport) -> None:
        self.report = report
        self.look()

    def look(self) -> None:
        report = self.report
        if report is None:
            return
        entries, copied = report.copied_now()
        elapsed = max(time.monotonic() - report.started, 1e-6)
        info = (
            f"{report.fragments_copied} fragments  {entries:,} entries  {copied / 1e6:.1f} MB  "
            f"{copied / 1e6 / elapsed:.1f} MB/s"
        )
        self.shown.update(report.ledgers_done, report.ledgers_total, info=info)


def _render(document: dict[str, Any], fmt: OutputFormat) -> None:
    if fmt is OutputFormat.json:
        write_json(document)
        return
    plan = document["plan"]
    summary = {k: v for k, v in document.items() if k != "plan"}
    write_mapping(summary, fmt)
    if plan:
        write_rows(plan, PLAN_COLUMNS, fmt)


def _failed_skips(report: RecoveryReport) -> list[SkippedLedger]:
    """Ledgers skipped for a problem (not by --skip-open-ledgers)."""
    return [s for s in report.ledgers_skipped if "--skip-open-ledgers" not in s["reason"]]


def _not_recovered(report: RecoveryReport) -> list[SkippedLedger | UnrecoverableLedger]:
    return [*_failed_skips(report), *report.ledgers_unrecoverable]


def _raise_for(report: RecoveryReport, skip_unrecoverable: bool) -> None:
    for ledger_id, entry_id, bookie in report.corrupt:
        message(
            f"bkctl: warning: ledger {ledger_id} entry {entry_id}: the copy on {bookie} fails its digest "
            "(another replica's was copied; `ledger check --full` shows it)"
        )
    failed = _failed_skips(report)
    for skipped in failed:
        message(f"bkctl: ledger {skipped['ledger_id']} not recovered: {skipped['reason']}")
    for lost in report.ledgers_unrecoverable:
        ranges = ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in lost["entries"])
        message(f"bkctl: ledger {lost['ledger_id']}: no surviving copy of entries {ranges}")
    problems = len(failed) + (0 if skip_unrecoverable else len(report.ledgers_unrecoverable))
    if problems:
        raise ProblemsFound(
            f"{problems} ledger(s) not fully recovered (listed above); the others were recovered"
        )


# --- ledger check / ledger recover ---------------------------------------------------------------------

CHECK_COLUMNS = (
    Column("segment", "SEGMENT", numeric=True),
    Column("first_entry_id", "FIRST", numeric=True),
    Column("last_entry_id", "LAST", numeric=True),
    Column("bookie", "BOOKIE"),
    Column("state", "STATE"),
    Column("entries", "BAD ENTRIES"),
)


@ledger_app.command("check")
def ledger_check(
    ledger_id: Annotated[int, typer.Argument(help="Ledger id.", min=0)],
    full: Annotated[bool, typer.Option("--full", help="Read every entry (default: first and last).")] = False,
    password: AdminPasswordOption = None,
    conf: PlacementConfOption = None,
    placement: PlacementKeysOption = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Whether each fragment's bookie holds its entries, and (with a placement policy in --conf) whether
    each segment's write sets span the racks it asks for; exit 3 when a replica is missing or misplaced."""
    fmt = resolve(output)
    secret = admin_password(password)

    async def work(client: Client) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        from bkctl.recovery.checker import check_ledger
        from bkctl.recovery.placement_check import ledger_placement

        checked = await check_ledger(client, ledger_id, full=full, password=secret)
        md = (await client.in_thread(client.layout.read_ledger, ledger_id)).value
        placed = await client.place(ledger_placement, client.placement, md)
        return [_check_row(s) for s in checked.states], [p.as_dict() for p in placed]

    rows, misplaced = run_client(metadata, work, conf=conf, placement=placement)
    if fmt is OutputFormat.json:
        write_json({"ledger_id": ledger_id, "fragments": rows, "placement": misplaced})
    else:
        write_rows(rows, CHECK_COLUMNS, fmt)
    for segment in misplaced:
        first = segment["violations"][0]
        message(
            f"bkctl: ledger {ledger_id} segment {segment['segment']} breaks the placement policy: "
            f"{len(segment['violations'])} write set(s), e.g. {', '.join(first['bookies'])} in "
            f"{', '.join(first['domains'])} ({first['reason']}); {segment['move']} is the replica to move"
        )
    bad = [r for r in rows if r["state"] != "ok"]
    if bad or misplaced:
        also = f", {len(misplaced)} segment(s) misplaced" if misplaced else ""
        raise ProblemsFound(f"ledger {ledger_id}: {len(bad)} fragment(s) under-replicated{also}")


def _check_row(state: Any) -> dict[str, Any]:
    f = state.fragment
    return {
        "segment": f.segment,
        "first_entry_id": f.first_entry_id,
        "last_entry_id": f.last_entry_id,
        "bookie": f.bookie,
        "state": state.state,
        "entries": state.entries,
    }


@ledger_app.command("recover")
def ledger_recover(
    ledger_id: Annotated[int, typer.Argument(help="Ledger id.", min=0)],
    target: Annotated[
        str | None, typer.Option("--target", help="Bookie to copy to (default: placement).")
    ] = None,
    full: Annotated[bool, typer.Option("--full", help="Check every entry, not first and last.")] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Copy to a target that breaks the placement policy.")
    ] = False,
    password: AdminPasswordOption = None,
    conf: PlacementConfOption = None,
    placement: PlacementKeysOption = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Re-replicate one ledger's missing replicas (found by `ledger check`): a dead bookie's move to new
    bookies; a live bookie that lacks entries never gets an open ledger fenced (see docs)."""
    fmt = resolve(output)
    secret = admin_password(password)

    async def work(client: Client) -> RecoveryReport:
        from bkctl.recovery.bookie_recovery import recover_ledger_replicas

        with (
            bar(f"ledger {ledger_id}", None, "ledgers") as shown,
            _RecoveryShown(shown, client.reactor) as told,
        ):
            return await recover_ledger_replicas(
                client, ledger_id, target=target, full=full, password=secret, force=force, progress=told
            )

    report = run_client(metadata, work, conf=conf, placement=placement)
    _say_fallbacks(report)
    _render(report.as_dict(), fmt)
    _raise_for(report, False)


# --- bookie decommission -------------------------------------------------------------------------------

DECOMMISSION_WAIT_S = 600.0  # local bound


@bookie_app.command("decommission")
def bookie_decommission(
    bookie: Annotated[str, typer.Argument(help="The bookie to retire (host:port); it must be stopped.")],
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask for confirmation on a terminal.")
    ] = False,
    conf: PlacementConfOption = None,
    placement: PlacementKeysOption = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Retire a stopped bookie: recover its ledgers onto the others, wait until no ensemble and no
    under-replication mark names it (bounded), then delete its cookie."""
    fmt = resolve(output)
    if not yes and sys.stdin.isatty():
        confirm(f"Decommission bookie {bookie}?", declined="nothing done", needs_yes="decommission")
    report = run_client(
        metadata, lambda client: decommission(client, bookie, fmt), conf=conf, placement=placement
    )
    _say_fallbacks(report)
    _render(report.as_dict(), fmt)
    _raise_for(report, False)


async def decommission(client: Client, bookie: str, fmt: OutputFormat = OutputFormat.json) -> RecoveryReport:
    """Recover a stopped bookie's ledgers, wait until nothing names it, delete its cookie (also the admin
    endpoint /api/v1/autorecovery/decommission's work)."""
    from bkctl.recovery.bookie_recovery import RecoveryOptions

    report = await _run(client, RecoveryOptions((bookie,)), False, False, fmt)
    # Ledgers the recovery could not repair will not change by waiting: named, exit 3 (by the caller).
    given_up = {int(item["ledger_id"]) for item in _not_recovered(report)}
    await _wait_unreferenced(client, bookie, given_up)
    if given_up:
        message(f"bkctl: cookie of {bookie} kept: ledger(s) {sorted(given_up)} still name it")
    else:
        await client.in_thread(_delete_cookies, client, (bookie,))
    return report


async def recover_bookie(client: Client, bookie: str, delete_cookie: bool) -> RecoveryReport:
    """`bkctl recover` of one stopped bookie onto the others (the admin endpoint
    /api/v1/autorecovery/bookie's work)."""
    from bkctl.recovery.bookie_recovery import RecoveryOptions

    return await _run(client, RecoveryOptions((bookie,)), False, delete_cookie, OutputFormat.json)


async def _wait_unreferenced(client: Client, bookie: str, given_up: set[int]) -> None:
    """Until no ledger's ensemble and no under-replication mark names `bookie` (autorecovery may be
    repairing marks at the same time), leaving out the ledgers in `given_up`; TimeoutError_ after
    DECOMMISSION_WAIT_S."""
    from twisted.internet import task

    from bkctl.errors import TimeoutError_
    from bkctl.recovery.bookie_recovery import ledgers_naming

    deadline = time.monotonic() + DECOMMISSION_WAIT_S
    while True:
        named = [i for i in await ledgers_naming(client, frozenset({bookie}), None) if i not in given_up]
        marks = await client.in_thread(
            lambda: [
                e.ledger_id
                for e in client.layout.underreplicated_ledgers()
                if bookie in e.mark.replicas and e.ledger_id not in given_up
            ]
        )
        if not named and not marks:
            return
        if time.monotonic() > deadline:
            raise TimeoutError_(f"bookie {bookie} still named by ledgers {named} and marks {marks}")
        message(f"waiting: {len(named)} ledger(s) and {len(marks)} mark(s) still name {bookie}")
        await task.deferLater(client.reactor, 2.0, lambda: None)
