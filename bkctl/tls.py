"""TLS between clients and bookies: settings from BookKeeper's configuration keys (PEM files, or PKCS12
and JKS stores through bkctl/keystores.py) and
the standard library's `ssl.SSLContext` each side's TlsChannel (bkctl/tls_channel.py) wraps once the
v3 START_TLS exchange succeeded.

What Java BookKeeper 4.14.8 does (TLSContextFactory), and so what bkctl does:
- TLS is on when `tlsProviderFactoryClass` is set. A bookie with it answers START_TLS with EOK and
  switches the connection to TLS; one without it answers EBADREQ (the client then gives up on the
  connection). A bookie with TLS on still serves clients that never ask for it.
- The bookie presents `tlsCertificatePath` + `tlsKeyStore`; with `tlsClientAuthentication` it requires
  a client certificate signed by a CA of `tlsTrustStore`, else it asks for none.
- The client verifies the bookie's certificate chain against `tlsTrustStore` (required); the host name
  is checked only with `tlsHostnameVerificationEnabled` (default false); with `tlsClientAuthentication`
  it presents its own `tlsCertificatePath` + `tlsKeyStore`.
- After the upgrade the connection carries whichever protocol the client speaks: v2 frames are fine.
- `tlsCertFilesRefreshDurationSeconds` (both sides): files that changed are loaded again. The bookie
  looks every so often (server/cert_reload.py); the client, as Java's TLSContextFactory, looks when it
  makes a connection at least that long after it last looked (`client_context`): new connections use
  the new files, connections already made keep theirs, and files that do not load keep the current
  context (logged; looked at again next time).

Configuration code; `ssl` is imported where a context is built (`bkctl --help` stays fast).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from bkctl.errors import UsageError
from bkctl.keystores import read_small_file
from bkctl.properties import properties_from_env

if TYPE_CHECKING:
    import ssl

JAVA_PROVIDER_FACTORY: Final = "org.apache.bookkeeper.tls.TLSContextFactory"
BKCTL_PROVIDER_FACTORY: Final = "bkctl.tls"
PROVIDER_FACTORIES: Final = (JAVA_PROVIDER_FACTORY, BKCTL_PROVIDER_FACTORY)
STORE_TYPE: Final = "PEM"  # the default; PKCS12 and JKS stores are turned into PEM (bkctl/keystores.py)
REFRESH_KEY: Final = "tlsCertFilesRefreshDurationSeconds"
log = logging.getLogger("bkctl.tls")

# Java's keys. The client also reads clientKeyStore/clientTrustStore (and their types) first, as Java's
# ClientConfiguration does; the bookie reads the tls* keys only.
SERVER_KEYS: Final = (
    "tlsProviderFactoryClass",
    "tlsProvider",
    "tlsCertificatePath",
    "tlsKeyStore",
    "tlsKeyStoreType",
    "tlsKeyStorePasswordPath",
    "tlsTrustStore",
    "tlsTrustStoreType",
    "tlsTrustStorePasswordPath",
    "tlsClientAuthentication",
    "tlsCertFilesRefreshDurationSeconds",
    "tlsRequired",  # bkctl's: the bookie serves nothing but START_TLS and AUTH before the handshake
)
CLIENT_KEYS: Final = (
    *SERVER_KEYS[:-1],
    "clientKeyStore",
    "clientKeyStoreType",
    "clientKeyStorePasswordPath",
    "clientTrustStore",
    "clientTrustStoreType",
    "tlsHostnameVerificationEnabled",
)


@dataclass(frozen=True)
class TlsSettings:
    """One side's TLS files and switches (paths as given; checked when a context is built)."""

    certificate_path: Path | None = None  # PEM certificate chain presented to the peer
    key_path: Path | None = None  # PEM private key (PKCS#8 or traditional; Java needs PKCS#8)
    key_password_path: Path | None = None  # a file holding the key's passphrase, if it is encrypted
    trust_path: Path | None = None  # PEM CA bundle the peer's certificate must chain to
    client_auth: bool = False  # bookie: require a client certificate; client: present one
    hostname_verification: bool = False  # client only: the bookie's certificate must name its host
    required: bool = False  # bookie only (tlsRequired): no request served before the TLS handshake
    key_store_type: str = STORE_TYPE  # PKCS12 / JKS: key_path is a store of the key and its chain
    trust_store_type: str = STORE_TYPE  # PKCS12 / JKS: trust_path is a store of certificates
    trust_password_path: Path | None = None  # the trust store's password file (PKCS12 / JKS)
    refresh_s: int = 0  # tlsCertFilesRefreshDurationSeconds: reload changed files; 0: never

    @property
    def files(self) -> tuple[Path, ...]:
        """The files a context is built from, the ones a reload looks at."""
        paths = (self.certificate_path, self.key_path, self.key_password_path, self.trust_path)
        return tuple(path for path in paths if path is not None)


def server_settings(properties: Mapping[str, str]) -> TlsSettings | None:
    """A bookie's TLS settings from bk_server.conf keys; None when TLS is off. UsageError names the key."""
    if not _enabled(properties):
        if _flag(properties, "tlsRequired"):
            raise UsageError("config key tlsRequired: needs TLS on (tlsProviderFactoryClass)")
        return None
    settings = TlsSettings(
        certificate_path=_path(properties, "tlsCertificatePath"),
        key_path=_path(properties, "tlsKeyStore", "tlsKeyStoreType"),
        key_password_path=_path(properties, "tlsKeyStorePasswordPath"),
        trust_path=_path(properties, "tlsTrustStore", "tlsTrustStoreType"),
        client_auth=_flag(properties, "tlsClientAuthentication"),
        required=_flag(properties, "tlsRequired"),
        key_store_type=_kind(properties, "tlsKeyStoreType"),
        trust_store_type=_kind(properties, "tlsTrustStoreType"),
        trust_password_path=_path(properties, "tlsTrustStorePasswordPath"),
        refresh_s=_seconds(properties, REFRESH_KEY),
    )
    if settings.key_path is None or (
        settings.certificate_path is None and settings.key_store_type == STORE_TYPE
    ):
        raise UsageError("TLS is on (tlsProviderFactoryClass) but tlsCertificatePath or tlsKeyStore is unset")
    if settings.client_auth and settings.trust_path is None:
        raise UsageError("config key tlsClientAuthentication: needs tlsTrustStore (the clients' CA bundle)")
    return settings


def client_settings(properties: Mapping[str, str]) -> TlsSettings | None:
    """A client's TLS settings from Java client-configuration keys; None when TLS is off."""
    if not _enabled(properties):
        return None
    settings = TlsSettings(
        certificate_path=_path(properties, "tlsCertificatePath"),
        key_path=_path(properties, "clientKeyStore", "clientKeyStoreType")
        or _path(properties, "tlsKeyStore", "tlsKeyStoreType"),
        key_password_path=_path(properties, "clientKeyStorePasswordPath")
        or _path(properties, "tlsKeyStorePasswordPath"),
        trust_path=_path(properties, "clientTrustStore", "clientTrustStoreType")
        or _path(properties, "tlsTrustStore", "tlsTrustStoreType"),
        client_auth=_flag(properties, "tlsClientAuthentication"),
        hostname_verification=_flag(properties, "tlsHostnameVerificationEnabled"),
        key_store_type=_kind(
            properties, "clientKeyStoreType" if "clientKeyStore" in properties else "tlsKeyStoreType"
        ),
        trust_store_type=_kind(
            properties, "clientTrustStoreType" if "clientTrustStore" in properties else "tlsTrustStoreType"
        ),
        trust_password_path=_path(properties, "clientTrustStorePasswordPath")
        or _path(properties, "tlsTrustStorePasswordPath"),
        refresh_s=_seconds(properties, REFRESH_KEY),
    )
    if settings.trust_path is None:
        raise UsageError("TLS is on but no trust store is set (tlsTrustStore: the bookies' CA bundle)")
    pem_identity = settings.key_store_type == STORE_TYPE
    if settings.client_auth and (
        settings.key_path is None or (settings.certificate_path is None and pem_identity)
    ):
        raise UsageError("config key tlsClientAuthentication: needs tlsCertificatePath and tlsKeyStore")
    return settings


def _enabled(properties: Mapping[str, str]) -> bool:
    factory = properties.get("tlsProviderFactoryClass", "").strip()
    if not factory:
        return False
    if factory not in PROVIDER_FACTORIES:
        raise UsageError(
            f"config key tlsProviderFactoryClass: {factory!r} is not one of {', '.join(PROVIDER_FACTORIES)}"
        )
    return True


def _path(properties: Mapping[str, str], key: str, type_key: str | None = None) -> Path | None:
    value = properties.get(key, "").strip()
    if type_key is not None:
        _kind(properties, type_key)
    return Path(value).expanduser() if value else None


def _kind(properties: Mapping[str, str], type_key: str) -> str:
    """A store type key's value: PEM (the default), PKCS12 or JKS; UsageError otherwise."""
    from bkctl.keystores import TYPES

    kind = properties.get(type_key, STORE_TYPE).strip().upper() or STORE_TYPE
    if kind not in TYPES:
        raise UsageError(f"config key {type_key}: {kind} is not one of {', '.join(TYPES)}")
    return kind


def _seconds(properties: Mapping[str, str], key: str) -> int:
    text = properties.get(key, "0").strip() or "0"
    if not text.isdigit() or int(text) > 86_400 * 365:
        raise UsageError(f"config key {key}: {text!r} is not a number of seconds (0: off)")
    return int(text)


def _flag(properties: Mapping[str, str], key: str) -> bool:
    text = properties.get(key, "false").strip().lower()
    if text not in ("true", "false"):
        raise UsageError(f"config key {key}: {text!r} is not true or false")
    return text == "true"


# --- the standard library's contexts ------------------------------------------------------------------


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """The bookie's side: its certificate and key; with client_auth, a client certificate is required."""
    import ssl

    context = _context(ssl.PROTOCOL_TLS_SERVER)
    _load_identity(context, settings)
    if settings.client_auth:
        assert settings.trust_path is not None  # server_settings checked it
        _load_trust(context, settings.trust_path, settings.trust_store_type, settings.trust_password_path)
        context.verify_mode = ssl.CERT_REQUIRED  # no certificate, or one not from the trust store: refused
    return context


Stamp = tuple[tuple[str, int, int] | None, ...]


def files_stamp(paths: tuple[Path, ...]) -> Stamp:
    """What tells a changed file: its path, modification time and size (None: unreadable now)."""
    return tuple(_file_stamp(path) for path in paths)


def _file_stamp(path: Path) -> tuple[str, int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return str(path), status.st_mtime_ns, status.st_size


@dataclass
class _Loaded:
    context: ssl.SSLContext
    stamp: Stamp
    looked_at: float


_CLIENT_CONTEXTS: dict[TlsSettings, _Loaded] = {}
_CLIENT_CONTEXTS_LOCK = threading.Lock()
CLIENT_CONTEXTS_MAX: Final = 8  # local bound: settings a process keeps a context for


def client_context(settings: TlsSettings, clock: Callable[[], float] = time.monotonic) -> ssl.SSLContext:
    """The client's context for a new connection: built once per settings (it reads the files, and
    connections are made on the reactor thread), built again when `refresh_s` passed since the files
    were last looked at and one of them changed; files that do not load keep the current context."""
    now = clock()
    with _CLIENT_CONTEXTS_LOCK:
        loaded = _CLIENT_CONTEXTS.get(settings)
        if loaded is None:
            stamp = files_stamp(settings.files)
            loaded = _Loaded(_client_context(settings), stamp, now)
            if len(_CLIENT_CONTEXTS) >= CLIENT_CONTEXTS_MAX:
                _CLIENT_CONTEXTS.pop(next(iter(_CLIENT_CONTEXTS)))
            _CLIENT_CONTEXTS[settings] = loaded
        elif settings.refresh_s > 0 and now - loaded.looked_at >= settings.refresh_s:
            loaded.looked_at = now
            stamp = files_stamp(settings.files)
            if stamp != loaded.stamp:
                try:
                    loaded.context = _client_context(settings)
                except UsageError as exc:
                    log.warning("TLS files changed but do not load, keeping the current ones: %s", exc)
                else:
                    loaded.stamp = stamp
                    log.info("TLS client certificate files reloaded; new connections use them")
        return loaded.context


def _client_context(settings: TlsSettings) -> ssl.SSLContext:
    """The client's side: the bookie's chain must reach the trust store; its host name is checked only
    with hostname_verification (the channel then passes the host dialled as `server_hostname`, and
    OpenSSL matches it against the certificate's DNS names, one `*.` label allowed, or IP addresses, as
    Java's HTTPS endpoint identification does)."""
    import ssl

    context = _context(ssl.PROTOCOL_TLS_CLIENT)  # verify_mode CERT_REQUIRED
    context.check_hostname = settings.hostname_verification
    if settings.client_auth:
        _load_identity(context, settings)
    assert settings.trust_path is not None  # client_settings checked it
    _load_trust(context, settings.trust_path, settings.trust_store_type, settings.trust_password_path)
    return context


def _context(protocol: int) -> ssl.SSLContext:
    import ssl

    context = ssl.SSLContext(protocol)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # Nothing to resume, as with Java's TLSContextFactory: no TLS 1.3 tickets, no TLS 1.2 tickets. (The
    # standard library cannot turn OpenSSL's server-side session-id cache off; bkctl's clients never
    # offer a session to resume.)
    if protocol == ssl.PROTOCOL_TLS_SERVER:
        context.num_tickets = 0
    context.options |= ssl.OP_NO_TICKET
    return context


def _load_identity(context: ssl.SSLContext, settings: TlsSettings) -> None:
    import ssl

    from bkctl.tls_channel import describe

    assert settings.key_path is not None
    if settings.key_store_type != STORE_TYPE:
        _load_store_identity(context, settings)
        return
    assert settings.certificate_path is not None
    password = read_small_file(settings.key_password_path).strip() if settings.key_password_path else None
    certificate = _existing(settings.certificate_path, "tlsCertificatePath")
    key = _existing(settings.key_path, "tlsKeyStore")
    try:
        context.load_cert_chain(certificate, key, password=password)
    except ssl.SSLError as exc:
        raise UsageError(
            f"TLS certificate {settings.certificate_path} / key {settings.key_path}: {describe(exc)}"
        ) from None


def _load_store_identity(context: ssl.SSLContext, settings: TlsSettings) -> None:
    """A PKCS12 / JKS key store: its key and chain, through a private temporary PEM file (the standard
    library loads a chain from a file only), removed at once."""
    import os
    import ssl
    import tempfile

    from bkctl.keystores import identity_pem, read_password
    from bkctl.tls_channel import describe

    assert settings.key_path is not None
    chain, key = identity_pem(
        _existing(settings.key_path, "tlsKeyStore"),
        settings.key_store_type,
        read_password(settings.key_password_path),
    )
    descriptor, name = tempfile.mkstemp(prefix="bkctl-identity-", suffix=".pem")  # mode 0600
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(chain + key)
        context.load_cert_chain(name)
    except ssl.SSLError as exc:
        raise UsageError(f"TLS key store {settings.key_path}: {describe(exc)}") from None
    finally:
        os.unlink(name)


def _load_trust(
    context: ssl.SSLContext, trust_path: Path, kind: str = STORE_TYPE, password_path: Path | None = None
) -> None:
    import ssl

    from bkctl.tls_channel import describe

    if kind != STORE_TYPE:
        from bkctl.keystores import read_password, trust_pem

        bundle = trust_pem(_existing(trust_path, "tlsTrustStore"), kind, read_password(password_path))
        context.load_verify_locations(cadata=bundle.decode())
        return

    # No client-CA list is sent: a peer then offers its certificate whatever CA signed it (Java's key
    # manager skips a certificate whose issuer is not in a non-empty list).
    if b"-----BEGIN CERTIFICATE-----" not in read_small_file(_existing(trust_path, "tlsTrustStore")):
        raise UsageError(f"TLS trust store {trust_path}: no PEM certificate in the file")
    try:
        context.load_verify_locations(cafile=trust_path)
    except ssl.SSLError as exc:
        raise UsageError(f"TLS trust store {trust_path}: {describe(exc)}") from None


def _existing(path: Path, key: str) -> Path:
    if not path.is_file():
        raise UsageError(f"{key}: {path} is not a readable file")
    return path


# --- the client's settings from bkctl's global options (cli.py puts them in the environment) ------------

ENV_TLS: Final = "BKCTL_TLS"  # "1": TLS to every bookie
ENV_TRUST_STORE: Final = "BKCTL_TLS_TRUST_STORE"
ENV_CERTIFICATE: Final = "BKCTL_TLS_CERT"
ENV_KEY: Final = "BKCTL_TLS_KEY"
ENV_HOSTNAME_VERIFICATION: Final = "BKCTL_TLS_HOSTNAME_VERIFICATION"


def client_settings_from_env(environ: Mapping[str, str]) -> TlsSettings | None:
    """`--tls` and its files (env BKCTL_TLS*) as Java client keys; the client certificate is presented
    when both --tls-cert and --tls-key are given; `tlsCertFilesRefreshDurationSeconds` comes from
    `--conf`. The files are loaded once here, so a bad one is a usage error before any connection."""
    if environ.get(ENV_TLS, "") not in ("1", "true"):
        return None
    certificate, key = environ.get(ENV_CERTIFICATE, ""), environ.get(ENV_KEY, "")
    if bool(certificate) != bool(key):
        raise UsageError("--tls-cert and --tls-key go together (the client's certificate and its key)")
    properties = {
        "tlsProviderFactoryClass": BKCTL_PROVIDER_FACTORY,
        "tlsTrustStore": environ.get(ENV_TRUST_STORE, ""),
        "tlsCertificatePath": certificate,
        "tlsKeyStore": key,
        "tlsClientAuthentication": "true" if certificate else "false",
        "tlsHostnameVerificationEnabled": str(environ.get(ENV_HOSTNAME_VERIFICATION) == "1").lower(),
        REFRESH_KEY: properties_from_env().get(REFRESH_KEY, "0"),  # from --conf, as Java's client conf
    }
    settings = client_settings(properties)
    if settings is not None:
        client_context(settings)
    return settings
