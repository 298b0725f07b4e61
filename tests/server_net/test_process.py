"""`python -m bkctl bookie start` as a real process: kill -9 during adds, a corrupt journal tail,
SIGTERM, and refusing to start on a cookie mismatch."""

from __future__ import annotations

import struct
import threading
import time
from pathlib import Path

import pytest

from bkctl.errors import ExitCode
from bkctl.protocol import wire
from bkctl.server.journal import list_journals
from bkctl.server.replay import replay
from tests.server_net.live import BookieProcess, metadata_uri, registrations_of
from tests.server_net.wire_client import MASTER_KEY, WireClient, package

pytestmark = pytest.mark.slow

EOK = wire.ReturnCode.EOK


def dir_args(base: Path) -> list[str]:
    return ["-j", str(base / "journal"), "-l", str(base / "ledgers")]


def start(base: Path, uri: str, *extra: str) -> BookieProcess:
    return BookieProcess([*dir_args(base), "--metadata", uri, *extra])


class AddStream:
    """Pipelines adds (window 64) on a thread and records which were acknowledged with EOK."""

    def __init__(self, port: int, ledger_id: int = 7) -> None:
        self.client = WireClient("127.0.0.1", port, timeout_s=5)
        self.ledger_id = ledger_id
        self.acked: dict[int, bytes] = {}
        self.sent: dict[int, bytes] = {}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        window, next_id = 64, 0
        try:
            while next_id < 1_000_000:
                in_flight = len(self.sent) - len(self.acked)
                batch = []
                for _ in range(window - in_flight):
                    payload = f"{self.ledger_id}:{next_id}:".encode() + bytes([next_id % 251]) * (
                        next_id % 300
                    )
                    self.sent[next_id] = payload
                    batch.append(
                        wire.encode_add_request(package(self.ledger_id, next_id, payload), MASTER_KEY)
                    )
                    next_id += 1
                self.client.send_payloads(batch)
                for response in self.client.receive(1):
                    assert response.rc == EOK, response  # type: ignore[union-attr]
                    self.acked[response.entry_id] = self.sent[response.entry_id]  # type: ignore[union-attr]
        except (OSError, ConnectionError) as exc:
            self.error = exc  # the bookie died under us: expected

    def wait_acked(self, count: int, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < count:
            assert time.monotonic() < deadline, f"only {len(self.acked)} adds acknowledged"
            assert self.thread.is_alive(), f"add stream stopped: {self.error}"
            time.sleep(0.01)


def check_all_readable(port: int, ledger_id: int, acked: dict[int, bytes]) -> None:
    with WireClient("127.0.0.1", port) as client:
        ids = sorted(acked)
        for first in range(0, len(ids), 500):
            chunk = ids[first : first + 500]
            client.send_payloads([wire.encode_read_request(ledger_id, e) for e in chunk])
            for entry_id, response in zip(chunk, client.receive(len(chunk)), strict=True):
                assert isinstance(response, wire.ReadResponse)
                assert response.rc == EOK, (entry_id, response.rc)
                assert response.entry == package(ledger_id, entry_id, acked[entry_id]), entry_id


def corrupt_journal_tail(journal_dir: Path) -> int:
    """Write a torn record (a length running past the file, then junk) where valid data ends."""
    report = replay(journal_dir, (-1, 0), lambda kind, body: None)
    journal_id, offset = report.end_mark
    path = dict(list_journals(journal_dir))[journal_id]
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(struct.pack(">i", 64 * 1024 * 1024) + b"torn record: the bookie died mid-write")
    return offset


def test_kill_9_during_adds_then_corrupt_tail_every_acked_entry_survives(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b1"
    bookie = start(base, uri, "-p", "0")
    try:
        bookie_id, port = bookie.wait_serving()
        stream = AddStream(port)
        stream.wait_acked(3000)
        bookie.kill()  # kill -9 with adds in flight
        stream.thread.join(10)
    finally:
        bookie.kill()
    acked = dict(stream.acked)
    assert len(acked) >= 3000
    corrupt_journal_tail(base / "journal" / "current")

    restarted = start(base, uri, "-p", str(port))
    try:
        assert restarted.wait_serving() == (bookie_id, port)
        check_all_readable(port, 7, acked)
        with WireClient("127.0.0.1", port) as client:  # and it takes adds again
            assert client.add(8, 0, b"after").rc == EOK
        assert restarted.terminate() == 0
    finally:
        restarted.kill()
    assert "replayed" in restarted.stderr


def test_sigterm_is_graceful(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b1"
    bookie = start(base, uri, "-p", "0", "--http-port", "0")
    try:
        bookie_id, port = bookie.wait_serving()
        assert registrations_of(uri) == ([bookie_id], [])
        with WireClient("127.0.0.1", port) as client:
            assert [r.rc for r in client.add_many(3, [b"x"] * 100)] == [EOK] * 100
        assert bookie.terminate() == 0
    finally:
        bookie.kill()
    assert f"bookie {bookie_id} stopped" in bookie.stderr
    assert registrations_of(uri) == ([], [])
    again = start(base, uri, "-p", str(port))
    try:
        again.wait_serving()
        # The final checkpoint wrote lastMark at the journal's end: nothing to replay.
        assert "replayed 0 records" in again.stderr
        check_all_readable(port, 3, {e: b"x" for e in range(100)})
        assert again.terminate() == 0
    finally:
        again.kill()


def test_cookie_mismatch_refuses_to_start(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    base = tmp_path / "b1"
    bookie = start(base, uri, "--bookie-id", "127.0.0.1:4100", "-p", "0")
    try:
        bookie.wait_serving()
        assert bookie.terminate() == 0
    finally:
        bookie.kill()
    moved = BookieProcess(
        [
            "-j",
            str(base / "journal"),
            "-l",
            str(tmp_path / "elsewhere"),
            "--metadata",
            uri,
            "--bookie-id",
            "127.0.0.1:4100",
        ]
    )
    assert moved.wait_exit() == ExitCode.CONFLICT
    assert "ledger directories differ" in moved.stderr
    assert "bkctl bookie cookie update" in moved.stderr
