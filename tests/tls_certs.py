"""Certificates for the TLS tests, made on the spot with `cryptography`: a CA, a bookie certificate
(for localhost and 127.0.0.1) and a client certificate signed by it, and a second, unrelated CA with
its own bookie certificate (the "wrong CA" cases). Keys are EC P-256 in unencrypted PKCS#8 PEM, the
form Java's TLSContextFactory (netty) reads as well.

`python -m tests.tls_certs DIR` writes the same files for checks outside the suite (benchmarks/java_tls.sh).
"""

from __future__ import annotations

import datetime
import ipaddress
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 30


@dataclass(frozen=True)
class Pem:
    """One certificate and its key, as files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Certificates:
    ca: Path  # CA bundle (trust store)
    bookie: Pem
    client: Pem
    other_ca: Path  # a CA that signed neither of the above
    other_bookie: Pem  # a bookie certificate from other_ca
    other_client: Pem  # a client certificate from other_ca
    elsewhere: Pem  # a bookie certificate from ca for the host elsewhere.test only (not 127.0.0.1)


def write_certificates(directory: Path) -> Certificates:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("bkctl test CA")
    other_key, other_cert = _ca("some other CA")
    ca = _write_cert(directory / "ca.pem", ca_cert)
    other_ca = _write_cert(directory / "other-ca.pem", other_cert)
    bookie = _leaf(directory, "bookie", ca_key, ca_cert, server=True)
    client = _leaf(directory, "client", ca_key, ca_cert, server=False)
    other_bookie = _leaf(directory, "other-bookie", other_key, other_cert, server=True)
    other_client = _leaf(directory, "other-client", other_key, other_cert, server=False)
    elsewhere = _leaf(
        directory, "elsewhere", ca_key, ca_cert, server=True, names=[x509.DNSName("elsewhere.test")]
    )
    return Certificates(ca, bookie, client, other_ca, other_bookie, other_client, elsewhere)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def _ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(common_name, _name(common_name), key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    directory: Path,
    name: str,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    *,
    server: bool,
    names: list[x509.GeneralName] | None = None,
) -> Pem:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    names = names or [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        _builder(f"{name}.bkctl.test", ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key_path = directory / f"{name}.key.pem"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return Pem(_write_cert(directory / f"{name}.pem", cert), key_path)


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


if __name__ == "__main__":
    print(write_certificates(Path(sys.argv[1])))
