"""SASL between clients and bookies: Java's keys, the JAAS sections, and who may connect.

As Java BookKeeper 4.14.8 (org.apache.bookkeeper.sasl):
- a bookie authenticates its clients when `bookieAuthProviderFactoryClass` is
  `org.apache.bookkeeper.sasl.SASLBookieAuthProviderFactory`; its JAAS section
  `saslJaasBookieSectionName` (default `Bookie`) holds either DIGEST-MD5 accounts (`user_NAME="password"`)
  or a Krb5LoginModule (its principal `bookkeeper/HOST@REALM` and keytab: GSSAPI, bkctl/kerberos.py),
  and only a client whose name (DIGEST-MD5 user, Kerberos principal `name@REALM`) fully matches the
  regular expression `saslJaasClientAllowedIds` (default `.*bookkeeper.*`) is let in;
- a client authenticates when `clientAuthProviderFactoryClass` is
  `org.apache.bookkeeper.sasl.SASLClientProviderFactory`, with the `username`/`password` or the
  Krb5LoginModule of the JAAS section `saslJaasClientSectionName` (default `BookKeeper`); with Kerberos
  the bookie's principal is `SERVICE/HOST@REALM`: SERVICE `bookkeeper.sasl.servicename` (default
  `bookkeeper`), HOST the bookie id's host (an IP address replaced by its reverse-DNS name, as Java's
  InetSocketAddress.getHostName does), REALM the client's (Java's SaslClientState);
- the plugin name on the wire is `sasl`.
The JAAS file is the one `--jaas` / BKCTL_JAAS names; the keys come from the bookie's conf or `--conf`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from bkctl.errors import ProtocolError, UsageError
from bkctl.jaas import ENV_JAAS, LoginEntry, jaas_from_env, section
from bkctl.kerberos import KerberosLogin, credentials, kerberos_login
from bkctl.properties import properties_from_env

PLUGIN_NAME: Final = "sasl"
BOOKIE_FACTORY: Final = "org.apache.bookkeeper.sasl.SASLBookieAuthProviderFactory"
CLIENT_FACTORY: Final = "org.apache.bookkeeper.sasl.SASLClientProviderFactory"
BOOKIE_SECTION_DEFAULT: Final = "Bookie"
CLIENT_SECTION_DEFAULT: Final = "BookKeeper"
ALLOWED_IDS_DEFAULT: Final = ".*bookkeeper.*"
SERVICE_NAME_KEY: Final = "bookkeeper.sasl.servicename"  # a Java system property; a conf key for bkctl
SERVICE_NAME_DEFAULT: Final = "bookkeeper"
SERVER_KEYS: Final = (
    "bookieAuthProviderFactoryClass",
    "saslJaasBookieSectionName",
    "saslJaasClientAllowedIds",
)
CLIENT_KEYS: Final = ("clientAuthProviderFactoryClass", "saslJaasClientSectionName", SERVICE_NAME_KEY)


@dataclass(frozen=True)
class BookieSaslKeys:
    """A bookie's SASL keys (pure configuration; the JAAS file is read when the bookie starts)."""

    section: str = BOOKIE_SECTION_DEFAULT
    allowed_ids: str = ALLOWED_IDS_DEFAULT


@dataclass(frozen=True)
class BookieSasl:
    """What a bookie checks: its DIGEST-MD5 accounts or its Kerberos login, and the allowed-ids rule."""

    users: dict[str, str]
    allowed_ids: re.Pattern[str]
    kerberos: KerberosLogin | None = None

    def allows(self, name: str) -> bool:
        return self.allowed_ids.fullmatch(name) is not None


@dataclass(frozen=True)
class ClientSasl:
    """A client's DIGEST-MD5 credentials, or its Kerberos login (`user` is then its principal)."""

    user: str
    password: str
    kerberos: KerberosLogin | None = None
    service: str = SERVICE_NAME_DEFAULT  # Kerberos: the bookies' principals are SERVICE/HOST@REALM


def bookie_sasl_keys(properties: dict[str, str]) -> BookieSaslKeys | None:
    """None when the bookie has no authentication; UsageError for another provider or a bad regex."""
    if not _provider(properties, "bookieAuthProviderFactoryClass", BOOKIE_FACTORY):
        return None
    allowed = properties.get("saslJaasClientAllowedIds", ALLOWED_IDS_DEFAULT)
    _pattern(allowed)
    return BookieSaslKeys(properties.get("saslJaasBookieSectionName", BOOKIE_SECTION_DEFAULT), allowed)


def _provider(properties: dict[str, str], key: str, sasl_factory: str) -> bool:
    """Whether `key` names Java's SASL provider; unset is False, another provider a UsageError."""
    factory = properties.get(key, "").strip()
    if factory and factory != sasl_factory:
        raise UsageError(
            f"config key {key}={factory}: not implemented by bkctl (it knows {sasl_factory} only); "
            "refusing to start rather than change who may connect"
        )
    return bool(factory)


def _pattern(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise UsageError(
            f"config key saslJaasClientAllowedIds: {text!r} is not a regular expression: {exc}"
        ) from None


def _entry(name: str, role: str) -> tuple[LoginEntry, KerberosLogin | None]:
    """The JAAS section's entry, and its Kerberos login when it is a Krb5LoginModule."""
    jaas = jaas_from_env()
    if jaas is None:
        raise UsageError(f"SASL ({role}) needs a JAAS file with a {name} section: --jaas FILE or {ENV_JAAS}")
    path, sections = jaas
    entry = section(sections, name, path)
    if entry is None:
        raise UsageError(f"JAAS file {path} has no {name} section (SASL {role})")
    if entry.is_kerberos:
        return entry, kerberos_login(entry, f"JAAS file {path}, section {name}")
    return entry, None


def bookie_sasl(keys: BookieSaslKeys) -> BookieSasl:
    """The bookie's accounts or Kerberos login from its JAAS section; UsageError (one line) when it
    cannot have them."""
    entry, kerberos = _entry(keys.section, "bookie")
    if kerberos is not None:
        if kerberos.keytab is None:
            raise UsageError(f"{kerberos.source}: a bookie accepts with a keytab: useKeyTab=true, keyTab")
        try:
            credentials(kerberos, "accept")  # now, not at the first client: a bad keytab stops the start
        except ProtocolError as exc:
            raise UsageError(str(exc)) from None
        return BookieSasl({}, _pattern(keys.allowed_ids), kerberos)
    if not entry.users:
        raise UsageError(f'JAAS section {keys.section} has no user_NAME="password" accounts')
    return BookieSasl(entry.users, _pattern(keys.allowed_ids))


def client_sasl(properties: dict[str, str]) -> ClientSasl | None:
    """The client's credentials when `clientAuthProviderFactoryClass` asks for SASL, else None."""
    if not _provider(properties, "clientAuthProviderFactoryClass", CLIENT_FACTORY):
        return None
    name = properties.get("saslJaasClientSectionName", CLIENT_SECTION_DEFAULT)
    entry, kerberos = _entry(name, "client")
    if kerberos is not None:
        service = properties.get(SERVICE_NAME_KEY, SERVICE_NAME_DEFAULT).strip() or SERVICE_NAME_DEFAULT
        return ClientSasl(kerberos.principal or "", "", kerberos, service)
    if "username" not in entry.options:
        raise UsageError(f"JAAS section {name} has no username/password for the client")
    return ClientSasl(entry.options["username"], entry.options.get("password", ""))


def client_sasl_from_env() -> ClientSasl | None:
    """The client's credentials from the conf in BKCTL_CONF (`--conf`) and the JAAS file (`--jaas`)."""
    return client_sasl(properties_from_env())
