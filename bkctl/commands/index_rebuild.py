"""`bkctl index rebuild`: rebuild a stopped DbLedgerStorage bookie's locations db from its entry logs."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from bkctl.commands.output import OutputOption, resolve, write_json, write_mapping
from bkctl.errors import UsageError


def index_rebuild(
    ledger_dir: Annotated[Path, typer.Argument(help="A DbLedgerStorage ledger dir (or its current/).")],
    output: OutputOption = None,
) -> None:
    """Rebuild current/locations from the entry logs (Java's rebuild-db-ledger-locations-index).

    Every entry of a ledger in current/ledgers gets the location of its last copy in the entry logs.
    The new db is built in locations.rebuilding and swapped in when complete; the old one is kept as
    locations.BACKUP-<time>. Offline: refused while a bkctl bookie holds the directory.
    """
    from bkctl.commands.inspect_index import db_current
    from bkctl.server.db_rebuild import rebuild_locations
    from bkctl.server.dirlock import locked

    current = db_current(ledger_dir)
    if current is None:
        raise UsageError(f"{ledger_dir}: no DbLedgerStorage databases (current/ledgers, current/locations)")
    fmt = resolve(output)
    with locked([("ledger directory", current.parent)], "bkctl index rebuild"):
        report = rebuild_locations(current.parent)
    doc = asdict(report)
    if fmt.value == "json":
        write_json(doc)
    else:
        doc["entry_logs"] = len(report.entry_logs)
        doc["stops"] = "; ".join(report.stops) or "none"
        doc["seconds"] = round(report.seconds, 3)
        write_mapping(doc, fmt)
