"""The online audit's reads, as plain Python over blocking sockets (they run in Spark executors, where a
reactor has no place): which entries a bookie holds of each ledger, asked with the v3 request
GET_LIST_OF_ENTRIES_OF_LEDGER (what the Java auditor's replicas check asks; Java and bkctl bookies answer
it), and, when digests are checked, the copies themselves with v2 READ_ENTRY on a second connection (a
Java bookie keeps one protocol per connection). Requests are pipelined, a window at a time.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final, TypeVar

import numpy as np

from bkctl import limits
from bkctl.client.sasl_auth import ClientAuth
from bkctl.errors import AccessDeniedError, BkctlError, ProtocolError
from bkctl.metadata.layout import Layout
from bkctl.metadata.stores import layout_at
from bkctl.pipeline import bitmaps
from bkctl.pipeline.inventory import Checks, HoldingRow, Verify, holding_rows, problem_row
from bkctl.protocol import entry_availability, wire, wire_v3
from bkctl.sasl import ClientSasl, client_sasl_from_env

WINDOW: Final = 256  # requests in flight on one connection
TIMEOUT_S: Final = 30.0  # local bound: per connect and per reply: a bookie silent this long is not answering
PROBE_TOLD_S: Final = 2.0  # local bound: connection probes still waiting after this are said on stderr
PROBES_AT_ONCE: Final = 64  # local bound: bookies probed at the same time
_LENGTH: Final = struct.Struct(">i")
_K = TypeVar("_K")
_R = TypeVar("_R")


@dataclass(frozen=True)
class OnlineBookie:
    bookie_id: str
    host: str
    port: int
    sasl: ClientSasl | None = None  # credentials for bookies with SASL (read on the driver, bkctl/sasl.py)


def registered_bookies(
    uri: str, told: Callable[[str], object] = lambda _: None
) -> tuple[list[OnlineBookie], list[str]]:
    """Registered bookies (read-write and read-only) with their addresses, and one problem line per
    bookie that has no address or does not accept a connection (it is then not audited: its replicas
    are `unknown`, never `missing`). A probe that waits is said through `told`."""
    with layout_at(uri) as layout:
        return _reachable(layout, told)


def _reachable(layout: Layout, told: Callable[[str], object]) -> tuple[list[OnlineBookie], list[str]]:
    found, problems, addresses = [], [], {}
    sasl = client_sasl_from_env()
    for bookie_id in sorted(set(layout.bookies()) | set(layout.bookies(readonly=True))):
        address = layout.bookie_rpc_address(bookie_id) or _address_in_id(bookie_id)
        if address is None:
            problems.append(f"bookie {bookie_id}: no address in its registration; not audited")
        else:
            addresses[bookie_id] = address
    refused = probe_connections(addresses, told, TIMEOUT_S)
    for bookie_id, address in addresses.items():
        if bookie_id in refused:
            problems.append(
                f"bookie {bookie_id} at {address[0]}:{address[1]} does not answer ({refused[bookie_id]}); "
                "not audited"
            )
        else:
            found.append(OnlineBookie(bookie_id, *address, sasl))
    return found, problems


def probe_connections(
    addresses: dict[str, tuple[str, int]], told: Callable[[str], object], timeout_s: float
) -> dict[str, str]:
    """Connect to each address, many at once, on daemon threads (Ctrl-C never waits for one): the ones
    that did not accept within `timeout_s`, with why. A wait past PROBE_TOLD_S is said once."""
    refused: dict[str, str] = {}

    def probe(bookie_id: str, address: tuple[str, int]) -> None:
        try:
            socket.create_connection(address, timeout=timeout_s).close()
        except OSError as exc:
            refused[bookie_id] = str(exc) or type(exc).__name__

    items = list(addresses.items())
    said = False
    for start in range(0, len(items), PROBES_AT_ONCE):
        batch = items[start : start + PROBES_AT_ONCE]
        threads = [
            threading.Thread(target=probe, args=item, daemon=True, name="bkctl-probe") for item in batch
        ]
        for thread in threads:
            thread.start()
        _join_until(threads, time.monotonic() + PROBE_TOLD_S)
        waiting = sum(thread.is_alive() for thread in threads)
        if waiting and not said:
            told(f"waiting for {waiting} bookie(s) to accept a connection (up to {timeout_s:g} s)")
            said = True
        _join_until(threads, time.monotonic() + timeout_s)
        for (bookie_id, _), thread in zip(batch, threads, strict=True):
            if thread.is_alive():
                refused.setdefault(bookie_id, f"no connection within {timeout_s:g} s")
    return refused


def _join_until(threads: list[threading.Thread], deadline: float) -> None:
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _address_in_id(bookie_id: str) -> tuple[str, int] | None:
    host, _, port = bookie_id.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def holdings(bookie: OnlineBookie, ledger_ids: list[int], verify: Verify | None) -> Iterator[HoldingRow]:
    """What one bookie holds of the given ledgers, as the offline readers' rows; a problem row (ledger
    -1) naming the bookie when it stops answering, then nothing more from it."""
    where = f"bookie {bookie.bookie_id} at {bookie.host}:{bookie.port}"
    try:
        held = _entry_lists(bookie, ledger_ids)
        if verify is None:
            for ledger_id, ids in held:
                yield from holding_rows(bookie.bookie_id, ledger_id, ids, None)
        else:
            yield from _verified(bookie, list(held), verify)
    except _LedgerProblem as exc:
        yield problem_row(bookie.bookie_id, f"{where}: {exc}")
    except (OSError, BkctlError) as exc:
        yield problem_row(bookie.bookie_id, f"{where} stopped answering: {exc}")


class _LedgerProblem(Exception):
    pass


def _entry_lists(bookie: OnlineBookie, ledger_ids: list[int]) -> Iterator[tuple[int, bitmaps.Ids]]:
    """(ledger, sorted entry ids) the bookie holds of each of `ledger_ids` it has (ENOLEDGER: none)."""
    encode = wire_v3.encode_entries_of_ledger_request
    requests = ((txn, encode(txn, ledger_id)) for txn, ledger_id in enumerate(ledger_ids))
    with _Connection(bookie, v3=True) as connection:
        for txn, response in connection.exchange(requests, _v3_reply):
            ledger_id = ledger_ids[txn]
            if response.status == wire_v3.StatusCode.ENOLEDGER:
                continue
            body = response.operation.body if response.operation is not None else None
            if response.status != wire_v3.StatusCode.EOK or body is None:
                why = wire_v3.status_name(response.status)
                raise _LedgerProblem(f"ledger {ledger_id}: GET_LIST_OF_ENTRIES_OF_LEDGER answered {why}")
            ids = _group_ids(entry_availability.decode(body))
            if len(ids):
                yield ledger_id, ids


def _group_ids(groups: list[entry_availability.SequenceGroup]) -> bitmaps.Ids:
    """The entry ids of availability groups (runs of `size` every `period` ids), sorted and distinct."""
    parts = [
        (
            np.arange(g.first_start, g.last_start + 1, g.period or 1, dtype=np.int64)[:, None]
            + np.arange(g.size)
        ).ravel()
        for g in groups
    ]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def _verified(
    bookie: OnlineBookie, held: list[tuple[int, bitmaps.Ids]], verify: Verify
) -> Iterator[HoldingRow]:
    """Rows of the held entries, the sampled ones read back and their digests checked."""
    sampled = [
        (ledger_id, entry_id)
        for ledger_id, ids in held
        if ledger_id in verify.keys
        for entry_id in ids.tolist()
        if verify.sampled(ledger_id, entry_id)
    ]
    checked: dict[tuple[int, int], tuple[bool | None, int | None]] = {}
    requests = ((key, wire.encode_read_request(*key)) for key in sampled)
    with _Connection(bookie) as connection:
        for key, response in connection.exchange(requests, _read_reply):
            # listed, unreadable: corrupt
            checked[key] = (
                (False, None) if response.rc != wire.ReturnCode.EOK else verify.check(key[0], response.entry)
            )
    for ledger_id, ids in held:
        results = [checked.get((ledger_id, entry_id), (None, None)) for entry_id in ids.tolist()]
        yield from holding_rows(bookie.bookie_id, ledger_id, ids, Checks.of(results))


def _v3_reply(payload: bytes) -> tuple[int, wire_v3.V3Response]:
    response = wire_v3.decode_v3_response(payload)
    return response.header.txn_id, response


def _read_reply(payload: bytes) -> tuple[tuple[int, int], wire.ReadResponse]:
    response = wire.decode_response(payload)
    if not isinstance(response, wire.ReadResponse):
        raise ProtocolError(f"expected a READ_ENTRY response, got {type(response).__name__}")
    return (response.ledger_id, response.entry_id), response


class _Connection:
    """One blocking connection; `exchange` pipelines requests and matches decoded replies by key."""

    def __init__(self, bookie: OnlineBookie, v3: bool = False) -> None:
        self._socket = socket.create_connection((bookie.host, bookie.port), timeout=TIMEOUT_S)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = bytearray()
        if bookie.sasl is not None:
            try:
                self._authenticate(bookie, bookie.sasl, v3)
            except BaseException:
                self._socket.close()
                raise

    def _authenticate(self, bookie: OnlineBookie, sasl: ClientSasl, v3: bool) -> None:
        """The SASL exchange (client/sasl_auth.py) over this blocking socket, before any request."""
        send = lambda chunks: self._socket.sendall(b"".join(chunks))  # noqa: E731
        auth = ClientAuth(send, lambda: None, sasl, v3, bookie.bookie_id, None, TIMEOUT_S)
        auth.begin()
        while not auth.done and auth.failure is None:
            chunk = self._socket.recv(1 << 16)
            if not chunk:
                auth.lost()
                break
            self._buffer += auth.data_received(chunk)
        if not auth.done:
            raise AccessDeniedError(f"bookie {bookie.bookie_id} refused the SASL credentials: {auth.failure}")

    def __enter__(self) -> _Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self._socket.close()

    def exchange(
        self, requests: Iterable[tuple[_K, bytes]], decode: Callable[[bytes], tuple[_K, _R]]
    ) -> Iterator[tuple[_K, _R]]:
        """(key, decoded reply) for every (key, request payload), in the order the replies come."""
        pending: set[_K] = set()
        queue = iter(requests)
        exhausted = False
        while True:
            batch = []
            while not exhausted and len(pending) < WINDOW:
                item = next(queue, None)
                if item is None:
                    exhausted = True
                    break
                pending.add(item[0])
                batch.append(wire.frame(item[1]))
            if batch:
                self._socket.sendall(b"".join(batch))
            if not pending:
                return
            key, reply = decode(self._frame())
            if key not in pending:
                raise ProtocolError(f"a reply to a request never sent ({key!r})")
            pending.discard(key)
            yield key, reply

    def _frame(self) -> bytes:
        while True:
            if len(self._buffer) >= _LENGTH.size:
                (size,) = _LENGTH.unpack_from(self._buffer)
                if not 0 < size <= limits.FRAME_SIZE_MAX:
                    raise ProtocolError(wire.bad_frame_length(size, limits.FRAME_SIZE_MAX))
                if len(self._buffer) >= _LENGTH.size + size:
                    payload = bytes(self._buffer[_LENGTH.size : _LENGTH.size + size])
                    del self._buffer[: _LENGTH.size + size]
                    return payload
            chunk = self._socket.recv(1 << 20)
            if not chunk:
                raise ProtocolError("the bookie closed the connection")
            self._buffer += chunk
