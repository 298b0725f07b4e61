"""Who bkctl is to ZooKeeper, and which ACLs the nodes it creates carry: Java's rules.

- Credentials come from the JAAS file's `Client` section (ZooKeeper's client reads the same one):
  a DigestLoginModule `username`/`password` means SASL DIGEST-MD5 (through kazoo and pure-sasl); a
  Krb5LoginModule (keyTab/principal or the ticket cache) means SASL GSSAPI, to the server principal
  `zookeeper/<host>@<the client's realm>`, the host canonicalized as Java's ZooKeeper client does
  (bkctl/kerberos.py, through kazoo's SASL).
  `BKCTL_ZK_DIGEST=user:password` adds ZooKeeper's plain `digest` scheme (zkCli's `addauth digest`).
- `zkEnableSecurity=true` (in `--conf` / BKCTL_CONF, or the bookie's conf) makes every node bkctl creates
  carry ZooKeeper's CREATOR_ALL_ACL, as Java's `ZkUtils.getACLs` does; without it nodes are open to
  the world (OPEN_ACL_UNSAFE). A rewrite (set) keeps a node's ACL: ZooKeeper never changes it there.
- Security on without credentials is refused when the store opens: ZooKeeper would answer every
  create with InvalidACL (a creator-only ACL needs an authenticated creator).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Final

from puresasl import SASLProtocolException
from puresasl.mechanisms import Mechanism

from bkctl.errors import ProtocolError, UsageError
from bkctl.jaas import ENV_JAAS, jaas_from_env, section
from bkctl.kerberos import GssapiClient, KerberosLogin, canonical_host_name, kerberos_login
from bkctl.properties import properties_from_env

ENV_DIGEST: Final = "BKCTL_ZK_DIGEST"
CLIENT_SECTION: Final = "Client"  # ZooKeeper's default (zookeeper.sasl.clientconfig)
ENABLE_SECURITY_KEY: Final = "zkEnableSecurity"


@dataclass(frozen=True)
class ZkAuth:
    """A ZooKeeper client's credentials and the ACL of the nodes it creates."""

    secure_acls: bool = False  # zkEnableSecurity: creator-only ACLs on created nodes
    sasl_user: str | None = None  # SASL DIGEST-MD5 from the JAAS Client section
    sasl_password: str | None = None
    digest: str | None = None  # `user:password` for the digest scheme
    source: str = ""  # where the credentials came from, for error messages
    kerberos: KerberosLogin | None = None  # SASL GSSAPI from the JAAS Client section

    @property
    def has_credentials(self) -> bool:
        return self.sasl_user is not None or self.digest is not None or self.kerberos is not None

    def kazoo_kwargs(self) -> dict[str, Any]:
        """KazooClient's keyword arguments for these credentials and ACLs."""
        from kazoo.security import CREATOR_ALL_ACL

        kwargs: dict[str, Any] = {}
        if self.secure_acls:
            kwargs["default_acl"] = CREATOR_ALL_ACL
        if self.sasl_user is not None:
            kwargs["sasl_options"] = {
                "mechanism": "DIGEST-MD5",
                "username": self.sasl_user,
                "password": self.sasl_password or "",
            }
        if self.kerberos is not None:
            _register_gssapi()
            kwargs["sasl_options"] = {"mechanism": "GSSAPI", "login": self.kerberos}
        if self.digest is not None:
            kwargs["auth_data"] = [("digest", self.digest)]
        return kwargs

    def check(self) -> None:
        """UsageError when security is on and nothing would authenticate the nodes' creator."""
        if self.secure_acls and not self.has_credentials:
            raise UsageError(
                f"{ENABLE_SECURITY_KEY}=true needs ZooKeeper credentials: a JAAS file with a "
                f"{CLIENT_SECTION} section (--jaas FILE / {ENV_JAAS}) or {ENV_DIGEST}=user:password"
            )


def zk_auth(properties: dict[str, str]) -> ZkAuth:
    """The credentials of the JAAS file in BKCTL_JAAS and BKCTL_ZK_DIGEST, with `properties`' ACL rule."""
    secure = properties.get(ENABLE_SECURITY_KEY, "false").strip().lower() == "true"
    user = password = None
    kerberos = None
    source = ""
    jaas = jaas_from_env()
    if jaas is not None:
        path, sections = jaas
        entry = section(sections, CLIENT_SECTION, path)
        source = f"{path} ({CLIENT_SECTION})"
        if entry is not None and entry.is_kerberos:
            kerberos = kerberos_login(entry, source)
        elif entry is not None:
            if "username" not in entry.options:
                raise UsageError(f"{path}: section {CLIENT_SECTION} has no username (DIGEST-MD5)")
            user, password = entry.options["username"], entry.options.get("password", "")
        else:
            source = ""
    digest = os.environ.get(ENV_DIGEST, "").strip() or None
    if digest is not None and ":" not in digest:
        raise UsageError(f"{ENV_DIGEST} must be user:password")
    return ZkAuth(secure, user, password, digest, source or (ENV_DIGEST if digest else ""), kerberos)


_FAILURES: list[str] = []  # the last Kerberos failure of this process's ZooKeeper SASL, for its error


def sasl_failure() -> str | None:
    """Why the last Kerberos (GSSAPI) exchange with ZooKeeper failed (kazoo reports only "protocol
    error"); None when the last one succeeded or there was none."""
    return _FAILURES[-1] if _FAILURES else None


def _register_gssapi() -> None:
    """Make pure-sasl's GSSAPI, which kazoo asks for by name, bkctl's (python-gssapi): pure-sasl's
    own needs the older `kerberos` module and cannot log in from a keytab."""
    from puresasl import mechanisms

    mechanisms.mechanisms[_PureSaslGssapi.name] = _PureSaslGssapi


class _PureSaslGssapi(Mechanism):  # type: ignore[misc]
    """pure-sasl's Mechanism interface over bkctl.kerberos.GssapiClient (kazoo calls `process` until
    `complete`, then `dispose`). kazoo passes the host it dialled; the service is `zookeeper`. The
    login and the KDC round trip run in kazoo's connection thread, never on a reactor."""

    name = "GSSAPI"
    score = 100
    allows_anonymous = False
    uses_plaintext = False
    active_safe = True

    def __init__(self, sasl: Any, login: KerberosLogin, **_props: Any) -> None:
        super().__init__(sasl)
        self._login = login
        self._client: GssapiClient | None = None

    def process(self, challenge: bytes | None = None) -> bytes:
        try:  # the login (a KDC round trip) fails here, where kazoo reports it as refused credentials
            if self._client is None:
                host = canonical_host_name(self.sasl.host)
                self._client = GssapiClient(self._login, self.sasl.service or "zookeeper", host)
            token = self._client.process(challenge)
        except ProtocolError as exc:
            _FAILURES[:] = [str(exc)]
            raise SASLProtocolException(str(exc)) from None
        self.complete = self._client.complete
        if self.complete:
            _FAILURES.clear()
        return token

    def dispose(self) -> None:
        pass


def zk_auth_from_env() -> ZkAuth:
    """ZkAuth of this process: the conf in BKCTL_CONF (`--conf`), the JAAS file in BKCTL_JAAS (`--jaas`)."""
    return zk_auth(properties_from_env())
