"""JAAS login configuration files, as Java reads them (`-Djava.security.auth.login.config=FILE`).

A Java bookie, client and ZooKeeper client find their credentials there, one section per role:
`Client` (ZooKeeper), `Bookie` and `BookKeeper` (SASL between clients and bookies). bkctl reads the
same file (`--jaas FILE` / BKCTL_JAAS) so an operator hands it the file the Java processes use:

    Client {
        org.apache.zookeeper.server.auth.DigestLoginModule required
        username="bookkeeper" password="secret";
    };

Grammar (sun.security.provider.ConfigFile): `Name { Module Flag key=value ...; ... };`, values bare
words or double-quoted strings, `//` and `/* */` comments. Pure: text in, sections out; UsageError
(one line, with the file) on anything else.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from bkctl.errors import UsageError

ENV_JAAS: Final = "BKCTL_JAAS"
JAAS_FILE_SIZE_MAX: Final = 1024 * 1024  # local bound
FLAGS: Final = ("required", "requisite", "sufficient", "optional")
DIGEST_MODULE: Final = "org.apache.zookeeper.server.auth.DigestLoginModule"
KERBEROS_MODULE: Final = "com.sun.security.auth.module.Krb5LoginModule"

_TOKEN = re.compile(r'\s+|//[^\n]*|/\*.*?\*/|"((?:[^"\\]|\\.)*)"|([{};=])|([^\s{};="]+)', re.DOTALL)


@dataclass(frozen=True)
class LoginEntry:
    """One login module line of a section: its class, flag and options."""

    module: str
    flag: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def is_digest(self) -> bool:
        """DIGEST-MD5: a client's username/password or a server's `user_NAME="password"` list."""
        return self.module != KERBEROS_MODULE and ("username" in self.options or bool(self.users))

    @property
    def users(self) -> dict[str, str]:
        """A server section's accounts: {name: password} from its `user_NAME` options."""
        return {k.removeprefix("user_"): v for k, v in self.options.items() if k.startswith("user_")}

    @property
    def is_kerberos(self) -> bool:
        return self.module == KERBEROS_MODULE


def parse_jaas(text: str, source: str = "JAAS file") -> dict[str, list[LoginEntry]]:
    """JAAS text -> {section name: its login entries}; UsageError naming `source` if malformed."""
    tokens = _tokens(text, source)
    sections: dict[str, list[LoginEntry]] = {}
    index = 0
    while index < len(tokens):
        name = tokens[index][1]
        if tokens[index][0] != "word" or _at(tokens, index + 1) != ("punct", "{"):
            raise UsageError(f"{source}: expected `Name {{` at {name!r}")
        index += 2
        entries: list[LoginEntry] = []
        while _at(tokens, index) != ("punct", "}"):
            entry, index = _entry(tokens, index, source)
            entries.append(entry)
        index += 1
        if _at(tokens, index) == ("punct", ";"):
            index += 1
        sections[name] = entries
    return sections


def _tokens(text: str, source: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise UsageError(f"{source}: unexpected {text[position : position + 20]!r}")
        quoted, punct, word = match.groups()
        if quoted is not None:
            tokens.append(("string", re.sub(r"\\(.)", r"\1", quoted)))
        elif punct is not None:
            tokens.append(("punct", punct))
        elif word is not None:
            tokens.append(("word", word))
        position = match.end()
    return tokens


def _at(tokens: list[tuple[str, str]], index: int) -> tuple[str, str] | None:
    return tokens[index] if index < len(tokens) else None


def _entry(tokens: list[tuple[str, str]], index: int, source: str) -> tuple[LoginEntry, int]:
    module, flag = _at(tokens, index), _at(tokens, index + 1)
    if module is None or module[0] != "word" or flag is None or flag[1].lower() not in FLAGS:
        raise UsageError(f"{source}: expected `LoginModuleClass required|optional|...` in a section")
    options: dict[str, str] = {}
    index += 2
    while _at(tokens, index) != ("punct", ";"):
        key, equals, value = _at(tokens, index), _at(tokens, index + 1), _at(tokens, index + 2)
        if (
            key is None
            or key[0] != "word"
            or equals != ("punct", "=")
            or value is None
            or value[0] == "punct"
        ):
            raise UsageError(f"{source}: expected `key=value` or `;` after {module[1]}")
        options[key[1]] = value[1]
        index += 3
    return LoginEntry(module[1], flag[1].lower(), options), index + 1


def read_jaas_file(path: Path) -> dict[str, list[LoginEntry]]:
    """Read and parse a JAAS file; UsageError if missing, unreadable, too large or malformed."""
    try:
        if path.stat().st_size > JAAS_FILE_SIZE_MAX:
            raise UsageError(f"JAAS file {path} is larger than {JAAS_FILE_SIZE_MAX} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read JAAS file {path}: {exc}") from None
    return parse_jaas(text, f"JAAS file {path}")


def jaas_from_env() -> tuple[Path, dict[str, list[LoginEntry]]] | None:
    """The file BKCTL_JAAS (set by `--jaas`) names, parsed; None when there is none."""
    value = os.environ.get(ENV_JAAS, "").strip()
    if not value:
        return None
    path = Path(value)
    return path, read_jaas_file(path)


def section(
    sections: dict[str, list[LoginEntry]], name: str, path: Path | str = "JAAS file"
) -> LoginEntry | None:
    """The one usable entry of section `name` (DIGEST-MD5 or Kerberos), None if the section is absent."""
    entries = sections.get(name)
    if entries is None:
        return None
    for entry in entries:
        if entry.is_digest or entry.is_kerberos:
            return entry
    raise UsageError(
        f"{path}: section {name} has no username/password or user_NAME (DIGEST-MD5) "
        f"and no {KERBEROS_MODULE} entry"
    )
