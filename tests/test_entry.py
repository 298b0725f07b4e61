"""entry.py: packaged entries of a real Java 4.14.8 client, digests, master key, explicit LAC bodies."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.model import DigestType
from bkctl.protocol import entry, wire
from tests.conftest import JAVA_WIRE

PASSWORD = b"testpasswd"
MASTER_KEY = bytes.fromhex("3b56e4145429cee1d2a84df4f6a4cb8ad7173a46")

CONNECTIONS: list[dict[str, Any]] = json.loads(
    (JAVA_WIRE / "v2-protocol-write-read-fence.frames.json").read_text()
)
ADDS = [
    r
    for c in CONNECTIONS
    for f in c["frames"]
    if f["dir"] == "client->bookie"
    for r in [wire.decode_request(bytes.fromhex(f["frame_hex"]))]
    if isinstance(r, wire.AddRequest)
]
READS = [
    r
    for c in CONNECTIONS
    for f in c["frames"]
    if f["dir"] == "bookie->client"
    for r in [wire.decode_response(bytes.fromhex(f["frame_hex"]))]
    if isinstance(r, wire.ReadResponse) and r.rc == wire.ReturnCode.EOK
]


def test_master_key_of_the_capture_password() -> None:
    assert entry.master_key(PASSWORD) == MASTER_KEY
    assert {add.master_key for add in ADDS} == {MASTER_KEY}
    # An empty password gives SHA-1("ledger"), which the Java bookie special-cases as the "empty" key.
    assert entry.master_key(b"") == bytes.fromhex("850bf1071c5e3d8c24235676f8816ae0cbe2f14f")


def test_every_captured_add_is_a_crc32_entry_that_repackages_identically() -> None:
    assert len(ADDS) == 34  # ledger 7: 10 x 2, ledger 8: 6 x 2 (entry 5 refused), 2 recovery adds
    for add in ADDS:
        parsed = entry.parse_entry(add.entry, DigestType.CRC32)
        assert (parsed.ledger_id, parsed.entry_id) == (add.ledger_id, add.entry_id)
        assert parsed.payload == f"L{add.ledger_id}-E{add.entry_id}".encode()
        assert entry.digest_matches(add.entry, DigestType.CRC32)
        assert entry.infer_digest(add.entry) is DigestType.CRC32
        repackaged = entry.package_entry(
            DigestType.CRC32,
            parsed.ledger_id,
            parsed.entry_id,
            parsed.last_add_confirmed,
            parsed.length,
            parsed.payload,
        )
        assert repackaged == add.entry


def test_captured_entries_carry_lac_and_cumulative_length() -> None:
    by_ledger: dict[int, list[entry.PackagedEntry]] = {}
    for add in ADDS:
        if add.flags == 0:  # the first writer's adds, not recovery write-backs
            by_ledger.setdefault(add.ledger_id, []).append(entry.parse_entry(add.entry, DigestType.CRC32))
    for entries in by_ledger.values():
        unique = sorted({e.entry_id: e for e in entries}.values(), key=lambda e: e.entry_id)
        total = 0
        for e in unique:
            total += len(e.payload)
            assert e.length == total
            assert e.last_add_confirmed < e.entry_id


def test_captured_read_responses_verify() -> None:
    assert READS
    for read in READS:
        parsed = entry.parse_entry(read.entry, DigestType.CRC32)
        # A fencing read of entry -1 answers with the bookie's last entry, whatever its id.
        expected = parsed.entry_id if read.entry_id == wire.LAST_ENTRY_ID else read.entry_id
        entry.verify_entry(read.entry, DigestType.CRC32, read.ledger_id, expected)


def test_verify_entry_rejects_a_wrong_id_or_a_flipped_bit() -> None:
    data = ADDS[0].entry
    with pytest.raises(ProtocolError, match="asked for"):
        entry.verify_entry(data, DigestType.CRC32, ADDS[0].ledger_id, ADDS[0].entry_id + 1)
    corrupt = bytearray(data)
    corrupt[-1] ^= 1
    with pytest.raises(ProtocolError, match="digest mismatch"):
        entry.verify_entry(bytes(corrupt), DigestType.CRC32, ADDS[0].ledger_id, ADDS[0].entry_id)
    assert entry.infer_digest(bytes(corrupt)) is None


ids = st.integers(0, 2**63 - 1)
payloads = st.binary(max_size=300)


@given(st.sampled_from([DigestType.CRC32, DigestType.CRC32C]), ids, ids, st.integers(-1, 2**40), payloads)
def test_checksum_round_trips(digest: DigestType, lid: int, eid: int, lac: int, payload: bytes) -> None:
    data = entry.package_entry(digest, lid, eid, lac, len(payload), payload)
    assert len(data) == entry.HEADER_SIZE + digest.digest_size + len(payload)
    assert entry.parse_entry(data, digest) == entry.PackagedEntry(
        lid, eid, lac, len(payload), data[32 : 32 + digest.digest_size], payload
    )
    assert entry.verify_entry(data, digest, lid, eid).payload == payload
    assert entry.infer_digest(data) is digest


@given(ids, ids, payloads, st.binary(max_size=30))
def test_mac_round_trip_needs_the_password(lid: int, eid: int, payload: bytes, password: bytes) -> None:
    key = entry.mac_key(password)
    data = entry.package_entry(DigestType.MAC, lid, eid, -1, len(payload), payload, key)
    assert entry.verify_entry(data, DigestType.MAC, lid, eid, key).payload == payload
    assert entry.infer_digest(data, key) is DigestType.MAC
    assert not entry.digest_matches(data, DigestType.MAC)  # no key, no match
    assert not entry.digest_matches(data, DigestType.MAC, entry.mac_key(password + b"x"))
    with pytest.raises(ProtocolError):
        entry.package_entry(DigestType.MAC, lid, eid, -1, 0, b"")


def test_digest_sizes_and_known_values() -> None:
    header = entry.HEADER.pack(1, 2, 3, 4)
    assert entry.compute_digest(DigestType.CRC32, header, b"x").hex()[:8] == "00000000"  # int64 of a u32
    assert len(entry.compute_digest(DigestType.CRC32C, header, b"x")) == 4
    assert len(entry.compute_digest(DigestType.MAC, header, b"x", entry.mac_key(b"p"))) == 20
    assert entry.compute_digest(DigestType.DUMMY, header, b"x") == b""
    dummy = entry.package_entry(DigestType.DUMMY, 1, 2, 3, 4, b"data")
    assert dummy == header + b"data"
    assert entry.verify_entry(dummy, DigestType.DUMMY, 1, 2).payload == b"data"
    assert entry.infer_digest(dummy) is None  # DUMMY is never inferred


def test_known_crc32c_value() -> None:
    # CRC-32C of "123456789" is the standard check value 0xe3069283.
    assert entry.compute_digest(DigestType.CRC32C, b"1234", b"56789") == bytes.fromhex("e3069283")
    assert entry.compute_digest(DigestType.CRC32, b"1234", b"56789") == bytes.fromhex("00000000cbf43926")


@pytest.mark.parametrize("big", [2**63, -(2**63) - 1])
def test_ids_outside_int64_raise_protocol_error(big: int) -> None:
    with pytest.raises(ProtocolError):
        entry.package_entry(DigestType.CRC32, big, 0, -1, 0, b"")
    with pytest.raises(ProtocolError):
        entry.package_entry(DigestType.CRC32C, 1, 0, -1, big, b"")
    with pytest.raises(ProtocolError):
        entry.encode_lac_body(DigestType.CRC32, 1, big)


def test_short_and_oversized_entries() -> None:
    with pytest.raises(ProtocolError):
        entry.parse_entry(bytes(35), DigestType.CRC32C)
    assert not entry.digest_matches(bytes(10), DigestType.CRC32)
    with pytest.raises(ProtocolError):
        entry.package_entry(DigestType.DUMMY, 1, 1, 0, 0, bytes(limits.ENTRY_SIZE_MAX + 1))


@given(st.sampled_from(list(DigestType)), ids, st.integers(-1, 2**63 - 1), st.binary(max_size=20))
def test_lac_body_round_trip(digest: DigestType, lid: int, lac: int, password: bytes) -> None:
    key = entry.mac_key(password) if digest is DigestType.MAC else None
    body = entry.encode_lac_body(digest, lid, lac, key)
    assert len(body) == 16 + digest.digest_size
    assert entry.decode_lac_body(body) == (lid, lac)
    assert body[16:] == entry.compute_digest(digest, body[:16], b"", key)


@given(st.binary(max_size=80), st.sampled_from(list(DigestType)))
def test_arbitrary_bytes_raise_only_protocol_error(data: bytes, digest: DigestType) -> None:
    with contextlib.suppress(ProtocolError):
        entry.parse_entry(data, digest)
    with contextlib.suppress(ProtocolError):
        entry.verify_entry(data, digest, 1, 2, entry.mac_key(b""))
    with contextlib.suppress(ProtocolError):
        entry.decode_lac_body(data)
    entry.infer_digest(data, entry.mac_key(b""))
