"""`bkctl bookie check`: an offline, read-only consistency check of a stopped bookie's ledger storage
(the work is bkctl.server.local_check)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from bkctl.commands.bookie import app
from bkctl.commands.bookie_server import IndexDirOption, LedgerDirOption
from bkctl.commands.index_rebuild import require_bookie_dirs
from bkctl.commands.options import open_layout
from bkctl.commands.output import Column, OutputFormat, OutputOption, message, resolve, write_json, write_rows
from bkctl.errors import ProblemsFound, UsageError

COLUMNS = (
    Column("problem", "PROBLEM"),
    Column("ledger_id", "LEDGER", numeric=True),
    Column("entry_id", "ENTRY", numeric=True),
    Column("file", "FILE"),
    Column("offset", "OFFSET", numeric=True),
    Column("detail", "DETAIL"),
)


def register(root: typer.Typer) -> None:
    """The command is added to the `bookie` group at import."""


@app.command("check")
def bookie_check(
    ledger_dir: LedgerDirOption = None,
    index_dir: IndexDirOption = None,
    journal_dir: Annotated[
        list[Path] | None,
        typer.Option(
            "--journal-dir", "-j", help="journalDirectories: records the next start replays are not problems."
        ),
    ] = None,
    metadata: Annotated[
        str | None,
        typer.Option(
            "--metadata",
            help="Also read the metadata store: records of ledgers it lacks (deleted, awaiting GC) are "
            "not problems.",
        ),
    ] = None,
    output: OutputOption = None,
) -> None:
    """Check a STOPPED bookie's index files and entry logs against each other (read-only; exit 3 with
    the list of problems): every index slot points at a record of its ledger and entry whose digest
    verifies, and every entry log record is reachable from its ledger's index."""
    from bkctl.server.local_check import check

    if not ledger_dir:
        raise UsageError("give the bookie's --ledger-dir (repeat for each)")
    ledger_dirs = tuple(ledger_dir)
    require_bookie_dirs((*ledger_dirs, *(index_dir or ())))
    fmt = resolve(output)
    deleted = _deleted_ledgers(metadata)
    report = check(ledger_dirs, tuple(index_dir or ledger_dirs), tuple(journal_dir or ()), deleted)
    if fmt is OutputFormat.json:
        write_json(report.as_dict())
    else:
        write_rows(report.problems, COLUMNS, fmt)
    summary = (
        f"{report.index_files} index files, {report.slots} slots, {report.entry_logs} entry logs, "
        f"{report.records} records ({report.in_journal} to be replayed from the journal)"
    )
    if report.problems:
        ledgers = sorted({int(str(p["ledger_id"])) for p in report.problems})
        raise ProblemsFound(
            f"{len(report.problems)} problems in ledgers {','.join(map(str, ledgers))} ({summary}); "
            "repair an index with `bkctl index rebuild --ledger-dir D --ledger L` (the bookie stopped)"
        )
    message(f"bkctl: no problem: {summary}")


def _deleted_ledgers(metadata: str | None) -> Callable[[int], bool]:
    if metadata is None:
        return lambda ledger_id: False
    with open_layout(metadata) as layout:
        listed = set(layout.ledger_ids())
    return lambda ledger_id: ledger_id not in listed
