"""CPU of the bookie's protocol work per add, v2 against v3, in process: a connection (StringTransport)
fed 1 KiB adds as a Java client frames them, its storage a stub that accepts every add. What is left
is framing, parsing and building the reply: the part of an add's cost that differs between the two
protocols (the storage, the journal and the socket are the same for both).

    python benchmarks/protocol_cpu.py [--adds 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from twisted.internet.testing import StringTransport

from bkctl.protocol import wire, wire_v3
from bkctl.server.protocol import BookieFactory
from tests.server_net.wire_client import MASTER_KEY, package


class AcceptAll:
    def add(self, *args: object) -> int:
        return 0


def stream(protocol: str, adds: int) -> bytes:
    frames = []
    for entry_id in range(adds):
        body = package(1, entry_id, b"x" * 1024, lac=entry_id - 1)
        if protocol == "v2":
            frames.append(wire.frame(wire.encode_add_request(body, MASTER_KEY)))
        else:
            op = wire_v3.Operation(
                "addRequest", ledger_id=1, entry_id=entry_id, master_key=MASTER_KEY, body=body
            )
            frames.append(
                wire.frame(wire_v3.encode_request(wire_v3.OperationType.ADD_ENTRY, entry_id + 1, op))
            )
    return b"".join(frames)


def us_per_add(data: bytes, adds: int) -> float:
    connection = BookieFactory(AcceptAll(), pending_adds_max=1 << 40).buildProtocol(None)  # type: ignore[arg-type]
    assert connection is not None
    connection.makeConnection(StringTransport())
    chunks = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    started = time.process_time()
    for chunk in chunks:
        connection.dataReceived(chunk)
    assert connection.pending == adds
    return (time.process_time() - started) / adds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--adds", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    # A tree from before v3 (to compare its v2 path) has no v3 encoder: v2 alone then.
    protocols = ("v2", "v3") if hasattr(wire_v3, "encode_request") else ("v2",)
    streams = {p: stream(p, args.adds) for p in protocols}
    results: dict[str, list[float]] = {p: [] for p in protocols}
    for _ in range(args.rounds):  # alternating, so drift hits both alike
        for protocol, data in streams.items():
            results[protocol].append(us_per_add(data, args.adds))
    for protocol, values in results.items():
        median = statistics.median(values)
        print(f"{protocol}: {median:.2f} us per add (median of {args.rounds}; min {min(values):.2f})")


if __name__ == "__main__":
    main()
