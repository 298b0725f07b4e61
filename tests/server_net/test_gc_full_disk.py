"""A bookie process turned read-only by a full disk (a small tmpfs) comes back read-write by itself once
its ledgers are deleted and a garbage collection run removes their entry logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkctl.protocol import wire
from tests.server_net.live import metadata_uri
from tests.server_net.test_full_disk import (
    add_rc,
    check_readable,
    fill,
    is_read_only,
    is_read_write,
    start,
    tmpfs,
    wait_for,
)
from tests.server_net.test_gc import layout_call
from tests.server_net.test_gc_crash import ADMIN, put_gc
from tests.server_net.wire_client import WireClient

pytestmark = pytest.mark.slow

MB = 1024 * 1024
KEYS = {
    "diskUsageThreshold": "0.6",
    "diskUsageLwmThreshold": "0.5",
    "logSizeLimit": str(MB),
    "flushInterval": "200",
    "journalMaxSizeMB": "1",
    "journalMaxBackups": "0",
    "gcWaitTime": "0",
    "httpServerPort": "0",
}


def write(port: int, ledger_id: int, megabytes: int) -> dict[int, bytes]:
    acked = {}
    with WireClient("127.0.0.1", port) as client:
        for first in range(0, megabytes * 256, 256):
            payloads = [f"{ledger_id}:{e}:".encode().ljust(4000, b"x") for e in range(first, first + 256)]
            for response in client.add_many(ledger_id, payloads, first=first):
                assert response.rc == wire.ReturnCode.EOK, response
                acked[response.entry_id] = payloads[response.entry_id - first]
    return acked


def size_of(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_full_disk_bookie_is_writable_again_after_gc(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    layout_call(uri, "create", [1, 2, 3])
    with tmpfs(tmp_path / "disk", size="96m") as disk:
        bookie = start(tmp_path, uri, disk / "journal", disk / "ledgers", keys=KEYS)
        try:
            bookie_id, port = bookie.wait_serving()
            http_port = int(next(m for m in map(ADMIN.search, bookie.lines) if m).group(1))
            wait_for("registered read-write", lambda: is_read_write(uri, bookie_id), bookie)
            write(port, 1, 10)
            write(port, 2, 10)
            kept = write(port, 3, 2)
            # Checkpoints trim the journals (1 MiB files, no backups): fill only once they are, or the
            # space they free afterwards brings the usage back under the threshold.
            wait_for("journals trimmed", lambda: size_of(disk / "journal") < 4 * MB, bookie)
            fill(disk, leave_fraction=0.35)  # 65% used: above the 0.6 threshold
            wait_for("registered read-only", lambda: is_read_only(uri, bookie_id), bookie)
            assert add_rc(port, 3, len(kept)) == wire.ReturnCode.EREADONLY
            layout_call(uri, "delete", [1, 2])
            report = put_gc(http_port, {})
            assert report["ledgers_deleted"] == [1, 2], report
            assert report["bytes_reclaimed"] > 15 * MB, report
            wait_for("registered read-write again", lambda: is_read_write(uri, bookie_id), bookie)
            check_readable(port, 3, kept)
            assert add_rc(port, 3, len(kept)) == wire.ReturnCode.EOK
        finally:
            bookie.kill()
