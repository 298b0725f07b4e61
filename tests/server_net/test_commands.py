"""`bkctl bookie cookie show|update` and `bkctl bookie format` as an operator runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bkctl.errors import ExitCode
from tests.conftest import REPO
from tests.server_net.live import BookieProcess, metadata_uri, registrations_of

pytestmark = pytest.mark.slow
BOOKIE_ID = "127.0.0.1:4242"


def bkctl(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bkctl", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def dirs(base: Path) -> list[str]:
    return ["-j", str(base / "journal"), "-l", str(base / "ledgers")]


def run_once(base: Path, uri: str) -> None:
    bookie = BookieProcess([*dirs(base), "--metadata", uri, "--bookie-id", BOOKIE_ID, "-p", "0"])
    try:
        bookie.wait_serving()
        assert bookie.terminate() == 0
    finally:
        bookie.kill()


def test_cookie_show_format_and_update(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b1"
    run_once(base, uri)

    shown = bkctl("bookie", "cookie", "show", *dirs(base), "--metadata", uri, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert [r["location"] for r in rows] == [
        str(base / "journal" / "current" / "VERSION"),
        str(base / "ledgers" / "current" / "VERSION"),
        f"/ledgers/cookies/{BOOKIE_ID}",
    ]
    assert {r["bookie_id"] for r in rows} == {BOOKIE_ID}
    assert all(r["problem"] is None and r["ledger_dirs"] == [str(base / "ledgers")] for r in rows)

    # Move the ledger directory: start refuses, `cookie update` fixes it.
    (base / "ledgers").rename(tmp_path / "moved")
    moved = ["-j", str(base / "journal"), "-l", str(tmp_path / "moved")]
    refused = BookieProcess([*moved, "--metadata", uri, "--bookie-id", BOOKIE_ID])
    assert refused.wait_exit() == ExitCode.CONFLICT
    update = bkctl("bookie", "cookie", "update", *moved, "--metadata", uri, "--bookie-id", BOOKIE_ID)
    assert update.returncode == 0, update.stderr
    assert "wrote /ledgers/cookies/127.0.0.1:4242" in update.stderr

    # Format: asks first; `n` keeps everything.
    kept = bkctl("bookie", "format", *moved, "--metadata", uri, "--bookie-id", BOOKIE_ID, stdin="n\n")
    assert kept.returncode != 0 and (tmp_path / "moved" / "current" / "VERSION").exists()
    wiped = bkctl("bookie", "format", *moved, "--metadata", uri, "--bookie-id", BOOKIE_ID, "--yes")
    assert wiped.returncode == 0, wiped.stderr
    assert not (tmp_path / "moved" / "current").exists() and not (base / "journal" / "current").exists()
    assert "bookie 127.0.0.1:4242 formatted" in wiped.stderr
    after = json.loads(
        bkctl(
            "bookie", "cookie", "show", *moved, "--metadata", uri, "--bookie-id", BOOKIE_ID, "-o", "json"
        ).stdout
    )
    assert [r["problem"] for r in after] == ["no cookie"] * 3


def test_format_refused_while_the_bookie_runs(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b1"
    bookie = BookieProcess([*dirs(base), "--metadata", uri, "--bookie-id", BOOKIE_ID, "-p", "0"])
    try:
        bookie.wait_serving()
        assert registrations_of(uri) == ([BOOKIE_ID], [])
        refused = bkctl("bookie", "format", *dirs(base), "--metadata", uri, "--bookie-id", BOOKIE_ID, "--yes")
        assert refused.returncode == ExitCode.LOCKED
        assert f"in use by another process (pid {bookie.proc.pid}, bkctl bookie start" in refused.stderr
        assert (base / "journal" / "current" / "VERSION").exists()
        assert bookie.terminate() == 0
    finally:
        bookie.kill()


def test_bad_config_is_a_usage_error(tmp_path: Path) -> None:
    conf = tmp_path / "bk_server.conf"
    conf.write_text("bookiePort=99999\n")
    result = bkctl("bookie", "start", "--conf", str(conf), "--metadata", metadata_uri(tmp_path))
    assert result.returncode == ExitCode.USAGE
    assert "bookiePort" in result.stderr
