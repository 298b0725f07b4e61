"""`bkctl sandbox --processes`: each bookie a `python -m bkctl bookie start` child process, supervised.

Children are started before the reactor, with a bounded wait for each one's port file. While the
sandbox runs, a supervisor on the reactor reaps any child that dies (no zombies), says so on stderr
with its exit status or signal, and restarts it on the same directories and port after a backoff that
doubles (a child that keeps dying is given up after a few tries a minute, and that is said too), unless
`--no-restart` asks to leave it down (for recovery demos). Stop: SIGTERM to every child (each flushes and
unregisters), a bounded wait, SIGKILL as a last resort. A sandbox that is itself killed (SIGKILL, OOM)
cannot stop them, so each child is told its parent (`BKCTL_PARENT_PID`) and asks the kernel for a
SIGTERM when that parent dies (`die_with_parent`): no bookie outlives its sandbox.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bkctl import limits
from bkctl.commands.output import message
from bkctl.errors import TimeoutError_, UnavailableError

ADMIN_KEY = "httpServerAdminEnabled"
PARENT_PID_ENV = "BKCTL_PARENT_PID"
_PR_SET_PDEATHSIG = 1  # format fact: linux/prctl.h
START_WAIT_S = limits.SANDBOX_BOOKIE_START_WAIT_S
STOP_WAIT_S = limits.SANDBOX_BOOKIE_STOP_WAIT_S
CHECK_INTERVAL_S = 0.5  # local bound
RESTART_BACKOFF_S = (1.0, 30.0)  # first wait, longest wait
RESTARTS_PER_MINUTE_MAX = 5  # local bound


class BookieChild:
    """One bookie process on `base`'s directories; `argv` restarts it the same way."""

    def __init__(self, base: Path, port: int, uri: str, extra: tuple[str, ...] = ()) -> None:
        self.base, self.port, self.uri, self.extra = base, port, uri, extra
        self.port_file = base / "port"
        base.mkdir(parents=True, exist_ok=True)
        # A playground on 127.0.0.1: the admin endpoints that change things are on (`bookie readonly`).
        self.conf_path = base / "bk_server.conf"
        self.conf_path.write_text(f"{ADMIN_KEY}=true\n")
        self.log_path = base / "bookie.log"
        self.log = self.log_path.open("ab")
        self.bookie_id = ""
        self.deaths: deque[float] = deque()
        self.proc = self._spawn()

    @property
    def argv(self) -> list[str]:
        return [
            "bkctl", "bookie", "start",
            "--port", str(self.port),
            "--journal-dir", str(self.base / "journal"),
            "--ledger-dir", str(self.base / "ledgers"),
            "--metadata", self.uri,
            "--http-port", "0",
            "--conf", str(self.conf_path),
            *self.extra,
        ]  # fmt: skip

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.port_file.unlink(missing_ok=True)
        return subprocess.Popen(
            [sys.executable, "-m", *self.argv, "--port-file", str(self.port_file)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, PARENT_PID_ENV: str(os.getpid())},
        )

    def serving_port(self) -> int | None:
        if self.port_file.exists() and self.port_file.read_text().strip():
            return int(self.port_file.read_text())
        return None

    def wait_serving(self, deadline: float) -> str:
        """The bookie id (127.0.0.1:<port>) once its port file appears; the port is kept for restarts
        (the cookies name it)."""
        while time.monotonic() < deadline:
            port = self.serving_port()
            if port is not None:
                self.port, self.bookie_id = port, f"127.0.0.1:{port}"
                return self.bookie_id
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise UnavailableError(f"a sandbox bookie exited with {self.proc.returncode}:\n{tail}")
            time.sleep(0.05)
        raise TimeoutError_(f"a sandbox bookie did not serve in time ({self.log_path})")

    def restart(self) -> None:
        self.proc = self._spawn()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_WAIT_S)
        self.log.close()


def die_with_parent() -> None:
    """In a sandbox's child: SIGTERM when the sandbox dies, whatever kills it (Linux's PDEATHSIG); a
    parent already gone by now (its pid no longer ours) is the same signal, sent here."""
    parent = os.environ.get(PARENT_PID_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(parent):
        os.kill(os.getpid(), signal.SIGTERM)


def exit_status(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


class Supervisor:
    """Watches the children from the reactor: reaps, reports, restarts (or leaves down)."""

    def __init__(self, reactor: Any, children: list[BookieChild], *, restart: bool) -> None:
        from twisted.internet import task

        self._reactor, self.children, self._restart = reactor, children, restart
        self._down: dict[BookieChild, Any] = {}  # child -> pending restart (None: left down)
        self._starting: set[BookieChild] = set()
        self._loop = task.LoopingCall(self._check)
        self._loop.clock = reactor

    def start(self) -> None:
        self._loop.start(CHECK_INTERVAL_S, now=False)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()
        for call in self._down.values():
            if call is not None and call.active():
                call.cancel()

    def _check(self) -> None:
        for child in self.children:
            if child in self._down:
                continue
            returncode = child.proc.poll()  # reaps a dead child: no zombie
            if returncode is not None:
                self._died(child, returncode)
            elif child in self._starting and child.serving_port() is not None:
                self._starting.discard(child)
                message(f"bkctl: sandbox: bookie {child.bookie_id} is serving again (pid {child.proc.pid})")

    def _died(self, child: BookieChild, returncode: int) -> None:
        self._starting.discard(child)
        message(f"bkctl: sandbox: bookie {child.bookie_id} (pid {child.proc.pid}) {exit_status(returncode)}")
        now = time.monotonic()
        child.deaths.append(now)
        while child.deaths and child.deaths[0] < now - 60:
            child.deaths.popleft()
        if not self._restart:
            self._down[child] = None
            message(f"bkctl: sandbox: left down (--no-restart); to start it again: {child.command_line}")
            return
        if len(child.deaths) > RESTARTS_PER_MINUTE_MAX:
            self._down[child] = None
            message(
                f"bkctl: sandbox: bookie {child.bookie_id} died {len(child.deaths)} times in a minute: "
                f"not restarting it (log: {child.log_path}); to start it by hand: {child.command_line}"
            )
            return
        first, longest = RESTART_BACKOFF_S
        wait = min(longest, first * 2 ** (len(child.deaths) - 1))
        message(f"bkctl: sandbox: restarting bookie {child.bookie_id} in {wait:.0f} s")
        self._down[child] = self._reactor.callLater(wait, self._restart_child, child)

    def _restart_child(self, child: BookieChild) -> None:
        del self._down[child]
        child.restart()
        self._starting.add(child)


def start_children(
    root: Path,
    uri: str,
    count: int,
    base_port: int,
    extra: tuple[str, ...] | Callable[[int], tuple[str, ...]] = (),
) -> tuple[list[BookieChild], list[str]]:
    """`count` bookies started at once; `extra`: the options of every one, or of bookie n (from 1)."""
    children: list[BookieChild] = []
    try:
        for index in range(1, count + 1):
            port = 0 if base_port == 0 else base_port + index - 1
            options = extra(index) if callable(extra) else extra
            children.append(BookieChild(root / f"bookie-{index}", port, uri, options))
        # They start at once, sharing the CPU: the bound grows with their number past three.
        deadline = time.monotonic() + START_WAIT_S * max(1.0, count / 3)
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
