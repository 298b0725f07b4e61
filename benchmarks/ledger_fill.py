"""Fill a cluster with closed ledgers of a fixed shape (E=3, Qw=2, Qa=2), many at once.

    python benchmarks/ledger_fill.py URI --ledgers 2000 --entries 30 --entry-size 1024

The recovery benchmarks run it in a process of its own (one reactor per process): on bkctl's bookies
or on Java's, the same ledgers. Prints one JSON line: ledgers, entries, bytes, seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from twisted.internet import defer  # noqa: E402

from bkctl.commands.running import run_client  # noqa: E402
from bkctl.model import DigestType  # noqa: E402

AT_ONCE = 32  # ledgers being written together
TIMEOUT_MS = 120_000


async def fill(client: Any, ledgers: int, entries: int, size: int) -> dict[str, Any]:
    started, left = time.monotonic(), [ledgers]
    payload = b"x" * size

    async def writer() -> None:
        while left[0] > 0:
            left[0] -= 1
            handle = await client.create_ledger(3, 2, 2, digest=DigestType.CRC32)
            await handle.add_many([payload] * entries)
            await handle.close()

    await defer.gatherResults([defer.ensureDeferred(writer()) for _ in range(AT_ONCE)], consumeErrors=True)
    return {
        "ledgers": ledgers,
        "entries": ledgers * entries,
        "bytes": ledgers * entries * size,
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("uri")
    parser.add_argument("--ledgers", type=int, default=2000)
    parser.add_argument("--entries", type=int, default=30)
    parser.add_argument("--entry-size", type=int, default=1024)
    args = parser.parse_args()
    work = lambda client: fill(client, args.ledgers, args.entries, args.entry_size)  # noqa: E731
    # a JVM bookie on a loaded machine can pause for seconds: a timeout would fail a bookie of 3
    done = run_client(args.uri, work, request_timeout_ms=TIMEOUT_MS)
    print(json.dumps(done), flush=True)


if __name__ == "__main__":
    main()
