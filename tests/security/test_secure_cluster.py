"""bkctl administers a cluster whose ZooKeeper requires SASL and whose znodes carry creator-only ACLs
(zkEnableSecurity), as an operator's script runs it: the same `--conf` and `--jaas` files the bookies
use. A client without credentials changes nothing and is told so at once (exit 9 / exit 2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkctl.errors import ExitCode
from bkctl.metadata.zk_server import ZooKeeperServer
from tests.conftest import REPO
from tests.security.conftest import client_jaas, secure_conf

pytestmark = pytest.mark.slow
WAIT_S = 60.0
COMMAND_S = 90.0


class Secured:
    def __init__(self, base: Path, uri: str, env: dict[str, str]) -> None:
        self.base, self.uri, self.env = base, uri, env
        self.bookies: dict[str, subprocess.Popen[bytes]] = {}

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "bkctl", *args],
            cwd=REPO,
            env=env or self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=COMMAND_S,
            check=False,
        )

    def start_bookie(self, name: str) -> str:
        data = self.base / name
        port_file = data / "port"
        data.mkdir()
        command = [
            sys.executable,
            "-m",
            "bkctl",
            "bookie",
            "start",
            "--port",
            "0",
            "--port-file",
            str(port_file),
        ]
        command += ["-j", str(data / "journal"), "-l", str(data / "ledgers")]
        log = (self.base / f"{name}.log").open("wb")
        proc = subprocess.Popen(command, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + WAIT_S
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, (self.base / f"{name}.log").read_text()
            assert time.monotonic() < deadline, f"bookie {name} did not start"
            time.sleep(0.1)
        bookie_id = f"127.0.0.1:{port_file.read_text().strip()}"
        self.bookies[bookie_id] = proc
        return bookie_id

    def stop(self) -> None:
        for proc in self.bookies.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.bookies.values():
            try:
                proc.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, zookeeper_sasl: ZooKeeperServer) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("secured")
    uri = f"zk://{zookeeper_sasl.hosts}/secured-{base.name}/ledgers"
    env = {
        **os.environ,
        "BKCTL_METADATA": uri,
        "BKCTL_CONF": str(secure_conf(base)),
        "BKCTL_JAAS": str(client_jaas(base)),
    }
    env.pop("BKCTL_OUTPUT", None)
    cluster = Secured(base, uri, env)
    try:
        init = cluster.run("cluster", "init")
        assert init.returncode == 0, init.stderr
        for name in ("b1", "b2", "b3"):
            cluster.start_bookie(name)
        yield cluster
    finally:
        cluster.stop()


def anonymous_env(secured: Secured) -> dict[str, str]:
    env = {**secured.env}
    env.pop("BKCTL_JAAS")
    env.pop("BKCTL_CONF")
    return env


def test_1_write_then_an_unauthenticated_client_changes_nothing(secured: Secured) -> None:
    done = secured.run("ledger", "write", "--entries", "30", "-E", "2", "-Qw", "2", "-Qa", "2", "-o", "json")
    assert done.returncode == 0, done.stderr
    ledger = str(json.loads(done.stdout)["ledger_id"])
    refused = secured.run("ledger", "delete", ledger, "--yes", env=anonymous_env(secured))
    assert refused.returncode == ExitCode.UNAUTHORIZED, refused.stderr
    assert "NoAuth" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    # Security on and no credentials: refused before anything is sent.
    no_credentials = {**anonymous_env(secured), "BKCTL_CONF": secured.env["BKCTL_CONF"]}
    usage = secured.run("ledger", "delete", ledger, "--yes", env=no_credentials)
    assert usage.returncode == ExitCode.USAGE and "needs ZooKeeper credentials" in usage.stderr
    read = secured.run("ledger", "read", ledger, "-o", "json")
    assert read.returncode == 0, read.stderr
    assert len(json.loads(read.stdout)) == 30


def test_2_recover_a_dead_bookie(secured: Secured) -> None:
    done = secured.run("ledger", "write", "--entries", "20", "-E", "2", "-Qw", "2", "-Qa", "2", "-o", "json")
    assert done.returncode == 0, done.stderr
    victim, proc = next(iter(secured.bookies.items()))
    proc.send_signal(signal.SIGTERM)  # it unregisters as it stops: recover refuses a registered bookie
    assert proc.wait(WAIT_S) == 0
    recovered = secured.run("recover", secured.uri, victim, "--yes", "-o", "json")
    assert recovered.returncode == 0, recovered.stderr + recovered.stdout


def test_3_autorecovery_and_audit_commands(secured: Secured) -> None:
    for args in (["autorecovery", "status"], ["underreplicated", "list"], ["autorecovery", "disable"]):
        done = secured.run(*args)
        assert done.returncode == 0, f"{args}: {done.stderr}"
    refused = secured.run("autorecovery", "enable", env=anonymous_env(secured))
    assert refused.returncode == ExitCode.UNAUTHORIZED, refused.stderr
    assert secured.run("autorecovery", "enable").returncode == 0
