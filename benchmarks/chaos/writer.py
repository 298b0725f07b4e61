"""A chaos writer process: creates ledgers one after another, adds entries (payloads.payload) with a
bounded number in flight, closes each ledger, and logs every event to its history file. A failed add
ends its ledger (the writer tries to close it, then goes on with a new one); SIGTERM ends the run after
closing the current ledger; SIGKILL is one of the faults (its open ledger is left to recovery).

    python -m benchmarks.chaos.writer --metadata URI --history FILE [--entries 3000] [--rate 1000]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

from twisted.internet import task

from benchmarks.chaos.history import HistoryLog
from benchmarks.chaos.payloads import payload
from benchmarks.chaos.process import run_worker
from bkctl.client.client import Client
from bkctl.client.ledger import LedgerHandle

PASSWORD = b"chaos"
IN_FLIGHT = 64
TICK_S = 0.02


class Writer:
    def __init__(self, client: Client, log: HistoryLog, args: argparse.Namespace) -> None:
        self.client, self.log, self.args = client, log, args
        self.rng = random.Random(args.seed)
        self.stopping = False

    async def run(self) -> None:
        while not self.stopping:
            try:
                handle = await self.client.create_ledger(
                    self.args.ensemble, self.args.write_quorum, self.args.ack_quorum, password=PASSWORD
                )
            except Exception as exc:  # no bookies or no metadata for now: try again shortly
                self.log.event("create_fail", why=str(exc)[:200])
                await task.deferLater(self.client.reactor, 1.0, lambda: None)
                continue
            self.log.event("create", l=handle.ledger_id)
            await self._fill(handle, self.rng.randint(1, self.args.entries))
            await self._close(handle)

    async def _fill(self, handle: LedgerHandle, count: int) -> None:
        """Add `count` entries, IN_FLIGHT at most, about `rate` a second; stop at the first failure."""
        state: dict[str, Any] = {"acked": -1, "logged": -1, "failed": None, "in_flight": 0}

        def done(entry_id: int, error: Exception | None) -> None:
            state["in_flight"] -= 1
            if error is None:
                state["acked"] = max(state["acked"], entry_id)
            elif state["failed"] is None:
                state["failed"] = (entry_id, str(error)[:200])

        sent = 0
        per_tick = max(1, int(self.args.rate * TICK_S))
        while sent < count and state["failed"] is None and not self.stopping:
            room = min(per_tick, IN_FLIGHT - state["in_flight"], count - sent)
            for _ in range(room):
                state["in_flight"] += 1
                handle.add_callback(payload(handle.ledger_id, sent), done)
                sent += 1
            await task.deferLater(self.client.reactor, TICK_S, lambda: None)
            self._log_acks(handle, state)
        while state["in_flight"] > 0 and state["failed"] is None:
            await task.deferLater(self.client.reactor, TICK_S, lambda: None)
            self._log_acks(handle, state)
        self._log_acks(handle, state)
        if state["failed"] is not None:
            entry_id, why = state["failed"]
            self.log.event("fail", l=handle.ledger_id, entry=entry_id, why=why)

    def _log_acks(self, handle: LedgerHandle, state: dict[str, Any]) -> None:
        if state["acked"] > state["logged"]:
            self.log.event("ack", l=handle.ledger_id, upto=state["acked"])
            state["logged"] = state["acked"]

    async def _close(self, handle: LedgerHandle) -> None:
        try:
            await handle.close()
        except Exception as exc:
            self.log.event("close_fail", l=handle.ledger_id, why=str(exc)[:200])
            return
        self.log.event("close", l=handle.ledger_id, last=handle.metadata.last_entry_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--history", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--entries", type=int, default=3000, help="entries per ledger at most")
    parser.add_argument("--rate", type=int, default=1000, help="adds per second, about")
    parser.add_argument("--ensemble", type=int, default=3)
    parser.add_argument("--write-quorum", type=int, default=3)
    parser.add_argument("--ack-quorum", type=int, default=2)
    args = parser.parse_args()
    run_worker(args.metadata, args.history, lambda client, log: Writer(client, log, args))


if __name__ == "__main__":
    main()
