"""wire_v3.py: v3 (protobuf) frames of a real Java 4.14.8 capture, v2/v3 detection, malformed input."""

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
from bkctl.protocol import entry as entry_codec
from bkctl.protocol import wire, wire_v3
from bkctl.protocol.protobuf import Field, bytes_field, encode_fields, varint_field
from bkctl.protocol.wire_v3 import OperationType, PacketHeader, StatusCode
from tests.conftest import JAVA_WIRE

V3: list[dict[str, Any]] = json.loads((JAVA_WIRE / "v3-protocol-write-read-fence.frames.json").read_text())
V2: list[dict[str, Any]] = json.loads((JAVA_WIRE / "v2-protocol-write-read-fence.frames.json").read_text())
MASTER_KEY = bytes.fromhex("3b56e4145429cee1d2a84df4f6a4cb8ad7173a46")
TO_BOOKIE = "client->bookie"


def frames(capture: list[dict[str, Any]], direction: str) -> list[bytes]:
    return [bytes.fromhex(f["frame_hex"]) for c in capture for f in c["frames"] if f["dir"] == direction]


V3_REQUESTS = frames(V3, TO_BOOKIE)
V3_RESPONSES = frames(V3, "bookie->client")


def test_every_v3_request_decodes() -> None:
    operations = set()
    for payload in V3_REQUESTS:
        request = wire_v3.decode_v3_request(payload)
        assert request.header.version == 3
        assert request.operation is not None
        operations.add((request.header.operation, request.operation.kind, request.operation.flag))
        if request.operation.kind == "addRequest":
            assert request.operation.master_key == MASTER_KEY
    assert operations == {
        (OperationType.ADD_ENTRY, "addRequest", None),
        (OperationType.ADD_ENTRY, "addRequest", wire_v3.ADD_FLAG_RECOVERY_ADD),
        (OperationType.READ_ENTRY, "readRequest", None),
        (OperationType.READ_ENTRY, "readRequest", wire_v3.READ_FLAG_FENCE_LEDGER),
    }


def test_every_v3_response_decodes_and_matches_its_request_txn() -> None:
    for connection in V3:
        pending: dict[int, int] = {}
        for f in connection["frames"]:
            payload = bytes.fromhex(f["frame_hex"])
            if f["dir"] == TO_BOOKIE:
                request = wire_v3.decode_v3_request(payload)
                pending[request.header.txn_id] = request.header.operation
                continue
            response = wire_v3.decode_v3_response(payload)
            assert pending.pop(response.header.txn_id) == response.header.operation
            assert response.operation is not None
            assert response.operation.status == response.status


def test_v3_add_bodies_are_crc32_entries_of_the_captured_ledgers() -> None:
    for payload in V3_REQUESTS:
        op = wire_v3.decode_v3_request(payload).operation
        if op is None or op.kind != "addRequest":
            continue
        assert op.body is not None and op.ledger_id is not None and op.entry_id is not None
        parsed = entry_codec.verify_entry(op.body, DigestType.CRC32, op.ledger_id, op.entry_id)
        assert parsed.payload == f"L{op.ledger_id}-E{op.entry_id}".encode()


def test_v3_capture_shows_fencing_recovery_priority_and_a_fenced_add() -> None:
    reads = [wire_v3.decode_v3_request(p) for p in V3_REQUESTS]
    fencing = [r for r in reads if r.operation and r.operation.flag == wire_v3.READ_FLAG_FENCE_LEDGER]
    assert {(r.operation.ledger_id if r.operation else None) for r in fencing} == {10}
    assert any(r.header.priority > 0 for r in fencing)  # recovery reads are high priority
    assert any(r.operation and r.operation.entry_id == -1 for r in fencing)  # the fencing LAC read
    statuses = {wire_v3.decode_v3_response(p).status for p in V3_RESPONSES}
    assert statuses == {StatusCode.EOK, StatusCode.ENOENTRY, StatusCode.EFENCED}


def test_describe_shows_keys_as_hex_and_bodies_as_sizes() -> None:
    request = wire_v3.decode_v3_request(V3_REQUESTS[0])
    assert request.operation is not None
    described = request.operation.describe()
    assert described["kind"] == "addRequest"
    assert described["master_key"] == MASTER_KEY.hex()
    assert described["body_size"] == len(request.operation.body or b"")
    assert "flag" not in described


def test_v2_and_v3_frames_are_told_apart_by_the_first_byte() -> None:
    for payload in V3_REQUESTS + V3_RESPONSES:
        assert not wire_v3.is_v2_frame(payload)
        assert wire_v3.protocol_version(payload) == 3
    for payload in frames(V2, TO_BOOKIE) + frames(V2, "bookie->client"):
        assert wire_v3.is_v2_frame(payload)
        assert wire_v3.protocol_version(payload) == 2
        # A v2 frame is never valid protobuf: field number 0.
        with pytest.raises(ProtocolError):
            wire_v3.decode_v3_request(payload)
    assert wire_v3.is_v2_frame(wire.encode_read_request(1, 2, version=0))
    assert not wire_v3.is_v2_frame(b"")
    for bad in (b"", b"\x03\x00", b"\x07"):
        with pytest.raises(ProtocolError):
            wire_v3.protocol_version(bad)


def test_status_codes_map_to_v2_return_codes() -> None:
    assert {s.to_return_code().name for s in StatusCode} == {rc.name for rc in wire.ReturnCode}
    assert StatusCode.EFENCED.to_return_code() == wire.ReturnCode.EFENCED
    assert wire_v3.status_name(504) == "EFENCED"
    assert wire_v3.status_name(1) == "status 1"
    assert wire_v3.operation_name(12) == "BATCH_READ_ENTRY"
    assert wire_v3.operation_name(99) == "operation 99"


def header(operation: int, txn_id: int, priority: int | None = None) -> Field:
    fields = [varint_field(1, 3), varint_field(2, operation), varint_field(3, txn_id)]
    if priority is not None:
        fields.append(varint_field(4, priority))
    return bytes_field(1, encode_fields(fields))


int64 = st.integers(-(2**63), 2**63 - 1)
uint64 = st.integers(0, 2**64 - 1)


@given(uint64, int64, int64, st.binary(max_size=40), st.integers(0, 2**32 - 1))
def test_built_read_lac_and_write_lac_requests(
    txn_id: int, ledger_id: int, lac: int, body: bytes, priority: int
) -> None:
    write_lac = encode_fields(
        [
            bytes_field(
                103,
                encode_fields(
                    [
                        varint_field(1, ledger_id),
                        varint_field(2, lac),
                        bytes_field(3, MASTER_KEY),
                        bytes_field(4, body),
                    ]
                ),
            ),
            header(OperationType.WRITE_LAC, txn_id, priority),  # field order is free in protobuf
        ]
    )
    request = wire_v3.decode_v3_request(write_lac)
    assert request.header == PacketHeader(3, OperationType.WRITE_LAC, txn_id, priority)
    assert request.operation == wire_v3.Operation(
        "writeLacRequest", ledger_id=ledger_id, lac=lac, master_key=MASTER_KEY, body=body
    )
    read_lac = encode_fields(
        [
            header(OperationType.READ_LAC, txn_id),
            bytes_field(104, encode_fields([varint_field(1, ledger_id)])),
        ]
    )
    assert wire_v3.decode_v3_request(read_lac).operation == wire_v3.Operation(
        "readLacRequest", ledger_id=ledger_id
    )


@given(st.sampled_from(list(StatusCode)), int64, st.binary(max_size=40), st.binary(max_size=40))
def test_built_read_lac_and_bookie_info_responses(
    status: int, ledger_id: int, lac: bytes, last: bytes
) -> None:
    read_lac = encode_fields(
        [
            header(OperationType.READ_LAC, 7),
            varint_field(2, status),
            bytes_field(
                104,
                encode_fields(
                    [
                        varint_field(1, status),
                        varint_field(2, ledger_id),
                        bytes_field(3, lac),
                        bytes_field(4, last),
                    ]
                ),
            ),
        ]
    )
    response = wire_v3.decode_v3_response(read_lac)
    assert response.status == status
    assert response.operation == wire_v3.Operation(
        "readLacResponse", status=status, ledger_id=ledger_id, body=lac, last_entry_body=last
    )
    info = encode_fields(
        [
            header(OperationType.GET_BOOKIE_INFO, 8),
            varint_field(2, status),
            bytes_field(
                105, encode_fields([varint_field(1, status), varint_field(2, 10**12), varint_field(3, 10**9)])
            ),
        ]
    )
    op = wire_v3.decode_v3_response(info).operation
    assert op == wire_v3.Operation(
        "getBookieInfoResponse", status=status, total_disk_capacity=10**12, free_disk_space=10**9
    )


def test_request_context_and_unknown_fields() -> None:
    context = bytes_field(200, encode_fields([bytes_field(1, "trace"), bytes_field(2, "abc")]))
    unknown = varint_field(150, 1)  # a field a newer client might send: skipped
    payload = encode_fields([header(OperationType.START_TLS, 1), bytes_field(106, b""), context, unknown])
    request = wire_v3.decode_v3_request(payload)
    assert request.operation == wire_v3.Operation("startTLSRequest")
    assert request.context == (("trace", "abc"),)


@pytest.mark.parametrize(
    "payload",
    [
        b"",  # no header
        encode_fields([bytes_field(1, encode_fields([varint_field(1, 3), varint_field(2, 1)]))]),  # no txnId
        encode_fields([varint_field(1, 5)]),  # header is not a message
        encode_fields(
            [header(1, 1), bytes_field(100, encode_fields([bytes_field(1, b"x")]))]
        ),  # ledgerId bytes
        encode_fields([header(1, 1), varint_field(100, 1)]),  # op message is a number
        encode_fields(
            [header(5, 1), bytes_field(102, encode_fields([bytes_field(1, b"\xff")]))]
        ),  # not UTF-8
    ],
)
def test_malformed_requests(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        wire_v3.decode_v3_request(payload)


def test_response_needs_a_status() -> None:
    with pytest.raises(ProtocolError, match="status"):
        wire_v3.decode_v3_response(encode_fields([header(1, 1)]))


def test_oversized_frame_is_refused_before_parsing() -> None:
    with pytest.raises(ProtocolError, match="limit"):
        wire_v3.decode_v3_request(bytes(limits.FRAME_SIZE_MAX + 1))


@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_protocol_error(data: bytes) -> None:
    for decode in (wire_v3.decode_v3_request, wire_v3.decode_v3_response, wire_v3.protocol_version):
        with contextlib.suppress(ProtocolError):
            decode(data)


@given(st.data())
def test_mutated_capture_frames_raise_only_protocol_error(data: st.DataObject) -> None:
    payload = bytearray(data.draw(st.sampled_from(V3_REQUESTS + V3_RESPONSES)))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(payload) - 1))
        payload[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    for decode in (wire_v3.decode_v3_request, wire_v3.decode_v3_response):
        with contextlib.suppress(ProtocolError):
            decode(bytes(payload[:cut]))
