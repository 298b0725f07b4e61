"""What the helpers of a bookie connection (protocol_v3.py, start_tls.py) use of it, and of its factory
and storage: typing Protocols that protocol.BookieProtocol and BookieFactory satisfy, so those helpers
need not import the module that imports them. Also the network side's counters.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from twisted.internet.defer import Deferred

from bkctl.protocol import wire, wire_v3
from bkctl.protocol.op_stats import OpStat
from bkctl.tls_channel import TlsChannel


class StorageApi(Protocol):
    """What the protocol needs of bkctl.server.storage.Storage (a Protocol, so tests can use a fake)."""

    def add(
        self,
        ledger_id: int,
        entry_id: int,
        master_key: bytes,
        entry: bytes | bytearray,
        recovery: bool,
        token: object,
    ) -> int: ...

    def fence(self, ledger_id: int, master_key: bytes, token: object) -> int: ...

    def read(self, ledger_id: int, entry_id: int) -> tuple[int, bytes]: ...

    def entry_availability(self, ledger_id: int) -> Deferred[tuple[int, bytes]]: ...

    # The v3 operations (server/protocol_v3.py).
    def explicit_lac(self, ledger_id: int) -> bytes | None: ...

    def is_fenced(self, ledger_id: int) -> bool: ...

    def write_lac(self, ledger_id: int, master_key: bytes, lac_body: bytes, token: object) -> int: ...

    def force_ledger(self, ledger_id: int, token: object) -> int: ...

    def last_add_confirmed(self, ledger_id: int) -> tuple[int, int]: ...

    def watch_lac(self, ledger_id: int, previous_lac: int, notify: Callable[[], None]) -> bool: ...

    def unwatch_lac(self, ledger_id: int, notify: Callable[[], None]) -> None: ...

    def disk_space(self) -> tuple[int, int]: ...


@dataclass
class NetworkMetrics:
    """Counters of the network side, for /metrics (reactor thread only, no lock)."""

    connections_open: int = 0
    connections_total: int = 0
    connections_refused: int = 0  # accepted before the bookie was ready, closed at once
    frames_rejected: int = 0  # malformed length or oversized: connection closed
    bad_requests: int = 0  # answered with EBADREQ
    read_pauses: int = 0  # times a connection stopped being read (backpressure)
    tls_handshakes: int = 0  # connections switched to TLS by START_TLS
    tls_handshake_failures: int = 0
    tls_required_refusals: int = 0  # requests answered EUA before START_TLS (tlsRequired)
    sasl_refusals: int = 0  # connections refused by SASL (server/sasl_auth.py)
    sasl_unauthenticated_requests: int = 0  # requests answered EUA before the client authenticated
    # Plain reads (v2 and v3), timed: Java's READ_ENTRY_REQUEST and BOOKIE_READ_ENTRY (java_metrics.py).
    read_latency: OpStat = field(default_factory=OpStat)


def timed_read(
    storage: StorageApi, metrics: NetworkMetrics, ledger_id: int, entry_id: int
) -> tuple[int, bytes]:
    """`storage.read`, its time and outcome counted in `metrics.read_latency` (one clock read each side,
    one sketch update: about a microsecond)."""
    started = time.perf_counter()
    rc, entry = storage.read(ledger_id, entry_id)
    metrics.read_latency.observe(rc == wire.ReturnCode.EOK, (time.perf_counter() - started) * 1000.0)
    return rc, entry


class ConnectionFactory(Protocol):
    """What a connection's helpers use of its factory (protocol.BookieFactory)."""

    @property
    def metrics(self) -> NetworkMetrics: ...

    @property
    def tls_context(self) -> ssl.SSLContext | None: ...

    @property
    def reactor(self) -> Any: ...


class Connection(Protocol):
    """What protocol_v3.py and start_tls.py use of one client connection (protocol.BookieProtocol)."""

    tls_state: str | None  # set by START_TLS
    tls: TlsChannel | None
    pending: int  # adds and fences waiting for the journal's fsync
    _buffer: bytearray  # received bytes not yet part of a handled frame (START_TLS must be alone)
    _out: list[bytes]  # replies queued during this read

    @property
    def factory(self) -> ConnectionFactory: ...

    @property
    def storage(self) -> StorageApi: ...

    @property
    def peer(self) -> str: ...

    @property
    def transport(self) -> Any: ...

    @property
    def connected(self) -> bool | int: ...

    @property
    def replies_owed(self) -> bool: ...

    def queue(self, reply: bytes) -> None: ...

    def send(self, chunks: list[bytes]) -> None: ...

    def start_tls(self, request: wire_v3.V3Request, size: int) -> None: ...

    def protected(self) -> None: ...

    def broken(self) -> None: ...

    def drop(self) -> None: ...

    def close(self) -> None: ...
