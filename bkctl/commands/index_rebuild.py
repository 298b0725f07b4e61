"""`bkctl index rebuild`: a stopped bookie's ledger index rebuilt from its entry logs. On the interleaved
storage, chosen ledgers' `.idx` files (Java's regenerate-interleaved-storage-index-file; the work is
bkctl.server.index_rebuild); on DbLedgerStorage, the whole locations db (Java's
rebuild-db-ledger-locations-index; bkctl.server.db_rebuild). This module takes the options, the
directory locks and the master key."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from bkctl.commands.bookie_server import IndexDirOption, LedgerDirOption
from bkctl.commands.options import MetadataOption, open_layout
from bkctl.commands.output import Column, OutputFormat, OutputOption, message, resolve, write_json, write_rows
from bkctl.errors import NotFoundError, UsageError

if TYPE_CHECKING:
    from bkctl.server.index_rebuild import Rebuild

COLUMNS = (
    Column("ledger_id", "LEDGER", numeric=True),
    Column("entries", "ENTRIES", numeric=True),
    Column("first_entry", "FIRST", numeric=True),
    Column("last_entry", "LAST", numeric=True),
    Column("rejected", "REJECTED", numeric=True),
    Column("fenced", "FENCED"),
    Column("key_from", "KEY FROM"),
    Column("old_index", "OLD INDEX"),
    Column("index", "INDEX"),
)


def require_bookie_dirs(directories: Iterable[Path]) -> None:
    """NotFoundError (exit 4) for a directory that is not a bookie's: a typo must not read as "empty"."""
    for directory in directories:
        if not (directory / "current").is_dir():
            raise NotFoundError(
                f"{directory}: no current/ directory: not a bookie's ledger or index directory"
            )


def parse_ledgers(text: str) -> list[int]:
    try:
        ledgers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--ledger {text!r}: give ledger ids, e.g. 7 or 7,9,12") from None
    if not ledgers or min(ledgers) < 0:
        raise UsageError(f"--ledger {text!r}: give non-negative ledger ids, e.g. 7 or 7,9,12")
    return sorted(set(ledgers))


def index_rebuild(
    ledger: Annotated[
        str | None,
        typer.Option("--ledger", help="Ledger id(s) to rebuild, comma-separated (interleaved storage)."),
    ] = None,
    ledger_dir: LedgerDirOption = None,
    index_dir: IndexDirOption = None,
    metadata: MetadataOption = None,
    password: Annotated[
        str | None,
        typer.Option("--password", help="The ledgers' password (default: from their metadata)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be written; write nothing.")
    ] = False,
    output: OutputOption = None,
) -> None:
    """Rebuild a STOPPED bookie's index from the records in its entry logs.

    Interleaved storage: the `.idx` files of the --ledger ids. The master key comes from the ledger's
    password in the metadata (or --password, or the old index when its header still decodes); the fenced
    bit is kept where the old index tells it. The old file stays until the new one is synced.
    DbLedgerStorage: current/locations, every entry of a ledger in current/ledgers at its last copy in
    the entry logs; built beside the old db and swapped in when complete (the old one kept as
    locations.BACKUP-<time>). Start the bookie afterwards: it replays the journal onto the new index.
    """
    from bkctl.server import index_rebuild as ir
    from bkctl.server.dirlock import holder_text, lock_directories
    from bkctl.server.storage_kind import DB, found_engine

    if not ledger_dir:
        raise UsageError("give the bookie's --ledger-dir (repeat for each)")
    require_bookie_dirs(ledger_dir)
    if found_engine(ledger_dir[0]) == DB:
        _rebuild_locations_db(ledger_dir, ledger, dry_run, output)
        return
    if ledger is None:
        raise UsageError("give the --ledger id(s) whose index files to rebuild, e.g. --ledger 7,9")
    ledgers = parse_ledgers(ledger)
    ledger_dirs = tuple(ledger_dir)
    index_dirs = tuple(index_dir or ledger_dirs)
    fmt = resolve(output)
    labelled = [("ledger directory", d) for d in ledger_dirs] + [("index directory", d) for d in index_dirs]
    require_bookie_dirs(d for _, d in labelled)
    locks = lock_directories(labelled, holder_text("bkctl index rebuild"), existing_only=True)
    try:
        rebuilds = ir.plan(ledgers, ledger_dirs, index_dirs)
        _master_keys(rebuilds, metadata, password)
        if not dry_run:
            for rebuild in rebuilds:
                ir.write(rebuild)
    finally:
        locks.release()
    rows = [{**r.as_dict(), "written": not dry_run} for r in rebuilds]
    if fmt is OutputFormat.json:
        write_json(rows)
    else:
        write_rows(rows, COLUMNS, fmt)
    verb = "would rebuild" if dry_run else "rebuilt"
    message(f"bkctl: {verb} {len(rows)} index file(s); start the bookie to replay its journal onto them")


def _master_keys(rebuilds: list[Rebuild], metadata: str | None, password: str | None) -> None:
    """Each ledger's master key and, where the old index cannot tell, its fenced bit from the metadata."""
    from bkctl.model import LedgerState
    from bkctl.protocol import entry

    if password is not None:
        for rebuild in rebuilds:
            rebuild.master_key, rebuild.key_from = entry.master_key(password.encode()), "--password"
    if password is not None and all(r.fenced_from == "old index" for r in rebuilds):
        return
    with open_layout(metadata) as layout:
        for rebuild in rebuilds:
            try:
                found = layout.read_ledger(rebuild.ledger_id).value
            except NotFoundError:
                if not rebuild.key_from:
                    raise NotFoundError(
                        f"ledger {rebuild.ledger_id}: not in the metadata and no readable old index: "
                        "give --password"
                    ) from None
                continue
            if not rebuild.key_from:
                if found.password is None:
                    raise UsageError(
                        f"ledger {rebuild.ledger_id}: its metadata holds no password: give --password"
                    )
                rebuild.master_key, rebuild.key_from = entry.master_key(found.password), "metadata"
            if rebuild.fenced_from != "old index" and found.state is LedgerState.CLOSED:
                rebuild.fenced, rebuild.fenced_from = True, "metadata: closed"


def _rebuild_locations_db(
    ledger_dirs: list[Path], ledger: str | None, dry_run: bool, output: OutputFormat | None
) -> None:
    """DbLedgerStorage: the whole locations db of one ledger directory, from its entry logs."""
    from dataclasses import asdict

    from bkctl.commands.output import write_mapping
    from bkctl.server.db_rebuild import rebuild_locations
    from bkctl.server.dirlock import locked

    if len(ledger_dirs) != 1 or ledger is not None or dry_run:
        raise UsageError(
            "a DbLedgerStorage directory: its whole locations db is rebuilt, one --ledger-dir at a time "
            "(--ledger and --dry-run are for the interleaved storage)"
        )
    fmt = resolve(output)
    with locked([("ledger directory", ledger_dirs[0])], "bkctl index rebuild"):
        report = rebuild_locations(ledger_dirs[0])
    doc = asdict(report)
    if fmt is OutputFormat.json:
        write_json(doc)
    else:
        doc["entry_logs"] = len(report.entry_logs)
        doc["stops"] = "; ".join(report.stops) or "none"
        doc["seconds"] = round(report.seconds, 3)
        write_mapping(doc, fmt)
