"""`bkctl bookie readonly|writable <bookie>`: switch a running bookie over its admin HTTP endpoint
(Java's `PUT /api/v1/bookie/state/readonly`), e.g. to drain it before maintenance without a restart."""

from __future__ import annotations

from typing import Annotated

import typer

from bkctl.commands.bookie import app
from bkctl.commands.bookie_gc import admin_endpoint, put_json
from bkctl.commands.options import MetadataOption
from bkctl.commands.output import OutputFormat, OutputOption, message, resolve, write_json

BookieArgument = Annotated[
    str | None, typer.Argument(help="Bookie id; its admin endpoint is read from its registration.")
]
HttpOption = Annotated[
    str | None, typer.Option("--http", help="The bookie's admin HTTP endpoint, HOST:PORT.")
]
PersistOption = Annotated[
    bool,
    typer.Option("--persist", help="Keep the state across restarts (the bookie's BOOKIE_STATUS file)."),
]


def register(root: typer.Typer) -> None:
    """The commands are added to the `bookie` group at import."""


@app.command("readonly")
def bookie_readonly(
    bookie: BookieArgument = None,
    http: HttpOption = None,
    persist: PersistOption = False,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Turn a running bookie read-only: it moves to readonly/ at once, refuses adds, serves reads.
    Needs httpServerAdminEnabled=true on the bookie."""
    _switch(True, bookie, http, persist, metadata, output)


@app.command("writable")
def bookie_writable(
    bookie: BookieArgument = None,
    http: HttpOption = None,
    persist: PersistOption = False,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Turn a read-only bookie writable again; refused (exit 10) when it is read-only for a full disk,
    a broken journal or forceReadOnlyBookie. Needs httpServerAdminEnabled=true on the bookie."""
    _switch(False, bookie, http, persist, metadata, output)


def _switch(
    read_only: bool,
    bookie: str | None,
    http: str | None,
    persist: bool,
    metadata: str | None,
    output: OutputFormat | None,
) -> None:
    endpoint = admin_endpoint(bookie, http, metadata)
    body = {"readOnly": read_only, "persist": persist}
    answer = put_json(f"http://{endpoint}/api/v1/bookie/state/readonly", body, wait=False)
    fmt = resolve(output)
    if fmt is OutputFormat.json:
        write_json(answer)
        return
    state = "read-only" if answer.get("readOnly") else "writable"
    message(f"bookie {bookie or endpoint} is {state}{' (kept across restarts)' if persist else ''}")
