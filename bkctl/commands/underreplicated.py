"""`bkctl underreplicated`: ledgers the auditor marked as missing replicas."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import typer

from bkctl.commands.options import MetadataOption, Problems, open_layout
from bkctl.commands.output import (
    Column,
    OutputFormat,
    OutputOption,
    resolve,
    write_json,
    write_rows,
    write_text,
)

LEDGER_COLUMN = Column("ledger_id", "LEDGER ID", numeric=True)
CTIME_COLUMN = Column("ctime", "CTIME", numeric=True)
MISSING_COLUMN = Column("missing_replicas", "MISSING REPLICAS")
WORKER_COLUMN = Column("replication_worker", "REPLICATION WORKER")

app = typer.Typer(help="Under-replicated ledgers (marked by the auditor).", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="underreplicated")


@app.command("list")
def underreplicated_list(
    missing_replica: Annotated[
        str | None,
        typer.Option("--missing-replica", help="Only ledgers missing a replica on this bookie (exact id)."),
    ] = None,
    exclude_missing_replica: Annotated[
        str | None,
        typer.Option("--exclude-missing-replica", help="Leave out ledgers missing a replica on this bookie."),
    ] = None,
    print_missing_replica: Annotated[
        bool, typer.Option("--print-missing-replica", help="Add the missing replicas column.")
    ] = False,
    print_replication_worker: Annotated[
        bool, typer.Option("--print-replication-worker", help="Add the worker holding each ledger's lock.")
    ] = False,
    count: Annotated[bool, typer.Option("--count", "-c", help="Print only the number of ledgers.")] = False,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """List under-replicated ledgers with when they were marked (ctime, ms).

    JSON always carries every field; the --print-* flags add table/plain columns. Malformed marks are
    reported on stderr and skipped (exit 3).
    """
    fmt = resolve(output)
    problems = Problems()
    with open_layout(metadata) as layout:
        rows = _rows(layout.underreplicated_ledgers(problems), missing_replica, exclude_missing_replica)
        if count and fmt is OutputFormat.json:
            write_json({"count": sum(1 for _ in rows)})
        elif count:
            write_text(str(sum(1 for _ in rows)))
        elif fmt is OutputFormat.json:
            write_json(rows)
        else:
            columns = [LEDGER_COLUMN, CTIME_COLUMN]
            columns += [MISSING_COLUMN] if print_missing_replica else []
            columns += [WORKER_COLUMN] if print_replication_worker else []
            write_rows(rows, columns, fmt)
    problems.raise_if_any()


def _rows(entries: Iterator[Any], include: str | None, exclude: str | None) -> Iterator[dict[str, Any]]:
    """Java's filter: the replica list contains `include` and does not contain `exclude` (exact strings)."""
    for entry in entries:
        replicas = list(entry.mark.replicas)
        if include is not None and include not in replicas:
            continue
        if exclude is not None and exclude in replicas:
            continue
        yield {
            "ledger_id": entry.ledger_id,
            "missing_replicas": replicas,
            "ctime": entry.mark.ctime,
            "replication_worker": entry.replication_worker,
        }
