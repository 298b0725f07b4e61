"""A `bkctl sandbox` subprocess for command tests, and running `python -m bkctl ...` against it.

Every wait is bounded: the sandbox must announce itself within WAIT_S, each command must finish
within COMMAND_S, and a stop must end the process within WAIT_S."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import REPO

WAIT_S = 150.0  # above the sandbox's own 90 s start bound: a loaded 2-core machine took 40 s per bookie
COMMAND_S = 60.0


class Sandbox:
    def __init__(self, data_dir: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bkctl", "sandbox", "--data-dir", str(data_dir), "-o", "json", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "BKCTL_METADATA": ""},
        )
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=_drain, args=(stream, sink), daemon=True).start()

    def wait_ready(self, timeout_s: float = WAIT_S) -> dict[str, object]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.out:
                document: dict[str, object] = json.loads(self.out[0])
                return document
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"sandbox did not start:\n{''.join(self.err)}")

    def stop(self, sig: int = signal.SIGINT) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"sandbox did not stop:\n{''.join(self.err)}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT_S)


def _drain(stream: object, sink: list[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sink.append(line)


def bkctl(
    *args: str, metadata: str | None = None, stdin: str | None = None, timeout_s: float = COMMAND_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bkctl", *args],
        cwd=REPO,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        env=_env(metadata),
        timeout=timeout_s,
        check=False,
    )


def bkctl_all(
    commands: list[list[str]], metadata: str | None = None, timeout_s: float = COMMAND_S
) -> list[subprocess.CompletedProcess[str]]:
    """`bkctl` of each argument list, all at once (each interpreter's start is most of a short
    command's time); their results in order."""
    env = _env(metadata)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bkctl", *args],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for args in commands
    ]
    done = []
    deadline = time.monotonic() + timeout_s
    for args, proc in zip(commands, procs, strict=True):
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
        done.append(subprocess.CompletedProcess([*args], proc.returncode, out, err))
    return done


def _env(metadata: str | None) -> dict[str, str]:
    env = {**os.environ}
    env.pop("BKCTL_OUTPUT", None)
    if metadata is not None:
        env["BKCTL_METADATA"] = metadata
    return env


def registered(uri: str, *, readonly: bool = True) -> set[str]:
    """Bookie ids registered now: read-write, and read-only unless told not to. Read in-process, so a
    wait that looks every 0.1 s costs no process start per look."""
    from bkctl.metadata.layout import Layout
    from bkctl.metadata.stores import open_store

    with open_store(uri) as store:
        layout = Layout(store)
        return {*layout.bookies(), *(layout.bookies(readonly=True) if readonly else [])}


def naming(uri: str, ledgers: list[int], bookie: str) -> int:
    """How many of `ledgers` still name `bookie` (read straight from the metadata store: fast to poll)."""
    from bkctl.metadata.layout import Layout
    from bkctl.metadata.stores import open_store

    with open_store(uri) as store:
        found = Layout(store).read_ledgers(ledgers)
        return sum(1 for _, md in found if any(bookie in s.ensemble for s in md.segments))


def assert_fully_replicated(uri: str, ledgers: list[int]) -> None:
    """`ledger check --full` of every ledger (all at once) is exit 0: every entry on every bookie."""
    checks = bkctl_all([["ledger", "check", str(ledger), "--full", "-o", "json"] for ledger in ledgers], uri)
    for check in checks:
        assert check.returncode == 0, (check.args, check.stdout, check.stderr)


def write_ledgers(uri: str, count: int, entries: int, size: int) -> list[int]:
    """`count` closed ledgers written at once by `bkctl ledger write`; their ids."""
    command = ["ledger", "write", "--entries", str(entries), "--size", str(size), "-o", "json"]
    return [json.loads(write.stdout)["ledger_id"] for write in bkctl_all([command] * count, uri)]
