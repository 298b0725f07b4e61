"""JAAS login configuration files, as the Java processes of a secured cluster use them."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bkctl.errors import UsageError
from bkctl.jaas import KERBEROS_MODULE, parse_jaas, read_jaas_file, section

# The shape of BookKeeper's own test files (jaas_md5.conf, a Kerberos Client section).
SAMPLE = """
// ZooKeeper's client
Client {
    org.apache.zookeeper.server.auth.DigestLoginModule required
    username="bookkeeper"
    password="zk-secret";
};
/* the bookie's accounts */
Bookie {
    org.apache.zookeeper.server.auth.DigestLoginModule required
    user_bookkeeperclient="clientpwd"
    user_admin="a\\"b";
};
BookKeeper {
  org.apache.zookeeper.server.auth.DigestLoginModule required username="bookkeeperclient" password=clientpwd;
};
Kerberos {
  com.sun.security.auth.module.Krb5LoginModule required
  useKeyTab=true keyTab="/etc/bk.keytab" storeKey=true principal="bookkeeper/host@EXAMPLE.COM";
};
"""


def test_sections_entries_and_options() -> None:
    sections = parse_jaas(SAMPLE)
    assert list(sections) == ["Client", "Bookie", "BookKeeper", "Kerberos"]
    client = section(sections, "Client")
    assert client is not None and client.flag == "required"
    assert client.options == {"username": "bookkeeper", "password": "zk-secret"}
    bookie = section(sections, "Bookie")
    assert bookie is not None and bookie.users == {"bookkeeperclient": "clientpwd", "admin": 'a"b'}
    assert section(sections, "BookKeeper").options["password"] == "clientpwd"  # type: ignore[union-attr]
    kerberos = section(sections, "Kerberos")
    assert kerberos is not None and kerberos.module == KERBEROS_MODULE and kerberos.is_kerberos
    assert section(sections, "Missing") is None


@pytest.mark.parametrize(
    "text",
    [
        'Client { org.Module required username="x" }',  # no `;` after the options
        "Client org.Module required;",  # no braces
        "Client { org.Module always; };",  # not a flag
        "Client { org.Module required username=; };",
        'Client { org.Module required "oops; };',
    ],
)
def test_malformed_is_one_usage_error_naming_the_file(text: str) -> None:
    with pytest.raises(UsageError, match=r"f\.conf"):
        parse_jaas(text, "f.conf")


def test_a_section_without_credentials_is_refused() -> None:
    sections = parse_jaas("Client { org.Module required debug=true; };")
    with pytest.raises(UsageError, match="section Client has no username"):
        section(sections, "Client")


def test_read_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read JAAS file"):
        read_jaas_file(tmp_path / "none.conf")


@given(st.text(max_size=200))
def test_never_fails_otherwise(text: str) -> None:
    with contextlib.suppress(UsageError):
        parse_jaas(text)
