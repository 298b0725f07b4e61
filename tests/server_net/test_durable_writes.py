"""kill -9 at each step of the one durable small-file write (fileio.write_durably), in a real bookie
process: the cookie on a first start (a directory each: a first start killed between its cookie writes
refuses the next start, as the cookie check wants), lastId and lastMark on a restart. Each time the
file is the old one or the new one, never a torn one, and the next start serves every acknowledged
entry."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from bkctl.files.marks import read_last_mark
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import metadata_format as mf
from bkctl.server.fileio import DURABLE_WRITE_STEPS
from tests.server_net.live import BookieProcess, metadata_uri
from tests.server_net.test_process import check_all_readable, dir_args
from tests.server_net.wire_client import WireClient

pytestmark = pytest.mark.slow

ENTRIES = 50


def run(base: Path, uri: str, fault: str = "", port: int = 0) -> BookieProcess:
    return BookieProcess(
        [*dir_args(base), "--metadata", uri, "-p", str(port), "--bookie-id", "durable-writes"],
        env={"BKCTL_FAULT_POINT": fault},
    )


def killed_at(base: Path, uri: str, fault: str) -> None:
    bookie = run(base, uri, fault)
    code = bookie.wait_exit()
    assert code == -signal.SIGKILL, bookie.stderr
    assert f"fault point {fault}" in bookie.stderr


def contents(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


STEPS = DURABLE_WRITE_STEPS[:-1]  # a kill after the last step is an ordinary kill -9


def test_kill_at_each_step_of_a_durable_write_leaves_old_or_new(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    for step in STEPS:
        first = tmp_path / f"first-{step}"
        killed_at(first, uri, f"{step}:VERSION")  # a first start writes the cookies (the journal's first)
        cookie = contents(first / "journal" / "current" / "VERSION")
        assert cookie is None or mf.decode_cookie(cookie)

    base = tmp_path / "b1"
    ledgers = base / "ledgers" / "current"
    bookie = run(base, uri)
    try:
        _, port = bookie.wait_serving()
        with WireClient("127.0.0.1", port) as client:
            acked = {e: f"entry {e}".encode() for e in range(ENTRIES)}
            for entry_id, payload in acked.items():
                assert client.add(7, entry_id, payload).rc == 0
        assert bookie.terminate() == 0
    finally:
        bookie.kill()

    for step in STEPS:  # each restart writes lastId (a new entry log), then lastMark (after replay)
        old_id = ef.decode_last_id(ledgers.joinpath("lastId").read_bytes())
        killed_at(base, uri, f"{step}:lastId")
        assert ef.decode_last_id(ledgers.joinpath("lastId").read_bytes()) in (old_id, old_id + 1)
        old_mark = read_last_mark(ledgers / "lastMark")
        killed_at(base, uri, f"{step}:lastMark")
        new_mark = read_last_mark(ledgers / "lastMark")  # decodes: never torn
        assert (new_mark.journal_id, new_mark.offset) >= (old_mark.journal_id, old_mark.offset)

    again = run(base, uri, port=port)
    try:
        again.wait_serving()
        check_all_readable(port, 7, acked)
        assert again.terminate() == 0
    finally:
        again.kill()
