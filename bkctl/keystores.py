"""Java's key and trust stores (`tlsKeyStoreType` / `tlsTrustStoreType` PKCS12 or JKS) as PEM, for the
standard library's `ssl.SSLContext` (bkctl/tls.py), which reads PEM only.

PKCS12 through `cryptography`, JKS through `pyjks`; the store's password comes from Java's password
file (`tlsKeyStorePasswordPath`, `tlsTrustStorePasswordPath`: the file's first line). A key store
gives the first private key and its certificate chain, as Java's key manager presents; a trust store
gives every certificate it holds. Any failure is one UsageError naming the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from bkctl.errors import UsageError

STORE_FILE_SIZE_MAX: Final = 1024 * 1024  # local bound
TYPES: Final = ("PEM", "PKCS12", "JKS")


def read_password(path: Path | None) -> bytes | None:
    """Java's password file: its first line (no newline); None without a file."""
    if path is None:
        return None
    data = read_small_file(path)
    return data.splitlines()[0] if data.strip() else b""


def identity_pem(path: Path, kind: str, password: bytes | None) -> tuple[bytes, bytes]:
    """(certificate chain PEM, unencrypted PKCS#8 key PEM) of a PKCS12 or JKS key store."""
    if kind == "JKS":
        return _jks_identity(path, password)
    from cryptography.hazmat.primitives.serialization import pkcs12

    try:
        key, certificate, extra = pkcs12.load_key_and_certificates(read_small_file(path), password)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"PKCS12 key store {path}: {exc} (wrong password file?)") from None
    if key is None or certificate is None:
        raise UsageError(f"PKCS12 key store {path} holds no private key with its certificate")
    return _pem_certificates([certificate, *extra]), _pem_key(key)


def trust_pem(path: Path, kind: str, password: bytes | None) -> bytes:
    """Every certificate of a PKCS12 or JKS trust store, as one PEM bundle."""
    if kind == "JKS":
        return _jks_trust(path, password)
    from cryptography.hazmat.primitives.serialization import pkcs12

    try:
        store = pkcs12.load_pkcs12(read_small_file(path), password)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"PKCS12 trust store {path}: {exc} (wrong password file?)") from None
    certificates = [c.certificate for c in store.additional_certs]
    if store.cert is not None:
        certificates.insert(0, store.cert.certificate)
    if not certificates:
        raise UsageError(f"PKCS12 trust store {path} holds no certificate")
    return _pem_certificates(certificates)


def _jks(path: Path, password: bytes | None) -> object:
    try:
        import jks
    except ImportError:
        raise UsageError(
            f"JKS store {path}: install pyjks, or convert it: keytool -importkeystore -srckeystore {path} "
            f"-destkeystore {path.with_suffix('.p12')} -deststoretype PKCS12 (then the type PKCS12)"
        ) from None
    try:
        return jks.KeyStore.loads(read_small_file(path), (password or b"").decode())
    except Exception as exc:  # pyjks raises its own errors and struct/ValueError on junk
        raise UsageError(f"JKS store {path}: {exc} (wrong password file?)") from None


def _jks_identity(path: Path, password: bytes | None) -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives.serialization import load_der_private_key
    from cryptography.x509 import load_der_x509_certificate

    store = _jks(path, password)
    keys = list(getattr(store, "private_keys", {}).values())
    if not keys:
        raise UsageError(f"JKS key store {path} holds no private key")
    entry = keys[0]
    if not entry.is_decrypted():
        entry.decrypt((password or b"").decode())
    key = load_der_private_key(entry.pkey_pkcs8, None)
    chain = [load_der_x509_certificate(der) for _, der in entry.cert_chain]
    return _pem_certificates(chain), _pem_key(key)


def _jks_trust(path: Path, password: bytes | None) -> bytes:
    from cryptography.x509 import load_der_x509_certificate

    store = _jks(path, password)
    certificates = [load_der_x509_certificate(c.cert) for c in getattr(store, "certs", {}).values()]
    if not certificates:
        raise UsageError(f"JKS trust store {path} holds no trusted certificate")
    return _pem_certificates(certificates)


def _pem_certificates(certificates: Sequence[object]) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding

    return b"".join(c.public_bytes(Encoding.PEM) for c in certificates)  # type: ignore[attr-defined]


def _pem_key(key: object) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())  # type: ignore[attr-defined, no-any-return]


def read_small_file(path: Path) -> bytes:
    """A key store, PEM or password file, bounded; an unreadable one is one UsageError line."""
    try:
        if path.stat().st_size > STORE_FILE_SIZE_MAX:
            raise UsageError(f"{path} is larger than {STORE_FILE_SIZE_MAX} bytes")
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
