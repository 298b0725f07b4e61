"""Options shared by every command that talks to a cluster: `--metadata URI` and opening the layout.

The store backends (kazoo, sqlite3) are imported only when a command opens the store, so
`bkctl --help` and TAB completion stay fast.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bkctl.commands.output import message
from bkctl.errors import Declined, NotFoundError, ProblemsFound, ReadOnlyError, UsageError

if TYPE_CHECKING:
    from pathlib import Path

    from bkctl.metadata.layout import Layout
    from bkctl.metadata.retry import RetryPolicy
    from bkctl.metadata.store import MetadataLocation, MetadataStore

MetadataOption = Annotated[
    str | None,
    typer.Option(
        "--metadata",
        envvar="BKCTL_METADATA",
        help="Metadata store: zk://host:port/ledgers, host:port[/chroot], sqlite:///path/metadata.db "
        "(default: the embedded SQLite store, see docs/cli.md).",
        show_default=False,
    ),
]

PlacementConfOption = Annotated[
    Path | None,
    typer.Option(
        "--conf",
        envvar="BKCTL_CONF",
        help="Java properties (a bk_client.conf or bk_server.conf) with the placement policy's keys: "
        "ensemblePlacementPolicy, minNumRacksPerWriteQuorum, reppDnsResolverClass... (docs/placement.md).",
        show_default=False,
    ),
]

PlacementKeysOption = Annotated[
    list[str] | None,
    typer.Option(
        "--placement",
        metavar="KEY=VALUE",
        help="A placement key overriding --conf's (repeat), e.g. --placement minNumRacksPerWriteQuorum=3.",
        show_default=False,
    ),
]


def placement_keys(pairs: list[str] | None) -> dict[str, str]:
    """`--placement KEY=VALUE` flags -> {key: value}; UsageError for one without `=`."""
    keys = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--placement {pair!r}: expected KEY=VALUE, e.g. minNumRacksPerWriteQuorum=3")
        keys[key.strip()] = value.strip()
    return keys


def conf_properties(conf: Path | None) -> dict[str, str]:
    """Java's keys in a command's `--conf` (or BKCTL_CONF, the root `--conf`), {} without one. The
    metadata store reads its security keys (zkEnableSecurity) from the same file, so it is exported."""
    if conf is None:
        return {}
    from bkctl.properties import ENV_CONF, read_properties_file

    os.environ[ENV_CONF] = str(conf)
    return read_properties_file(conf)


@contextmanager
def open_layout(uri: str | None, *, initialized: bool = True, daemon: bool = False) -> Iterator[Layout]:
    """The cluster's Layout on the store `uri` names, closed on exit.

    UnavailableError (exit 6) if the store cannot be reached within the connect timeout (a `daemon`
    waits as long as an operation rides through an outage: started while ZooKeeper is away, it comes up
    when ZooKeeper is back instead of exiting); with
    `initialized`, NotFoundError (exit 4) if no cluster was initialized at its root, and an SQLite file
    that does not exist is not created (a read-only command never leaves a store behind).
    """
    from bkctl.metadata.layout import Layout
    from bkctl.metadata.store import parse_metadata_uri

    chosen = metadata_choice(uri)
    location = parse_metadata_uri(chosen)
    if initialized and location.backend == "sqlite" and location.path and not location.path.exists():
        raise NotFoundError(f"no metadata store at {chosen}{_how_chosen(uri)}: {START_HINT}")
    if logging.getLogger().getEffectiveLevel() >= logging.WARNING:
        # kazoo warns on every failed connection attempt; a command reports one error line instead
        # (-v shows them).
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    with open_store_told(location, daemon=daemon) as store:
        layout = Layout(store, location.root)
        if initialized:
            try:
                layout.check_initialized()
            except NotFoundError as exc:
                raise NotFoundError(f"{exc} in {chosen}{_how_chosen(uri)}: {START_HINT}") from None
        yield layout


def open_store_told(
    where: str | MetadataLocation, *, daemon: bool = True, retry: RetryPolicy | None = None, **options: Any
) -> MetadataStore:
    """The store; a daemon's wait for a ZooKeeper that is away (up to the metadata deadline, 120 s by
    default) is said on stderr once the usual connect timeout has passed, so it does not look hung."""
    from bkctl.errors import UnavailableError
    from bkctl.metadata.retry import RetryPolicy
    from bkctl.metadata.store import parse_metadata_uri
    from bkctl.metadata.stores import open_store

    location = parse_metadata_uri(where) if isinstance(where, str) else where
    if not daemon or location.backend == "sqlite":
        return open_store(location, retry=retry, **options)
    try:
        return open_store(location, retry=retry, **options)
    except UnavailableError:
        deadline_s = (retry or RetryPolicy.from_env()).deadline_ms / 1000
        message(f"bkctl: waiting for ZooKeeper at {location.hosts} (up to {deadline_s:g} s)")
        return open_store(location, retry=retry, wait_for_server=True, **options)


def confirm(question: str, *, declined: str, needs_yes: str) -> None:
    """Ask on the terminal; Declined (exit 14) on no. Without a terminal never read stdin: UsageError
    (exit 2) saying --yes is needed, so a script without --yes fails at once instead of hanging."""
    import sys

    if not sys.stdin.isatty():
        raise UsageError(f"refusing to {needs_yes} without --yes (no terminal to ask)")
    if not typer.confirm(question, err=True):
        raise Declined(declined)


START_HINT = (
    "start one with `bkctl sandbox` (it prints the export line to use) or `bkctl cluster init`, "
    "or name yours with --metadata URI / BKCTL_METADATA"
)


def metadata_choice(uri: str | None) -> str:
    """--metadata (or BKCTL_METADATA, which typer reads into it), else the default store; an empty
    value is a usage error, never a silent fall-back to another store."""
    from bkctl.metadata.store import resolve_metadata_uri

    if uri is not None and not uri.strip():
        raise UsageError("--metadata (or BKCTL_METADATA) is empty: give a metadata URI")
    return resolve_metadata_uri(uri)


def _how_chosen(uri: str | None) -> str:
    return " (no --metadata and no BKCTL_METADATA: the default store)" if uri is None else ""


@dataclass
class Problems:
    """Malformed or foreign metadata nodes met by a listing: each is reported on stderr and skipped;
    once the output is complete, `raise_if_any` makes the command exit 3 (PROBLEMS_FOUND)."""

    count: int = 0

    def __call__(self, path: str, why: str) -> None:
        self.count += 1
        message(f"bkctl: warning: {path}: {why} (skipped)")

    def raise_if_any(self) -> None:
        if self.count:
            raise ProblemsFound(f"{self.count} malformed or foreign metadata node(s) skipped, listed above")


# --- output paths, checked before any work starts ---------------------------------------------------


def check_output_file(path: Path, option: str) -> None:
    """A file the command will write at the end (`recover --plan-out`): refused now, exit 2 (12 when
    its directory cannot be written), rather than after the work is done."""
    import os

    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory; give a file name")
    if not path.parent.is_dir():
        raise UsageError(f"{option} {path}: no such directory {path.parent}")
    if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ReadOnlyError(f"{option} {path}: not writable")


def check_output_dir(path: Path, option: str) -> None:
    """A directory the command will create if needed (`audit --output-dir`, `sandbox --data-dir`): not
    a file, and its nearest existing ancestor a writable directory."""
    import os

    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: is a file, not a directory")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{option} {path}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ReadOnlyError(f"{option} {path}: {existing} is not writable")
