"""`bkctl sandbox --processes`: each bookie a `python -m bkctl bookie start` child process (for load
tests: one Python process per bookie, as in production). Started before the reactor, with a bounded
wait for each child's port file; stopped with SIGTERM (each flushes and unregisters) then a bounded
wait, SIGKILL as a last resort."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from bkctl import limits
from bkctl.errors import TimeoutError_, UnavailableError

START_WAIT_S = limits.SANDBOX_BOOKIE_START_WAIT_S
STOP_WAIT_S = limits.SANDBOX_BOOKIE_STOP_WAIT_S


class BookieChild:
    def __init__(self, base: Path, port: int, uri: str) -> None:
        self.port_file = base / "port"
        self.port_file.unlink(missing_ok=True)
        base.mkdir(parents=True, exist_ok=True)
        self.log_path = base / "bookie.log"
        self.log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "bkctl", "bookie", "start",
                "--port", str(port),
                "--journal-dir", str(base / "journal"),
                "--ledger-dir", str(base / "ledgers"),
                "--metadata", uri,
                "--port-file", str(self.port_file),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_serving(self, deadline: float) -> str:
        """The bookie id (127.0.0.1:<port>) once its port file appears."""
        while time.monotonic() < deadline:
            if self.port_file.exists() and self.port_file.read_text().strip():
                return f"127.0.0.1:{int(self.port_file.read_text())}"
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise UnavailableError(f"a sandbox bookie exited with {self.proc.returncode}:\n{tail}")
            time.sleep(0.05)
        raise TimeoutError_(f"a sandbox bookie did not serve within {START_WAIT_S:.0f} s ({self.log_path})")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_WAIT_S)
        self.log.close()


def start_children(root: Path, uri: str, count: int, base_port: int) -> tuple[list[BookieChild], list[str]]:
    children: list[BookieChild] = []
    try:
        for index in range(1, count + 1):
            port = 0 if base_port == 0 else base_port + index - 1
            children.append(BookieChild(root / f"bookie-{index}", port, uri))
        deadline = time.monotonic() + START_WAIT_S
        ids = [child.wait_serving(deadline) for child in children]
    except BaseException:
        stop_children(children)
        raise
    return children, ids


def stop_children(children: list[BookieChild]) -> None:
    for child in children:
        if child.proc.poll() is None:
            child.proc.terminate()
    for child in children:
        child.stop()
