"""Java BookKeeper 4.14.8 bookies (the build in $BKJAVA, ../shared/tools/java-bookkeeper/) as child
processes, for the side-by-side recovery benchmarks: the same ZooKeeper, ledgers and kill as bkctl's run.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from functools import cache
from pathlib import Path

from bkctl.metadata.layout import Layout
from bkctl.metadata.stores import open_store
from bkctl.metadata.zk_server import free_port

START_WAIT_S = 180.0  # a JVM on a loaded 2-core machine


@cache
def java_env() -> tuple[str, list[str]]:
    """(class path, JVM options) from $BKJAVA/scripts/env.sh."""
    home = os.environ.get("BKJAVA", "/tmp/bkjava")
    script = f'. {shlex.quote(home)}/scripts/env.sh && printf "%s\\n%s" "$BK_CP" "$JAVA_OPTS_SMALL"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    class_path, options = out.split("\n", 1)
    return class_path, shlex.split(options)


def java(main: str, *args: str, heap: str = "-Xmx512m") -> list[str]:
    class_path, options = java_env()
    return ["java", *options, heap, "-cp", class_path, main, *args]


def bookie_conf(base: Path, port: int, zk_hosts: str, extra: dict[str, str]) -> Path:
    keys = {
        "bookiePort": str(port),
        "advertisedAddress": "127.0.0.1",
        "allowLoopback": "true",
        "useHostNameAsBookieID": "false",
        "journalDirectories": str(base / "journal"),
        "ledgerDirectories": str(base / "ledgers"),
        "metadataServiceUri": f"zk+null://{zk_hosts}/ledgers",
        "ledgerStorageClass": "org.apache.bookkeeper.bookie.InterleavedLedgerStorage",
        "statsProviderClass": "org.apache.bookkeeper.stats.NullStatsProvider",
        "httpServerEnabled": "false",
        **extra,
    }
    base.mkdir(parents=True, exist_ok=True)
    conf = base / "bk.conf"
    conf.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    return conf


def metaformat(base: Path, zk_hosts: str) -> None:
    conf = bookie_conf(base / "format", free_port(), zk_hosts, {})
    subprocess.run(
        java("org.apache.bookkeeper.bookie.BookieShell", "-conf", str(conf), "metaformat", "-n", "-f"),
        capture_output=True, check=True, timeout=START_WAIT_S,
    )  # fmt: skip


class JavaBookie:
    def __init__(self, base: Path, zk_hosts: str, extra: dict[str, str]) -> None:
        self.port = free_port()
        self.bookie_id = f"127.0.0.1:{self.port}"
        conf = bookie_conf(base, self.port, zk_hosts, extra)
        self.log = (base / "bookie.log").open("ab")
        argv = java("org.apache.bookkeeper.server.Main", "--conf", str(conf))
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_registered(self, uri: str) -> str:
        deadline = time.monotonic() + START_WAIT_S
        with open_store(uri) as store:
            while self.bookie_id not in Layout(store).bookies():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Java bookie {self.bookie_id} did not register")
                time.sleep(0.2)
        return self.bookie_id

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(20)
        self.log.close()
