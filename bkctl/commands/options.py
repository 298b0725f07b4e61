"""Options shared by every command that talks to a cluster: `--metadata URI` and opening the layout.

The store backends (kazoo, sqlite3) are imported only when a command opens the store, so
`bkctl --help` and TAB completion stay fast.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer

from bkctl.commands.output import message
from bkctl.errors import ProblemsFound

if TYPE_CHECKING:
    from bkctl.metadata.layout import Layout

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


@contextmanager
def open_layout(uri: str | None, *, initialized: bool = True) -> Iterator[Layout]:
    """The cluster's Layout on the store `uri` names, closed on exit.

    UnavailableError (exit 6) if the store cannot be reached within the connect timeout; with
    `initialized`, NotFoundError (exit 4) if no cluster was initialized at its root.
    """
    from bkctl.metadata.layout import Layout
    from bkctl.metadata.store import open_store, parse_metadata_uri, resolve_metadata_uri

    location = parse_metadata_uri(resolve_metadata_uri(uri))
    if logging.getLogger().getEffectiveLevel() >= logging.WARNING:
        # kazoo warns on every failed connection attempt; a command reports one error line instead
        # (-v shows them).
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    with open_store(location) as store:
        layout = Layout(store, location.root)
        if initialized:
            layout.check_initialized()
        yield layout


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
