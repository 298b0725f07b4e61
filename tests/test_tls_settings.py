"""bkctl/tls.py: Java's TLS keys (PEM only), what each side requires, the --tls environment, contexts
from the test certificates (host names and error texts: tests/test_tls_channel.py)."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from bkctl import tls
from bkctl.errors import UsageError
from bkctl.server.config import load_config
from tests.tls_certs import Certificates, write_certificates

JAVA = tls.JAVA_PROVIDER_FACTORY


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Certificates]:
    yield write_certificates(tmp_path_factory.mktemp("certs"))


def server_keys(certs: Certificates, **extra: str) -> dict[str, str]:
    keys = {
        "tlsProviderFactoryClass": JAVA,
        "tlsCertificatePath": str(certs.bookie.cert),
        "tlsKeyStore": str(certs.bookie.key),
        "tlsKeyStoreType": "PEM",
    }
    return {**keys, **extra}


def test_tls_is_off_without_a_provider_factory(certs: Certificates) -> None:
    assert tls.server_settings({"tlsCertificatePath": str(certs.bookie.cert)}) is None
    assert tls.client_settings({"tlsTrustStore": str(certs.ca)}) is None
    assert load_config({}).tls is None
    with pytest.raises(UsageError, match="tlsRequired: needs TLS on"):
        load_config({"tlsRequired": "true"})
    required = load_config(server_keys(certs, tlsRequired="true")).tls
    assert required is not None and required.required


def test_server_keys_as_java_reads_them(certs: Certificates) -> None:
    config = load_config(server_keys(certs, tlsClientAuthentication="true", tlsTrustStore=str(certs.ca)))
    assert config.tls == tls.TlsSettings(
        certificate_path=certs.bookie.cert, key_path=certs.bookie.key, trust_path=certs.ca, client_auth=True
    )
    tls.server_context(config.tls)  # the files load


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ({"tlsProviderFactoryClass": "com.example.Tls"}, "tlsProviderFactoryClass"),
        ({"tlsKeyStoreType": "BKS"}, "tlsKeyStoreType: BKS is not one of PEM, PKCS12, JKS"),
        ({"tlsCertificatePath": ""}, "tlsCertificatePath or tlsKeyStore"),
        ({"tlsClientAuthentication": "true"}, "needs tlsTrustStore"),
        ({"tlsClientAuthentication": "maybe"}, "not true or false"),
    ],
)
def test_bad_server_keys_name_the_key(certs: Certificates, keys: dict[str, str], words: str) -> None:
    with pytest.raises(UsageError, match=words):
        load_config(server_keys(certs, **keys))


def test_unreadable_or_mismatched_files_are_usage_errors(certs: Certificates, tmp_path: Path) -> None:
    missing = tls.TlsSettings(certificate_path=tmp_path / "none.pem", key_path=certs.bookie.key)
    with pytest.raises(UsageError, match=r"tlsCertificatePath: .* is not a readable file"):
        tls.server_context(missing)
    mismatched = tls.TlsSettings(certificate_path=certs.bookie.cert, key_path=certs.client.key)
    with pytest.raises(UsageError, match="TLS certificate"):
        tls.server_context(mismatched)
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("hello")
    with pytest.raises(UsageError, match="no PEM certificate"):
        tls.client_context(tls.TlsSettings(trust_path=not_pem))


def test_client_keys_java_names_and_overrides(certs: Certificates) -> None:
    with pytest.raises(UsageError, match="no trust store"):
        tls.client_settings({"tlsProviderFactoryClass": JAVA})
    settings = tls.client_settings(
        {
            "tlsProviderFactoryClass": JAVA,
            "tlsTrustStore": "/elsewhere.pem",
            "clientTrustStore": str(certs.ca),  # Java's client-side key wins over tlsTrustStore
            "tlsHostnameVerificationEnabled": "true",
        }
    )
    assert settings == tls.TlsSettings(trust_path=certs.ca, hostname_verification=True)
    with pytest.raises(UsageError, match="clientTrustStoreType: BKS"):
        tls.client_settings(
            {"tlsProviderFactoryClass": JAVA, "clientTrustStore": "x.bks", "clientTrustStoreType": "BKS"}
        )
    with pytest.raises(UsageError, match="needs tlsCertificatePath and tlsKeyStore"):
        tls.client_settings(
            {
                "tlsProviderFactoryClass": JAVA,
                "tlsTrustStore": str(certs.ca),
                "tlsClientAuthentication": "true",
            }
        )


def test_the_tls_options_environment(certs: Certificates) -> None:
    assert tls.client_settings_from_env({}) is None
    env = {tls.ENV_TLS: "1", tls.ENV_TRUST_STORE: str(certs.ca)}
    assert tls.client_settings_from_env(env) == tls.TlsSettings(trust_path=certs.ca)
    with_cert = {**env, tls.ENV_CERTIFICATE: str(certs.client.cert), tls.ENV_KEY: str(certs.client.key)}
    settings = tls.client_settings_from_env(with_cert)
    assert settings is not None and settings.client_auth and settings.key_path == certs.client.key
    with pytest.raises(UsageError, match="go together"):
        tls.client_settings_from_env({**env, tls.ENV_CERTIFICATE: str(certs.client.cert)})
    with pytest.raises(UsageError, match="no trust store"):
        tls.client_settings_from_env({tls.ENV_TLS: "1"})


def test_contexts_as_java_sets_them_up(certs: Certificates, tmp_path: Path) -> None:
    server = tls.server_context(tls.TlsSettings(certs.bookie.cert, certs.bookie.key, trust_path=certs.ca))
    assert server.minimum_version == ssl.TLSVersion.TLSv1_2 and server.num_tickets == 0
    assert server.verify_mode == ssl.CERT_NONE  # no client certificate asked for without client_auth
    assert server.options & ssl.OP_NO_TICKET
    required = tls.server_context(
        tls.TlsSettings(certs.bookie.cert, certs.bookie.key, trust_path=certs.ca, client_auth=True)
    )
    assert required.verify_mode == ssl.CERT_REQUIRED
    client = tls.client_context(tls.TlsSettings(trust_path=certs.ca))
    assert client.verify_mode == ssl.CERT_REQUIRED and not client.check_hostname
    assert tls.client_context(tls.TlsSettings(trust_path=certs.ca, hostname_verification=True)).check_hostname
    # An encrypted key with its password in a file (tlsKeyStorePasswordPath).
    key = serialization.load_pem_private_key(certs.bookie.key.read_bytes(), None)
    encrypted = tmp_path / "encrypted.key.pem"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    password = tmp_path / "password"
    password.write_text("secret\n")
    tls.server_context(tls.TlsSettings(certs.bookie.cert, encrypted, password))
    password.write_text("wrong\n")
    with pytest.raises(UsageError, match="TLS certificate"):
        tls.server_context(tls.TlsSettings(certs.bookie.cert, encrypted, password))
