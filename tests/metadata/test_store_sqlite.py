"""What only the SQLite backend has: the file, its schema, leases and the change log."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bkctl.errors import ExitCode, UnavailableError
from bkctl.metadata.sqlite import SqliteStore, inspect_database, reap_expired_sessions
from bkctl.metadata.store import Stat
from bkctl.metadata.stores import open_store
from tests.metadata.test_store_contract import Recorder


def test_garbage_file_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "metadata.db"
    path.write_bytes(b"this is not a database, just text. " * 200)
    with pytest.raises(UnavailableError) as info:  # connect_timeout_ms bounds the wait
        open_store(f"sqlite://{path}", connect_timeout_ms=1000)
    assert info.value.exit_code == ExitCode.UNAVAILABLE
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_directory_or_missing_directory_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(UnavailableError, match="directory"):
        SqliteStore(tmp_path)
    with pytest.raises(UnavailableError, match="does not exist"):
        SqliteStore(tmp_path / "missing" / "metadata.db")


def test_default_location_is_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BKCTL_HOME", str(tmp_path / "new" / "home"))
    with open_store("sqlite://") as store:
        store.create("/x")
    assert (tmp_path / "new" / "home" / "metadata.db").is_file()


def test_schema_wal_and_inspection(tmp_path: Path) -> None:
    path = tmp_path / "metadata.db"
    with SqliteStore(path) as store:
        store.create("/a", b"1")
        store.create("/e", ephemeral=True)
        info = inspect_database(path)
        assert info["schema_version"] == "1"
        tables = info["tables"]
        assert isinstance(tables, dict)
        assert tables["nodes"] == 3 and tables["sessions"] == 1 and tables["changelog"] == 2
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()
    assert inspect_database(path)["sessions"] == []


def test_two_stores_share_one_file_safely(tmp_path: Path) -> None:
    path = tmp_path / "metadata.db"
    with SqliteStore(path) as one, SqliteStore(path) as two:
        assert one.session_id != two.session_id
        one.create("/shared", b"0")
        assert two.get("/shared")[0] == b"0"


def test_reaper_removes_expired_sessions(tmp_path: Path) -> None:
    path = tmp_path / "metadata.db"
    with SqliteStore(path) as store:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            # A session whose process vanished long ago, with an ephemeral node.
            conn.execute(
                "INSERT INTO sessions(id, timeout_ms, expires_at_ms, created_ms, owner)"
                " VALUES (999, 1, 1, 1, 'x')"
            )
            conn.execute(
                "INSERT INTO nodes(path, parent, name, data, ctime_ms, mtime_ms, czxid, mzxid, pzxid,"
                " ephemeral_owner) VALUES ('/ghost', '/', 'ghost', x'', 1, 1, 0, 0, 0, 999)"
            )
            conn.execute("UPDATE nodes SET num_children = num_children + 1 WHERE path = '/'")
            assert reap_expired_sessions(conn) == [999]
            assert reap_expired_sessions(conn) == []
        finally:
            conn.close()
        assert store.exists("/ghost") is None
        assert store.get("/")[1].num_children == 0


def test_pruned_change_log_makes_watches_reread(tmp_path: Path) -> None:
    """A poller that fell behind the change log's retention re-reads every watched node."""
    path = tmp_path / "metadata.db"
    with SqliteStore(path) as watcher, SqliteStore(path) as writer:
        writer.create("/x", b"0")
        seen = Recorder()
        watcher.watch_data("/x", seen.data)
        with watcher._events.lock:  # the poller waits here: it falls behind
            writer.set("/x", b"1")
            conn = sqlite3.connect(path, isolation_level=None)
            conn.execute("DELETE FROM changelog")
            conn.close()
            writer.create("/unrelated")
        seen.wait_for((b"1", 1))


def test_watch_callbacks_run_on_the_events_thread(tmp_path: Path) -> None:
    names: list[str] = []
    done = threading.Event()

    def callback(data: bytes | None, stat: Stat | None) -> None:
        names.append(threading.current_thread().name)
        if stat is not None:
            done.set()

    with SqliteStore(tmp_path / "m.db") as store:
        store.watch_data("/n", callback)
        store.create("/n")
        assert done.wait(5)
    assert names[-1] == "bkctl-sqlite-events"


def test_opening_a_store_loads_neither_pandas_nor_numpy(tmp_path: Path) -> None:
    """sqlite-utils imports both when installed (0.7 s of CPU per process); the store hides them from it,
    and they stay importable afterwards."""
    script = (
        "import sys\n"
        "from bkctl.metadata.sqlite import SqliteStore\n"
        f"SqliteStore({str(tmp_path / 'm.db')!r}).close()\n"
        "print(sorted(m for m in ('pandas', 'numpy') if m in sys.modules))\n"
        "import numpy\n"
        "print(numpy.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "numpy"]
