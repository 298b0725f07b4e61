"""Live bookies for tests: in-process BookieService on 127.0.0.1 port 0 over an SQLite metadata store,
and `python -m bkctl bookie start` subprocesses (bounded waits, port from the stderr line)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest_twisted
from twisted.internet import reactor, threads

from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from bkctl.server.config import load_config
from bkctl.server.service import BookieService
from tests.conftest import REPO

WAIT_S = 30.0
SERVING = re.compile(r"bookie (\S+) serving on ([\d.]+):(\d+)")

T = TypeVar("T")
TestFunction = TypeVar("TestFunction", bound=Callable[..., Any])


def twisted_test(function: TestFunction) -> TestFunction:
    return cast(TestFunction, pytest_twisted.ensureDeferred(function))


async def in_thread(function: Callable[..., T], *args: Any) -> T:
    """Run blocking client code off the reactor thread (the bookie serves on it meanwhile)."""
    return cast(T, await threads.deferToThread(function, *args))


def metadata_uri(tmp_path: Path, instance_id: str | None = None) -> str:
    """An initialised SQLite cluster under tmp_path (idempotent)."""
    path = tmp_path / "metadata.db"
    tmp_path.mkdir(parents=True, exist_ok=True)
    with SqliteStore(path) as store:
        layout = Layout(store)
        if layout.instance_id() is None:
            layout.init_cluster(instance_id=instance_id)
    return f"sqlite://{path}"


def bookie_flags(base: Path, **extra: str) -> dict[str, str]:
    """bk_server.conf keys for a bookie with its directories under `base` (fast group commit)."""
    keys = {
        "bookiePort": "0",
        "journalDirectories": str(base / "journal"),
        "ledgerDirectories": str(base / "ledgers"),
        "journalPreAllocSizeMB": "1",
        "journalMaxGroupWaitMSec": "1",
        "flushInterval": "3600000",
    }
    keys.update(extra)
    return keys


async def start_bookie(
    tmp_path: Path, name: str = "b1", uri: str | None = None, **extra: str
) -> BookieService:
    service = BookieService(
        load_config(bookie_flags(tmp_path / name, **extra)), uri or metadata_uri(tmp_path), reactor
    )
    await service.start()
    return service


# --- subprocess bookies -----------------------------------------------------------------------------


class BookieProcess:
    """`python -m bkctl bookie start ...` with stderr collected on a thread."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bkctl", "-v", "bookie", "start", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_serving(self, timeout_s: float = WAIT_S) -> tuple[str, int]:
        """(bookie id, port) from the `serving on` line; AssertionError with stderr if it never comes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                match = SERVING.search(line)
                if match:
                    return match.group(1), int(match.group(3))
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise AssertionError(f"bookie exited {self.proc.returncode}:\n{self.stderr}")
            time.sleep(0.02)
        self.kill()
        raise AssertionError(f"bookie not serving within {timeout_s} s:\n{self.stderr}")

    def wait_exit(self, timeout_s: float = WAIT_S) -> int:
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"bookie did not exit within {timeout_s} s:\n{self.stderr}") from None
        self._reader.join(5)
        return code

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT_S)


def registrations_of(uri: str) -> tuple[list[str], list[str]]:
    """(read-write, read-only) bookie ids registered in the SQLite store `uri`."""
    with SqliteStore(uri.removeprefix("sqlite://")) as store:
        layout = Layout(store)
        return layout.bookies(), layout.bookies(readonly=True)
