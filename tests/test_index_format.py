"""Index codec: golden Java index files, header versions, slots with holes, paths, garbage."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bkctl.errors import ProtocolError
from bkctl.model import DigestType
from bkctl.protocol import entry
from bkctl.protocol import index_format as ixf
from bkctl.protocol.entrylog_format import entry_location, split_location
from bkctl.protocol.index_format import IndexHeader
from tests.conftest import JAVA_BOOKIES

MASTER_KEY = bytes.fromhex("3b56e4145429cee1d2a84df4f6a4cb8ad7173a46")


@pytest.mark.parametrize("bookie", ["bookie1", "bookie2", "bookie3"])
@pytest.mark.parametrize("ledger", [0, 1, 2, 3])
def test_golden_java_index(bookie: str, ledger: int) -> None:
    path = JAVA_BOOKIES / bookie / "ledgers" / "current" / ixf.index_path(ledger)
    data = path.read_bytes()
    header = ixf.decode_header(data)
    assert header.version == 1 and header.master_key == MASTER_KEY and header.explicit_lac is None
    assert header.fenced == (ledger == 2)  # fenced by the recovery open of ledger 2
    assert ixf.encode_header(header) == data[: ixf.HEADER_SIZE]
    slots = list(ixf.decode_slots(data[ixf.HEADER_SIZE :]))
    assert slots and all(split_location(loc)[0] == 0 for _, loc in slots)
    assert len(data) == ixf.HEADER_SIZE + ixf.PAGE_SIZE
    assert ixf.encode_slots(dict(slots)) == data[ixf.HEADER_SIZE :]


def test_index_paths() -> None:
    assert ixf.index_path(1) == "0/1/1.idx"
    assert ixf.index_path(1234567890) == "2/d2/499602d2.idx"
    assert ixf.parse_index_file_name("499602d2.idx") == 1234567890
    assert ixf.slot_offset(3) == 1048


def test_explicit_lac_header_round_trip() -> None:
    lac = entry.encode_lac_body(DigestType.CRC32C, 5, 41)
    header = IndexHeader(1, MASTER_KEY, ixf.STATE_FENCED, lac)
    decoded = ixf.decode_header(ixf.encode_header(header))
    assert decoded == header and decoded.fenced
    assert entry.decode_lac_body(decoded.explicit_lac or b"") == (5, 41)
    v0 = IndexHeader(0, b"k" * 20)
    assert ixf.decode_header(ixf.encode_header(v0)) == v0
    with pytest.raises(ProtocolError):
        ixf.encode_header(IndexHeader(0, b"", 0, lac))


def test_slots_with_holes() -> None:
    locations = {0: entry_location(0, 1028), 3: entry_location(2, 99), 1500: entry_location(1, 4)}
    encoded = ixf.encode_slots(locations)
    assert len(encoded) == 2 * ixf.PAGE_SIZE
    assert dict(ixf.decode_slots(encoded)) == locations
    assert dict(ixf.decode_slots(encoded[8 * 1000 :], 1000)) == {1500: locations[1500]}


@pytest.mark.parametrize(
    "data",
    [
        b"BKLX" + bytes(1020),
        b"BKLE\0\0\0\x02" + bytes(1016),
        b"BKLE\0\0\0\0\xff\xff\xff\xff" + bytes(1012),
        b"BKLE\0\0\0\0\0\0\x04\x00" + bytes(1012),
        b"BKLE\0\0\0\x01\0\0\0\0\0\0\0\0\0\0\0\x05" + bytes(1004),
        b"BKLE\0\0\0\x01\0\0\0\0\0\0\0\0\0\0\x03\xff" + bytes(1004),
        b"BKLE",
    ],
)
def test_corrupt_headers(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        ixf.decode_header(data)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 1),
    st.binary(max_size=64),
    st.integers(-(2**31), 2**31 - 1),
    st.dictionaries(st.integers(0, 3000), st.integers(1, 2**63 - 1), max_size=30),
)
def test_round_trip(version: int, key: bytes, state: int, locations: dict[int, int]) -> None:
    header = IndexHeader(version, key, state, b"\1" * 16 if version else None)
    assert ixf.decode_header(ixf.encode_header(header)) == header
    assert dict(ixf.decode_slots(ixf.encode_slots(locations))) == locations


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=1200))
def test_arbitrary_bytes_raise_only_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        ixf.decode_header(b"BKLE" + data)
    with contextlib.suppress(ProtocolError):
        ixf.decode_header(data)
    list(ixf.decode_slots(data))
