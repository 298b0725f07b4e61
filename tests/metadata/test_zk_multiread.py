"""The multiRead codec (bkctl.metadata.zk_multiread): request bytes, answers, malformed responses."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bkctl.errors import ProtocolError
from bkctl.metadata.store import Stat
from bkctl.metadata.zk_multiread import END, HEADER, MultiRead, MultiReadError

STAT = Stat(
    version=3, cversion=1, ctime_ms=10, mtime_ms=20, ephemeral_owner=0x77, data_length=2, num_children=1,
    czxid=5, mzxid=6,
)  # fmt: skip
# czxid, mzxid, ctime, mtime, version, cversion, aversion, ephemeralOwner, dataLength, numChildren, pzxid
STAT_BYTES = struct.pack("!qqqqiiiqiiq", 5, 6, 10, 20, 3, 1, 0, 0x77, 2, 1, 9)


def get_data_answer(data: bytes | None) -> bytes:
    length = -1 if data is None else len(data)
    return HEADER.pack(4, 0, 0) + struct.pack("!i", length) + (data or b"") + STAT_BYTES


def error_answer(code: int) -> bytes:
    return HEADER.pack(-1, 0, code) + struct.pack("!i", code)


def test_request_bytes() -> None:
    request = MultiRead(["/a", "/bc"])
    assert request.type == 22
    assert request.serialize() == (
        b"\x00\x00\x00\x04\x00\xff\xff\xff\xff" + b"\x00\x00\x00\x02/a\x00"
        b"\x00\x00\x00\x04\x00\xff\xff\xff\xff" + b"\x00\x00\x00\x03/bc\x00"
        b"\xff\xff\xff\xff\x01\xff\xff\xff\xff"
    )
    assert repr(request) == "MultiRead(2 paths)"


def test_answers_in_request_order() -> None:
    response = b"HDR" + get_data_answer(b"hi") + error_answer(-101) + get_data_answer(None) + END
    answers = MultiRead(["/a", "/missing", "/null"]).deserialize(response, 3)
    assert answers == [(b"hi", STAT), -101, (b"", STAT)]


@pytest.mark.parametrize(
    "response",
    [
        get_data_answer(b"hi") + END,  # one answer short
        get_data_answer(b"hi") * 3 + END,  # one too many
        get_data_answer(b"hi") + get_data_answer(b"hi"),  # no end marker
        HEADER.pack(8, 0, 0) + b"\x00" * 8 + END,  # getChildren: never asked for
    ],
)
def test_mismatched_responses_are_protocol_errors(response: bytes) -> None:
    with pytest.raises(MultiReadError):
        MultiRead(["/a", "/b"]).deserialize(response, 0)


def test_every_truncation_is_a_protocol_error() -> None:
    response = get_data_answer(b"hello") + error_answer(-101) + END
    for cut in range(len(response)):
        with pytest.raises(ProtocolError):
            MultiRead(["/a", "/b"]).deserialize(response[:cut], 0)


@given(st.binary(max_size=200), st.integers(0, 4))
def test_arbitrary_bytes_raise_only_protocol_error(response: bytes, count: int) -> None:
    try:
        answers = MultiRead([f"/n{i}" for i in range(count)]).deserialize(response, 0)
    except ProtocolError:
        return
    assert len(answers) == count
