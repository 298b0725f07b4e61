"""TLS as an operator uses it: `bkctl bookie start -c bk_server.conf` with Java's TLS keys (client
certificates required) and `bkctl --tls ...` commands; a wrong CA or a missing client certificate is one
error line and exit 6 (the bookie is unusable), a bad TLS option exit 2 before any connection."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkctl.errors import ExitCode
from tests.server_net.live import BookieProcess, metadata_uri
from tests.server_net.test_commands import bkctl
from tests.tls_certs import Certificates, write_certificates

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Certificates]:
    yield write_certificates(tmp_path_factory.mktemp("certs"))


def tls_options(certs: Certificates, *, trust: Path | None = None, with_cert: bool = True) -> list[str]:
    options = ["--tls", "--tls-trust-store", str(trust or certs.ca)]
    if with_cert:
        options += ["--tls-cert", str(certs.client.cert), "--tls-key", str(certs.client.key)]
    return options


def write(options: list[str], uri: str, entries: int = 20) -> tuple[int, str, str]:
    done = bkctl(*options, "ledger", "write", "-n", str(entries), "-E", "1", "-Qw", "1", "-Qa", "1",
                 "--metadata", uri, "-o", "json")  # fmt: skip
    return done.returncode, done.stdout, done.stderr


def test_tls_commands_against_a_bookie_requiring_client_certificates(
    tmp_path: Path, certs: Certificates
) -> None:
    uri = metadata_uri(tmp_path)
    conf = tmp_path / "bk_server.conf"
    conf.write_text(
        "tlsProviderFactoryClass=org.apache.bookkeeper.tls.TLSContextFactory\n"
        f"tlsCertificatePath={certs.bookie.cert}\ntlsKeyStoreType=PEM\ntlsKeyStore={certs.bookie.key}\n"
        f"tlsTrustStoreType=PEM\ntlsTrustStore={certs.ca}\ntlsClientAuthentication=true\n"
    )
    bookie = BookieProcess(["-c", str(conf), "-j", str(tmp_path / "j"), "-l", str(tmp_path / "l"),
                            "-p", "0", "--metadata", uri])  # fmt: skip
    try:
        bookie.wait_serving()
        code, out, err = write(tls_options(certs), uri)
        assert code == 0, err
        ledger = str(json.loads(out)["ledger_id"])
        read = bkctl(
            *tls_options(certs), "ledger", "read", ledger, "--as-text", "--metadata", uri, "-o", "json"
        )
        assert read.returncode == 0, read.stderr
        assert [row["payload"] for row in json.loads(read.stdout)][:2] == [f"L{ledger}-E0", f"L{ledger}-E1"]

        for options, why in (
            (tls_options(certs, trust=certs.other_ca), "certificate verify failed"),
            (tls_options(certs, with_cert=False), "certificate required"),
        ):
            code, _, err = write(options, uri)
            assert code == ExitCode.UNAVAILABLE, err
            lines = err.strip().splitlines()
            assert lines[-1].startswith("bkctl: error: ") and why in err  # a warning names the TLS cause
        assert "TLS handshake with 127.0.0.1:" in bookie.stderr  # the bookie logs the peer
    finally:
        bookie.kill()


def test_bad_tls_options_are_usage_errors(tmp_path: Path, certs: Certificates) -> None:
    uri = metadata_uri(tmp_path)
    for options, words in (
        (["--tls"], "no trust store"),
        (["--tls", "--tls-trust-store", str(tmp_path / "missing.pem")], "is not a readable file"),
        (["--tls", "--tls-trust-store", str(certs.ca), "--tls-cert", str(certs.client.cert)], "go together"),
    ):
        code, _, err = write(options, uri)
        assert code == ExitCode.USAGE, err
        assert words in err and err.strip().startswith("bkctl: error: ")


def test_autorecovery_in_a_tls_bookie_needs_a_trust_store(tmp_path: Path, certs: Certificates) -> None:
    # As Java's AutoRecoveryMain, the daemon talks TLS with the bookie's keys as a client's: without a
    # trust store it could not, so the bookie does not start (Java: "CA Certificate required").
    conf = tmp_path / "bk_server.conf"
    conf.write_text(
        "tlsProviderFactoryClass=org.apache.bookkeeper.tls.TLSContextFactory\n"
        f"tlsCertificatePath={certs.bookie.cert}\ntlsKeyStore={certs.bookie.key}\n"
    )
    started = bkctl("bookie", "start", "-c", str(conf), "-j", str(tmp_path / "j"), "-l", str(tmp_path / "l"),
                    "--autorecovery", "--metadata", metadata_uri(tmp_path))  # fmt: skip
    assert started.returncode == ExitCode.USAGE
    assert "no trust store" in started.stderr and len(started.stderr.strip().splitlines()) == 1
