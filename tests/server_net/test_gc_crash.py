"""kill -9 at each step of a compaction (BKCTL_FAULT_POINT makes the bookie process SIGKILL itself there),
then a restart on the same directories: every live entry reads back byte-identical, and the next GC run
finishes the compaction (no marker left, the old log gone). On both engines: the db one moves the
locations in RocksDB, and no location there names a log that is gone (read by Debian's `ldb`)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bkctl.server.ledger_storage import ENGINE_CLASSES
from bkctl.server.storage_kind import DB, INTERLEAVED
from tests.server.test_db_storage import ldb_logs_named
from tests.server_net.live import BookieProcess, bookie_flags, metadata_uri
from tests.server_net.test_gc import PART, layout_call, payload
from tests.server_net.wire_client import WireClient, package

pytestmark = pytest.mark.slow

LEDGERS = [1, 2, 3, 4]
DELETED = [1, 3]
PARTS = 3
ADMIN = re.compile(r"admin http on [\d.]+:(\d+)")


def conf_file(tmp_path: Path, uri: str, storage: str = INTERLEAVED) -> Path:
    keys = bookie_flags(
        tmp_path / "b1",
        logSizeLimit=str(1024 * 1024),
        gcWaitTime="0",
        httpServerPort="0",
        bookieId="gc-crash",
        metadataServiceUri=uri,
        ledgerStorageClass=ENGINE_CLASSES[storage],
    )
    path = tmp_path / "bk_server.conf"
    path.write_text("".join(f"{k}={v}\n" for k, v in keys.items()))
    return path


def start(conf: Path, fault: str | None = None) -> tuple[BookieProcess, int, int]:
    bookie = BookieProcess(["--conf", str(conf)], env={"BKCTL_FAULT_POINT": fault or ""})
    _, port = bookie.wait_serving()
    match = next(m for m in (ADMIN.search(line) for line in bookie.lines) if m)
    return bookie, port, int(match.group(1))


def put_gc(http_port: int, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/api/v1/bookie/gc?wait=true",
        data=json.dumps(body).encode(),
        method="PUT",
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        result: dict[str, Any] = json.loads(answer.read())
        return result


def write_parts(port: int) -> None:
    """Each part of every ledger in turn, so that every entry log holds some of each ledger."""
    with WireClient("127.0.0.1", port) as c:
        for part in range(PARTS):
            for ledger_id in LEDGERS:
                first = part * PART
                payloads = [payload(ledger_id, e) for e in range(first, first + PART)]
                assert all(r.rc == 0 for r in c.add_many(ledger_id, payloads, first=first))


def read_live(port: int) -> None:
    with WireClient("127.0.0.1", port) as c:
        for ledger_id in LEDGERS:
            if ledger_id in DELETED:
                continue
            for entry_id in range(PARTS * PART):
                r = c.read(ledger_id, entry_id)
                assert (r.rc, r.entry) == (0, package(ledger_id, entry_id, payload(ledger_id, entry_id))), (
                    ledger_id,
                    entry_id,
                )


@pytest.mark.parametrize("storage", [INTERLEAVED, DB])
@pytest.mark.parametrize(
    "fault", ["compaction-marked", "compaction-copied", "compaction-before-remove", "compaction-removed"]
)
def test_kill_at_each_compaction_step_loses_nothing(tmp_path: Path, fault: str, storage: str) -> None:
    uri = metadata_uri(tmp_path)
    layout_call(uri, "create", LEDGERS)
    conf = conf_file(tmp_path, uri, storage)
    current = tmp_path / "b1" / "ledgers" / "current"
    bookie, port, http_port = start(conf, fault)
    try:
        write_parts(port)
        assert bookie.terminate() == 0  # graceful: every entry checkpointed into the entry logs
        bookie, port, http_port = start(conf, fault)
        layout_call(uri, "delete", DELETED)
        put_gc(http_port, {})  # deletes the ledgers' indexes; no compaction yet
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            put_gc(http_port, {"forceMajor": True})
        assert bookie.wait_exit() == -9, bookie.stderr
        assert f"fault point {fault}" in bookie.stderr
        bookie, port, http_port = start(conf)
        read_live(port)
        report = put_gc(http_port, {"forceMajor": True})
        assert not report["errors"], report
        assert not list(current.glob("*.compacting"))
        read_live(port)
        assert bookie.terminate() == 0
        bookie, port, http_port = start(conf)
        read_live(port)
        assert bookie.terminate() == 0
    finally:
        bookie.kill()
    if storage == DB:
        named, _ = ldb_logs_named(current)
        assert named <= {int(p.stem, 16) for p in current.glob("*.log")}
