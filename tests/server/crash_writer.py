"""Child process of the crash test: adds entries forever, printing each acknowledged `ledger entry`.

Run as `python -m tests.server.crash_writer DIR`; the test kills it with SIGKILL. It exits on its own
after a while so it can never outlive a failed test.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from twisted.internet import reactor as _reactor

from bkctl.protocol.wire import ReturnCode
from bkctl.server.storage import Storage
from tests.server.helpers import KEY, config, packaged

reactor: Any = _reactor
LEDGERS = 3
LIFETIME_S = 60.0


def payload(ledger_id: int, entry_id: int) -> bytes:
    return f"L{ledger_id}-E{entry_id}-".encode() * (1 + (ledger_id * 7 + entry_id) % 40)


def main() -> None:
    directory = Path(sys.argv[1])

    def on_durable(tokens: list[Any]) -> None:
        sys.stdout.write("".join(f"{t[0]} {t[1]}\n" for t in tokens))
        sys.stdout.flush()

    storage = Storage(
        config(directory, flush_interval_ms=50, write_cache_max_bytes=64 * 1024, log_size_limit=256 * 1024),
        on_durable,
        reactor,
    )
    storage.start()
    next_entry = [0] * LEDGERS

    def pump() -> None:
        for n in range(64):
            ledger_id = n % LEDGERS
            entry_id = next_entry[ledger_id]
            data = packaged(ledger_id, entry_id, payload(ledger_id, entry_id))
            if storage.add(ledger_id, entry_id, KEY, data, False, (ledger_id, entry_id)) == ReturnCode.EOK:
                next_entry[ledger_id] += 1
        reactor.callLater(0.0005, pump)

    reactor.callWhenRunning(pump)
    reactor.callLater(LIFETIME_S, os._exit, 3)
    reactor.run()


if __name__ == "__main__":
    main()
