"""One manual recovery per failed bookie at a time: a lock node per bookie in the metadata store.

Two `bkctl recover` runs of the same bookie used to copy every fragment twice and each claim the other's
swaps. The lock is an ephemeral node `underreplication/bkctl-recover/<bookie>` of the recovering
process's session (ZooKeeper's ephemeral node, SQLite's session-bound row): it goes when the process
ends, even killed -9 (once its session expires). Java reads only `ledgers`, `locks` and its flags under
`underreplication`, so the extra child is invisible to it (as `bkctl-daemons` is).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Sequence

from bkctl.errors import BadVersionError, NodeExistsError, NotFoundError, RecoveryBusyError
from bkctl.metadata.layout import Layout

LOCKS = "bkctl-recover"


def holder() -> bytes:
    """Who holds a lock, for the message the other run prints."""
    found = {"host": socket.gethostname(), "pid": os.getpid(), "since_ms": int(time.time() * 1000)}
    return json.dumps(found).encode()


def describe(data: bytes | None) -> str:
    try:
        found = json.loads(data or b"")
        return f"pid {found['pid']} on {found['host']}"
    except (ValueError, KeyError, TypeError):
        return "another process"


def take(layout: Layout, bookies: Sequence[str]) -> None:
    """Lock every bookie of `bookies`, or none: RecoveryBusyError naming the holder when one is held."""
    layout.store.ensure_path(layout.ur_path(LOCKS))
    taken: list[str] = []
    data = holder()
    for bookie in bookies:
        path = layout.ur_path(LOCKS, bookie)
        try:
            layout.store.create(path, data, ephemeral=True)
        except NodeExistsError:
            release(layout, taken)
            raise RecoveryBusyError(
                f"bookie {bookie} is being recovered by another `bkctl recover` ({who(layout, path)}); "
                "it ends when that one does (--wait SECONDS waits for it)"
            ) from None
        taken.append(bookie)


def who(layout: Layout, path: str) -> str:
    try:
        return describe(layout.store.get(path)[0])
    except NotFoundError:
        return "it just finished"


def release(layout: Layout, bookies: Sequence[str]) -> None:
    """Delete this session's locks (one whose session expired meanwhile may be another run's now)."""
    for bookie in bookies:
        path = layout.ur_path(LOCKS, bookie)
        try:
            _, stat = layout.store.get(path)
            if stat.ephemeral_owner == layout.store.session_id:
                layout.store.delete(path, stat.version)
        except (NotFoundError, BadVersionError):
            pass
