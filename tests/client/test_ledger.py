"""Create, add, read, close and open-without-recovery against real in-process bookies; the basic
scenario also on ZooKeeper."""

from __future__ import annotations

from pathlib import Path

import pytest
from twisted.internet.protocol import Factory, Protocol

from bkctl.client.bookie_client import BookieClient
from bkctl.errors import (
    CorruptDataError,
    LedgerClosedError,
    NotFoundError,
    ProtocolError,
    UnauthorizedError,
    UnavailableError,
    UsageError,
)
from bkctl.model import DigestType, LedgerState
from bkctl.protocol import wire, wire_v3
from bkctl.protocol.entry import master_key, package_entry
from tests.client.cluster import Cluster, bounded
from tests.conftest import StoreTarget
from tests.server_net.live import in_thread, twisted_test

PW = b"pw"


def payloads(n: int, prefix: str = "e") -> list[bytes]:
    return [f"{prefix}{i}".encode() * (i % 5 + 1) for i in range(n)]


@pytest.mark.parametrize("store_target", ["sqlite", "zookeeper"], indirect=True)
@twisted_test
async def test_create_add_read_close_on_each_store(tmp_path: Path, store_target: StoreTarget) -> None:
    cluster = await Cluster(tmp_path, store_target.uri).start(3)
    try:
        client = cluster.client()
        lh = await bounded(client.create_ledger(3, 2, 2, password=PW, custom_metadata=[("app", b"t")]))
        data = payloads(50)
        ids = [await bounded(lh.add(p)) for p in data[:10]]
        ids += await bounded(lh.add_many(data[10:]))
        assert ids == list(range(50))
        assert lh.last_add_confirmed == 49 and lh.length == sum(map(len, data))
        got = await bounded(lh.read(0, 49))
        assert [e.payload for e in got] == data
        assert [e.entry_id for e in got] == list(range(50))
        await bounded(lh.close())
        md = (await in_thread(cluster.layout.read_ledger, lh.ledger_id)).value  # type: ignore[union-attr]
        assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 49, lh.length)
        assert md.custom_metadata == (("app", b"t"),) and md.password == PW
        assert len(set(md.segments[0].ensemble)) == 3
        with pytest.raises(LedgerClosedError):
            await bounded(lh.add(b"late"))
        reader = await bounded(cluster.client(2).open_ledger(lh.ledger_id, PW))
        assert reader.is_closed and reader.last_add_confirmed == 49
        assert [e.payload for e in await bounded(reader.read(40, 49))] == data[40:]
    finally:
        await cluster.stop()


@pytest.mark.parametrize("digest", list(DigestType))
@twisted_test
async def test_digest_types(tmp_path: Path, digest: DigestType) -> None:
    cluster = await Cluster(tmp_path).start(2)
    try:
        lh = await bounded(cluster.client().create_ledger(2, 2, 1, digest=digest, password=PW))
        await bounded(lh.add_many(payloads(20)))
        await bounded(lh.close())
        reader = await bounded(cluster.client().open_ledger(lh.ledger_id, PW))
        assert reader.digest is digest
        assert [e.payload for e in await bounded(reader.read(0, 19))] == payloads(20)
    finally:
        await cluster.stop()


@twisted_test
async def test_open_without_recovery_reads_to_lac_and_never_fences(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(3)
    try:
        writer = await bounded(cluster.client().create_ledger(3, 3, 2, password=PW))
        for p in payloads(10):  # one at a time: each entry carries the previous one as its LAC
            await bounded(writer.add(p))
        reader = await bounded(cluster.client(5).open_ledger(writer.ledger_id, PW, recovery=False))
        # Entries carry the LAC of their time: entry 9 says 8, so a reader sees 8 (BookKeeper's rule).
        assert reader.last_add_confirmed == 8 and not reader.is_closed
        assert [e.payload for e in await bounded(reader.read(0, 8))] == payloads(10)[:9]
        with pytest.raises(NotFoundError, match="past the last add confirmed"):
            await bounded(reader.read(9))
        # The writer was not fenced: it goes on, and the reader catches up with read_lac.
        assert await bounded(writer.add(b"more")) == 10
        assert await bounded(reader.read_lac()) == 9
        md = (await in_thread(cluster.layout.read_ledger, writer.ledger_id)).value  # type: ignore[union-attr]
        assert md.state is LedgerState.OPEN
        with pytest.raises(UsageError):
            await bounded(reader.add(b"x"))
        await bounded(writer.close())
    finally:
        await cluster.stop()


@twisted_test
async def test_bad_input(tmp_path: Path) -> None:
    cluster = await Cluster(tmp_path).start(2)
    try:
        client = cluster.client()
        with pytest.raises(NotFoundError):
            await bounded(client.open_ledger(12345, PW))
        with pytest.raises(UnavailableError, match="not enough bookies"):
            await bounded(client.create_ledger(3, 2, 2))
        with pytest.raises(UsageError):
            await bounded(client.create_ledger(2, 3, 2))
        lh = await bounded(client.create_ledger(2, 2, 2, password=PW))
        await bounded(lh.add(b"x"))
        with pytest.raises(UnauthorizedError):
            await bounded(client.open_ledger(lh.ledger_id, b"wrong"))
        with pytest.raises(UnauthorizedError):
            await bounded(client.open_ledger(lh.ledger_id, b"wrong", recovery=False))
        md = (await in_thread(cluster.layout.read_ledger, lh.ledger_id)).value  # type: ignore[union-attr]
        assert md.state is LedgerState.OPEN  # a wrong password fences nothing
        await bounded(lh.close())
        await bounded(client.delete_ledger(lh.ledger_id))
        with pytest.raises(NotFoundError):
            await bounded(client.open_ledger(lh.ledger_id, PW))
    finally:
        await cluster.stop()


async def _raw_add(client: BookieClient, entry: bytes, entry_id: int, ledger_id: int) -> int:
    from twisted.internet.defer import Deferred

    done: Deferred[int] = Deferred()
    client.add(entry, master_key(PW), 0, ledger_id, entry_id, lambda rc, _: done.callback(rc))
    return int(await bounded(done))


@twisted_test
async def test_digest_mismatch_falls_back_then_fails(tmp_path: Path) -> None:
    """Entry 0 is corrupt on its first replica only, entry 1 on both: read 0 works, read 1 is corrupt."""
    cluster = await Cluster(tmp_path).start(2)
    try:
        client = cluster.client()
        lh = await bounded(client.create_ledger(2, 2, 2, digest=DigestType.CRC32C, password=PW))
        lid, ensemble = lh.ledger_id, lh.ensemble
        good = [package_entry(DigestType.CRC32C, lid, i, i - 1, 3 * (i + 1), b"abc") for i in range(2)]
        bad = [g[:-1] + b"X" for g in good]
        for entry_id, copies in ((0, (bad[0], good[0])), (1, (bad[1], bad[1]))):
            for position, copy in enumerate(copies):
                bookie = ensemble[(entry_id + position) % 2]
                assert await _raw_add(client.bookies.get(bookie), copy, entry_id, lid) == 0
        await lh.close_metadata(1, 6)
        reader = await bounded(cluster.client(3).open_ledger(lid, PW))
        (entry,) = await bounded(reader.read(0))
        assert entry.payload == b"abc"
        with pytest.raises(CorruptDataError, match="digest mismatch"):
            await bounded(reader.read(1))
    finally:
        await cluster.stop()


@twisted_test
async def test_acknowledged_adds_leave_no_garbage_cycles(tmp_path: Path) -> None:
    """Every entry's objects die by reference counting once acknowledged: a cycle per entry would leave
    them to the cyclic GC, whose long collections were most of the client's p99 under load."""
    import gc

    from twisted.internet import reactor, task

    from bkctl.client.ledger import _Add

    cluster = await Cluster(tmp_path, f"sqlite://{tmp_path / 'md.db'}").start(3)
    try:
        lh = await bounded(cluster.client().create_ledger(3, 2, 2, password=PW))
        gc.collect()
        gc.disable()
        try:
            await bounded(lh.add_many(payloads(200)))
            done: list[int] = []
            for p in payloads(50):
                lh.add_callback(p, lambda entry_id, error: done.append(entry_id))
            await bounded(lh.wait_drained())
            await task.deferLater(reactor, 0, lambda: None)  # out of the acknowledging call's frame
            assert len(done) == 50
            left = [o for o in gc.get_objects() if type(o) is _Add]
            assert not left
        finally:
            gc.enable()
        await bounded(lh.close())
    finally:
        await cluster.stop()


class _Refusing(Protocol):
    """A bookie peer that answers every request with EBADREQ (a request it cannot take)."""

    def connectionMade(self) -> None:
        self.decoder = wire.FrameDecoder()

    def dataReceived(self, data: bytes) -> None:
        self.decoder.feed(data)
        for payload in self.decoder.frames():
            if not wire_v3.is_v2_frame(payload):
                v3 = wire_v3.decode_v3_request(payload)
                self.transport.write(
                    wire.frame(wire_v3.encode_status_response(v3, wire_v3.StatusCode.EBADREQ))
                )
                continue
            request = wire.decode_request(payload)
            self.transport.write(wire.frame(wire.encode_error_response(request, wire.ReturnCode.EBADREQ)))


@twisted_test
async def test_a_bad_request_reply_fails_the_add_and_replaces_no_bookie(tmp_path: Path) -> None:
    """EBADREQ was taken for a dead bookie (ensemble change, then "not enough bookies")."""
    from twisted.internet import reactor

    cluster = await Cluster(tmp_path).start(3)
    port = reactor.listenTCP(0, Factory.forProtocol(_Refusing), interface="127.0.0.1")
    refusing = f"127.0.0.1:{port.getHost().port}"
    try:
        await in_thread(cluster.layout.register_bookie, refusing)  # type: ignore[union-attr]
        lh = await bounded(cluster.client().create_ledger(4, 4, 4, password=PW))
        with pytest.raises(
            ProtocolError, match=f"add of ledger {lh.ledger_id} entry 0 to {refusing} refused"
        ):
            await bounded(lh.add(b"x"))
        md = (await in_thread(cluster.layout.read_ledger, lh.ledger_id)).value  # type: ignore[union-attr]
        assert len(md.segments) == 1 and refusing in md.segments[0].ensemble  # no ensemble change
    finally:
        await in_thread(cluster.layout.unregister_bookie, refusing)  # type: ignore[union-attr]
        await bounded(port.stopListening())
        await cluster.stop()
