"""A Java BookKeeper 4.14.8 bookie's directories, copied and served by bkctl over the socket.

The copy lives elsewhere than the Java cookies say, so the bookie first refuses to start; `bkctl
bookie cookie update` (the documented fix for a moved disk) makes it start, and ledger 3's entries
come back byte for byte as the Java bookie stored them (positions from the Java shell's index dump).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bkctl.errors import ConflictError
from bkctl.protocol import wire
from bkctl.protocol.metadata_format import decode_cookie
from tests.conftest import JAVA_BOOKIES, JAVA_SHELL_OUTPUT, JAVA_WIRE, REPO
from tests.server_net.live import in_thread, metadata_uri, start_bookie, twisted_test
from tests.server_net.wire_client import WireClient

JAVA_INSTANCE_ID = "76a3f9d8-1a95-4d6d-9ea6-d348aaecafd7"
BOOKIE1 = "127.0.0.1:33181"


def java_locations() -> dict[int, int]:
    """entry id -> offset in 0.log, from `bookkeeper shell ledger -m 3` on bookie1."""
    text = (JAVA_SHELL_OUTPUT / "snap1-bookie1-ledger-index-3.txt").read_text()
    return {int(e): int(p) for e, p in re.findall(r"entry (\d+)\t:\t\(log:0, pos: (\d+)\)", text)}


def copy_bookie1(tmp_path: Path) -> Path:
    base = tmp_path / "b1"
    shutil.copytree(JAVA_BOOKIES / "bookie1", base)
    return base


def update_cookies(base: Path, uri: str) -> None:
    """`bkctl bookie cookie update` for the copy's directories (the documented fix for a moved disk)."""
    command = ["bookie", "cookie", "update", "--bookie-id", BOOKIE1, "--metadata", uri]
    command += ["-j", str(base / "journal"), "-l", str(base / "ledgers")]
    update = subprocess.run(
        [sys.executable, "-m", "bkctl", *command],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert update.returncode == 0, update.stderr


@twisted_test
async def test_java_bookie_dirs_served_byte_for_byte(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path, instance_id=JAVA_INSTANCE_ID)
    base = copy_bookie1(tmp_path)
    with pytest.raises(ConflictError, match="journal directories differ"):
        await start_bookie(tmp_path, uri=uri, bookieId=BOOKIE1)

    update_cookies(base, uri)
    cookie = decode_cookie((base / "ledgers" / "current" / "VERSION").read_bytes())
    assert (cookie.bookie_id, cookie.instance_id) == (BOOKIE1, JAVA_INSTANCE_ID)
    assert cookie.ledger_dirs == (str(base / "ledgers"),)

    service = await start_bookie(tmp_path, uri=uri, bookieId=BOOKIE1)
    try:
        log_bytes = (JAVA_BOOKIES / "bookie1" / "ledgers" / "current" / "0.log").read_bytes()
        locations = java_locations()
        assert len(locations) == 134

        def read_all() -> list[wire.Response]:
            with WireClient("127.0.0.1", service.port) as client:
                client.send_payloads([wire.encode_read_request(3, e) for e in range(200)])
                return client.receive(200)

        responses = await in_thread(read_all)
        for entry_id, response in enumerate(responses):
            assert isinstance(response, wire.ReadResponse)
            if entry_id not in locations:  # striped onto bookie2 and bookie3 only
                assert response.rc == wire.ReturnCode.ENOENTRY, entry_id
                continue
            pos = locations[entry_id]
            size = int.from_bytes(log_bytes[pos - 4 : pos], "big")
            assert response.rc == wire.ReturnCode.EOK
            assert response.entry == log_bytes[pos : pos + size], entry_id
            assert response.entry.endswith(f"L3-E{entry_id}".encode())
        # Ledger 2 was fenced by the Java recovery: a plain add is refused.
        assert service.storage is not None and service.storage.is_fenced(2)
    finally:
        await service.stop()


def ledger_of(request_hex: str) -> int:
    payload = bytes.fromhex(request_hex)
    request = wire.decode_request(payload)
    assert isinstance(request, wire.AddRequest | wire.ReadRequest)
    return request.ledger_id


@twisted_test
async def test_java_v2_capture_answered_identically(tmp_path: Path) -> None:
    """Ledger 7 of the v2 capture (adds then reads, three bookies): bkctl bookies, each fed one Java
    bookie's requests in order, answer with the bytes the Java bookies sent."""
    capture = json.loads((JAVA_WIRE / "v2-protocol-write-read-fence.frames.json").read_text())
    connections = [
        c
        for c in capture
        if all(ledger_of(f["frame_hex"]) == 7 for f in c["frames"] if f["dir"] == "client->bookie")
    ]
    assert len(connections) == 3
    uri = metadata_uri(tmp_path)
    services = {}
    try:
        for c in connections:
            services[c["bookie"]] = await start_bookie(tmp_path, name=c["bookie"].replace(":", "_"), uri=uri)

        def replay_connection(c: dict[str, object], port: int) -> list[tuple[str, str]]:
            frames = c["frames"]
            assert isinstance(frames, list)
            requests = [f["frame_hex"] for f in frames if f["dir"] == "client->bookie"]
            expected = [f["frame_hex"] for f in frames if f["dir"] == "bookie->client"]
            got = []
            with WireClient("127.0.0.1", port) as client:
                for request in requests:
                    client.send_payloads([bytes.fromhex(request)])
                    (response,) = client.receive(1)
                    got.append(wire.encode_response(response).hex())
            return list(zip(got, expected, strict=True))

        for c in connections:
            pairs = await in_thread(replay_connection, c, services[c["bookie"]].port)
            for ours, java in pairs:
                assert ours == java
    finally:
        for service in services.values():
            await service.stop()
