"""`bkctl bookie rack set|list`: where bookies are, in Apache Pulsar's rack map (the `/bookies` znode
beside `/ledgers`, as Pulsar's BookieRackAffinityMapping reads it; docs/placement.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from bkctl.commands.bookie import app as bookie_app
from bkctl.commands.options import MetadataOption, open_layout
from bkctl.commands.output import Column, OutputFormat, OutputOption, message, resolve, write_json, write_rows
from bkctl.errors import UsageError

rack_app = typer.Typer(
    name="rack", help="Set and show the bookies' racks (Pulsar's /bookies rack map).", no_args_is_help=True
)

COLUMNS = (
    Column("bookie", "BOOKIE"),
    Column("rack", "RACK"),
    Column("hostname", "HOSTNAME"),
    Column("group", "GROUP"),
    Column("state", "STATE"),
)


def register(_root: typer.Typer) -> None:
    bookie_app.add_typer(rack_app, name="rack")


@rack_app.command("set")
def rack_set(
    bookie: Annotated[str, typer.Argument(help="The bookie id (host:port).")],
    rack: Annotated[
        str | None, typer.Argument(help="Its rack: /rack, /region/rack or /zone/upgradedomain.")
    ] = None,
    hostname: Annotated[
        str | None, typer.Option("--hostname", help="Its host name, as Pulsar records it.")
    ] = None,
    group: Annotated[str, typer.Option("--group", help="Pulsar's bookie affinity group.")] = "default",
    remove: Annotated[bool, typer.Option("--remove", help="Take the bookie out of the map.")] = False,
    metadata: MetadataOption = None,
) -> None:
    """Put a bookie in a rack (or take it out with --remove); placement sees the change at once."""
    from bkctl.metadata.racks import RackEntry, set_rack

    if remove == (rack is not None):
        raise UsageError("give a rack, or --remove (not both)")
    if ":" not in bookie:
        raise UsageError(f"bookie {bookie!r} is not host:port")
    entry = None if remove else RackEntry(group, bookie, _slash(rack or ""), hostname)
    with open_layout(metadata, initialized=False) as layout:
        set_rack(layout.store, entry, remove=bookie if remove else None)
    message(
        f"bookie {bookie}: "
        + ("removed from the rack map" if remove else f"rack {entry.rack if entry else ''}")
    )


@rack_app.command("list")
def rack_list(metadata: MetadataOption = None, output: OutputOption = None) -> None:
    """The rack map and the registered bookies: bookies it does not name are in the default rack."""
    from bkctl.metadata.racks import read_rack_map

    fmt = resolve(output)
    with open_layout(metadata) as layout:
        entries = read_rack_map(layout.store)
        states = {b: "rw" for b in layout.bookies()}
        states.update((b, "ro") for b in layout.bookies(readonly=True))
    rows = [{**e.as_dict(), "state": states.get(e.bookie, "down")} for e in entries]
    named = {e.bookie for e in entries}
    rows += [
        {"group": None, "bookie": b, "rack": None, "hostname": None, "state": state}
        for b, state in states.items()
        if b not in named
    ]
    rows.sort(key=lambda row: str(row["bookie"]))
    if fmt is OutputFormat.json:
        write_json(rows)
    else:
        write_rows(rows, COLUMNS, fmt)


def _slash(rack: str) -> str:
    text = rack.strip()
    if not text:
        raise UsageError("a rack must not be empty")
    return text  # as given, as Pulsar's admin stores it; readers add the leading "/"
