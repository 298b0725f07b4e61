"""Java's PKCS12 and JKS key and trust stores (tlsKeyStoreType / tlsTrustStoreType) with their password
files: a bkctl bookie presents a PKCS12 identity and requires client certificates from a JKS trust
store; a client trusting a PKCS12 store and presenting a JKS identity writes and reads over TLS."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import jks
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
    pkcs12,
)
from twisted.internet import reactor

from bkctl.client.client import Client
from bkctl.errors import UsageError
from bkctl.tls import JAVA_PROVIDER_FACTORY, client_context, client_settings, server_settings
from tests.client.cluster import REQUEST_TIMEOUT_MS, Cluster, bounded
from tests.server_net.live import start_bookie, twisted_test
from tests.tls_certs import Certificates, Pem, write_certificates

PASSWORD = "store-secret"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Certificates]:
    yield write_certificates(tmp_path_factory.mktemp("certs"))


def _pair(identity: Pem) -> tuple[object, x509.Certificate]:
    key = load_pem_private_key(identity.key.read_bytes(), None)
    return key, x509.load_pem_x509_certificate(identity.cert.read_bytes())


def pkcs12_identity(directory: Path, identity: Pem, name: str) -> Path:
    key, cert = _pair(identity)
    path = directory / f"{name}.p12"
    encryption = BestAvailableEncryption(PASSWORD.encode())
    path.write_bytes(pkcs12.serialize_key_and_certificates(name.encode(), key, cert, None, encryption))  # type: ignore[arg-type]
    return path


def pkcs12_trust(directory: Path, ca: Path) -> Path:
    cert = x509.load_pem_x509_certificate(ca.read_bytes())
    path = directory / "trust.p12"
    store = pkcs12.serialize_java_truststore(
        [pkcs12.PKCS12Certificate(cert, b"ca")], BestAvailableEncryption(PASSWORD.encode())
    )
    path.write_bytes(store)
    return path


def jks_identity(directory: Path, identity: Pem, name: str) -> Path:
    key, cert = _pair(identity)
    der_key = key.private_bytes(Encoding.DER, PrivateFormat.PKCS8, NoEncryption())  # type: ignore[attr-defined]
    entry = jks.PrivateKeyEntry.new(name, [cert.public_bytes(Encoding.DER)], der_key, "pkcs8")
    path = directory / f"{name}.jks"
    jks.KeyStore.new("jks", [entry]).save(str(path), PASSWORD)
    return path


def jks_trust(directory: Path, ca: Path) -> Path:
    cert = x509.load_pem_x509_certificate(ca.read_bytes())
    entry = jks.TrustedCertEntry.new("ca", cert.public_bytes(Encoding.DER))
    path = directory / "trust.jks"
    jks.KeyStore.new("jks", [entry]).save(str(path), PASSWORD)
    return path


def password_file(directory: Path) -> Path:
    path = directory / "password"
    path.write_text(PASSWORD + "\n")
    return path


@twisted_test
async def test_pkcs12_and_jks_stores_on_both_sides(tmp_path: Path, certs: Certificates) -> None:
    password = password_file(tmp_path)
    bookie_keys = {
        "tlsProviderFactoryClass": JAVA_PROVIDER_FACTORY,
        "tlsKeyStoreType": "PKCS12",
        "tlsKeyStore": str(pkcs12_identity(tmp_path, certs.bookie, "bookie")),
        "tlsKeyStorePasswordPath": str(password),
        "tlsTrustStoreType": "JKS",
        "tlsTrustStore": str(jks_trust(tmp_path, certs.ca)),
        "tlsTrustStorePasswordPath": str(password),
        "tlsClientAuthentication": "true",
    }
    client_keys = {
        "tlsProviderFactoryClass": JAVA_PROVIDER_FACTORY,
        "tlsKeyStoreType": "JKS",
        "tlsKeyStore": str(jks_identity(tmp_path, certs.client, "client")),
        "tlsKeyStorePasswordPath": str(password),
        "tlsTrustStoreType": "PKCS12",
        "tlsTrustStore": str(pkcs12_trust(tmp_path, certs.ca)),
        "tlsTrustStorePasswordPath": str(password),
        "tlsClientAuthentication": "true",
        "tlsHostnameVerificationEnabled": "true",
    }
    cluster = await Cluster(tmp_path).start(0)
    try:
        cluster.bookies.append(await start_bookie(tmp_path, "b1", cluster.uri, **bookie_keys))
        assert cluster.layout is not None
        settings = client_settings(client_keys)
        client = Client(
            cluster.layout, reactor, rng=random.Random(1), tls=settings, request_timeout_ms=REQUEST_TIMEOUT_MS
        )
        cluster.clients.append(client)
        lh = await bounded(client.create_ledger(1, 1, 1, password=b"pw"))
        assert await bounded(lh.add_many([b"a", b"b", b"c"])) == [0, 1, 2]
        assert [e.payload for e in await bounded(lh.read(0, 2))] == [b"a", b"b", b"c"]
        assert cluster.bookies[0].factory.metrics.tls_handshakes >= 1
    finally:
        await cluster.stop()


def test_a_wrong_password_file_and_an_unknown_type_are_one_usage_error(
    tmp_path: Path, certs: Certificates
) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    for trust, kind in ((pkcs12_trust(tmp_path, certs.ca), "PKCS12"), (jks_trust(tmp_path, certs.ca), "JKS")):
        keys = {
            "tlsProviderFactoryClass": JAVA_PROVIDER_FACTORY,
            "tlsTrustStoreType": kind,
            "tlsTrustStore": str(trust),
            "tlsTrustStorePasswordPath": str(wrong),
        }
        with pytest.raises(UsageError, match="wrong password file"):
            client_context(client_settings(keys))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="BKS is not one of PEM, PKCS12, JKS"):
        server_settings(
            {"tlsProviderFactoryClass": JAVA_PROVIDER_FACTORY, "tlsKeyStoreType": "BKS", "tlsKeyStore": "x"}
        )
