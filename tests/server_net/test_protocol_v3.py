"""The bookie's v3 (protobuf) requests on a StringTransport: a Java client's captured frames answered
byte-for-byte as the Java bookie answered them, every v3 operation, long-poll reads, bad input.
(The v2 protocol tests run over v3 too: tests/server_net/test_protocol.py, `dialect`.)"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from bkctl.protocol import entry_availability, wire, wire_v3
from bkctl.protocol.protobuf import bytes_field, encode_fields, encode_varint, varint_field
from bkctl.protocol.wire_v3 import Operation, OperationType, StatusCode
from tests.conftest import JAVA_WIRE
from tests.server_net.test_protocol import MemoryStorage, RecordingStorage, connect, v3_replies
from tests.server_net.wire_client import MASTER_KEY, package

OP = OperationType
TO_BOOKIE = "client->bookie"
CAPTURE: list[dict[str, Any]] = json.loads(
    (JAVA_WIRE / "v3-protocol-write-read-fence.frames.json").read_text()
)


def framed(payload: bytes) -> bytes:
    return wire.frame(payload)


def _phase(connection: dict[str, Any]) -> int:
    """When a captured connection ran: writers, then the recovering reader, then the writer's adds that
    met the fence (the capture keeps time per connection only, this is the order the README tells)."""
    frames = [bytes.fromhex(f["frame_hex"]) for f in connection["frames"] if f["dir"] == TO_BOOKIE]
    requests = [wire_v3.decode_v3_request(frame) for frame in frames]
    fencing = any(r.operation and r.operation.flag == wire_v3.READ_FLAG_FENCE_LEDGER for r in requests)
    return 1 if fencing else 0


def test_java_clients_requests_get_java_bookies_answers_byte_for_byte() -> None:
    by_bookie: dict[str, list[dict[str, Any]]] = {}
    for connection in CAPTURE:
        by_bookie.setdefault(connection["bookie"], []).append(connection)
    compared = 0
    for connections in by_bookie.values():
        storage = MemoryStorage()
        # (phase, connection, frame index): the fenced adds (answered EFENCED by Java) come last.
        steps = []
        for number, connection in enumerate(connections):
            frames = connection["frames"]
            for index, f in enumerate(frames):
                if f["dir"] != TO_BOOKIE:
                    continue
                answer = next((g for g in frames[index + 1 :] if g["dir"] != TO_BOOKIE), None)
                status = answer and wire_v3.decode_v3_response(bytes.fromhex(answer["frame_hex"])).status
                fenced = status == StatusCode.EFENCED
                steps.append((2 if fenced else _phase(connection), number, index))
        protocols = [connect(storage) for _ in connections]
        got: dict[int, list[bytes]] = {n: [] for n in range(len(connections))}
        for _, number, index in sorted(steps):
            proto, transport = protocols[number]
            proto.dataReceived(framed(bytes.fromhex(connections[number]["frames"][index]["frame_hex"])))
            storage.sync()
            decoder = wire.FrameDecoder()
            decoder.feed(transport.value())
            transport.clear()
            got[number].extend(decoder.frames())
        for number, connection in enumerate(connections):
            expected = [bytes.fromhex(f["frame_hex"]) for f in connection["frames"] if f["dir"] != TO_BOOKIE]
            assert got[number] == expected, connection["client"]
            compared += len(expected)
    assert compared == 54


txns = itertools.count(100)


def request(operation: int, op: Operation | None, priority: int = 0, version: int = 3) -> bytes:
    if op is None:
        header = encode_fields([varint_field(1, version), varint_field(2, operation), varint_field(3, 77)])
        return framed(encode_fields([bytes_field(1, header)]))
    if version != 3:
        payload = wire_v3.encode_request(operation, 77, op, priority)
        return framed(payload.replace(b"\x08\x03", bytes((8, version)), 1))
    return framed(wire_v3.encode_request(operation, next(txns), op, priority))


def add(ledger_id: int, entry_id: int, lac: int = -1, payload: bytes = b"x") -> bytes:
    body = wire_v3.Operation(
        "addRequest",
        ledger_id=ledger_id,
        entry_id=entry_id,
        master_key=MASTER_KEY,
        body=package(ledger_id, entry_id, payload, lac=lac),
    )
    return request(OP.ADD_ENTRY, body)


def one(transport: Any) -> wire_v3.V3Response:
    (response,) = v3_replies(transport)
    return response


def test_entries_of_ledger_and_unknown_operations() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(b"".join(add(7, e) for e in (0, 1, 3, 4)))
    storage.sync()
    v3_replies(transport)
    asks = [wire_v3.encode_entries_of_ledger_request(txn, lid) for txn, lid in ((11, 7), (12, 8))]
    # RANGE_READ_ENTRY (priority 5) and BATCH_READ_ENTRY: operations a 4.14 bookie does not serve.
    range_read = encode_fields([bytes_field(1, bytes.fromhex("0803100318142005"))])
    batch_read = encode_fields([bytes_field(1, bytes.fromhex("0803100c1815"))])
    proto.dataReceived(b"".join(framed(p) for p in (*asks, range_read, batch_read)))
    decoder = wire.FrameDecoder()
    decoder.feed(transport.value())
    raw = decoder.frames()
    got = {r.header.txn_id: r for r in map(wire_v3.decode_v3_response, raw)}
    assert got[11].status == StatusCode.EOK and got[11].operation is not None
    assert list(entry_availability.entry_ids(got[11].operation.body or b"")) == [0, 1, 3, 4]
    assert got[12].status == StatusCode.ENOLEDGER
    # Java's default branch: the request's header echoed (priority too), EBADREQ, no operation message.
    assert raw[2:] == [range_read + bytes.fromhex("109403"), batch_read + bytes.fromhex("109403")]
    assert not transport.disconnecting
    assert proto.factory.metrics.bad_requests == 2


def test_auth_is_answered_like_the_auth_disabled_java_bookie() -> None:
    proto, transport = connect(MemoryStorage())
    ask = Operation("authRequest", plugin_name="AuthDisabledPlugin", body=b"")
    proto.dataReceived(request(OP.AUTH, ask, priority=0))
    payload = transport.value()[4:]
    response = one(transport)
    assert response.status == StatusCode.EOK
    assert response.operation == Operation("authResponse", plugin_name="AuthDisabledPlugin", body=b"")
    assert payload.endswith(bytes.fromhex("b206160a12") + b"AuthDisabledPlugin" + b"\x12\x00")


def test_start_tls_without_tls_configured_is_ebadreq() -> None:
    proto, transport = connect(MemoryStorage())
    proto.dataReceived(request(OP.START_TLS, Operation("startTLSRequest")))
    response = one(transport)
    assert (response.status, response.operation, response.header.operation) == (
        StatusCode.EBADREQ,
        None,
        OP.START_TLS,
    )
    assert not transport.disconnecting


def test_write_lac_force_ledger_read_lac() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(add(4, 0) + add(4, 1, lac=0))
    storage.sync()
    v3_replies(transport)
    write = Operation("writeLacRequest", ledger_id=4, lac=1, master_key=MASTER_KEY, body=b"lac-body")
    proto.dataReceived(request(OP.WRITE_LAC, write))
    proto.dataReceived(request(OP.FORCE_LEDGER, Operation("forceLedgerRequest", ledger_id=4)))
    assert transport.value() == b"" and proto.pending == 2  # both wait for the journal's fsync
    storage.sync()
    lac_answer, force_answer = v3_replies(transport)
    assert lac_answer.operation == Operation("writeLacResponse", status=0, ledger_id=4)
    assert force_answer.operation == Operation("forceLedgerResponse", status=0, ledger_id=4)
    proto.dataReceived(request(OP.READ_LAC, Operation("readLacRequest", ledger_id=4)))
    answer = one(transport).operation
    assert answer == Operation(
        "readLacResponse", status=0, ledger_id=4, body=b"lac-body", last_entry_body=package(4, 1, b"x", lac=0)
    )
    proto.dataReceived(request(OP.READ_LAC, Operation("readLacRequest", ledger_id=9)))
    assert one(transport).status == StatusCode.ENOENTRY  # neither LAC nor entry: Java says ENOENTRY
    other = Operation("writeLacRequest", ledger_id=4, lac=1, master_key=bytes(20), body=b"x")
    proto.dataReceived(request(OP.WRITE_LAC, other))
    assert one(transport).status == StatusCode.EUA


def test_bookie_info_answers_what_was_asked() -> None:
    proto, transport = connect(MemoryStorage())
    both = wire_v3.BOOKIE_INFO_FREE_DISK_SPACE | wire_v3.BOOKIE_INFO_TOTAL_DISK_CAPACITY
    for requested, total, free in (
        (both, 10**12, 4 * 10**11),
        (wire_v3.BOOKIE_INFO_FREE_DISK_SPACE, None, 4 * 10**11),
        (0, None, None),
    ):
        proto.dataReceived(
            request(OP.GET_BOOKIE_INFO, Operation("getBookieInfoRequest", requested=requested))
        )
        assert one(transport).operation == Operation(
            "getBookieInfoResponse", status=0, total_disk_capacity=total, free_disk_space=free
        )


def test_reads_carry_the_bookies_lac_and_fencing_reads_do_not() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(add(2, 0) + add(2, 1, lac=0) + add(2, 2, lac=1))
    storage.sync()
    v3_replies(transport)
    proto.dataReceived(request(OP.READ_ENTRY, Operation("readRequest", ledger_id=2, entry_id=0)))
    assert one(transport).operation == Operation(
        "readResponse", status=0, ledger_id=2, entry_id=0, body=package(2, 0, b"x"), max_lac=1
    )
    fence = Operation("readRequest", ledger_id=2, entry_id=-1, master_key=MASTER_KEY, flag=1)
    proto.dataReceived(request(OP.READ_ENTRY, fence, priority=wire_v3.HIGH_PRIORITY))
    storage.sync()
    assert one(transport).operation == Operation(
        "readResponse", status=0, ledger_id=2, entry_id=-1, body=package(2, 2, b"x", lac=1)
    )


def long_poll(
    ledger_id: int, previous_lac: int, timeout_ms: int | None = 1000, piggyback: bool = True
) -> bytes:
    op = Operation(
        "readRequest",
        ledger_id=ledger_id,
        entry_id=-1,
        previous_lac=previous_lac,
        timeout_ms=timeout_ms,
        flag=wire_v3.READ_FLAG_ENTRY_PIGGYBACK if piggyback else None,
    )
    return request(OP.READ_ENTRY, op)


def test_long_poll_waits_for_the_lac_and_piggybacks_the_next_entry() -> None:
    storage, clock = MemoryStorage(), Clock()
    writer, _ = connect(storage, reactor=clock)
    reader, transport = connect(storage, reactor=clock)
    writer.dataReceived(add(6, 0) + add(6, 1, lac=0))
    reader.dataReceived(long_poll(6, previous_lac=0))  # the LAC is 0: wait
    assert transport.value() == b""
    writer.dataReceived(add(6, 2, lac=1))  # LAC 1 > 0: the poll is answered on the next tick
    clock.advance(0)
    answer = one(transport).operation
    assert answer is not None and answer.lac_update_timestamp is not None
    assert (answer.status, answer.entry_id, answer.max_lac, answer.body) == (
        0,
        1,
        1,
        package(6, 1, b"x", lac=0),
    )
    # Already past: answered at once, without a timestamp.
    reader.dataReceived(long_poll(6, previous_lac=0))
    answer = one(transport).operation
    assert answer is not None and (answer.entry_id, answer.max_lac, answer.lac_update_timestamp) == (
        1,
        1,
        None,
    )


def test_long_poll_times_out_with_the_lac_only_and_ends_on_fence() -> None:
    storage, clock = MemoryStorage(), Clock()
    proto, transport = connect(storage, reactor=clock)
    proto.dataReceived(add(8, 0) + add(8, 1, lac=0))
    storage.sync()
    v3_replies(transport)
    proto.dataReceived(long_poll(8, previous_lac=0, timeout_ms=500))
    clock.advance(0.4)
    assert transport.value() == b""
    clock.advance(0.2)
    assert one(transport).operation == Operation(
        "readResponse", status=0, ledger_id=8, entry_id=-1, max_lac=0
    )
    assert storage.watchers == []
    proto.dataReceived(long_poll(8, previous_lac=0, timeout_ms=60_000))
    fence = Operation("readRequest", ledger_id=8, entry_id=1, master_key=MASTER_KEY, flag=1)
    proto.dataReceived(request(OP.READ_ENTRY, fence))
    clock.advance(0)
    storage.sync()
    statuses = sorted((r.operation.entry_id, r.status) for r in v3_replies(transport) if r.operation)
    assert statuses == [(-1, 0), (1, 0)]  # the poll ended with the fence, the fencing read answered
    assert clock.getDelayedCalls() == [] or all(not c.active() for c in clock.getDelayedCalls())


def test_long_poll_without_piggyback_reads_the_asked_entry_and_connection_loss_ends_it() -> None:
    storage, clock = MemoryStorage(), Clock()
    proto, transport = connect(storage, reactor=clock)
    proto.dataReceived(add(9, 0))
    storage.sync()
    v3_replies(transport)
    proto.dataReceived(long_poll(9, previous_lac=-2, piggyback=False))  # LAC -1 > -2: no wait
    answer = one(transport).operation
    assert answer is not None and (answer.entry_id, answer.body, answer.max_lac) == (
        -1,
        package(9, 0, b"x"),
        -1,
    )
    proto.dataReceived(long_poll(9, previous_lac=5))
    assert len(storage.watchers) == 1
    proto.connectionLost()
    assert storage.watchers == [] and not any(c.active() for c in clock.getDelayedCalls())
    bad = Operation(
        "readRequest", ledger_id=9, entry_id=0, previous_lac=-2, flag=wire_v3.READ_FLAG_ENTRY_PIGGYBACK
    )
    proto2, transport2 = connect(storage, reactor=clock)
    proto2.dataReceived(request(OP.READ_ENTRY, bad))
    assert one(transport2).status == StatusCode.EBADREQ  # piggyback needs entry -1, as in Java


def test_wrong_version_and_mismatched_or_missing_operation() -> None:
    storage = MemoryStorage()
    proto, transport = connect(storage)
    read = Operation("readRequest", ledger_id=1, entry_id=0)
    proto.dataReceived(request(OP.READ_ENTRY, read, version=2))
    response = one(transport)
    assert response.status == StatusCode.EBADVERSION
    assert response.operation == Operation(
        "readResponse", status=StatusCode.EBADVERSION, ledger_id=1, entry_id=0
    )
    proto.dataReceived(request(OP.ADD_ENTRY, read))  # an ADD_ENTRY header with a readRequest
    proto.dataReceived(request(OP.READ_ENTRY, None))  # no operation message at all
    assert [r.status for r in v3_replies(transport)] == [StatusCode.EBADREQ] * 2
    assert not transport.disconnecting


@settings(max_examples=200, deadline=None)
@given(
    txn=st.integers(0, 2**64 - 1),
    ids=st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1)),
    key=st.binary(min_size=20, max_size=20),
    tail=st.binary(max_size=200),
    flag=st.sampled_from([None, 1]),
    write_flags=st.sampled_from([None, 0, 1]),
    priority=st.sampled_from([0, 100]),
)
def test_add_fast_path_agrees_with_the_general_decoder(
    txn: int,
    ids: tuple[int, int],
    key: bytes,
    tail: bytes,
    flag: int | None,
    write_flags: int | None,
    priority: int,
) -> None:
    body = ids[0].to_bytes(8, "big") + ids[1].to_bytes(8, "big") + tail
    op = Operation(
        "addRequest",
        ledger_id=ids[0],
        entry_id=ids[1],
        master_key=key,
        body=body,
        flag=flag,
        write_flags=write_flags,
    )
    payload = wire_v3.encode_request(OP.ADD_ENTRY, txn, op, priority)
    matched = wire_v3.match_add(payload, 0, len(payload))
    assert matched is not None
    decoded = wire_v3.decode_v3_request(payload)
    assert decoded.operation == op
    txn_raw, ledger_raw, entry_raw, master_key, body_start, body_end, recovery = matched
    assert (txn_raw, ledger_raw, entry_raw) == tuple(map(encode_varint, (txn, *ids)))
    assert (master_key, payload[body_start:body_end], recovery) == (key, body, flag == 1)
    reply = wire_v3.add_reply(txn_raw, ledger_raw, entry_raw, encode_varint(StatusCode.EFENCED))
    assert reply == framed(
        wire_v3.encode_response(
            OP.ADD_ENTRY, txn, 504, Operation("addResponse", status=504, ledger_id=ids[0], entry_id=ids[1])
        )
    )
    storage = RecordingStorage()
    proto, transport = connect(storage)
    proto.dataReceived(framed(payload))
    assert storage.calls == [(ids[0], ids[1], key, body, flag == 1)]
    expected = wire_v3.encode_response(
        OP.ADD_ENTRY,
        txn,
        StatusCode.EREADONLY,
        Operation("addResponse", status=505, ledger_id=ids[0], entry_id=ids[1]),
    )
    assert transport.value() == framed(expected)


@pytest.mark.parametrize(
    "payload",
    [
        # the add's fields in another order: the general decoder takes it, same answer
        encode_fields(
            [
                bytes_field(1, encode_fields([varint_field(1, 3), varint_field(2, 2), varint_field(3, 5)])),
                bytes_field(
                    101,
                    encode_fields(
                        [
                            bytes_field(4, package(3, 0, b"y")),
                            varint_field(2, 0),
                            varint_field(1, 3),
                            bytes_field(3, MASTER_KEY),
                        ]
                    ),
                ),
            ]
        ),
        # a master key of another size than SHA-1's 20 bytes
        wire_v3.encode_request(
            OP.ADD_ENTRY,
            5,
            Operation("addRequest", ledger_id=3, entry_id=0, master_key=bytes(32), body=package(3, 0, b"y")),
        ),
    ],
)
def test_unusual_field_order_takes_the_general_path(payload: bytes) -> None:
    assert wire_v3.match_add(payload, 0, len(payload)) is None
    storage = MemoryStorage()
    proto, transport = connect(storage)
    proto.dataReceived(framed(payload))
    storage.sync()
    assert one(transport).operation == Operation("addResponse", status=0, ledger_id=3, entry_id=0)


def test_an_add_is_stored_under_its_entrys_ids_and_answered_with_the_requests() -> None:
    # As Java's Bookie.addEntry: the ids inside the entry decide where it goes.
    storage = MemoryStorage()
    proto, transport = connect(storage)
    op = Operation("addRequest", ledger_id=3, entry_id=9, master_key=MASTER_KEY, body=package(3, 1, b"z"))
    proto.dataReceived(framed(wire_v3.encode_request(OP.ADD_ENTRY, 8, op)))
    storage.sync()
    assert one(transport).operation == Operation("addResponse", status=0, ledger_id=3, entry_id=9)
    assert list(storage.entries) == [(3, 1)]
