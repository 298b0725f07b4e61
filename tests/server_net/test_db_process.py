"""`bkctl bookie start --storage db` as a real process, over one ledger dir and two: kill -9 during adds
with checkpoints running, every acknowledged entry served after the restart; the interleaved config
refuses its directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkctl.errors import ExitCode
from bkctl.protocol import db_format as dbf
from tests.server_net.live import metadata_uri
from tests.server_net.test_process import AddStream, check_all_readable, start

pytestmark = pytest.mark.slow


def test_kill_9_during_adds_and_checkpoints_every_acked_entry_survives(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b1"
    conf = tmp_path / "bk.conf"
    conf.write_text(f"ledgerStorageClass={dbf.STORAGE_CLASS}\nflushInterval=100\njournalPreAllocSizeMB=1\n")
    bookie = start(base, uri, "-p", "0", "--conf", str(conf))
    try:
        _, port = bookie.wait_serving()
        stream = AddStream(port)
        stream.wait_acked(3000)
        bookie.kill()  # kill -9 with adds in flight and checkpoints every 100 ms
        stream.thread.join(10)
    finally:
        bookie.kill()
    acked = dict(stream.acked)
    assert (base / "ledgers" / "current" / dbf.LOCATIONS_DB / "CURRENT").is_file()
    refused = start(base, uri, "-p", str(port))  # interleaved: the default
    assert refused.wait_exit() == ExitCode.CONFLICT, refused.stderr
    assert "holds DbLedgerStorage files" in refused.stderr
    again = start(base, uri, "-p", str(port), "--storage", "db")
    try:
        again.wait_serving()
        check_all_readable(port, 7, acked)
        assert again.terminate() == 0
    finally:
        again.kill()


def test_two_ledger_dirs_kill_9_during_adds_every_acked_entry_survives(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b1"
    second = ["-l", str(base / "ledgers1"), "--storage", "db"]
    conf = tmp_path / "bk.conf"
    conf.write_text("flushInterval=100\njournalPreAllocSizeMB=1\n")
    bookie = start(base, uri, "-p", "0", "--conf", str(conf), *second)
    try:
        _, port = bookie.wait_serving()
        streams = [AddStream(port, ledger_id) for ledger_id in (7, 8)]  # ledger 7 in ledgers1/, 8 in ledgers/
        for stream in streams:
            stream.wait_acked(1500)
        bookie.kill()
        for stream in streams:
            stream.thread.join(10)
    finally:
        bookie.kill()
    for directory in ("ledgers", "ledgers1"):
        assert (base / directory / "current" / dbf.LOCATIONS_DB / "CURRENT").is_file()
    again = start(base, uri, "-p", str(port), *second)
    try:
        again.wait_serving()
        for stream in streams:
            check_all_readable(port, stream.ledger_id, dict(stream.acked))
        assert again.terminate() == 0
    finally:
        again.kill()
