"""`bkctl bookie ...`: the bookie group. Several modules add commands to `app`:
this one (cluster view: `list`), and commands/bookie_server.py (`start`, `format`, `cookie`)."""

from __future__ import annotations

from typing import Annotated

import typer

from bkctl.commands.options import MetadataOption, open_layout
from bkctl.commands.output import Column, OutputFormat, OutputOption, resolve, write_json, write_rows
from bkctl.errors import UsageError

app = typer.Typer(name="bookie", help="Run a bookie and look at the cluster's bookies.", no_args_is_help=True)

COLUMNS = (Column("bookie_id", "BOOKIE"), Column("state", "STATE"))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="bookie")


@app.command("list")
def bookie_list(
    rw: Annotated[bool, typer.Option("--rw", help="Only read-write bookies.")] = False,
    ro: Annotated[bool, typer.Option("--ro", help="Only read-only bookies.")] = False,
    all_: Annotated[
        bool, typer.Option("--all", help="Also bookies with a cookie that are not registered (state down).")
    ] = False,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """List bookies and their state: rw, ro (and down with --all). Default: every registered bookie."""
    if rw + ro + all_ > 1:
        raise UsageError("give at most one of --rw, --ro and --all")
    fmt = resolve(output)
    with open_layout(metadata) as layout:
        states: dict[str, str] = {}
        if all_:
            states.update((bookie, "down") for bookie in layout.cookie_bookies())
        if not ro:
            states.update((bookie, "rw") for bookie in layout.bookies())
        if not rw:
            states.update((bookie, "ro") for bookie in layout.bookies(readonly=True))
    rows = [{"bookie_id": bookie, "state": state} for bookie, state in sorted(states.items())]
    if fmt is OutputFormat.json:
        write_json(rows)
    else:
        write_rows(rows, COLUMNS, fmt)
