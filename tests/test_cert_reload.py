"""tlsCertFilesRefreshDurationSeconds: a changed certificate is loaded for new connections; a file
that does not load keeps the current context and is tried again."""

from __future__ import annotations

import os
import shutil
import ssl
from pathlib import Path

from twisted.internet import task

from bkctl.server.cert_reload import CertificateReloader
from bkctl.tls import JAVA_PROVIDER_FACTORY, server_settings
from tests.tls_certs import write_certificates


def test_reload_on_change_and_keep_on_a_bad_file(tmp_path: Path) -> None:
    certs = write_certificates(tmp_path / "certs")
    cert, key = tmp_path / "bookie.pem", tmp_path / "bookie.key"
    shutil.copy(certs.bookie.cert, cert)
    shutil.copy(certs.bookie.key, key)
    settings = server_settings(
        {
            "tlsProviderFactoryClass": JAVA_PROVIDER_FACTORY,
            "tlsCertificatePath": str(cert),
            "tlsKeyStore": str(key),
            "tlsCertFilesRefreshDurationSeconds": "60",
        }
    )
    assert settings is not None and settings.refresh_s == 60
    used: list[ssl.SSLContext] = []
    clock = task.Clock()
    reloader = CertificateReloader(settings, used.append, clock, settings.refresh_s)
    reloader.start()
    clock.advance(60)
    assert used == []  # nothing changed

    cert.write_text("not a certificate")  # half written
    os.utime(cert, ns=(1, 1))
    clock.advance(60)
    assert used == []  # kept the current context

    shutil.copy(certs.elsewhere.cert, cert)
    shutil.copy(certs.elsewhere.key, key)
    clock.advance(60)
    assert len(used) == 1 and isinstance(used[0], ssl.SSLContext)
    clock.advance(60)
    assert len(used) == 1
    reloader.stop()


def test_the_client_looks_again_after_the_period_and_keeps_a_bad_file(tmp_path: Path) -> None:
    from bkctl.tls import TlsSettings, client_context

    certs = write_certificates(tmp_path / "certs")
    trust = tmp_path / "ca.pem"
    shutil.copy(certs.ca, trust)
    settings = TlsSettings(trust_path=trust, refresh_s=30)
    now = [1000.0]
    first = client_context(settings, clock=lambda: now[0])

    shutil.copy(certs.other_ca, trust)  # changed, but the period has not passed: not looked at
    os.utime(trust, ns=(2, 2))
    now[0] += 29
    assert client_context(settings, clock=lambda: now[0]) is first
    now[0] += 1
    second = client_context(settings, clock=lambda: now[0])
    assert second is not first

    trust.write_text("not a certificate")  # half written: the current context stays
    os.utime(trust, ns=(3, 3))
    now[0] += 30
    assert client_context(settings, clock=lambda: now[0]) is second
