"""The bookie's DIGEST-MD5 server against pure-sasl's client (the library bkctl's client uses), and the
RFC 2831 example's digest values."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from puresasl.client import SASLClient

from bkctl.errors import ProtocolError
from bkctl.protocol.sasl_digest import HOST, SERVICE, DigestMd5Server, parse_directives, response_value

USERS = {"bookkeeperclient": "clientpwd", "intruder": "pwd"}


def allowed(name: str) -> bool:
    return "bookkeeper" in name


def exchange(server: DigestMd5Server, user: str, password: str) -> SASLClient:
    client = SASLClient(HOST, SERVICE, mechanism="DIGEST-MD5", username=user, password=password)
    challenge = server.step(b"")
    response = client.process(challenge)
    rspauth = server.step(response)
    client.process(rspauth)  # pure-sasl checks the server's rspauth here
    return client


def test_a_known_allowed_user_authenticates_both_ways() -> None:
    server = DigestMd5Server(USERS, allowed)
    client = exchange(server, "bookkeeperclient", "clientpwd")
    assert server.complete and server.user == "bookkeeperclient"
    assert client.complete


@pytest.mark.parametrize(
    ("user", "password", "why"),
    [
        ("bookkeeperclient", "wrong", "wrong user name or password"),
        ("nobody-bookkeeper", "clientpwd", "wrong user name or password"),
        ("intruder", "pwd", "not an allowed id"),
    ],
)
def test_refusals(user: str, password: str, why: str) -> None:
    server = DigestMd5Server(USERS, allowed)
    with pytest.raises(ProtocolError, match=why):
        exchange(server, user, password)
    assert not server.complete and server.user is None


def test_an_initial_response_and_a_replayed_nonce_are_refused() -> None:
    with pytest.raises(ProtocolError, match="initial response"):
        DigestMd5Server(USERS, allowed).step(b"x")
    first = DigestMd5Server(USERS, allowed)
    client = SASLClient(
        HOST, SERVICE, mechanism="DIGEST-MD5", username="bookkeeperclient", password="clientpwd"
    )
    response = client.process(first.step(b""))
    second = DigestMd5Server(USERS, allowed)
    second.step(b"")
    with pytest.raises(ProtocolError, match="another nonce"):
        second.step(response)


def test_rfc_2831_example() -> None:
    """RFC 2831 4, the IMAP example (chris / secret, realm elwood.innosoft.com)."""
    d = {
        "realm": "elwood.innosoft.com",
        "nonce": "OA6MG9tEQGm2hh",
        "cnonce": "OA6MHXh6VqTrRk",
        "nc": "00000001",
        "qop": "auth",
        "digest-uri": "imap/elwood.innosoft.com",
    }
    assert (
        response_value("chris", "secret", d, a2_prefix=b"AUTHENTICATE") == b"d388dad90d4bbd760a152321f2143af7"
    )
    assert response_value("chris", "secret", d, a2_prefix=b"") == b"ea40f60335c427b5527b84dbabcdfffd"


def test_directives() -> None:
    assert parse_directives(b'a=b, c="d\\"e",qop=auth') == {"a": "b", "c": 'd"e', "qop": "auth"}
    with pytest.raises(ProtocolError):
        parse_directives(b"not a list")


@given(st.binary(max_size=300))
def test_arbitrary_tokens_are_refused_cleanly(token: bytes) -> None:
    server = DigestMd5Server(USERS, allowed)
    server.step(b"")
    with pytest.raises(ProtocolError):
        server.step(token)
