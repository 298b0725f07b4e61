"""A live bookie (BookieService on 127.0.0.1) answering v3 over real sockets: adds and reads, explicit
LAC, force, bookie info, a long poll woken by another connection's add, AUTH, START_TLS, and bad
protobuf closing only its own connection."""

from __future__ import annotations

import itertools
from pathlib import Path

from bkctl.model import DigestType
from bkctl.protocol import wire_v3
from bkctl.protocol.entry import encode_lac_body
from bkctl.protocol.wire_v3 import Operation, OperationType, StatusCode
from tests.server_net.live import in_thread, start_bookie, twisted_test
from tests.server_net.wire_client import MASTER_KEY, WireClient, package

OP = OperationType
txns = itertools.count(1)


def ask(client: WireClient, operation: int, op: Operation, priority: int = 0) -> None:
    client.send_payloads([wire_v3.encode_request(operation, next(txns), op, priority)])


def add_op(ledger_id: int, entry_id: int, lac: int) -> Operation:
    body = package(ledger_id, entry_id, f"e{entry_id}".encode(), lac=lac)
    return Operation("addRequest", ledger_id=ledger_id, entry_id=entry_id, master_key=MASTER_KEY, body=body)


@twisted_test
async def test_v3_operations_over_sockets(tmp_path: Path) -> None:
    service = await start_bookie(tmp_path)

    def scenario() -> None:
        with WireClient("127.0.0.1", service.port) as a, WireClient("127.0.0.1", service.port) as b:
            for entry_id in range(3):
                ask(a, OP.ADD_ENTRY, add_op(12, entry_id, entry_id - 1))
            assert [r.status for r in a.receive_v3(3)] == [StatusCode.EOK] * 3
            ask(a, OP.READ_ENTRY, Operation("readRequest", ledger_id=12, entry_id=1))
            (read,) = a.receive_v3(1)
            assert read.operation is not None and (read.operation.max_lac, read.operation.entry_id) == (1, 1)
            lac = encode_lac_body(DigestType.CRC32C, 12, 2)
            ask(
                a,
                OP.WRITE_LAC,
                Operation("writeLacRequest", ledger_id=12, lac=2, master_key=MASTER_KEY, body=lac),
            )
            ask(a, OP.FORCE_LEDGER, Operation("forceLedgerRequest", ledger_id=12))
            ask(a, OP.READ_LAC, Operation("readLacRequest", ledger_id=12))
            ask(a, OP.GET_BOOKIE_INFO, Operation("getBookieInfoRequest", requested=3))
            ask(a, OP.AUTH, Operation("authRequest", plugin_name="AuthDisabledPlugin", body=b""))
            ask(a, OP.START_TLS, Operation("startTLSRequest"))
            # Answered as each is known: those waiting for the fsync come after the others.
            got = {r.header.operation: r for r in a.receive_v3(6)}
            wrote, forced, read_lac = got[OP.WRITE_LAC], got[OP.FORCE_LEDGER], got[OP.READ_LAC]
            info, auth, tls = got[OP.GET_BOOKIE_INFO], got[OP.AUTH], got[OP.START_TLS]
            assert [r.status for r in (wrote, forced, read_lac, info, auth)] == [StatusCode.EOK] * 5
            assert read_lac.operation is not None and read_lac.operation.body == lac
            assert read_lac.operation.last_entry_body == package(12, 2, b"e2", lac=1)
            assert info.operation is not None and info.operation.total_disk_capacity
            assert auth.operation is not None and auth.operation.plugin_name == "AuthDisabledPlugin"
            assert tls.status == StatusCode.EBADREQ
            # A long poll on b waits for a's next add, then piggybacks entry 2 (LAC 2 > 1).
            poll = Operation(
                "readRequest", ledger_id=12, entry_id=-1, previous_lac=1, timeout_ms=10_000, flag=2
            )
            ask(b, OP.READ_ENTRY, poll)
            ask(a, OP.ADD_ENTRY, add_op(12, 3, 2))
            assert a.receive_v3(1)[0].status == StatusCode.EOK
            (polled,) = b.receive_v3(1)
            assert polled.operation is not None
            assert (polled.operation.entry_id, polled.operation.max_lac) == (2, 2)
            assert polled.operation.body == package(12, 2, b"e2", lac=1)
            # Bad protobuf: that connection closes, the other goes on.
            b.send_raw(b"\x00\x00\x00\x03\x0a\x7f\x08")
            assert b.closed_by_peer()
            ask(a, OP.READ_ENTRY, Operation("readRequest", ledger_id=12, entry_id=3))
            (last,) = a.receive_v3(1)
            assert last.operation is not None and last.operation.max_lac == 2

    try:
        await in_thread(scenario)
    finally:
        await service.stop()
