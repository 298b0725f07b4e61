"""A throwaway MIT Kerberos KDC (Debian's krb5-kdc) for tests and demos of Kerberos (GSSAPI) security.

Everything lives in one temporary directory: the realm's database (kdb5_util), the KDC's kdc.conf, a
krb5.conf naming the KDC on 127.0.0.1 and a port chosen at start, and the keytabs of the principals
`add_principal` creates (kadmin.local, no kadmind). Processes that should use this realm get
`KRB5_CONFIG` (MIT) or `-Djava.security.krb5.conf` (Java) pointing at `krb5_conf`: nothing system-wide
changes. Host names are not canonicalized (`dns_canonicalize_hostname = false`, `rdns = false`), so
`bookkeeper/127.0.0.1@REALM` is the principal of a service on 127.0.0.1. Not for production.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from bkctl.errors import UnavailableError
from bkctl.metadata.zk_server import free_port, stop_throwaway

KDB5_UTIL = "/usr/sbin/kdb5_util"
KADMIN_LOCAL = "/usr/sbin/kadmin.local"
KRB5KDC = "/usr/sbin/krb5kdc"
START_TIMEOUT_S = 20.0  # local bound
COMMAND_TIMEOUT_S = 30.0  # local bound: one kadmin.local or kdb5_util run
PORT_ATTEMPTS = 3  # local bound

KDC_CONF = """\
[kdcdefaults]
    kdc_listen = 127.0.0.1:{port}
    kdc_tcp_listen = 127.0.0.1:{port}
[realms]
    {realm} = {{
        database_name = {dir}/principal
        key_stash_file = {dir}/stash
        acl_file = {dir}/kadm5.acl
        kdc_listen = 127.0.0.1:{port}
        kdc_tcp_listen = 127.0.0.1:{port}
        max_life = 12h
        supported_enctypes = aes256-cts-hmac-sha1-96:normal aes128-cts-hmac-sha1-96:normal
    }}
[logging]
    kdc = FILE:{dir}/kdc.log
"""
# udp_preference_limit = 1: every client (MIT's and Java's) talks TCP, one port to probe and wait on.
KRB5_CONF = """\
[libdefaults]
    default_realm = {realm}
    dns_lookup_kdc = false
    dns_lookup_realm = false
    dns_canonicalize_hostname = false
    rdns = false
    udp_preference_limit = 1
    ticket_lifetime = 12h
    forwardable = false
[realms]
    {realm} = {{
        kdc = 127.0.0.1:{port}
    }}
[domain_realm]
    127.0.0.1 = {realm}
    localhost = {realm}
"""


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Kdc:
    """`kdc = Kdc().start(); kdc.add_principal("bookkeeper/127.0.0.1"); ...; kdc.stop()`."""

    def __init__(self, realm: str = "BKCTL.TEST") -> None:
        self.realm = realm
        self.port = 0
        self.directory: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def krb5_conf(self) -> Path:
        assert self.directory is not None
        return self.directory / "krb5.conf"

    def env(self) -> dict[str, str]:
        """The environment variables MIT's tools and libraries need for this realm."""
        assert self.directory is not None
        return {"KRB5_CONFIG": str(self.krb5_conf), "KRB5_KDC_PROFILE": str(self.directory / "kdc.conf")}

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Kdc:
        """Create the realm and start krb5kdc; UnavailableError (with the log's tail) if it cannot."""
        for tool in (KDB5_UTIL, KADMIN_LOCAL, KRB5KDC):
            if not Path(tool).is_file():
                raise UnavailableError(
                    f"cannot start a KDC: need {tool} (Debian's krb5-kdc, krb5-admin-server)"
                )
        self.directory = Path(tempfile.mkdtemp(prefix="bkctl-kdc-"))
        (self.directory / "kadm5.acl").write_text("")
        deadline = time.monotonic() + timeout_s
        created = False
        for _ in range(PORT_ATTEMPTS):  # another process may take the port between probe and bind
            self._configure(free_port())
            if not created:
                self._run([KDB5_UTIL, "create", "-s", "-r", self.realm, "-P", os.urandom(12).hex()])
                created = True
            if self._launch(deadline):
                return self
        log = self.log_tail()
        self.stop()
        raise UnavailableError(f"the KDC did not start in {timeout_s:.0f} s: {log}")

    def add_principal(self, name: str) -> Path:
        """Create principal `name` (its realm added) with a random key; the path of a keytab holding it."""
        assert self.directory is not None
        principal = self.principal(name)
        keytab = self.directory / (principal.replace("/", "_").replace("@", "_") + ".keytab")
        self._run([KADMIN_LOCAL, "-r", self.realm, "-q", f"addprinc -randkey {principal}"])
        self._run([KADMIN_LOCAL, "-r", self.realm, "-q", f"ktadd -norandkey -k {keytab} {principal}"])
        return keytab

    def principal(self, name: str) -> str:
        return name if "@" in name else f"{name}@{self.realm}"

    def _configure(self, port: int) -> None:
        assert self.directory is not None
        self.port = port
        values = {"realm": self.realm, "port": port, "dir": self.directory}
        (self.directory / "kdc.conf").write_text(KDC_CONF.format(**values))
        self.krb5_conf.write_text(KRB5_CONF.format(**values))

    def _run(self, command: list[str]) -> None:
        result = subprocess.run(
            command,
            env={**os.environ, **self.env()},
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        if result.returncode != 0:
            why = (result.stderr or result.stdout).decode(errors="replace").strip().splitlines()
            raise UnavailableError(f"{Path(command[0]).name} failed: {' | '.join(why[-3:])}")

    def _launch(self, deadline: float) -> bool:
        assert self.directory is not None
        with open(self.directory / "krb5kdc.out", "ab") as out:
            self._proc = subprocess.Popen(
                [KRB5KDC, "-n", "-r", self.realm, "-P", str(self.directory / "kdc.pid")],
                env={**os.environ, **self.env()},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            if _listening(self.port):
                return True
            time.sleep(0.05)
        return False

    def log_tail(self, lines: int = 5) -> str:
        if self.directory is None:
            return "(no log)"
        text: list[str] = []
        for name in ("krb5kdc.out", "kdc.log"):
            path = self.directory / name
            if path.exists():
                text += path.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "(empty log)"

    def stop(self) -> None:
        """SIGTERM, wait, then SIGKILL; remove the directory. Idempotent."""
        stop_throwaway(self._proc, self.directory)
        self._proc, self.directory = None, None
