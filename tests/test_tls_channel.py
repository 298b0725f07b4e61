"""bkctl/tls_channel.py, sans-I/O: a client and a bookie channel handshake in memory; all plaintext of
several records at once, a record split anywhere, host names checked only when asked, the one-line
reasons of failures, close_notify."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import pytest

from bkctl import tls
from bkctl.tls_channel import TlsChannel, TlsError, describe
from tests.tls_certs import Certificates, Pem, write_certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Certificates]:
    yield write_certificates(tmp_path_factory.mktemp("certs"))


def bookie(identity: Pem, trust: Certificates | None = None) -> TlsChannel:
    settings = tls.TlsSettings(
        identity.cert, identity.key, trust_path=trust and trust.ca, client_auth=bool(trust)
    )
    return TlsChannel(tls.server_context(settings), server_side=True)


def client(settings: tls.TlsSettings, host: str | None = None) -> TlsChannel:
    return TlsChannel(tls.client_context(settings), server_side=False, server_hostname=host)


def handshake(a_client: TlsChannel, a_bookie: TlsChannel) -> None:
    """Both flights; raises the TlsError of whichever side fails."""
    a_bookie.receive(a_client.take_output())
    a_client.receive(a_bookie.take_output())
    a_bookie.receive(a_client.take_output())


def test_all_plaintext_of_several_records_at_once_and_a_split_record(certs: Certificates) -> None:
    a_client, a_bookie = client(tls.TlsSettings(trust_path=certs.ca)), bookie(certs.bookie)
    handshake(a_client, a_bookie)
    assert a_client.handshake_done and a_bookie.handshake_done and a_bookie.version() == "TLSv1.3"
    records = b"".join(a_client.encrypt([b"%05d" % n, b"|"]) for n in range(20))
    assert a_bookie.receive(records) == b"".join(b"%05d|" % n for n in range(20))
    record = a_client.encrypt([b"a" * 20_000])  # two records: more than 16 KiB
    assert [a_bookie.receive(record[i : i + 7]) for i in range(0, len(record), 7)].count(b"") > 1
    assert a_bookie.receive(a_client.encrypt([b"b"])) == b"b"
    with pytest.raises(TlsError, match=r"bad record mac|decryption failed"):
        a_bookie.receive(records)  # replayed


def test_host_names_are_checked_only_when_asked(certs: Certificates) -> None:
    checking = tls.TlsSettings(trust_path=certs.ca, hostname_verification=True)
    for host in ("localhost", "127.0.0.1"):
        handshake(client(checking, host), bookie(certs.bookie))
    for host in ("127.0.0.2", "example.com"):
        with pytest.raises(TlsError, match=r"certificate verify failed: .*mismatch"):
            handshake(client(checking, host), bookie(certs.bookie))
    handshake(client(tls.TlsSettings(trust_path=certs.ca)), bookie(certs.elsewhere))  # chain only


def test_failures_are_one_line(certs: Certificates) -> None:
    with pytest.raises(TlsError, match=r"^certificate verify failed"):
        handshake(client(tls.TlsSettings(trust_path=certs.ca)), bookie(certs.other_bookie))
    a_client, a_bookie = client(tls.TlsSettings(trust_path=certs.ca)), bookie(certs.bookie, trust=certs)
    with pytest.raises(TlsError, match=r"^peer did not return a certificate$"):
        handshake(a_client, a_bookie)  # TLS 1.3: the client's side of the handshake is over
    with pytest.raises(TlsError, match=r"^tlsv13 alert certificate required$"):
        a_client.receive(a_bookie.take_output())  # the bookie's alert
    error = ssl.SSLCertVerificationError(
        1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed (_ssl.c:1006)"
    )
    assert describe(error) == "certificate verify failed" and describe(None) == "connection closed"


def test_close_notify(certs: Certificates) -> None:
    a_client, a_bookie = client(tls.TlsSettings(trust_path=certs.ca)), bookie(certs.bookie)
    a_client.close()  # before the handshake: nothing to close, and no error
    a_client, a_bookie = client(tls.TlsSettings(trust_path=certs.ca)), bookie(certs.bookie)
    handshake(a_client, a_bookie)
    assert a_bookie.receive(a_client.encrypt([b"last"]) + a_client.close()) == b"last"
    assert a_bookie.peer_closed
    assert a_client.receive(a_bookie.close()) == b"" and a_client.peer_closed
