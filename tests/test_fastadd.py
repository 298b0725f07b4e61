"""bkctl/protocol/_fastadd.c: the C v3 add fast path equals its Python reference, wire_v3.v3_add_reference.

Equal means the same value for every input: None for the same buffers, the same tuple (ids, master key,
body bounds, RECOVERY_ADD, EOK reply bytes) otherwise, ValueError for the same bad offsets. Checked on
arbitrary bytes, on Java-shaped add frames from wire_v3's encoder, on frames assembled from raw varint
spellings (non-canonical, 10-byte, too long, lying sizes), on all of those mutated and placed inside
larger buffers, and on the adds of a real Java 4.14.8 v3 capture.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bkctl.protocol import wire, wire_v3
from bkctl.protocol.protobuf import encode_varint
from bkctl.protocol.wire_v3 import Operation, OperationType, StatusCode, V3Add
from tests.conftest import JAVA_WIRE

Buffer = bytes | bytearray
INT64 = st.integers(-(2**63), 2**63 - 1)
UINT64 = st.integers(0, 2**64 - 1)
JAVA_KEY_SIZE = 20


def fast() -> Callable[[Buffer, int, int], V3Add | None]:
    compiled = wire_v3.compiled_v3_add
    if compiled is None:
        pytest.fail("bkctl.protocol._fastadd is not built: run scripts/venv (pip install -e .)")
    return compiled


def outcome(
    function: Callable[[Buffer, int, int], V3Add | None], buffer: Buffer, start: int, end: int
) -> Any:
    try:
        return function(buffer, start, end)
    except ValueError:
        return ValueError


def assert_same(buffer: Buffer, start: int = 0, end: int | None = None) -> V3Add | None:
    """Both definitions on buffer[start:end], as bytes and as bytearray (the bookie's buffer type)."""
    end = len(buffer) if end is None else end
    expected = outcome(wire_v3.v3_add_reference, bytes(buffer), start, end)
    assert outcome(fast(), bytes(buffer), start, end) == expected
    assert outcome(fast(), bytearray(buffer), start, end) == expected
    return None if expected is ValueError else expected


def test_the_c_extension_is_built_and_on_the_bookies_hot_path() -> None:
    """Fails where the C module did not build: the test venv always builds it (scripts/venv runs
    `pip install -e .`, setup.py compiles bkctl/protocol/_fastadd.c), so CI exercises the C path
    rather than silently testing the Python fallback against itself."""
    from bkctl.protocol import _fastadd

    assert wire_v3.compiled_v3_add is _fastadd.v3_add
    assert wire_v3.v3_add is _fastadd.v3_add


# --- arbitrary bytes --------------------------------------------------------------------------------


@given(st.binary(max_size=300), st.data())
def test_arbitrary_bytes(data: bytes, draw: st.DataObject) -> None:
    start = draw.draw(st.integers(0, len(data)))
    end = draw.draw(st.integers(start, len(data)))
    assert_same(data, start, end)


@given(st.binary(max_size=40), st.integers(-50, 100), st.integers(-50, 100))
def test_any_offsets_even_outside_the_buffer(data: bytes, start: int, end: int) -> None:
    assert_same(data, start, end)


@pytest.mark.parametrize("args", [(), (b"",), (b"", 0), (b"", 0, 0, 0)])
def test_wrong_argument_count(args: tuple[object, ...]) -> None:
    with pytest.raises(TypeError):
        fast()(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize("buffer, start, end", [("text", 0, 0), (b"", 0.0, 0), (b"", 0, None), (None, 0, 0)])
def test_wrong_argument_types(buffer: object, start: object, end: object) -> None:
    with pytest.raises(TypeError):
        fast()(buffer, start, end)  # type: ignore[arg-type]


def test_offsets_beyond_a_c_integer_are_refused() -> None:
    with pytest.raises(OverflowError):
        fast()(b"", 0, 2**64)


@pytest.mark.parametrize("end", [0, 10, 99])
def test_the_buffer_is_released_on_every_path(end: int) -> None:
    """A bytearray exported and not released could not grow: the bookie appends to its buffer."""
    op = Operation("addRequest", ledger_id=1, entry_id=2, master_key=bytes(20), body=bytes(16))
    payload = wire_v3.encode_request(OperationType.ADD_ENTRY, 7, op)
    buffer = bytearray(payload)
    references = sys.getrefcount(buffer)
    for bounds in ((0, len(payload)), (0, min(end, len(payload))), (0, end + len(payload))):
        outcome(fast(), buffer, *bounds)
        buffer += b"x"
        del buffer[-1]
    assert sys.getrefcount(buffer) == references


# --- Java-shaped adds from the encoder ----------------------------------------------------------------


@st.composite
def java_adds(draw: st.DrawFn) -> bytes:
    """An add request payload as Java's client writes one, from wire_v3's encoder."""
    size = draw(st.one_of(st.integers(16, 200), st.integers(16, 64 * 1024)))
    body = random.Random(draw(st.integers(0, 2**32))).randbytes(size)
    op = Operation(
        "addRequest",
        ledger_id=draw(st.one_of(INT64, st.integers(0, 300))),
        entry_id=draw(st.one_of(INT64, st.integers(-1, 300))),
        master_key=draw(st.binary(min_size=JAVA_KEY_SIZE, max_size=JAVA_KEY_SIZE)),
        body=body,
        write_flags=draw(st.none() | st.sampled_from([0, wire_v3.WRITE_FLAG_DEFERRED_SYNC]) | INT64),
        flag=draw(st.none() | st.just(wire_v3.ADD_FLAG_RECOVERY_ADD) | st.integers(-(2**31), 2**31 - 1)),
    )
    txn = draw(st.one_of(st.integers(0, 127), st.integers(128, 2**21), UINT64))
    priority = draw(st.sampled_from([0, wire_v3.HIGH_PRIORITY]) | st.integers(0, 2**31 - 1))
    return wire_v3.encode_request(OperationType.ADD_ENTRY, txn, op, priority)


@settings(max_examples=300)
@given(java_adds())
def test_java_shaped_adds_match_with_their_values(payload: bytes) -> None:
    add = assert_same(payload)
    assert add is not None
    request = wire_v3.decode_v3_request(payload)
    op = request.operation
    assert op is not None and op.body is not None and op.ledger_id is not None and op.entry_id is not None
    ledger_id, entry_id, master_key, body_start, body_end, recovery, reply = add
    assert (ledger_id, entry_id) == wire_v3.ENTRY_IDS.unpack_from(op.body)
    assert (master_key, payload[body_start:body_end]) == (op.master_key, op.body)
    assert recovery == (op.flag == wire_v3.ADD_FLAG_RECOVERY_ADD)
    response = Operation("addResponse", status=StatusCode.EOK, ledger_id=op.ledger_id, entry_id=op.entry_id)
    expected = wire_v3.encode_response(
        OperationType.ADD_ENTRY, request.header.txn_id, StatusCode.EOK, response
    )
    assert reply == wire.frame(expected)


@given(java_adds(), st.binary(max_size=30), st.binary(max_size=30))
def test_java_shaped_adds_inside_a_larger_buffer(payload: bytes, before: bytes, after: bytes) -> None:
    assert assert_same(before + payload + after, len(before), len(before) + len(payload)) is not None


@given(st.integers(0, 40).filter(lambda n: n != JAVA_KEY_SIZE), st.integers(0, 15))
def test_other_key_sizes_and_short_bodies_are_not_fast_adds(key_size: int, body_size: int) -> None:
    for key, body in ((bytes(key_size), bytes(16)), (bytes(JAVA_KEY_SIZE), bytes(body_size))):
        op = Operation("addRequest", ledger_id=1, entry_id=2, master_key=key, body=body)
        assert assert_same(wire_v3.encode_request(OperationType.ADD_ENTRY, 7, op)) is None


# --- adds assembled from raw varint spellings ----------------------------------------------------------

# Any spelling of a varint: canonical, non-canonical (0x80 0x00), 10 bytes of up to 70 bits.
VARINTS = st.one_of(
    UINT64.map(encode_varint),
    st.builds(
        lambda high, last: bytes(high) + bytes([last]),
        st.lists(st.integers(0x80, 0xFF), max_size=9),
        st.integers(0, 0x7F),
    ),
)
# Not a varint the shape takes: 11 bytes, or none (a field's tag then the next field's).
NOT_VARINTS = st.sampled_from([b"\x80" * 10 + b"\x00", b"\xff" * 10 + b"\x01", b""])


def _mostly(draw: st.DrawFn, truth: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> Any:
    """One draw in eight from `other` (a lie, a bad spelling), else the truth: most cases still match."""
    return draw(other if draw(st.integers(0, 7)) == 7 else truth)  # shrinks to the truth


def _varint(draw: st.DrawFn) -> bytes:
    return _mostly(draw, VARINTS, NOT_VARINTS)  # type: ignore[no-any-return]


def _wrapped(value: int) -> bytes:
    """value + 2**64 as a 10-byte varint: the size it spells only to 64-bit arithmetic."""
    value += 1 << 64
    groups = [value >> (7 * i) & 0x7F for i in range(10)]
    return bytes(group | 0x80 for group in groups[:9]) + bytes(groups[9:])


def _size(draw: st.DrawFn, size: int) -> bytes:
    lies = VARINTS | NOT_VARINTS | st.just(_wrapped(size))
    return _mostly(draw, st.just(encode_varint(size)), lies)  # type: ignore[no-any-return]


@st.composite
def assembled_adds(draw: st.DrawFn) -> bytes:
    """The Java shape laid out byte by byte, each varint in any spelling, sizes sometimes lies."""
    header = b"\x08\x03\x10\x02\x18" + _varint(draw)
    if draw(st.booleans()):
        header += b"\x20" + _varint(draw)
    header_size = _mostly(draw, st.just(len(header) & 0x7F), st.integers(0, 0xFF))
    body = _mostly(draw, st.binary(min_size=16, max_size=40), st.binary(max_size=15))
    tail = b""
    if draw(st.booleans()):
        tail += b"\x28" + _varint(draw)
    if draw(st.booleans()):
        tail += b"\xa0\x06" + _mostly(draw, st.sampled_from([b"\x01", b"\x81\x00"]), VARINTS | NOT_VARINTS)
    op = b"\x08" + _varint(draw) + b"\x10" + _varint(draw) + b"\x1a\x14" + bytes(range(20))
    op += b"\x22" + _size(draw, len(body)) + body + tail
    return bytes([0x0A, header_size]) + header + b"\xaa\x06" + _size(draw, len(op)) + op


@settings(max_examples=500)
@given(assembled_adds())
def test_assembled_adds(payload: bytes) -> None:
    assert_same(payload)


# --- mutations ------------------------------------------------------------------------------------------


@st.composite
def mutated(draw: st.DrawFn, frames: st.SearchStrategy[bytes]) -> tuple[bytes, int, int]:
    """A frame with bytes flipped, cut or added, placed at an offset of a larger buffer."""
    frame = bytearray(draw(frames))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(frame) - 1))
        frame[at] = draw(st.integers(0, 0xFF) | st.sampled_from([frame[at] ^ 1, frame[at] ^ 0x80]))
    frame = frame[: draw(st.integers(0, len(frame)))] if draw(st.booleans()) else frame
    frame += draw(st.binary(max_size=12))
    before, after = draw(st.binary(max_size=12)), draw(st.binary(max_size=12))
    return before + frame + after, len(before), len(before) + len(frame)


@settings(max_examples=500)
@given(mutated(java_adds() | assembled_adds()))
def test_mutated_adds(case: tuple[bytes, int, int]) -> None:
    assert_same(*case)


@given(java_adds(), st.data())
def test_every_cut_and_extension_of_an_add(payload: bytes, draw: st.DataObject) -> None:
    cut = draw.draw(st.integers(0, len(payload) - 1))
    assert assert_same(payload, 0, cut) is None
    assert assert_same(payload + draw.draw(st.binary(min_size=1, max_size=8))) is None


# --- a real Java client --------------------------------------------------------------------------------

CAPTURE: list[dict[str, Any]] = json.loads(
    (JAVA_WIRE / "v3-protocol-write-read-fence.frames.json").read_text()
)
JAVA_REQUESTS = [
    bytes.fromhex(f["frame_hex"]) for c in CAPTURE for f in c["frames"] if f["dir"] == "client->bookie"
]


def test_java_capture_adds_all_take_the_fast_path() -> None:
    adds = 0
    for payload in JAVA_REQUESTS:
        add = assert_same(payload)
        op = wire_v3.decode_v3_request(payload).operation
        assert (add is not None) == (op is not None and op.kind == "addRequest")
        adds += add is not None
    assert adds > 0
    recovery = [a for p in JAVA_REQUESTS if (a := assert_same(p)) is not None and a[5]]
    assert recovery, "the capture has RECOVERY_ADD adds"


def test_java_capture_replies_are_javas() -> None:
    """Each EOK reply is byte for byte the one the Java bookie sent to the same add."""
    compared = 0
    for connection in CAPTURE:
        frames = [(f["dir"], bytes.fromhex(f["frame_hex"])) for f in connection["frames"]]
        answers = {wire_v3.decode_v3_response(p).header.txn_id: p for d, p in frames if d == "bookie->client"}
        for direction, payload in frames:
            add = assert_same(payload) if direction == "client->bookie" else None
            java = None if add is None else answers[wire_v3.decode_v3_request(payload).header.txn_id]
            if java is not None and wire_v3.decode_v3_response(java).status == StatusCode.EOK:
                assert add is not None and add[6] == wire.frame(java)
                compared += 1
    assert compared > 0


@given(st.sampled_from(JAVA_REQUESTS), st.data())
def test_mutated_java_capture(payload: bytes, draw: st.DataObject) -> None:
    assert_same(*draw.draw(mutated(st.just(payload))))
