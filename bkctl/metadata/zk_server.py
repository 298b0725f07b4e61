"""A throwaway standalone ZooKeeper (Debian's zookeeper package) for tests, benchmarks and demos.

It runs the JVM directly (not zkServer.sh, which reads /etc/zookeeper and logs to /var/log) with a
config tuned for fast starts and fast session expiry: tickTime 200 ms, so sessions may be as short as
400 ms. Everything lives in one temporary directory, removed on stop. Not for production data:
forceSync is off.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from bkctl.errors import UnavailableError

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
START_TIMEOUT_S = 30.0  # local bound
STOP_TIMEOUT_S = 10.0  # local bound
PORT_ATTEMPTS = 3  # local bound

CONFIG = """\
tickTime={tick_ms}
minSessionTimeout={min_session_ms}
maxSessionTimeout=60000
dataDir={data_dir}
clientPort={port}
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr,conf,cons
forceSync=no
preAllocSize=4096
maxClientCnxns=0
"""
# With `sasl_users`: ZooKeeper's SASL provider (DIGEST-MD5 accounts of the JAAS Server section).
SASL_CONFIG = "authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider\n"
SASL_JAAS = """\
Server {{
    org.apache.zookeeper.server.auth.DigestLoginModule required
{users};
}};
"""
# With `kerberos`: ZooKeeper's SASL provider with GSSAPI: its JAAS Server section logs in from a keytab
# (the server's principal, e.g. zookeeper/127.0.0.1@REALM), its KDC from `java.security.krb5.conf`.
KERBEROS_JAAS = """\
Server {{
    com.sun.security.auth.module.Krb5LoginModule required
    useKeyTab=true keyTab="{keytab}" storeKey=true useTicketCache=false principal="{principal}";
}};
"""


@dataclass(frozen=True)
class ServerKerberos:
    """A Kerberos-authenticating ZooKeeper's principal, its keytab and the krb5.conf naming the KDC."""

    principal: str
    keytab: Path
    krb5_conf: Path


def free_port() -> int:
    """A port free on 127.0.0.1 right now (ZooKeeper's clientPort=0 cannot be discovered afterwards)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def four_letter_word(port: int, word: str, timeout_s: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command (ruok, srvr, mntr, …) and return the answer ('' if none)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(word.encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def stop_throwaway(proc: subprocess.Popen[bytes] | None, directory: Path | None) -> None:
    """SIGTERM a throwaway server, wait, then SIGKILL; remove its directory (None: nothing to do)."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


class ZooKeeperServer:
    """`with ZooKeeperServer() as zk: open_store(zk.hosts)`; `start()`/`stop()` for fixtures."""

    def __init__(
        self,
        *,
        heap_mb: int = 256,
        tick_ms: int = 200,
        java: str = "java",
        sasl_users: dict[str, str] | None = None,
        kerberos: ServerKerberos | None = None,
    ) -> None:
        """`sasl_users`: {name: password} that may authenticate with SASL DIGEST-MD5 (docs/bookie.md
        "Security"); `kerberos`: clients authenticate with SASL GSSAPI instead (one or the other: a
        Kerberos login makes ZooKeeper's SASL server GSSAPI only); neither: no authentication provider
        (clients are anonymous, ACLs still apply)."""
        self.heap_mb, self.tick_ms, self.java = heap_mb, tick_ms, java
        self.sasl_users = sasl_users
        self.kerberos = kerberos
        self.port = 0
        self.directory: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, timeout_s: float = START_TIMEOUT_S) -> ZooKeeperServer:
        """Start and wait until it serves sessions; UnavailableError (with the log's tail) if it cannot."""
        java = shutil.which(self.java)
        if java is None or not ZOOKEEPER_JAR.is_file():
            raise UnavailableError(
                f"cannot start ZooKeeper: need {self.java} and {ZOOKEEPER_JAR} (scripts/install-system-deps)"
            )
        self.directory = Path(tempfile.mkdtemp(prefix="bkctl-zk-"))
        deadline = time.monotonic() + timeout_s
        for _ in range(PORT_ATTEMPTS):  # another process may grab the port between probe and bind
            if self._launch(java, deadline):
                return self
        self.stop()
        raise UnavailableError(f"ZooKeeper did not start in {timeout_s:.0f} s: {self.log_tail()}")

    def pause(self, seconds: float) -> None:
        """SIGSTOP the server for `seconds` (a long GC pause, a partition), then SIGCONT, whatever
        happens meanwhile: sessions past their timeout expire."""
        self.freeze()
        try:
            time.sleep(seconds)
        finally:
            self.thaw()

    def freeze(self) -> None:
        """SIGSTOP: connections stay open and nothing answers (`thaw` resumes; `stop` kills it anyway)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def restart(self, down_s: float = 0.0, timeout_s: float = START_TIMEOUT_S) -> None:
        """kill -9, stay down `down_s` (the port refuses connections), start again on the same port and
        data directory: the sessions and nodes of before are still there."""
        assert self._proc is not None and self.directory is not None
        self._proc.kill()
        self._proc.wait(STOP_TIMEOUT_S)
        time.sleep(down_s)
        java = shutil.which(self.java)
        assert java is not None
        if not self._launch(java, time.monotonic() + timeout_s, port=self.port):
            raise UnavailableError(f"ZooKeeper did not restart in {timeout_s:.0f} s: {self.log_tail()}")

    def _launch(self, java: str, deadline: float, port: int = 0) -> bool:
        assert self.directory is not None
        self.port = port or free_port()
        config = self.directory / "zoo.cfg"
        data_dir = self.directory / "data"
        data_dir.mkdir(exist_ok=True)
        config.write_text(
            CONFIG.format(
                tick_ms=self.tick_ms, min_session_ms=2 * self.tick_ms, data_dir=data_dir, port=self.port
            )
            + (SASL_CONFIG if self.sasl_users is not None or self.kerberos is not None else "")
        )
        command = [
            java,
            *self._sasl_jvm_options(),
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            str(ZOOKEEPER_JAR),
            MAIN_CLASS,
            str(config),
        ]
        with open(self.directory / "zk.log", "ab") as log_file:
            self._proc = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            # Not `ruok`: it answers as soon as the port listens, before the server takes sessions
            # (a client then waits out kazoo's reconnect backoff). `srvr` gives a Mode once serving.
            if "Mode: " in four_letter_word(self.port, "srvr", timeout_s=0.5):
                return True
            time.sleep(0.02)
        return False

    def _sasl_jvm_options(self) -> list[str]:
        assert self.directory is not None
        jaas = self.directory / "jaas.conf"
        if self.kerberos is not None:
            k = self.kerberos
            jaas.write_text(KERBEROS_JAAS.format(keytab=k.keytab, principal=k.principal))
            return [f"-Djava.security.auth.login.config={jaas}", f"-Djava.security.krb5.conf={k.krb5_conf}"]
        if self.sasl_users is None:
            return []
        users = "\n".join(f'    user_{name}="{password}"' for name, password in self.sasl_users.items())
        jaas.write_text(SASL_JAAS.format(users=users))
        return [f"-Djava.security.auth.login.config={jaas}"]

    def log_tail(self, lines: int = 5) -> str:
        if self.directory is None or not (self.directory / "zk.log").exists():
            return "(no log)"
        text = (self.directory / "zk.log").read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "(empty log; no SLF4J binding)"

    def stop(self) -> None:
        """SIGTERM, wait, then SIGKILL; remove the directory. Idempotent."""
        stop_throwaway(self._proc, self.directory)
        self._proc, self.directory = None, None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
