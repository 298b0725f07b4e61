"""`bkctl index rebuild`: a stopped bookie's ledger index rebuilt from its entry logs. On the interleaved
storage, chosen ledgers' `.idx` files (Java's regenerate-interleaved-storage-index-file; the work is
bkctl.server.index_rebuild); on DbLedgerStorage, each ledger directory's locations db and, when asked
or needed, its ledgers db (Java's rebuild-db-ledger-locations-index and rebuild-db-ledgers-index;
bkctl.server.db_rebuild). This module takes the options, the directory locks and the master key."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bkctl.commands.bookie_server import IndexDirOption, JournalDirOption, LedgerDirOption
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
    db: Annotated[
        str,
        typer.Option(
            "--db",
            help="DbLedgerStorage: which RocksDB db to rebuild: auto (the ledgers db too when it is "
            "missing or unreadable, else the locations db), locations, ledgers or all.",
        ),
    ] = "auto",
    journal_dir: JournalDirOption = None,
    output: OutputOption = None,
) -> None:
    """Rebuild a STOPPED bookie's index from the records in its entry logs.

    Interleaved storage: the `.idx` files of the --ledger ids. The master key comes from the ledger's
    password in the metadata (or --password, or the old index when its header still decodes); the fenced
    bit is kept where the old index tells it. The old file stays until the new one is synced.
    DbLedgerStorage (give every --ledger-dir, in ledgerDirectories' order): per directory,
    current/locations (every entry of a ledger in current/ledgers at its last copy in the entry logs)
    and, with --db ledgers|all (or auto, when it is missing or unreadable), current/ledgers (every
    ledger of the entry logs and of the --journal-dir journals, fenced; its state kept from the old db
    where it reads, else the master key from the journal or the metadata's password); each built
    beside the old db and swapped in when complete (the old one kept as <db>.BACKUP-<time>). Start the
    bookie afterwards: it replays the journal onto the new index.
    """
    from bkctl.server import index_rebuild as ir
    from bkctl.server.dirlock import holder_text, lock_directories
    from bkctl.server.storage_kind import DB, found_engine

    if not ledger_dir:
        raise UsageError("give the bookie's --ledger-dir (repeat for each)")
    require_bookie_dirs(ledger_dir)
    if found_engine(ledger_dir[0]) == DB:
        if ledger is not None or dry_run:
            raise UsageError(
                "a DbLedgerStorage bookie: its whole dbs are rebuilt (--ledger and --dry-run are for the "
                "interleaved storage)"
            )
        _rebuild_dbs(ledger_dir, db, tuple(journal_dir or ()), metadata, output)
        return
    if db != "auto" or journal_dir:
        raise UsageError("--db and --journal-dir are for a DbLedgerStorage bookie")
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


DB_CHOICES = ("auto", "locations", "ledgers", "all")


def _rebuild_dbs(
    ledger_dirs: list[Path],
    db: str,
    journal_dirs: tuple[Path, ...],
    metadata: str | None,
    output: OutputFormat | None,
) -> None:
    """DbLedgerStorage: each ledger directory's chosen dbs, from its entry logs (and journals)."""
    from dataclasses import asdict

    from bkctl.commands.output import write_mapping
    from bkctl.server.db_rebuild import ledgers_db_readable, rebuild_ledgers, rebuild_locations
    from bkctl.server.dirlock import locked

    if db not in DB_CHOICES:
        raise UsageError(f"--db {db!r}: expected one of {', '.join(DB_CHOICES)}")
    require_bookie_dirs(journal_dirs)
    if len(set(ledger_dirs)) != len(ledger_dirs):
        raise UsageError("a --ledger-dir is given twice")
    fmt = resolve(output)
    labelled = [("ledger directory", d) for d in ledger_dirs] + [
        ("journal directory", d) for d in journal_dirs
    ]
    docs: list[dict[str, Any]] = []
    with locked(labelled, "bkctl index rebuild"):
        metadata_key = _metadata_keys(metadata) if metadata is not None else None
        for index, directory in enumerate(ledger_dirs):
            doc: dict[str, Any] = {"ledger_dir": str(directory)}
            ledgers = db in ("ledgers", "all") or (db == "auto" and not ledgers_db_readable(directory))
            if ledgers:
                report = rebuild_ledgers(directory, index, len(ledger_dirs), journal_dirs, metadata_key)
                doc["ledgers_db"] = asdict(report)
            if db != "ledgers":  # at the top, as before the ledgers db could be rebuilt
                doc.update(asdict(rebuild_locations(directory)))
            docs.append(doc)
    if fmt is OutputFormat.json:
        write_json(docs if len(docs) > 1 else docs[0])
        return
    for doc in docs:
        write_mapping(_flat(doc), fmt)


def _flat(doc: dict[str, Any]) -> dict[str, Any]:
    """One directory's reports as one mapping of short values (table and plain output)."""
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if key == "ledgers_db":
            flat.update({f"ledgers_db.{k}": _short(k, v) for k, v in value.items()})
        else:
            flat[key] = _short(key, value)
    return flat


def _short(key: str, value: Any) -> Any:
    if isinstance(value, list):
        return len(value) if key != "stops" else "; ".join(value) or "none"
    return round(value, 3) if isinstance(value, float) else value


def _metadata_keys(metadata: str) -> Callable[[int], bytes | None]:
    """ledger id -> master key from its password in the metadata (None: no such ledger, no password)."""
    from bkctl.protocol import entry

    with open_layout(metadata) as layout:
        passwords: dict[int, bytes | None] = {}
        for ledger_id in layout.ledger_ids():
            try:
                passwords[ledger_id] = layout.read_ledger(ledger_id).value.password
            except NotFoundError:
                continue

    def key(ledger_id: int) -> bytes | None:
        password = passwords.get(ledger_id)
        return entry.master_key(password) if password is not None else None

    return key
