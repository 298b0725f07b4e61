"""Our client against the frames a real Java BookKeeper 4.14.8 client sent (wire/v2-*.frames.json):
ledger 7 (write 10 entries, close, read back) and ledger 8 (write 5, recovery open by another client,
the old writer's next add fenced, read back).

1. Every captured client frame re-encodes byte for byte from its decoded values with the encoders the
   client uses (package_entry + encode_add_request / encode_read_request).
2. The same scenario run by our Client through recording proxies in front of real bookies sends,
   connection by connection, exactly the frames the Java client sent; over v3 (wire/v3-*: ledgers 9
   and 10) too, but for the txn ids (Java counts them per client, we per connection).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.protocols import portforward

from bkctl.errors import FencedError
from bkctl.model import DigestType
from bkctl.protocol import wire, wire_v3
from bkctl.protocol.entry import master_key, package_entry, parse_entry
from tests.client.cluster import Cluster, bounded
from tests.conftest import JAVA_WIRE
from tests.server_net.live import in_thread, twisted_test

CAPTURE = JAVA_WIRE / "v2-protocol-write-read-fence.frames.json"
CAPTURE_V3 = JAVA_WIRE / "v3-protocol-write-read-fence.frames.json"
PASSWORD = b"testpasswd"
# Ensembles from the capture's README: ledger 7 on b1,b2,b4; ledger 8 on b4,b1,b2 (v2); ledger 9 on
# b1,b2,b4; ledger 10 on b4,b2,b1 (v3).
JAVA_BOOKIES = {"127.0.0.1:33181": "b1", "127.0.0.1:33182": "b2", "127.0.0.1:33184": "b4"}
ENSEMBLES = {7: ("b1", "b2", "b4"), 8: ("b4", "b1", "b2"), 9: ("b1", "b2", "b4"), 10: ("b4", "b2", "b1")}
# Per protocol: the capture, the written-and-read ledger, the fenced ledger.
SCENARIOS = {"v2": (CAPTURE, 7, 8), "v3": (CAPTURE_V3, 9, 10)}


def without_txn_id(payload: bytes) -> bytes:
    """A v3 request with txn id 0 (a v2 one as it is)."""
    if wire_v3.is_v2_frame(payload):
        return payload
    request = wire_v3.decode_v3_request(payload)
    assert request.operation is not None
    header = request.header
    return wire_v3.encode_request(header.operation, 0, request.operation, header.priority)


def captured_connections(capture: Path = CAPTURE) -> list[tuple[str, list[bytes]]]:
    """(bookie name, client->bookie payloads) per captured connection, in capture order."""
    connections = []
    for conn in json.loads(capture.read_text()):
        frames = [bytes.fromhex(f["frame_hex"]) for f in conn["frames"] if f["dir"] == "client->bookie"]
        connections.append((JAVA_BOOKIES[conn["bookie"]], frames))
    return connections


def test_every_captured_client_frame_reencodes_identically() -> None:
    key = master_key(PASSWORD)
    count = 0
    for _, frames in captured_connections():
        for payload in frames:
            request = wire.decode_request(payload)
            if isinstance(request, wire.AddRequest):
                e = parse_entry(request.entry, DigestType.CRC32)
                entry = package_entry(
                    DigestType.CRC32, e.ledger_id, e.entry_id, e.last_add_confirmed, e.length, e.payload
                )
                assert request.master_key == key
                assert wire.encode_add_request(entry, key, request.flags) == payload
            else:
                assert isinstance(request, wire.ReadRequest)
                assert request.flags in (
                    0,
                    wire.FLAG_DO_FENCING,
                    wire.FLAG_DO_FENCING | wire.FLAG_HIGH_PRIORITY,
                )
                rebuilt = wire.encode_read_request(
                    request.ledger_id, request.entry_id, request.flags, request.master_key
                )
                assert rebuilt == payload
            count += 1
    assert count > 40


class _Recorder(portforward.ProxyServer):
    def connectionMade(self) -> None:
        self.received = bytearray()
        self.factory.connections.append(self.received)  # type: ignore[attr-defined]
        super().connectionMade()

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        super().dataReceived(data)


class _RecordingFactory(portforward.ProxyFactory):
    protocol = _Recorder

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.connections: list[bytearray] = []


def _frames(data: bytes) -> list[bytes]:
    decoder = wire.FrameDecoder()
    decoder.feed(data)
    return decoder.frames()


@twisted_test
async def test_client_sends_the_java_clients_frames(tmp_path: Path, client_protocol: str) -> None:
    capture, written, fenced = SCENARIOS[client_protocol]
    cluster = await Cluster(tmp_path).start(3)
    listeners: list[Any] = []
    try:
        # Proxies stand in for b1, b2, b4; the client only knows the proxies' ids.
        proxies: dict[str, tuple[str, _RecordingFactory]] = {}
        for name, bookie in zip(("b1", "b2", "b4"), cluster.bookies, strict=True):
            factory = _RecordingFactory("127.0.0.1", bookie.port)
            port = reactor.listenTCP(0, factory, interface="127.0.0.1")
            listeners.append(port)
            proxies[name] = (f"127.0.0.1:{port.getHost().port}", factory)

        def ensemble(ledger_id: int) -> list[str]:
            return [proxies[name][0] for name in ENSEMBLES[ledger_id]]

        # Ledger 7 (9): write 10 entries one by one, close, read them back (same client).
        first = cluster.client()
        lh = await bounded(
            first.create_ledger(
                3,
                2,
                2,
                digest=DigestType.CRC32,
                password=PASSWORD,
                ledger_id=written,
                ensemble=ensemble(written),
            )
        )
        for i in range(10):
            await bounded(lh.add(f"L{written}-E{i}".encode()))
        await bounded(lh.close())
        reader = await bounded(first.open_ledger(written, PASSWORD))
        assert [e.payload for e in await bounded(reader.read(0, 9))] == [
            f"L{written}-E{i}".encode() for i in range(10)
        ]

        # Ledger 8 (10): a writer adds 5, another client recovers it, the writer's 6th add is fenced.
        writer = await bounded(
            cluster.client().create_ledger(
                3,
                2,
                2,
                digest=DigestType.CRC32,
                password=PASSWORD,
                ledger_id=fenced,
                ensemble=ensemble(fenced),
            )
        )
        for i in range(5):
            await bounded(writer.add(f"L{fenced}-E{i}".encode()))
        # Java 4.14's client reads forward one entry at a time: a window of 1 reproduces its frames.
        recovering = cluster.client(recovery_reads_in_flight=1)
        recovered = await bounded(recovering.open_ledger(fenced, PASSWORD))
        assert recovered.last_add_confirmed == 4
        try:
            await bounded(writer.add(f"L{fenced}-E5".encode()))
            raise AssertionError("the fenced writer got an ack")
        except FencedError:
            pass
        got = await bounded(recovered.read(0, 4))
        assert [e.payload for e in got] == [f"L{fenced}-E{i}".encode() for i in range(5)]

        ours: dict[str, list[list[bytes]]] = {
            name: [[without_txn_id(f) for f in _frames(bytes(c))] for c in factory.connections]
            for name, (_, factory) in proxies.items()
        }
        expected: dict[str, list[list[bytes]]] = {name: [] for name in proxies}
        for name, frames in captured_connections(capture):
            expected[name].append([without_txn_id(f) for f in frames])
        for name in proxies:
            assert len(ours[name]) == len(expected[name]), name
            for mine, java in zip(ours[name], expected[name], strict=True):
                assert [f.hex() for f in mine] == [f.hex() for f in java], name
    finally:
        for port in listeners:
            await bounded(port.stopListening())
        await cluster.stop()
        await in_thread(lambda: None)
