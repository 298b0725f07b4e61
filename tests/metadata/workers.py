"""Code the store tests run in other processes (multiprocessing spawn, or `python -m` to be killed)."""

from __future__ import annotations

import sys
import time

from bkctl.errors import BadVersionError
from bkctl.metadata.stores import open_store

HOLD_MAX_S = 60.0


def cas_increments(uri: str, path: str, count: int) -> int:
    """Add 1 to the decimal counter at `path` `count` times by compare-and-swap; return the retries."""
    retries = 0
    with open_store(uri) as store:
        done = 0
        while done < count:
            data, stat = store.get(path)
            try:
                store.set(path, str(int(data) + 1).encode(), stat.version)
            except BadVersionError:
                retries += 1
                continue
            done += 1
    return retries


def sequential_creates(uri: str, prefix: str, count: int) -> list[str]:
    with open_store(uri) as store:
        return [store.create(prefix, sequential=True) for _ in range(count)]


def hold_ephemeral(uri: str, path: str, session_timeout_ms: int) -> None:
    """Create an ephemeral node, say so on stdout, then wait (bounded) to be killed or paused.

    When the session is lost (e.g. the process was paused past its lease), re-create the node under
    the new session and print `lost <new session id>`, as a bookie re-registers.
    """
    store = open_store(uri, session_timeout_ms=session_timeout_ms)

    def on_lost() -> None:
        store.create(path, ephemeral=True)
        print(f"lost {store.session_id}", flush=True)

    store.on_session_lost(on_lost)
    store.create(path, ephemeral=True)
    print(f"ready {store.session_id}", flush=True)
    time.sleep(HOLD_MAX_S)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "hold-ephemeral":
        hold_ephemeral(args[0], args[1], int(args[2]))
    else:
        sys.exit(f"unknown command {command}")
