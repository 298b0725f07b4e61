"""`bkctl bookie convert --to db|interleaved`: change a stopped bookie's ledger index engine offline."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from bkctl.commands.bookie import app
from bkctl.commands.output import OutputOption, resolve, write_json, write_mapping
from bkctl.errors import UsageError


@app.command("convert")
def bookie_convert(
    to: Annotated[str, typer.Option("--to", help="The engine to convert to: db or interleaved.")],
    ledger_dir: Annotated[
        Path, typer.Option("--ledger-dir", "-l", help="The bookie's ledger dir (holding current/).")
    ],
    output: OutputOption = None,
) -> None:
    """Convert a stopped bookie's index between .idx files (interleaved) and DbLedgerStorage's RocksDB
    databases (db), as Java's convert-to-db-storage / convert-to-interleaved-storage.

    The new index is written, then compared with the old one entry by entry, and only then is the old
    one removed; a rerun after a kill finishes the job. Entry logs and journal are not touched. Then
    start the bookie with --storage TO (or ledgerStorageClass).
    """
    from bkctl.server import storage_convert
    from bkctl.server.dirlock import locked
    from bkctl.server.ledger_storage import ENGINES
    from bkctl.server.storage_kind import DB, found_engine

    if to not in ENGINES:
        raise UsageError(f"--to {to}: expected one of {', '.join(ENGINES)}")
    if not (ledger_dir / "current").is_dir():
        raise UsageError(f"--ledger-dir {ledger_dir}: no current/ directory in it")
    fmt = resolve(output)
    with locked([("ledger directory", ledger_dir)], f"bkctl bookie convert --to {to}"):
        _refuse_several_dirs(ledger_dir)
        found = found_engine(ledger_dir)
        leftover_idx = to == DB and found == DB and storage_convert.has_index_files(ledger_dir / "current")
        if found is None or (found == to and not leftover_idx):
            raise UsageError(f"{ledger_dir}: already {to} storage (or no index at all): nothing to convert")
        convert = storage_convert.to_db if to == DB else storage_convert.to_interleaved
        report = convert(ledger_dir)
    doc = asdict(report)
    if fmt.value == "json":
        write_json(doc)
    else:
        doc["removed"] = len(report.removed)
        doc["seconds"] = round(report.seconds, 3)
        write_mapping(doc, fmt)


def _refuse_several_dirs(ledger_dir: Path) -> None:
    """UsageError for a dir of a bookie with several ledger dirs (its cookie lists them): the storages
    lay them out differently (interleaved: one sequence of entry logs over all; db: ledger L and its
    logs in dir L mod n, log ids per dir), so a converted dir would not be served whole."""
    from bkctl.server.cookies import read_local_cookie

    cookie = read_local_cookie(ledger_dir).cookie
    if cookie is not None and len(cookie.ledger_dirs) > 1:
        raise UsageError(
            f"{ledger_dir}: its bookie has {len(cookie.ledger_dirs)} ledger dirs (its cookie): converting "
            "a bookie of several ledger dirs is not supported (the two storages lay them out differently); "
            "nothing was changed"
        )


def register(root: typer.Typer) -> None:
    """`convert` is added to the `bookie` group (bkctl.commands.bookie) at import."""
