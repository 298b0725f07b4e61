"""wire.py: v2 frames against a real Java 4.14.8 capture, round trips, the incremental decoder, limits."""

from __future__ import annotations

import contextlib
import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bkctl import limits
from bkctl.errors import (
    FencedError,
    NotFoundError,
    ProtocolError,
    ReadOnlyError,
    UnauthorizedError,
    UnavailableError,
)
from bkctl.model import DigestType
from bkctl.protocol import entry as entries
from bkctl.protocol import wire
from bkctl.protocol.wire import (
    FLAG_DO_FENCING,
    FLAG_HIGH_PRIORITY,
    FLAG_RECOVERY_ADD,
    AddRequest,
    AddResponse,
    AuthRequest,
    AuthResponse,
    BatchReadRequest,
    BatchReadResponse,
    FrameDecoder,
    OpCode,
    ReadRequest,
    ReadResponse,
    ReturnCode,
    UnknownRequest,
    UnknownResponse,
)
from tests.conftest import JAVA_WIRE

V2_CAPTURE = JAVA_WIRE / "v2-protocol-write-read-fence.frames.json"
V3_CAPTURE = JAVA_WIRE / "v3-protocol-write-read-fence.frames.json"
MASTER_KEY = bytes.fromhex("3b56e4145429cee1d2a84df4f6a4cb8ad7173a46")
TO_BOOKIE = "client->bookie"


def load_connections(path: Any) -> list[dict[str, Any]]:
    connections: list[dict[str, Any]] = json.loads(path.read_text())
    return connections


def payloads(connection: dict[str, Any], direction: str) -> list[bytes]:
    return [bytes.fromhex(f["frame_hex"]) for f in connection["frames"] if f["dir"] == direction]


def stream_of(frames: list[bytes]) -> bytes:
    return b"".join(wire.frame(p) for p in frames)


V2 = load_connections(V2_CAPTURE)
DIRECTIONS = [(i, d) for i in range(len(V2)) for d in (TO_BOOKIE, "bookie->client")]


# --- golden vectors -----------------------------------------------------------------------------------


def test_capture_frames_match_their_recorded_length() -> None:
    for connection in V2:
        for f in connection["frames"]:
            assert len(f["frame_hex"]) == 2 * f["len"]


@pytest.mark.parametrize("index", range(len(V2)))
def test_every_v2_frame_decodes_and_reencodes_to_the_same_bytes(index: int) -> None:
    connection = V2[index]
    for payload in payloads(connection, TO_BOOKIE):
        request = wire.decode_request(payload)
        assert not isinstance(request, UnknownRequest)
        assert wire.encode_request(request) == payload
    for payload in payloads(connection, "bookie->client"):
        response = wire.decode_response(payload)
        assert not isinstance(response, UnknownResponse)
        assert wire.encode_response(response) == payload


def test_capture_requests_carry_what_the_java_client_sent() -> None:
    kinds: set[tuple[str, int]] = set()
    for connection in V2:
        for payload in payloads(connection, TO_BOOKIE):
            request = wire.decode_request(payload)
            assert request.version == wire.PROTOCOL_VERSION
            kinds.add((type(request).__name__, request.flags))
            if isinstance(request, AddRequest):
                assert request.master_key == MASTER_KEY
                assert request.entry[:16] == struct.pack(">qq", request.ledger_id, request.entry_id)
            elif isinstance(request, ReadRequest):
                assert (request.master_key == MASTER_KEY) == bool(request.flags & FLAG_DO_FENCING)
    assert kinds == {
        ("AddRequest", 0),
        ("AddRequest", FLAG_RECOVERY_ADD | FLAG_HIGH_PRIORITY),  # recovery write-back
        ("ReadRequest", 0),
        ("ReadRequest", FLAG_DO_FENCING),  # fencing LAC read of entry -1
        ("ReadRequest", FLAG_DO_FENCING | FLAG_HIGH_PRIORITY),  # recovery reads
    }


def test_capture_responses_include_fenced_adds_and_missing_entries() -> None:
    codes: dict[tuple[str, int], int] = {}
    for connection in V2:
        for payload in payloads(connection, "bookie->client"):
            response = wire.decode_response(payload)
            assert isinstance(response, AddResponse | ReadResponse)
            key = (type(response).__name__, response.rc)
            codes[key] = codes.get(key, 0) + 1
            if isinstance(response, ReadResponse):
                assert bool(response.entry) == (response.rc == ReturnCode.EOK)
    assert codes.keys() == {
        ("AddResponse", ReturnCode.EOK),
        ("AddResponse", ReturnCode.EFENCED),
        ("ReadResponse", ReturnCode.EOK),
        ("ReadResponse", ReturnCode.ENOENTRY),
    }


def test_fenced_add_in_the_capture_is_refused_by_both_bookies_of_its_write_set() -> None:
    # Ledger 8 has ensemble (bookie4, bookie1, bookie2); entry 5 goes to indexes 2 and 0.
    fenced = sorted(
        (c["bookie"], r.ledger_id, r.entry_id)
        for c in V2
        for r in map(wire.decode_response, payloads(c, "bookie->client"))
        if isinstance(r, AddResponse) and r.rc == ReturnCode.EFENCED
    )
    assert fenced == [("127.0.0.1:33182", 8, 5), ("127.0.0.1:33184", 8, 5)]


# --- incremental decoder --------------------------------------------------------------------------------


@pytest.mark.parametrize(("index", "direction"), DIRECTIONS)
def test_decoder_yields_the_same_frames_for_every_split_point(index: int, direction: str) -> None:
    frames = payloads(V2[index], direction)
    stream = stream_of(frames)
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        decoder.feed(stream[:cut])
        got = decoder.frames()
        decoder.feed(stream[cut:])
        got += decoder.frames()
        assert got == frames
        assert decoder.buffered == 0


def test_decoder_fed_one_byte_at_a_time() -> None:
    frames = [p for c in V2 for p in payloads(c, TO_BOOKIE)]
    decoder = FrameDecoder()
    got: list[bytes] = []
    for byte in stream_of(frames):
        decoder.feed(bytes([byte]))
        got += decoder.frames()
    assert got == frames


ALL_V2_FRAMES = [p for c in V2 for d in (TO_BOOKIE, "bookie->client") for p in payloads(c, d)]
ALL_V2_STREAM = stream_of(ALL_V2_FRAMES)


@given(st.lists(st.integers(0, len(ALL_V2_STREAM)), max_size=40))
def test_decoder_random_splits(cuts: list[int]) -> None:
    decoder = FrameDecoder()
    got: list[bytes] = []
    previous = 0
    for cut in [*sorted(cuts), len(ALL_V2_STREAM)]:
        decoder.feed(memoryview(ALL_V2_STREAM)[previous:cut])
        got += decoder.frames()
        previous = cut
    assert got == ALL_V2_FRAMES


def test_decoder_needs_more_bytes_is_not_an_error() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"\x00\x00")
    assert decoder.frames() == []
    decoder.feed(b"\x00\x18" + bytes(10))
    assert decoder.frames() == []
    decoder.feed(bytes(14))
    assert decoder.frames() == [bytes(24)]


@pytest.mark.parametrize("length", [-1, -(2**31), 0, 3, limits.FRAME_SIZE_MAX + 1, 2**31 - 1])
def test_decoder_rejects_bad_lengths_as_soon_as_the_prefix_arrives(length: int) -> None:
    decoder = FrameDecoder()
    decoder.feed(wire.frame(bytes(24)) + struct.pack(">i", length))
    assert decoder.frames() == [bytes(24)]  # the good frame before the bad length still counts
    with pytest.raises(ProtocolError):
        decoder.frames()
    # The stream cannot be resynchronised: the decoder stays failed.
    with pytest.raises(ProtocolError):
        decoder.feed(b"more")
    with pytest.raises(ProtocolError):
        decoder.frames()


def test_decoder_honours_its_own_limit_and_accepts_exactly_the_limit() -> None:
    decoder = FrameDecoder(frame_size_max=100)
    decoder.feed(struct.pack(">i", 100) + bytes(100))
    assert decoder.frames() == [bytes(100)]
    assert decoder.buffered == 0
    decoder.feed(struct.pack(">i", 101))
    with pytest.raises(ProtocolError, match="exceeds the 100-byte limit"):
        decoder.frames()


@pytest.mark.parametrize("limit", [0, 3, limits.FRAME_SIZE_MAX + 1])
def test_decoder_limit_must_be_sane(limit: int) -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder(frame_size_max=limit)


def test_decoder_holds_at_most_one_partial_frame() -> None:
    decoder = FrameDecoder(frame_size_max=1000)
    chunk = stream_of([bytes(range(200))] * 7)
    for _ in range(50):
        decoder.feed(chunk[:333])
        decoder.frames()
        assert decoder.buffered < 4 + 1000
        decoder.feed(chunk[333:])
        assert len(decoder.frames()) >= 1
    assert decoder.buffered == 0


def test_frame_prefix_limits() -> None:
    assert wire.frame(b"abcd") == b"\x00\x00\x00\x04abcd"
    with pytest.raises(ProtocolError):
        wire.frame_prefix(limits.FRAME_SIZE_MAX + 1)
    with pytest.raises(ProtocolError):
        wire.frame_prefix(-1)


@given(st.binary(max_size=300))
def test_decoder_on_arbitrary_bytes_raises_only_protocol_error(data: bytes) -> None:
    decoder = FrameDecoder(frame_size_max=64)
    try:
        decoder.feed(data)
        for frame in decoder.frames():
            assert 4 <= len(frame) <= 64
    except ProtocolError:
        pass


# --- round trips ----------------------------------------------------------------------------------------

int64 = st.integers(-(2**63), 2**63 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
keys = st.binary(min_size=20, max_size=20)
versions = st.sampled_from([1, 2])
flags = st.integers(0, 0xFFFF)
rcs = st.one_of(st.sampled_from(list(ReturnCode)), int32)


@given(versions, flags, keys, int64, int64, st.binary(max_size=200))
def test_add_request_round_trip(version: int, flag: int, key: bytes, lid: int, eid: int, rest: bytes) -> None:
    entry = struct.pack(">qq", lid, eid) + rest
    payload = wire.encode_add_request(entry, key, flag, version)
    assert wire.decode_request(payload) == AddRequest(version, flag, key, lid, eid, entry)


@given(st.sampled_from(list(DigestType)), flags, keys, int64, st.integers(0, 2**62), st.binary(max_size=300))
def test_framed_add_in_one_copy_equals_the_composed_codecs(
    digest: DigestType, flag: int, key: bytes, lid: int, eid: int, payload: bytes
) -> None:
    mac = entries.mac_key(b"pw")
    packaged = entries.package_entry(digest, lid, eid, eid - 1, eid + len(payload), payload, mac)
    head = wire.add_request_head(key, flag)
    one_copy = wire.frame_add_request(head, digest, lid, eid, eid - 1, eid + len(payload), payload, mac)
    assert one_copy == wire.frame(wire.encode_add_request(packaged, key, flag))


@given(st.sampled_from([0, 1, 2]), flags, int64, int64, keys)
def test_read_request_round_trip(version: int, flag: int, lid: int, eid: int, key: bytes) -> None:
    if version == 0:
        flag = 0
    keyed = bool(flag & FLAG_DO_FENCING) and version >= 2
    master_key = key if keyed else None
    payload = wire.encode_read_request(lid, eid, flag, master_key, version)
    assert len(payload) == (40 if keyed else 20)
    assert wire.decode_request(payload) == ReadRequest(version, flag, lid, eid, master_key)


@given(versions, flags, int64, int64, int64, int32, int64, keys)
def test_batch_read_request_round_trip(
    version: int, flag: int, lid: int, eid: int, request_id: int, count: int, size: int, key: bytes
) -> None:
    master_key = key if flag & FLAG_DO_FENCING and version >= 2 else None
    payload = wire.encode_batch_read_request(lid, eid, request_id, count, size, flag, master_key, version)
    expected = BatchReadRequest(version, flag, lid, eid, request_id, count, size, master_key)
    assert wire.decode_request(payload) == expected
    assert wire.encode_request(expected) == payload


@given(versions, flags, st.text(max_size=30), st.binary(max_size=100))
def test_auth_request_round_trip(version: int, flag: int, name: str, data: bytes) -> None:
    payload = wire.encode_auth_request(name, data, flag, version)
    assert wire.decode_request(payload) == AuthRequest(version, flag, name, data)


@given(st.sampled_from([4, 5, 6, 8, 0xFF]), flags, st.binary(max_size=64))
def test_unknown_opcodes_decode_to_a_value_the_bookie_answers_with_ebadreq(
    opcode: int, flag: int, body: bytes
) -> None:
    payload = wire.encode_unknown_request(2, opcode, flag, body)
    request = wire.decode_request(payload)
    assert request == UnknownRequest(2, opcode, flag, body)
    answer = wire.decode_response(wire.encode_error_response(request, ReturnCode.EBADREQ))
    assert answer == UnknownResponse(2, opcode, struct.pack(">iqq", ReturnCode.EBADREQ, -1, -1))


@given(st.sampled_from([0, 1, 2]), rcs, int64, int64)
def test_add_response_round_trip(version: int, rc: int, lid: int, eid: int) -> None:
    payload = wire.encode_add_response(rc, lid, eid, version)
    assert len(payload) == wire.RESPONSE_FIXED_SIZE
    assert wire.decode_response(payload) == AddResponse(version, rc, lid, eid)


@given(versions, rcs, int64, int64, st.binary(max_size=200))
def test_read_response_round_trip(version: int, rc: int, lid: int, eid: int, entry: bytes) -> None:
    payload = wire.encode_read_response(rc, lid, eid, entry, version)
    assert wire.decode_response(payload) == ReadResponse(version, rc, lid, eid, entry)


@given(versions, rcs, int64, int64, int64, st.lists(st.binary(max_size=50), max_size=10))
def test_batch_read_response_round_trip(
    version: int, rc: int, lid: int, eid: int, request_id: int, entries: list[bytes]
) -> None:
    payload = wire.encode_batch_read_response(rc, lid, eid, request_id, entries, version)
    expected = BatchReadResponse(version, rc, lid, eid, request_id, tuple(entries))
    assert wire.decode_response(payload) == expected
    assert wire.encode_response(expected) == payload


@given(versions, st.text(max_size=30), st.binary(max_size=100))
def test_auth_response_round_trip(version: int, name: str, data: bytes) -> None:
    payload = wire.encode_auth_response(name, data, version)
    assert wire.decode_response(payload) == AuthResponse(version, name, data)


def test_auth_is_answered_as_disabled_by_default() -> None:
    assert wire.decode_response(wire.encode_auth_response()) == AuthResponse(2, "AuthDisabledPlugin", b"")


def test_error_responses_echo_the_request() -> None:
    add = wire.decode_request(wire.encode_add_request(struct.pack(">qq", 3, 9) + bytes(24), MASTER_KEY))
    assert wire.decode_response(wire.encode_error_response(add, ReturnCode.EFENCED)) == AddResponse(
        2, ReturnCode.EFENCED, 3, 9
    )
    read = wire.decode_request(wire.encode_read_request(3, 9, FLAG_DO_FENCING, MASTER_KEY))
    assert wire.decode_response(wire.encode_error_response(read, ReturnCode.EUA)) == ReadResponse(
        2, ReturnCode.EUA, 3, 9, b""
    )
    batch = wire.decode_request(wire.encode_batch_read_request(3, 9, 77, 10, 1000))
    assert wire.decode_response(wire.encode_error_response(batch, ReturnCode.EIO)) == BatchReadResponse(
        2, ReturnCode.EIO, 3, 9, 77, ()
    )
    auth = wire.decode_request(wire.encode_auth_request("x", b""))
    assert wire.decode_response(wire.encode_error_response(auth, ReturnCode.EBADREQ)) == AuthResponse(
        2, wire.AUTH_DISABLED_PLUGIN, b""
    )


# --- header ----------------------------------------------------------------------------------------------


def test_header_layout() -> None:
    assert wire.pack_header(2, OpCode.ADD_ENTRY, 0) == 0x02010000
    assert wire.pack_header(2, OpCode.READ_ENTRY, FLAG_DO_FENCING | FLAG_HIGH_PRIORITY) == 0x02020005
    assert wire.pack_header(0, OpCode.READ_ENTRY, 0) == 2  # legacy: the bare opcode
    assert wire.unpack_header(b"\x00\x00\x00\x02") == (0, 2, 0)
    assert wire.unpack_header(b"\x01\x07\x00\x01") == (1, 7, 1)


def test_legacy_read_decodes_and_version_1_fencing_read_has_no_key() -> None:
    assert wire.decode_request(struct.pack(">iqq", 2, 5, 6)) == ReadRequest(0, 0, 5, 6, None)
    payload = struct.pack(">Iqq", 0x01020001, 5, 6)
    assert wire.decode_request(payload) == ReadRequest(1, FLAG_DO_FENCING, 5, 6, None)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\x02\x01\x00",
        b"\x03\x01\x00\x00" + bytes(40),  # version 3 is protobuf, never a v2 header
        b"\x00\x01\x00\x02" + bytes(16),  # legacy header with bits outside the opcode
        b"\x02\x01\x00\x00" + bytes(35),  # add: key present but no room for the ids
        b"\x02\x02\x00\x00" + bytes(15),  # read: short
        b"\x02\x02\x00\x00" + bytes(17),  # read: trailing byte
        b"\x02\x02\x00\x01" + bytes(16),  # fencing read without a key
        b"\x02\x07\x00\x00" + bytes(35),  # batch read: short
        b"\x02\x03\x00\x00\x0a\x05ab",  # auth: truncated protobuf
        b"\x02\x03\x00\x00\x08\x01",  # auth: plugin name is not a string
    ],
)
def test_malformed_requests(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        wire.decode_request(payload)


@pytest.mark.parametrize(
    "payload",
    [
        b"\x02\x01\x00\x00" + bytes(19),  # add response: short
        b"\x02\x01\x00\x00" + bytes(21),  # add response: long
        b"\x02\x02\x00\x00" + bytes(19),  # read response: short
        b"\x02\x07\x00\x00" + bytes(27),  # batch: no request id
        b"\x02\x07\x00\x00" + bytes(28) + b"\x00\x00",  # batch: truncated entry length
        b"\x02\x07\x00\x00" + bytes(28) + b"\x00\x00\x00\x05abc",  # batch: entry past the end
        b"\x02\x07\x00\x00" + bytes(28) + b"\xff\xff\xff\xff",  # batch: negative entry length
    ],
)
def test_malformed_responses(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        wire.decode_response(payload)


@given(st.binary(max_size=120))
def test_arbitrary_bytes_raise_only_protocol_error(data: bytes) -> None:
    for decode in (wire.decode_request, wire.decode_response):
        with contextlib.suppress(ProtocolError):
            decode(data)


@given(st.binary(min_size=16, max_size=80), st.sampled_from([1, 2, 3, 7]))
def test_arbitrary_bodies_after_a_valid_header_raise_only_protocol_error(body: bytes, opcode: int) -> None:
    for flag in (0, FLAG_DO_FENCING):
        payload = struct.pack(">I", wire.pack_header(2, opcode, flag)) + body
        for decode in (wire.decode_request, wire.decode_response):
            with contextlib.suppress(ProtocolError):
                decode(payload)


@pytest.mark.parametrize(
    "encode",
    [
        lambda: wire.encode_add_request(bytes(32), b"short"),
        lambda: wire.encode_add_request(bytes(15), MASTER_KEY),
        lambda: wire.encode_add_request(bytes(limits.FRAME_SIZE_MAX), MASTER_KEY),
        lambda: wire.encode_read_request(1, 2, FLAG_DO_FENCING),
        lambda: wire.encode_read_request(1, 2, 0, MASTER_KEY),
        lambda: wire.encode_read_request(2**63, 0),
        lambda: wire.encode_read_request(1, 2, version=3),
        lambda: wire.encode_read_request(1, 2, FLAG_HIGH_PRIORITY, version=0),
        lambda: wire.encode_read_request(1, 2, 0x10000),
        lambda: wire.encode_batch_read_request(1, 2, 3, 2**31, 5),
        lambda: wire.encode_add_response(2**31, 0, 0),
        lambda: wire.encode_auth_request("\ud800", b""),
        lambda: wire.encode_unknown_request(2, 256, 0, b""),
        lambda: wire.encode_read_response(0, 0, 0, bytes(limits.FRAME_SIZE_MAX)),
        lambda: wire.encode_batch_read_response(0, 0, 0, 0, [bytes(limits.FRAME_SIZE_MAX // 2)] * 3),
    ],
)
def test_encoders_reject_what_the_wire_cannot_carry(encode: Any) -> None:
    with pytest.raises(ProtocolError):
        encode()


# --- return codes ----------------------------------------------------------------------------------------


def test_return_codes_map_to_bkctl_errors() -> None:
    expected = {
        ReturnCode.ENOLEDGER: NotFoundError,
        ReturnCode.ENOENTRY: NotFoundError,
        ReturnCode.EUA: UnauthorizedError,
        ReturnCode.EFENCED: FencedError,
        ReturnCode.EREADONLY: ReadOnlyError,
        ReturnCode.EIO: UnavailableError,
        ReturnCode.EBADREQ: ProtocolError,
    }
    for rc, error_class in expected.items():
        assert type(wire.error_for_rc(rc, "read")) is error_class
    assert set(wire.RC_ERRORS) == set(ReturnCode) - {ReturnCode.EOK}
    error = wire.error_for_rc(104, "add of ledger 8 entry 5")
    assert str(error) == "add of ledger 8 entry 5: EFENCED"
    assert type(wire.error_for_rc(42, "read")) is ProtocolError
    assert wire.rc_name(42) == "rc 42"


def test_v2_return_code_values() -> None:
    assert [int(rc) for rc in ReturnCode] == [0, 1, 2, *range(100, 108)]
    assert [int(op) for op in OpCode] == list(range(1, 8))
    assert (FLAG_DO_FENCING, FLAG_RECOVERY_ADD, FLAG_HIGH_PRIORITY) == (1, 2, 4)


@settings(max_examples=20)
@given(st.data())
def test_capture_frames_survive_truncation_only_as_protocol_errors(data: st.DataObject) -> None:
    payload = data.draw(st.sampled_from(ALL_V2_FRAMES))
    cut = data.draw(st.integers(0, len(payload) - 1))
    for decode in (wire.decode_request, wire.decode_response):
        with contextlib.suppress(ProtocolError):
            decode(payload[:cut])
