"""`bkctl bookie start -j J0 -j J1` as a real process: adds over a socket spread over two journals,
kill -9, restart with every acknowledged entry back, fences kept, lastMark.<i> per journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkctl import limits
from bkctl.errors import UsageError
from bkctl.files.marks import find_last_marks, read_last_mark
from bkctl.protocol import wire
from bkctl.protocol.metadata_format import decode_cookie
from bkctl.server.config import load_config
from bkctl.server.journal import list_journals
from tests.server_net.live import BookieProcess, bookie_flags, metadata_uri
from tests.server_net.test_process import AddStream, check_all_readable
from tests.server_net.wire_client import WireClient, package

pytestmark = pytest.mark.slow

EOK = wire.ReturnCode.EOK


def start(base: Path, uri: str, *extra: str) -> BookieProcess:
    dirs = ["-j", str(base / "j0"), "-j", str(base / "j1"), "-l", str(base / "ledgers")]
    return BookieProcess([*dirs, "--metadata", uri, *extra])


def test_two_journal_dirs_kill_9_and_restart(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b1"
    bookie = start(base, uri, "-p", "0")
    try:
        bookie_id, port = bookie.wait_serving()
        with WireClient("127.0.0.1", port) as client:
            assert [r.rc for r in client.add_many(4, [b"four"] * 10)] == [EOK] * 10  # type: ignore[union-attr]
            assert [r.rc for r in client.add_many(5, [b"five"] * 10)] == [EOK] * 10  # type: ignore[union-attr]
            assert client.fence(5).rc == EOK
        even, odd = AddStream(port, ledger_id=6), AddStream(port, ledger_id=7)
        even.wait_acked(1500)
        odd.wait_acked(1500)
        bookie.kill()  # kill -9 with adds in flight on both journals
        even.thread.join(10)
        odd.thread.join(10)
    finally:
        bookie.kill()
    assert list_journals(base / "j0" / "current") and list_journals(base / "j1" / "current")
    cookie = decode_cookie((base / "j1" / "current" / "VERSION").read_bytes())
    assert cookie.journal_dirs == (str(base / "j0"), str(base / "j1"))

    restarted = start(base, uri, "-p", str(port))
    try:
        assert restarted.wait_serving() == (bookie_id, port)
        check_all_readable(port, 6, dict(even.acked))
        check_all_readable(port, 7, dict(odd.acked))
        check_all_readable(port, 4, {e: b"four" for e in range(10)})
        check_all_readable(port, 5, {e: b"five" for e in range(10)})
        with WireClient("127.0.0.1", port) as client:
            assert client.add(5, 10, b"late").rc == wire.ReturnCode.EFENCED  # the fence survived
            assert client.add(4, 10, b"more").rc == EOK
            assert client.read(4, 10).entry == package(4, 10, b"more")
        assert restarted.terminate() == 0
    finally:
        restarted.kill()
    assert "replayed" in restarted.stderr
    marks = sorted(find_last_marks(base / "ledgers"))
    assert [p.name for p in marks] == ["lastMark.0", "lastMark.1"]
    for index, path in enumerate(marks):
        mark = read_last_mark(path)
        assert mark.journal_id in dict(list_journals(base / f"j{index}" / "current"))


def test_config_journal_dirs_checked(tmp_path: Path) -> None:
    journal = str(tmp_path / "j")
    with pytest.raises(UsageError, match="listed twice"):
        load_config(bookie_flags(tmp_path, journalDirectories=f"{journal},{journal}"))
    many = ",".join(str(tmp_path / f"j{i}") for i in range(limits.JOURNAL_DIRS_MAX + 1))
    with pytest.raises(UsageError, match="more than"):
        load_config(bookie_flags(tmp_path, journalDirectories=many))
    two = load_config(bookie_flags(tmp_path, journalDirectories=f"{journal},{journal}2"))
    assert two.journal_dirs == (Path(journal), Path(journal + "2"))
