"""`bkctl bookie convert --to db|interleaved`: change a stopped bookie's ledger index engine offline."""

from __future__ import annotations

import os
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
        list[Path],
        typer.Option(
            "--ledger-dir",
            "-l",
            help="The bookie's ledger dirs (holding current/): every one, in ledgerDirectories' order.",
        ),
    ],
    output: OutputOption = None,
) -> None:
    """Convert a stopped bookie's index between .idx files (interleaved) and DbLedgerStorage's RocksDB
    databases (db), as Java's convert-to-db-storage / convert-to-interleaved-storage, over one ledger dir
    or several.

    With several dirs, to db an entry held in another dir than its ledger's (DbLedgerStorage keeps
    ledger L in dir L mod n) is copied there; to interleaved, entry logs whose id two dirs share are
    renamed apart. The new index is written, then compared with the old one entry by entry, and only
    then is the old one removed; a rerun after a kill finishes the job. Then start the bookie with
    --storage TO (or ledgerStorageClass).
    """
    from bkctl.server import storage_convert
    from bkctl.server.dirlock import locked
    from bkctl.server.ledger_storage import ENGINES

    if to not in ENGINES:
        raise UsageError(f"--to {to}: expected one of {', '.join(ENGINES)}")
    dirs = list(dict.fromkeys(ledger_dir))
    for directory in dirs:
        if not (directory / "current").is_dir():
            raise UsageError(f"--ledger-dir {directory}: no current/ directory in it")
    fmt = resolve(output)
    with locked([("ledger directory", d) for d in dirs], f"bkctl bookie convert --to {to}"):
        _check_cookie(dirs)
        _check_source(dirs, to, storage_convert.decided(dirs))
        convert = storage_convert.to_db if to == "db" else storage_convert.to_interleaved
        report = convert(dirs)
    doc = asdict(report)
    if fmt.value == "json":
        write_json(doc)
    else:
        doc["removed"] = len(report.removed)
        doc["seconds"] = round(report.seconds, 3)
        write_mapping(doc, fmt)


def _check_cookie(dirs: list[Path]) -> None:
    """UsageError unless the dirs are as many as the ledger dirs the bookie's cookie lists, in its order
    when they are the same paths (the db engine keeps ledger L in the (L mod n)-th; a moved disk keeps
    its place in ledgerDirectories), and its index dirs are its ledger dirs."""
    from bkctl.server.cookies import read_local_cookie

    cookie = read_local_cookie(dirs[0]).cookie
    if cookie is None:
        return
    given, listed = [os.path.abspath(d) for d in dirs], [os.path.abspath(d) for d in cookie.ledger_dirs]
    if len(given) != len(listed) or (set(given) == set(listed) and given != listed):
        raise UsageError(
            f"--ledger-dir: the bookie's cookie lists its ledger dirs as {' '.join(cookie.ledger_dirs)}: "
            "give every one, in that order (ledgerDirectories'); nothing was changed"
        )
    if cookie.index_dirs is not None and list(cookie.index_dirs) != list(cookie.ledger_dirs):
        raise UsageError(
            f"{dirs[0]}: the bookie keeps its index in other directories (indexDirectories): "
            "converting it is not supported; nothing was changed"
        )


def _check_source(dirs: list[Path], to: str, decided: str | None) -> None:
    """UsageError when there is nothing to convert to `to`, or an unfinished conversion the other way."""
    from bkctl.server.storage_kind import DB, INTERLEAVED, found_kinds

    if decided is not None:
        if decided != to:
            raise UsageError(
                f"{dirs[0]}: a conversion to {decided} is decided and unfinished: rerun with --to {decided}"
            )
        return
    kinds: set[str] = set().union(*(found_kinds(d) for d in dirs))
    source = DB if to == INTERLEAVED else INTERLEAVED
    if source not in kinds:
        raise UsageError(
            f"{' '.join(map(str, dirs))}: already {to} storage (or no index at all): nothing to convert"
        )
    if to == DB and DB in kinds:
        raise UsageError(
            f"{' '.join(map(str, dirs))}: holds both storages' indexes (a conversion to interleaved was "
            "interrupted): rerun with --to interleaved first"
        )


def register(root: typer.Typer) -> None:
    """`convert` is added to the `bookie` group (bkctl.commands.bookie) at import."""
