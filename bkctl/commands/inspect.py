"""Offline inspection of a bookie's files: `journal`, `entrylog`, `index` groups and `lastmark`.

Thin: parse options, call the read-only readers in bkctl.files, render with output.py. Every command
prints all it can decode and then, if a file was corrupt or truncated, fails with CorruptDataError
(exit 7) naming the file, the offset and the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from bkctl.commands import index_rebuild, inspect_entrylog, inspect_index, inspect_journal
from bkctl.commands.inspect_common import Failures
from bkctl.commands.output import Column, OutputOption, resolve, write_json, write_rows
from bkctl.errors import NotFoundError, ProtocolError

LAST_MARK_COLUMNS = (
    Column("file", "FILE"),
    Column("journal_id", "JOURNAL ID", numeric=True),
    Column("journal_file", "JOURNAL FILE"),
    Column("offset", "OFFSET", numeric=True),
)


def register(app: typer.Typer) -> None:
    journal = typer.Typer(help="Inspect journal files offline (read-only).", no_args_is_help=True)
    journal.command("inspect")(inspect_journal.journal_inspect)
    app.add_typer(journal, name="journal")
    entrylog = typer.Typer(help="Inspect entry log files offline (read-only).", no_args_is_help=True)
    entrylog.command("inspect")(inspect_entrylog.entrylog_inspect)
    entrylog.command("metadata")(inspect_entrylog.entrylog_metadata)
    app.add_typer(entrylog, name="entrylog")
    index = typer.Typer(
        help="Inspect ledger indexes offline (read-only) and rebuild them (either storage).",
        no_args_is_help=True,
    )
    index.command("inspect")(inspect_index.index_inspect)
    index.command("ledgers")(inspect_index.index_ledgers)
    index.command("rebuild")(index_rebuild.index_rebuild)
    app.add_typer(index, name="index")
    app.command("lastmark")(lastmark)


def lastmark(
    paths: Annotated[
        list[Path], typer.Argument(help="Ledger dir(s), their current/ dir, or a bookie root holding them.")
    ],
    output: OutputOption = None,
) -> None:
    """Show every lastMark (where journal replay starts) found in the given ledger dirs."""
    from bkctl.files.marks import find_last_marks, read_last_mark

    fmt = resolve(output)
    failures = Failures()
    marks: list[dict[str, Any]] = []
    for path in paths:
        for mark_path in find_last_marks(path):
            try:
                mark = read_last_mark(mark_path)
            except ProtocolError as exc:
                failures.add(mark_path, 0, str(exc))
                continue
            marks.append(
                {
                    "file": str(mark.path),
                    "journal_id": mark.journal_id,
                    "journal_file": mark.journal_file,
                    "offset": mark.offset,
                }
            )
    if not marks and not failures:
        raise NotFoundError(f"no lastMark file in {', '.join(map(str, paths))}")
    if fmt.value == "json":
        write_json({"marks": marks})
    else:
        write_rows(marks, LAST_MARK_COLUMNS, fmt)
    failures.raise_if_any()
