"""`bkctl bookie start` refuses what it cannot serve, before it writes any file, as a real process:
DbLedgerStorage configured (exit 2), a DbLedgerStorage-shaped ledger directory under the interleaved
configuration (exit 10), a damaged index header with acknowledged entries only in the journal
(exit 7, naming the file and `bkctl index rebuild`). Each time every file stays as it was."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bkctl.errors import ExitCode
from bkctl.protocol import index_format as ixf
from tests.conftest import REPO
from tests.server.test_corrupt_files import flip
from tests.server_net.live import BookieProcess, bookie_flags, metadata_uri
from tests.server_net.test_process import check_all_readable, dir_args
from tests.server_net.wire_client import WireClient

pytestmark = pytest.mark.slow

OTHER_CLASS = "org.example.bookie.CustomLedgerStorage"


def snapshot(base: Path) -> dict[str, str]:
    """Every file under `base` and its digest (the lock file beside `current/` is the bookie's own)."""
    return {
        str(path.relative_to(base)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(base.rglob("*"))
        if path.is_file() and path.name != "bkctl.lock"
    }


def refused(args: list[str], code: ExitCode) -> BookieProcess:
    bookie = BookieProcess(args)
    assert bookie.wait_exit() == code, bookie.stderr
    return bookie


def conf(tmp_path: Path, uri: str, **keys: str) -> Path:
    path = tmp_path / "bk_server.conf"
    flags = bookie_flags(tmp_path / "b1", metadataServiceUri=uri, **keys)
    path.write_text("".join(f"{k}={v}\n" for k, v in flags.items()))
    return path


def test_an_unknown_ledger_storage_class_refuses_exit_2_writes_nothing(tmp_path: Path) -> None:
    path = conf(tmp_path, metadata_uri(tmp_path), ledgerStorageClass=OTHER_CLASS)
    bookie = refused(["--conf", str(path)], ExitCode.USAGE)
    assert f"ledgerStorageClass={OTHER_CLASS}: a storage bkctl does not know" in bookie.stderr
    assert not (tmp_path / "b1").exists()  # not even a directory or a lock file


def test_db_shaped_directory_under_interleaved_refuses_exit_10_files_unchanged(tmp_path: Path) -> None:
    base = tmp_path / "b1"
    current = base / "ledgers" / "current"
    for name in ("ledgers", "locations"):
        (current / name).mkdir(parents=True)
        (current / name / "CURRENT").write_text("MANIFEST-000001\n")
    (current / "0.log").write_bytes(b"BKLO" + bytes(2000))
    (current / "lastId").write_text("0")
    before = snapshot(base)
    bookie = refused([*dir_args(base), "--metadata", metadata_uri(tmp_path)], ExitCode.CONFLICT)
    assert f"{current} holds DbLedgerStorage files but interleaved storage is configured" in bookie.stderr
    assert snapshot(base) == before


def test_unused_keys_warned_once_auth_provider_refused(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    path = conf(tmp_path, uri, bookieAuthProviderFactoryClass="org.example.SaslProvider")
    bookie = refused(["--conf", str(path)], ExitCode.USAGE)
    assert "config key bookieAuthProviderFactoryClass=org.example.SaslProvider" in bookie.stderr
    path = conf(tmp_path, uri, someJavaOnlyKey="x", entryLogFilePreallocationEnabled="true")
    bookie = BookieProcess(["--conf", str(path)])
    try:
        bookie.wait_serving()
        assert bookie.terminate() == 0
    finally:
        bookie.kill()
    warned = [line for line in bookie.lines if "config keys not implemented by bkctl" in line]
    assert len(warned) == 1 and "entryLogFilePreallocationEnabled, someJavaOnlyKey" in warned[0], warned


def checkpointed_then_journal_tail(base: Path, uri: str) -> tuple[int, dict[int, bytes]]:
    """Ledger 7: entries 0-99 checkpointed (a clean stop), 100-199 acknowledged then kill -9 (only in
    the journal). Returns the port and the acknowledged entries."""
    acked: dict[int, bytes] = {}
    port = 0
    for first, clean in ((0, True), (100, False)):
        bookie = BookieProcess([*dir_args(base), "--metadata", uri, "-p", str(port)])
        try:
            _, port = bookie.wait_serving()
            with WireClient("127.0.0.1", port) as client:
                for entry_id in range(first, first + 100):
                    acked[entry_id] = f"entry {entry_id}".encode() * 3
                    assert client.add(7, entry_id, acked[entry_id]).rc == 0
            if clean:
                assert bookie.terminate() == 0
        finally:
            bookie.kill()
    return port, acked


def bkctl_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bkctl", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_damaged_index_header_refused_unchanged_rebuilt_then_every_entry_reads_back(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b1"
    port, acked = checkpointed_then_journal_tail(base, uri)
    index = base / "ledgers" / "current" / ixf.index_path(7)
    flip(index, 0)
    before = snapshot(base)
    bookie = refused([*dir_args(base), "--metadata", uri, "-p", str(port)], ExitCode.CORRUPT)
    errors = [line for line in bookie.lines if "error:" in line]
    assert len(errors) == 1, bookie.stderr
    assert f"{index}: ledger 7: corrupt index header" in errors[0]
    assert "bkctl index rebuild" in errors[0] and "--ledger 7" in errors[0]
    assert snapshot(base) == before
    ledgers = str(base / "ledgers")
    check = bkctl_run("bookie", "check", "-l", ledgers, "-j", str(base / "journal"), "-o", "json")
    assert check.returncode == ExitCode.PROBLEMS_FOUND, check.stderr
    found = json.loads(check.stdout)  # entries 100-199 are only in the journal: not the entry logs'
    assert {(p["problem"], p["entry_id"]) for p in found["problems"]} == {
        ("index", None),
        *(("unreachable", e) for e in range(100)),
    }
    assert snapshot(base) == before  # read-only
    dry = bkctl_run("index", "rebuild", "-l", ledgers, "--ledger", "7", "--password", "secret",
                    "--metadata", uri, "--dry-run", "-o", "json")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    (row,) = json.loads(dry.stdout)
    assert (row["entries"], row["first_entry"], row["last_entry"]) == (100, 0, 99)  # the checkpointed ones
    assert row["key_from"] == "--password" and not row["written"]
    assert snapshot(base) == before
    done = bkctl_run("index", "rebuild", "-l", ledgers, "--ledger", "7", "--password", "secret",
                     "--metadata", uri, "-o", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    again = BookieProcess([*dir_args(base), "--metadata", uri, "-p", str(port)])
    try:
        again.wait_serving()  # replays the journal's entries 100-199 onto the rebuilt index
        check_all_readable(port, 7, acked)
        assert again.terminate() == 0
    finally:
        again.kill()
