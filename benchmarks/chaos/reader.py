"""A chaos reader process: opens ledgers that writers created (never fencing: no recovery open), reads
a random range up to the last add confirmed (or the last entry of a closed ledger), and logs what it
saw: `read` with the range and the entries whose bytes were not what was written, or `read_fail`.
The checker then holds every read to the ledger's final state: no entry past the end a ledger was
closed at, and every byte as written, so all readers saw one sequence.

    python -m benchmarks.chaos.reader --metadata URI --dir HISTORY_DIR --history FILE [--seed N]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from twisted.internet import task

from benchmarks.chaos.history import HistoryLog
from benchmarks.chaos.payloads import payload
from benchmarks.chaos.process import run_worker
from bkctl.client.client import Client

PASSWORD = b"chaos"
RANGE_MAX = 300
PAUSE_S = 0.2


def created_ledgers(directory: Path) -> list[int]:
    """Every ledger a writer logged as created so far."""
    found: set[int] = set()
    for path in directory.glob("writer-*.jsonl"):
        for line in path.read_text().splitlines():
            if '"e":"create"' in line:
                try:
                    found.add(json.loads(line)["l"])
                except (json.JSONDecodeError, KeyError):
                    continue  # a line cut by a kill -9
    return sorted(found)


class Reader:
    def __init__(self, client: Client, log: HistoryLog, directory: Path, seed: int) -> None:
        self.client, self.log, self.directory = client, log, directory
        self.rng = random.Random(seed)
        self.stopping = False

    async def run(self) -> None:
        while not self.stopping:
            ledgers = created_ledgers(self.directory)
            if ledgers:
                await self.read_one(self.rng.choice(ledgers))
            await task.deferLater(self.client.reactor, PAUSE_S, lambda: None)

    async def read_one(self, ledger_id: int) -> None:
        try:
            handle = await self.client.open_ledger(ledger_id, PASSWORD, recovery=False)
            end = handle.metadata.last_entry_id if handle.is_closed else handle.last_add_confirmed
            if end < 0:
                return
            first = self.rng.randint(0, end)
            last = min(end, first + self.rng.randint(0, RANGE_MAX - 1))
            entries = await handle.read(first, last)
        except Exception as exc:  # a bookie down, a ledger deleted, metadata away: logged, not judged
            self.log.event("read_fail", l=ledger_id, why=str(exc)[:200])
            return
        bad = [e.entry_id for e in entries if e.payload != payload(ledger_id, e.entry_id)]
        seen = [e.entry_id for e in entries]
        if seen != list(range(first, last + 1)):
            bad.append(-1)  # entries missing or out of order in a successful read
        self.log.event("read", l=ledger_id, first=first, last=last, bad=bad[:20])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--dir", type=Path, required=True, help="the run's history directory")
    parser.add_argument("--history", type=Path, required=True, help="this reader's history file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    run_worker(args.metadata, args.history, lambda client, log: Reader(client, log, args.dir, args.seed))


if __name__ == "__main__":
    main()
