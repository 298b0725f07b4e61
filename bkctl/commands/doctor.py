"""`bkctl doctor`: a first-use (and any-day) check of a cluster, read-only: metadata reachable, layout and
instance id, bookies registered against cookies, disk usage, under-replicated ledgers, autorecovery and
the auditor, the last audits. Exit 0 when all is well, 3 with the list of problems. See
docs/commands/doctor.md.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from bkctl.commands.options import (
    MetadataOption,
    PlacementConfOption,
    PlacementKeysOption,
    metadata_choice,
    open_layout,
    placement_keys,
)
from bkctl.commands.output import (
    Column,
    OutputFormat,
    OutputOption,
    message,
    resolve,
    write_json,
    write_rows,
    write_title,
)
from bkctl.errors import BkctlError, ProblemsFound

CHECK_COLUMNS = (Column("check", "CHECK"), Column("state", "STATE"), Column("detail", "DETAIL"))
BOOKIE_COLUMNS = (
    Column("bookie_id", "BOOKIE"),
    Column("state", "STATE"),
    Column("cookie", "COOKIE"),
    Column("disk", "DISK"),
)


def register(root: typer.Typer) -> None:
    root.command("doctor")(doctor)


def doctor(
    disk_warn: Annotated[
        float,
        typer.Option(
            "--disk-warn", min=0.0, max=1.0, help="Used fraction of a bookie's disk that is a problem."
        ),
    ] = 0.90,
    conf: PlacementConfOption = None,
    placement: PlacementKeysOption = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Check a cluster: metadata, identity, bookies, disks, under-replication, autorecovery, audits, and
    with a placement policy in --conf the closed ledgers breaking it.

    Changes nothing. Exit 0 when every check is ok (or unknown), 3 (PROBLEMS_FOUND) when any found a
    problem: the list is printed (stdout) and summed up on stderr.
    """
    from bkctl.commands import doctor_checks as checks
    from bkctl.metadata.store import parse_metadata_uri

    fmt = resolve(output)
    parse_metadata_uri(metadata_choice(metadata))  # a bad --metadata is a usage error (exit 2), not a finding
    try:
        with open_layout(metadata) as layout:
            report = checks.run_checks(layout, disk_warn)
            if conf is not None or placement:
                from bkctl.commands.running import placement_policy

                checks.check_placement(
                    layout, report, placement_policy(layout, conf, placement_keys(placement))
                )
    except BkctlError as exc:  # unreachable, no cluster, a foreign or undecodable LAYOUT: reported
        report = checks.unreachable(exc)
    _render(report, fmt)
    problems = report.problems
    if problems:
        for check in problems:
            message(f"bkctl: {check.check}: {check.detail}")
        raise ProblemsFound(f"{len(problems)} problem(s) found: {', '.join(c.check for c in problems)}")


def _render(report: Any, fmt: OutputFormat) -> None:
    checks = [{"check": c.check, "state": c.state, "detail": c.detail} for c in report.checks]
    bookies = [b.as_dict() for b in report.bookies]
    if fmt is OutputFormat.json:
        write_json({"healthy": not report.problems, "checks": checks, "bookies": bookies, **report.facts})
        return
    write_rows(checks, CHECK_COLUMNS, fmt)
    if not bookies:
        return
    if fmt is OutputFormat.table:
        write_title("\nbookies:", fmt)
    rows = ({**b, "cookie": "yes" if b["cookie"] else "no"} for b in bookies)
    if fmt is OutputFormat.plain:  # every line led by what it is, as `ledger inspect -o plain`
        write_rows(({"key": "bookie", **r} for r in rows), (Column("key", "KEY"), *BOOKIE_COLUMNS), fmt)
    else:
        write_rows(rows, BOOKIE_COLUMNS, fmt)
