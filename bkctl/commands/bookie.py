"""`bkctl bookie ...`: the bookie group. Several modules add commands to `app`:
this one (cluster view: `list`), and commands/bookie_server.py (`start`, `format`, `cookie`)."""

from __future__ import annotations

import typer

app = typer.Typer(name="bookie", help="Run a bookie and look at the cluster's bookies.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="bookie")
