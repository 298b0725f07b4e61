"""Child process of the crash tests: adds entries forever, printing each acknowledged `ledger entry`.

Run as `python -m tests.server.crash_writer DIR [JOURNAL_DIRS [ENGINE [LEDGER_DIRS]]]` (journal dirs
DIR/journal, DIR/journal1, ...; ENGINE interleaved or db; ledger dirs DIR/ledgers, DIR/ledgers1, ...);
the test kills it with SIGKILL. It exits on its own after a while so it can never outlive a failed test.
The tests' side: `run_until_killed` and `assert_served_right`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from twisted.internet import reactor as _reactor

from bkctl.protocol.wire import ReturnCode
from bkctl.server.storage import Storage
from tests.conftest import REPO
from tests.server.helpers import KEY, WAIT_S, config, journal_dirs, ledger_dirs, packaged

reactor: Any = _reactor
LEDGERS = 5
LIFETIME_S = 60.0
# Past many checkpoints (50 ms apart), so replay starts from a lastMark mid-journal: killed at ACKED_MIN
# acknowledged adds, or at the deadline with at least ACKED_ENOUGH (a loaded machine, where each of the
# db engine's checkpoints also flushes RocksDB's memtable, may not reach ACKED_MIN within it).
ACKED_MIN = 20_000
ACKED_ENOUGH = 2_000
DEADLINE_S = 30.0
# Entries past each ledger's last acknowledged one that are read back after the restart.
UNACKED_CHECKED = 1000


def payload(ledger_id: int, entry_id: int) -> bytes:
    return f"L{ledger_id}-E{entry_id}-".encode() * (1 + (ledger_id * 7 + entry_id) % 40)


def main() -> None:
    directory = Path(sys.argv[1])
    journal_count = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    engine = sys.argv[3] if len(sys.argv) > 3 else "interleaved"
    ledger_dir_count = int(sys.argv[4]) if len(sys.argv) > 4 else 1

    def on_durable(tokens: list[Any]) -> None:
        sys.stdout.write("".join(f"{t[0]} {t[1]}\n" for t in tokens))
        sys.stdout.flush()

    storage = Storage(
        config(
            directory,
            journal_dirs=journal_dirs(directory, journal_count),
            ledger_dirs=ledger_dirs(directory, ledger_dir_count),
            flush_interval_ms=50,
            write_cache_max_bytes=64 * 1024,
            log_size_limit=256 * 1024,
            engine=engine,
        ),
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


def run_until_killed(
    directory: Path,
    journal_count: int = 1,
    engine: str = "interleaved",
    ledger_dir_count: int = 1,
    fault: str = "",
    acked_at_fault: int = 1,
) -> list[tuple[int, int]]:
    """Run the writer on `directory` until ACKED_MIN adds are acknowledged, SIGKILL it; the acknowledged.
    With `fault`, the writer kills itself at that fault point (bkctl/server/faults.py) instead, having
    had at least `acked_at_fault` adds acknowledged."""
    args = [str(directory), str(journal_count), engine, str(ledger_dir_count)]
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.server.crash_writer", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "BKCTL_FAULT_POINT": fault},
    )
    acked: list[tuple[int, int]] = []

    def collect() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if line.endswith("\n"):
                ledger_id, entry_id = map(int, line.split())
                acked.append((ledger_id, entry_id))

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    deadline = time.monotonic() + DEADLINE_S
    enough = acked_at_fault if fault else ACKED_ENOUGH
    while (fault or len(acked) < ACKED_MIN) and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.01)
    died_at_fault = child.poll() is not None
    child.send_signal(signal.SIGKILL)
    code = child.wait(WAIT_S)
    reader.join(WAIT_S)
    assert code == -signal.SIGKILL, f"the writer exited with {code}"
    assert died_at_fault or not fault, f"the writer never reached fault point {fault}"
    assert len(acked) >= enough, f"only {len(acked)} acknowledged before the kill"
    return acked


def assert_served_right(storage: Storage, acked: list[tuple[int, int]]) -> None:
    """Every acknowledged entry reads back exactly, and so does any unacknowledged one that is served.

    An add in flight at the kill may be there or not (its journal record may be whole), but a record the
    kill cut short must never be served, as itself or as an earlier entry (see test_torn_tail.py).
    """
    highest = [-1] * LEDGERS
    for ledger_id, entry_id in acked:
        expected = packaged(ledger_id, entry_id, payload(ledger_id, entry_id))
        assert storage.read(ledger_id, entry_id) == (ReturnCode.EOK, expected), (ledger_id, entry_id)
        highest[ledger_id] = max(highest[ledger_id], entry_id)
    for ledger_id, last in enumerate(highest):
        for entry_id in range(last + 1, last + UNACKED_CHECKED):
            code, data = storage.read(ledger_id, entry_id)
            served_right = data == packaged(ledger_id, entry_id, payload(ledger_id, entry_id))
            assert code == ReturnCode.ENOENTRY or served_right, (ledger_id, entry_id, code)


if __name__ == "__main__":
    main()
