"""SASL between clients and bookies: Java's keys, the JAAS sections, and who may connect.

As Java BookKeeper 4.14.8 (org.apache.bookkeeper.sasl):
- a bookie authenticates its clients when `bookieAuthProviderFactoryClass` is
  `org.apache.bookkeeper.sasl.SASLBookieAuthProviderFactory`; its accounts are the `user_NAME="password"`
  options of the JAAS section `saslJaasBookieSectionName` (default `Bookie`), and only a client whose
  name fully matches the regular expression `saslJaasClientAllowedIds` (default `.*bookkeeper.*`) is let in;
- a client authenticates when `clientAuthProviderFactoryClass` is
  `org.apache.bookkeeper.sasl.SASLClientProviderFactory`, with the `username`/`password` of the JAAS
  section `saslJaasClientSectionName` (default `BookKeeper`);
- the mechanism is DIGEST-MD5 (Kerberos/GSSAPI principals are refused with one line: docs/bookie.md);
  the plugin name on the wire is `sasl`.
The JAAS file is the one `--jaas` / BKCTL_JAAS names; the keys come from the bookie's conf or `--conf`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from bkctl.errors import UsageError
from bkctl.jaas import ENV_JAAS, LoginEntry, jaas_from_env, section
from bkctl.properties import properties_from_env

PLUGIN_NAME: Final = "sasl"
BOOKIE_FACTORY: Final = "org.apache.bookkeeper.sasl.SASLBookieAuthProviderFactory"
CLIENT_FACTORY: Final = "org.apache.bookkeeper.sasl.SASLClientProviderFactory"
BOOKIE_SECTION_DEFAULT: Final = "Bookie"
CLIENT_SECTION_DEFAULT: Final = "BookKeeper"
ALLOWED_IDS_DEFAULT: Final = ".*bookkeeper.*"
SERVER_KEYS: Final = (
    "bookieAuthProviderFactoryClass",
    "saslJaasBookieSectionName",
    "saslJaasClientAllowedIds",
)
CLIENT_KEYS: Final = ("clientAuthProviderFactoryClass", "saslJaasClientSectionName")


@dataclass(frozen=True)
class BookieSaslKeys:
    """A bookie's SASL keys (pure configuration; the JAAS file is read when the bookie starts)."""

    section: str = BOOKIE_SECTION_DEFAULT
    allowed_ids: str = ALLOWED_IDS_DEFAULT


@dataclass(frozen=True)
class BookieSasl:
    """What a bookie checks: its DIGEST-MD5 accounts and the allowed-ids rule."""

    users: dict[str, str]
    allowed_ids: re.Pattern[str]

    def allows(self, name: str) -> bool:
        return self.allowed_ids.fullmatch(name) is not None


@dataclass(frozen=True)
class ClientSasl:
    """A client's DIGEST-MD5 credentials."""

    user: str
    password: str


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


def _entry(name: str, role: str) -> LoginEntry:
    jaas = jaas_from_env()
    if jaas is None:
        raise UsageError(f"SASL ({role}) needs a JAAS file with a {name} section: --jaas FILE or {ENV_JAAS}")
    path, sections = jaas
    entry = section(sections, name, path)
    if entry is None:
        raise UsageError(f"JAAS file {path} has no {name} section (SASL {role})")
    if entry.is_kerberos:
        raise UsageError(
            f"JAAS file {path}, section {name}: Kerberos (GSSAPI) between clients and bookies is not "
            'supported by bkctl; use DIGEST-MD5 (docs/bookie.md "Security")'
        )
    return entry


def bookie_sasl(keys: BookieSaslKeys) -> BookieSasl:
    """The bookie's accounts from its JAAS section; UsageError (one line) when it cannot have them."""
    entry = _entry(keys.section, "bookie")
    if not entry.users:
        raise UsageError(f'JAAS section {keys.section} has no user_NAME="password" accounts')
    return BookieSasl(entry.users, _pattern(keys.allowed_ids))


def client_sasl(properties: dict[str, str]) -> ClientSasl | None:
    """The client's credentials when `clientAuthProviderFactoryClass` asks for SASL, else None."""
    if not _provider(properties, "clientAuthProviderFactoryClass", CLIENT_FACTORY):
        return None
    name = properties.get("saslJaasClientSectionName", CLIENT_SECTION_DEFAULT)
    entry = _entry(name, "client")
    if "username" not in entry.options:
        raise UsageError(f"JAAS section {name} has no username/password for the client")
    return ClientSasl(entry.options["username"], entry.options.get("password", ""))


def client_sasl_from_env() -> ClientSasl | None:
    """The client's credentials from the conf in BKCTL_CONF (`--conf`) and the JAAS file (`--jaas`)."""
    return client_sasl(properties_from_env())
