"""Bad input to the metadata commands: unreachable stores, unreadable databases, malformed znodes.

Each gives one line on stderr and a documented exit code, never a hang or a traceback.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from bkctl.errors import ExitCode
from bkctl.metadata.layout import Layout
from tests.layout.conftest import LoadedDump
from tests.layout.test_commands import bkctl
from tests.server_net.test_commands import bkctl as bkctl_process


def run(*args: str) -> subprocess.CompletedProcess[str]:
    # The default connect timeout is 5 s; bkctl's 60 s bound leaves room for interpreter start-up and
    # slow CI. A command that hangs fails on it (TimeoutExpired); how fast it ends is for benchmarks/.
    return bkctl_process(*args)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("uri", ["zk://127.0.0.1:{port}/ledgers", "127.0.0.1:{port}"])
def test_unreachable_zookeeper_exits_6_in_time(uri: str) -> None:
    result = run("ledger", "list", "--metadata", uri.format(port=closed_port()))
    assert result.returncode == ExitCode.UNAVAILABLE
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "not reachable" in result.stderr
    assert "Traceback" not in result.stderr


def test_garbage_sqlite_file_exits_6(tmp_path: Path) -> None:
    database = tmp_path / "metadata.db"
    database.write_bytes(b"this is not a database, just garbage bytes\n" * 100)
    before = database.read_bytes()
    result = run("cluster", "info", "--metadata", f"sqlite://{database}")
    assert result.returncode == ExitCode.UNAVAILABLE
    assert result.stderr.startswith(f"bkctl: error: metadata database {database}")
    assert result.stderr.count("\n") == 1
    assert database.read_bytes() == before


def test_missing_sqlite_store_is_not_found_and_not_created(tmp_path: Path) -> None:
    result = run("bookie", "list", "--metadata", f"sqlite://{tmp_path}/nope/metadata.db")
    assert result.returncode == ExitCode.NOT_FOUND and result.stderr.count("\n") == 1
    assert not (tmp_path / "nope").exists()


def test_bad_metadata_uri_is_a_usage_error() -> None:
    result = run("ledger", "list", "--metadata", "etcd://somewhere")
    assert result.returncode == ExitCode.USAGE and result.stderr.count("\n") == 1


def test_uninitialized_store_is_not_found(tmp_path: Path) -> None:
    from bkctl.metadata.sqlite import SqliteStore

    SqliteStore(tmp_path / "metadata.db").close()  # a store, but no cluster in it
    result = run("ledger", "list", "--metadata", f"sqlite://{tmp_path}/metadata.db")
    assert result.returncode == ExitCode.NOT_FOUND
    assert (
        f"no BookKeeper cluster at /ledgers (/ledgers/LAYOUT is missing) in sqlite://{tmp_path}"
        in result.stderr
    )
    assert "bkctl cluster init" in result.stderr


def test_malformed_ledger_is_reported_and_skipped(
    capsys: pytest.CaptureFixture[str], dump5: LoadedDump
) -> None:
    dump5.store.create("/ledgers/00/0000/L0011", b"BookieMetadataFormatVersion\t3\n\xff\xff")
    dump5.store.create("/ledgers/00/0000/notaledger")
    code, out, err = bkctl(capsys, dump5, "ledger", "list", "-o", "plain")
    assert code == ExitCode.PROBLEMS_FOUND
    assert out == "".join(f"{i}\n" for i in range(12))  # listing ids does not read L0011
    assert err.splitlines() == [
        "bkctl: warning: /ledgers/00/0000/notaledger: foreign node in the ledger tree "
        "(expected L + 4 digits) (skipped)",
        "bkctl: error: 1 malformed or foreign metadata node(s) skipped, listed above",
    ]
    code, out, err = bkctl(capsys, dump5, "ledger", "list", "--bookie", "127.0.0.1:33184", "-o", "plain")
    assert code == ExitCode.PROBLEMS_FOUND and out == "".join(f"{i}\n" for i in range(11))
    assert "/ledgers/00/0000/L0011: bad metadata" in err
    code, out, err = bkctl(capsys, dump5, "ledger", "inspect", "11")
    assert (code, out) == (ExitCode.CORRUPT, "")
    assert err.startswith("bkctl: error: ledger 11 (/ledgers/00/0000/L0011): bad metadata:")


def test_malformed_mark_is_reported_and_skipped(
    capsys: pytest.CaptureFixture[str], dump5: LoadedDump
) -> None:
    Layout(dump5.store).mark_underreplicated(1, ["127.0.0.1:33183"], ctime_ms=5)
    path = "/ledgers/underreplication/ledgers/0000/0000/0000/0002/urL0000000002"
    dump5.store.create(path, b"replica: not-quoted", make_parents=True)
    code, out, err = bkctl(capsys, dump5, "underreplicated", "list", "-o", "plain")
    assert (code, out) == (ExitCode.PROBLEMS_FOUND, "1\t5\n")
    assert err.startswith(f"bkctl: warning: {path}: ")


def test_foreign_lock_and_vote_are_reported(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    dump5.store.create("/ledgers/underreplication/auditorelection/garbage")
    code, out, err = bkctl(capsys, dump5, "autorecovery", "status", "-o", "json")
    assert code == ExitCode.PROBLEMS_FOUND and '"enabled": true' in out
    assert "auditorelection/garbage: not an auditor vote" in err
