"""A frame fuzzer (hypothesis) against a live bookie process: whatever arrives, every reply is a
well-formed v2 or v3 response, and the bookie keeps serving other clients (and new ones) afterwards."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bkctl import limits
from bkctl.protocol import wire, wire_v3
from tests.server_net.live import BookieProcess, metadata_uri
from tests.server_net.wire_client import MASTER_KEY, WireClient, package

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bookie_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    base = tmp_path_factory.mktemp("fuzz")
    uri = metadata_uri(base)
    bookie = BookieProcess(
        ["-p", "0", "-j", str(base / "journal"), "-l", str(base / "ledgers"), "--metadata", uri]
    )
    try:
        _, port = bookie.wait_serving()
        yield port
        assert bookie.terminate() == 0, bookie.stderr
    finally:
        bookie.kill()


def header(version: int, opcode: int, flags: int) -> bytes:
    return struct.pack(">I", version << 24 | opcode << 16 | flags)


_versions = st.sampled_from([0, 1, 2, 3, 8, 255])
_opcodes = st.sampled_from([1, 2, 3, 4, 5, 6, 7, 0, 99, 255])
_flags = st.sampled_from([0, 1, 2, 4, 6, 7, 0xFFFF])
_ids = st.sampled_from([0, 1, 2, -1, -4096, 2**63 - 1, -(2**63)])


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """A frame: mostly plausible requests with a twist, sometimes a lying length prefix."""
    kind = draw(st.integers(0, 7))
    if kind == 0:
        payload = draw(st.binary(max_size=120))
    elif kind == 1:  # a valid add with random ids (a body that may not match them)
        ledger, entry = draw(_ids), draw(_ids)
        body = package(draw(st.integers(0, 3)), max(0, draw(st.integers(0, 3))), draw(st.binary(max_size=64)))
        payload = header(2, 1, draw(_flags)) + draw(st.sampled_from([MASTER_KEY, bytes(20)])) + body
        payload = payload if draw(st.booleans()) else payload[: draw(st.integers(0, len(payload)))]
        del ledger, entry
    elif kind == 2:  # reads, fencing or not, with or without the key
        body = struct.pack(">qq", draw(_ids), draw(_ids)) + draw(st.sampled_from([b"", MASTER_KEY, b"\0"]))
        payload = header(draw(_versions), 2, draw(_flags)) + body
    elif kind == 3:  # batch reads
        body = struct.pack(
            ">qqqiq", draw(_ids), draw(_ids), 1, draw(st.integers(-5, 100)), draw(st.integers(-1, 10_000))
        )
        payload = header(2, 7, draw(_flags)) + body
    elif kind >= 6:  # v3: a well-encoded request of any operation with odd values, maybe cut short
        operation = draw(st.integers(0, 13))
        op = wire_v3.Operation(
            wire_v3.request_kind(operation) or "readRequest",
            ledger_id=draw(st.none() | _ids),
            entry_id=draw(st.none() | _ids),
            flag=draw(st.none() | st.integers(0, 3)),
            master_key=draw(st.none() | st.sampled_from([MASTER_KEY, b""])),
            body=draw(st.none() | st.sampled_from([package(7, 0, b"v3"), b"short", b""])),
            previous_lac=draw(st.none() | _ids),
            timeout_ms=draw(st.none() | st.sampled_from([0, 1, 50])),
            requested=draw(st.none() | st.integers(0, 3)),
        )
        payload = wire_v3.encode_request(7 if operation == 0 else operation, draw(_ids) & (2**64 - 1), op)
        payload = payload if draw(st.booleans()) else payload[: draw(st.integers(0, len(payload)))]
    else:
        payload = header(draw(_versions), draw(_opcodes), draw(_flags)) + draw(st.binary(max_size=80))
    if draw(st.integers(0, 9)) == 0:
        lie = draw(st.sampled_from([-1, 0, 3, len(payload) + 1, limits.FRAME_SIZE_MAX + 1, 2**31 - 1]))
        return struct.pack(">i", lie) + payload
    return wire.frame(payload) if payload else struct.pack(">i", 0)


def exchange(port: int, data: bytes) -> list[wire.Response | wire_v3.V3Response]:
    """Send `data`, half-close, read every reply until the bookie closes (bounded by the timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        received = bytearray()
        try:
            while chunk := sock.recv(1 << 16):
                received += chunk
        except ConnectionResetError:
            pass
    decoder = wire.FrameDecoder()
    decoder.feed(received)
    # Each reply is v2 or v3 as its request was; decoding raises if one is malformed.
    replies = [
        wire.decode_response(p) if wire_v3.is_v2_frame(p) else wire_v3.decode_v3_response(p)
        for p in decoder.frames()
    ]
    assert decoder.buffered == 0, "a reply was cut short"
    return replies


@settings(
    max_examples=int(os.environ.get("BKCTL_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(frames=st.lists(requests(), min_size=1, max_size=8))
def test_frame_fuzzer(bookie_port: int, frames: list[bytes]) -> None:
    exchange(bookie_port, b"".join(frames))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=1, max_size=300))
def test_random_bytes(bookie_port: int, data: bytes) -> None:
    exchange(bookie_port, data)


def test_bookie_still_answers_after_the_fuzzing(bookie_port: int, tmp_path: Path) -> None:
    with WireClient("127.0.0.1", bookie_port) as client:
        assert client.add(424242, 0, b"still here").rc == wire.ReturnCode.EOK
        assert client.read(424242, 0).entry == package(424242, 0, b"still here")


def test_captured_frames_mutated_with_slow_half_open_and_idle_connections(tmp_path: Path) -> None:
    """A real Java client's frames, mutated (benchmarks/fuzz_bookie.py; 1,000,000 frames
    there, figures in benchmarks/RESULTS.md), against a bookie process while slow byte-by-byte
    senders, half-open requests and hundreds of idle connections hang on: it keeps answering a good
    client, its memory stays bounded, and it stops cleanly."""
    from benchmarks.fuzz_bookie import run

    result = run(frames=20_000, idle=300, seed=3, root=tmp_path)
    assert result["frames"] == 20_000 and result["bookie_alive"], result
    assert result["probe_failures"] == [] and result["probes"] >= 2, result
    assert result["rss_mb_max"] - result["rss_mb_start"] < 64, result
    assert result["bookie_exit_code"] == 0, result


def test_an_add_whose_entry_id_no_index_file_can_hold_is_refused(bookie_port: int) -> None:
    """Found by the fuzzer: an add of entry 2^62 was acknowledged, then every checkpoint failed writing
    its index page (EFBIG) and the bookie stayed read-only. Now it is a bad request."""
    with WireClient("127.0.0.1", bookie_port) as client:
        assert client.add(515151, 2**62, b"far").rc == wire.ReturnCode.EBADREQ
        assert client.add(515151, limits.ENTRY_ID_MAX + 1, b"far").rc == wire.ReturnCode.EBADREQ
        assert client.add(515151, 0, b"near").rc == wire.ReturnCode.EOK
        assert client.read(515151, 0).entry == package(515151, 0, b"near")
