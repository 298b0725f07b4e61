"""The scratch directories of RocksDB secondary and read-only opens (compaction's scan process, offline
commands): a process killed -9 leaves its own behind, and the next open removes it, never a live one's."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bkctl.server.rocksdb_store import SCRATCH_PREFIX, KeyValueDb, sweep_scratch
from tests.conftest import REPO

_HOLDER = """
import sys, time
from pathlib import Path
from bkctl.server.rocksdb_store import KeyValueDb
db = KeyValueDb(Path(sys.argv[1]), huge=True, secondary=True)
print(db._scratch.name, flush=True)
time.sleep(120)
"""


def _holder(db: Path, tmp: Path) -> tuple[subprocess.Popen[str], Path]:
    """A process holding a secondary open on `db`, and its scratch directory."""
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(db)], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()  # '' if it died: the assert below says so
    assert line, f"holder exited {proc.wait(30)}"
    return proc, Path(line)


def test_a_dead_scans_scratch_is_removed_a_live_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    db = tmp_path / "locations"
    primary = KeyValueDb(db, huge=True)
    primary.write({b"k": b"v"})
    dead, dead_dir = _holder(db, tmp)
    live, live_dir = _holder(db, tmp)
    try:
        dead.kill()  # kill -9: its scratch directory stays
        dead.wait(30)
        assert dead_dir.is_dir()
        old_unlocked = tmp / (SCRATCH_PREFIX + "secondary-old")  # made before the lock file existed
        old_unlocked.mkdir()
        os.utime(old_unlocked, (1, 1))
        new_unlocked = tmp / (SCRATCH_PREFIX + "secondary-new")  # or being made right now
        new_unlocked.mkdir()
        unrelated = tmp / "other-tool-dir"
        unrelated.mkdir()
        reader = KeyValueDb(db, huge=True, secondary=True)  # sweeps first
        assert reader.get(b"k") == b"v"
        assert not dead_dir.exists() and not old_unlocked.exists()
        assert live_dir.is_dir() and new_unlocked.is_dir() and unrelated.is_dir()
        assert sweep_scratch() == 0  # its own scratch is live too
        reader.close()
    finally:
        live.kill()
        live.wait(30)
        primary.close()
    assert sweep_scratch() == 1 and not live_dir.exists()
