"""Kerberos: SASL GSSAPI (RFC 4752) for ZooKeeper and between clients and bookies, as Java logs in.

A JAAS section with `com.sun.security.auth.module.Krb5LoginModule` (Java's `Client`, `Bookie` or
`BookKeeper`) names who a process is: `useKeyTab=true keyTab="FILE" principal="NAME"` logs in from a
keytab (bkctl asks the KDC itself, into a private in-memory ticket cache; the operator's own cache is
never touched), `useTicketCache=true` uses the tickets `kinit` left (KRB5CCNAME). `storeKey` is Java's
way to let a server accept with the keytab's key; bkctl's acceptor reads the keytab in either case.
The KDC and realm come from MIT's krb5.conf (KRB5_CONFIG), as Java's come from
`java.security.krb5.conf`.

The GSS-API itself is the `gssapi` package (python-gssapi, maintained, over MIT's libgssapi_krb5);
this module writes only RFC 4752's security-layer negotiation on top: after the context is set up
the server sends a wrapped 4-byte word (the layers it offers, its max buffer), the client answers
with a wrapped word (the layer it chose, its max buffer) and its authorization id. Only "no security
layer" (qop `auth`) is offered and accepted, as BookKeeper and ZooKeeper use SASL: TLS protects the
bytes when they must be. Every refusal is a ProtocolError carrying the reason.

Calls into the GSS-API block: the client's first step asks the KDC for a service ticket (one round
trip, bounded by krb5's own timeouts; cached for the process's later connections), the rest is local.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from bkctl.errors import ProtocolError, UsageError
from bkctl.jaas import LoginEntry

LAYER_NONE: Final = 0x01  # RFC 4752: the "no security layer" bit
_WORD = struct.Struct("!I")


@dataclass(frozen=True)
class KerberosLogin:
    """Who a process is to Kerberos, from its JAAS section (Java's Krb5LoginModule options)."""

    principal: str | None
    keytab: str | None
    source: str = field(default="", compare=False)  # the JAAS file and section, for error messages


def kerberos_login(entry: LoginEntry, source: str) -> KerberosLogin:
    """The login of a Krb5LoginModule entry; UsageError (one line) when it cannot be used."""
    options = {key: value.strip() for key, value in entry.options.items()}
    use_keytab = options.get("useKeyTab", "false").lower() == "true"
    use_cache = options.get("useTicketCache", "false").lower() == "true"
    principal = options.get("principal") or None
    if not use_keytab and not use_cache:
        raise UsageError(f"{source}: Krb5LoginModule needs useKeyTab=true (with keyTab, principal) or "
                         "useTicketCache=true; bkctl cannot prompt for a password")  # fmt: skip
    if not use_keytab:
        return KerberosLogin(principal, None, source)
    keytab = options.get("keyTab")
    if not keytab or principal is None:
        raise UsageError(f"{source}: useKeyTab=true needs keyTab and principal")
    if not os.access(keytab, os.R_OK) or not Path(keytab).is_file():
        raise UsageError(f"{source}: keytab {keytab} is not a readable file")
    return KerberosLogin(principal, keytab, source)


_CREDENTIALS: dict[tuple[KerberosLogin, str], Any] = {}
_CREDENTIALS_LOCK = threading.Lock()


def _gssapi() -> Any:
    try:
        import gssapi
    except ImportError:
        raise UsageError(
            "Kerberos (Krb5LoginModule) needs the gssapi package: pip install 'bkctl[kerberos]' "
            "(it builds against MIT Kerberos: Debian's libkrb5-dev)"
        ) from None
    return gssapi


def credentials(login: KerberosLogin, usage: str) -> Any:
    """gssapi Credentials for `usage` "initiate" (a client) or "accept" (a server), one per process
    and login (the tickets got once serve every later connection). ProtocolError if GSS-API refuses."""
    gssapi = _gssapi()
    with _CREDENTIALS_LOCK:
        cached = _CREDENTIALS.get((login, usage))
        if cached is not None:
            return cached
        store: dict[str, str] = {}
        if login.keytab is not None and usage == "initiate":
            # A private cache: the keytab's tickets never land in (or come from) the operator's.
            store = {"client_keytab": login.keytab, "ccache": f"MEMORY:bkctl-{os.getpid()}-{id(login)}"}
        elif login.keytab is not None:
            store = {"keytab": login.keytab}
        name = None
        if login.principal is not None:
            name = gssapi.Name(login.principal, gssapi.NameType.kerberos_principal)
        try:
            made = gssapi.Credentials(name=name, usage=usage, store=store or None)
        except gssapi.exceptions.GSSError as exc:
            raise ProtocolError(f"Kerberos login of {login.principal or 'the ticket cache'} "
                                f"({login.source}) failed: {_reason(exc)}") from None  # fmt: skip
        _CREDENTIALS[(login, usage)] = made
        return made


def _reason(exc: Exception) -> str:
    """GSS-API's major and minor messages on one line."""
    return " ".join(str(exc).split())


def java_host_name(host: str) -> str:
    """The host part of a bookie's principal as Java's client names it (InetSocketAddress.getHostName):
    an IP address becomes its reverse-DNS name (127.0.0.1: usually `localhost`), a name stays as given.
    The address itself when there is no reverse name."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host
    try:
        return socket.gethostbyaddr(host)[0]
    except OSError:
        return host


def canonical_host_name(host: str) -> str:
    """The host part of ZooKeeper's principal as Java's ZooKeeper client names it
    (`zookeeper.sasl.client.canonicalize.hostname`, default true): the reverse-DNS name of the address
    the host resolves to, or the host as given when there is none."""
    try:
        return socket.gethostbyaddr(socket.gethostbyname(host))[0]
    except OSError:
        return host


def realm_of(principal: str) -> str:
    """The realm of `name@REALM` ('' without one)."""
    return principal.rpartition("@")[2] if "@" in principal else ""


class GssapiClient:
    """The client's side of one SASL GSSAPI exchange with service `service` on `host`: the target is
    `service/host@REALM`, the realm the client's own (as Java's SaslClientState names a bookie)."""

    def __init__(self, login: KerberosLogin, service: str, host: str) -> None:
        gssapi = self._gssapi = _gssapi()
        creds = credentials(login, "initiate")
        realm = realm_of(str(creds.name))
        target = f"{service}/{host}" + (f"@{realm}" if realm else "")
        self.target = target
        self._context = gssapi.SecurityContext(
            name=gssapi.Name(target, gssapi.NameType.kerberos_principal),
            creds=creds,
            usage="initiate",
            flags=gssapi.RequirementFlag.mutual_authentication,
        )
        self.user = str(creds.name)
        self.complete = False

    def process(self, challenge: bytes | None = None) -> bytes:
        """The next token for the server's `challenge` (None/b"" at first); ProtocolError if refused."""
        if self.complete:
            raise ProtocolError("SASL GSSAPI exchange already complete")
        try:
            if not self._context.complete:
                return self._context.step(challenge or None) or b""
            return self._layer(challenge or b"")
        except self._gssapi.exceptions.GSSError as exc:
            raise ProtocolError(f"Kerberos (GSSAPI) to {self.target}: {_reason(exc)}") from None

    def _layer(self, challenge: bytes) -> bytes:
        offer = self._context.unwrap(challenge).message
        if len(offer) != 4:
            raise ProtocolError(
                f"SASL GSSAPI: the server's security-layer offer has {len(offer)} bytes, not 4"
            )
        if not offer[0] & LAYER_NONE:
            raise ProtocolError(
                "SASL GSSAPI: the server requires a security layer (only qop auth is supported)"
            )
        answer = _WORD.pack(LAYER_NONE << 24) + self.user.encode()
        self.complete = True
        return bytes(self._context.wrap(answer, False).message)


class GssapiServer:
    """The server's side of one SASL GSSAPI exchange; `allowed(principal)` is the allowed-ids rule.
    `step` returns the next token, or None once the exchange completed (nothing more is sent, as
    Java's GssKrb5Server answers the client's last token)."""

    def __init__(self, login: KerberosLogin, allowed: Any) -> None:
        gssapi = self._gssapi = _gssapi()
        self._context = gssapi.SecurityContext(creds=credentials(login, "accept"), usage="accept")
        self._allowed = allowed
        self._offered = False
        self.complete = False
        self.user: str | None = None

    def step(self, token: bytes) -> bytes | None:
        if self.complete:
            raise ProtocolError("SASL GSSAPI exchange already complete")
        try:
            if not self._context.complete:
                return self._context.step(token) or b""
            if not self._offered:
                self._offered = True  # the client's empty answer to the context's last token
                return bytes(self._context.wrap(_WORD.pack(LAYER_NONE << 24), False).message)
            self._verify(self._context.unwrap(token).message)
            return None
        except self._gssapi.exceptions.GSSError as exc:
            raise ProtocolError(f"Kerberos (GSSAPI): {_reason(exc)}") from None

    def _verify(self, answer: bytes) -> None:
        """The client's security-layer answer: 'no layer', and itself as authorization id."""
        if len(answer) < 4:
            raise ProtocolError(f"SASL GSSAPI: the client's security-layer answer has {len(answer)} bytes")
        if answer[0] != LAYER_NONE:
            raise ProtocolError(f"SASL GSSAPI: the client chose security layer {answer[0]:#x}, not 'none'")
        user = str(self._context.initiator_name)
        try:
            authzid = answer[4:].decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("SASL GSSAPI: the authorization id is not UTF-8") from None
        if authzid and authzid != user:
            raise ProtocolError(f"SASL GSSAPI: {user!r} may not act as {authzid!r}")
        if not self._allowed(user):
            raise ProtocolError(f"SASL GSSAPI: {user!r} is not an allowed id (saslJaasClientAllowedIds)")
        self.complete, self.user = True, user
