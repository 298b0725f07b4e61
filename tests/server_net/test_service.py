"""In-process bookies on 127.0.0.1 port 0: adds and reads over a socket, fencing, master keys,
read-only mode, registration, cookies, the admin HTTP endpoint."""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.request
from pathlib import Path

import pytest
from twisted.internet import reactor
from twisted.internet.task import deferLater

from bkctl.errors import ConflictError, NotFoundError
from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from bkctl.protocol import wire
from bkctl.protocol.metadata_format import decode_cookie
from bkctl.server.config import load_config
from bkctl.server.service import BookieService
from tests.server_net.live import (
    WAIT_S,
    bookie_flags,
    in_thread,
    metadata_uri,
    registrations_of,
    start_bookie,
    twisted_test,
)
from tests.server_net.wire_client import WireClient, package

EOK = wire.ReturnCode.EOK


def client(service: BookieService, protocol: str = "v2") -> WireClient:
    return WireClient("127.0.0.1", service.port, protocol=protocol)


both_protocols = pytest.mark.parametrize("protocol", ["v2", "v3"])


registrations = registrations_of


async def wait_for(predicate, timeout_s: float = WAIT_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not await in_thread(predicate):
        assert time.monotonic() < deadline, "condition not met in time"
        await deferLater(reactor, 0.05, lambda: None)


@both_protocols
@twisted_test
async def test_adds_and_reads_over_a_socket(tmp_path: Path, protocol: str) -> None:
    service = await start_bookie(tmp_path)
    try:
        payloads = [f"entry-{i}".encode() * (i % 7 + 1) for i in range(300)]

        def scenario() -> None:
            with client(service, protocol) as c:
                got = c.add_many(10, payloads)
                assert [(r.rc, r.ledger_id, r.entry_id) for r in got] == [(EOK, 10, i) for i in range(300)]
                # Pipelined reads, including entry -1 (the last entry this bookie has).
                reads = c.read_many(10, [0, 150, 299, -1, 300])
                for r, i in zip(reads[:3], (0, 150, 299), strict=True):
                    assert isinstance(r, wire.ReadResponse)
                    assert (r.rc, r.entry) == (EOK, package(10, i, payloads[i]))
                assert reads[3].entry == package(10, 299, payloads[299])  # type: ignore[union-attr]
                assert reads[4].rc == wire.ReturnCode.ENOENTRY  # type: ignore[union-attr]
                assert c.read(11, 0).rc == wire.ReturnCode.ENOLEDGER

        await in_thread(scenario)
        assert service.storage is not None and service.storage.metrics.adds == 300
    finally:
        await service.stop()


@twisted_test
async def test_registration_and_unregistration(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    service = await start_bookie(tmp_path, uri=uri)
    assert service.bookie_id == f"127.0.0.1:{service.port}"
    assert await in_thread(registrations, uri) == ([service.bookie_id], [])
    with SqliteStore(uri.removeprefix("sqlite://")) as store:
        info = Layout(store).bookie_service_info(service.bookie_id)
    assert [(e.id, e.port, e.protocol) for e in info.endpoints] == [("bookie", service.port, "bookie-rpc")]
    await service.stop()
    assert await in_thread(registrations, uri) == ([], [])


@both_protocols
@twisted_test
async def test_fence_wrong_key_and_fenced_after_restart(tmp_path: Path, protocol: str) -> None:
    uri = metadata_uri(tmp_path)
    service = await start_bookie(tmp_path, uri=uri, bookieId="127.0.0.1:3999")
    other_key = bytes(20)

    def before() -> None:
        with client(service, protocol) as c:
            assert c.add(1, 0, b"a").rc == EOK
            assert c.add(1, 1, b"b", key=other_key).rc == wire.ReturnCode.EUA
            assert c.fence(1, key=other_key).rc == wire.ReturnCode.EUA
            fenced = c.fence(1, entry_id=0)
            assert (fenced.rc, fenced.entry) == (EOK, package(1, 0, b"a"))
            assert c.add(1, 1, b"b").rc == wire.ReturnCode.EFENCED
            assert c.add(1, 1, b"b", flags=wire.FLAG_RECOVERY_ADD | wire.FLAG_HIGH_PRIORITY).rc == EOK
            # Fencing a ledger the bookie never saw creates it fenced (an old writer's late adds fail).
            assert c.fence(2).rc == wire.ReturnCode.ENOENTRY
            assert c.add(2, 0, b"late").rc == wire.ReturnCode.EFENCED

    await in_thread(before)
    await service.stop()
    service = await start_bookie(tmp_path, uri=uri, bookieId="127.0.0.1:3999")

    def after() -> None:
        with client(service, protocol) as c:
            assert c.add(1, 2, b"c").rc == wire.ReturnCode.EFENCED
            assert c.read(1, 1).entry == package(1, 1, b"b")
            assert c.add(1, 2, b"c", key=other_key).rc == wire.ReturnCode.EUA

    try:
        await in_thread(after)
    finally:
        await service.stop()


@both_protocols
@twisted_test
async def test_read_only_flag_and_runtime_switch(tmp_path: Path, protocol: str) -> None:
    uri = metadata_uri(tmp_path)
    service = await start_bookie(tmp_path, uri=uri, forceReadOnlyBookie="true")
    try:
        assert await in_thread(registrations, uri) == ([], [service.bookie_id])
        with_ro = await in_thread(lambda: client(service, protocol).add(1, 0, b"x"))
        assert with_ro.rc == wire.ReturnCode.EREADONLY
        await service.set_read_only(False)
        assert await in_thread(registrations, uri) == ([service.bookie_id], [])
        assert (await in_thread(lambda: client(service, protocol).add(1, 0, b"x"))).rc == EOK
        await service.set_read_only(True)
        assert await in_thread(registrations, uri) == ([], [service.bookie_id])
        assert (await in_thread(lambda: client(service, protocol).read(1, 0))).rc == EOK  # reads still served
    finally:
        await service.stop()


@twisted_test
async def test_reregisters_after_a_lost_session(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    service = await start_bookie(tmp_path, uri=uri)
    try:
        assert service.store is not None
        session = service.store.session_id
        db = sqlite3.connect(uri.removeprefix("sqlite://"))
        with db:  # what a long pause does: the lease runs out, the reaper drops the ephemeral node
            db.execute("UPDATE sessions SET expires_at_ms = 0 WHERE id = ?", (session,))
        db.close()
        await wait_for(lambda: service.store is not None and service.store.session_id != session)
        await wait_for(lambda: registrations(uri) == ([service.bookie_id], []))
    finally:
        await service.stop()


@twisted_test
async def test_cookies_written_then_checked(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    service = await start_bookie(tmp_path, uri=uri, bookieId="127.0.0.1:4000")
    await service.stop()
    journal_cookie = decode_cookie((tmp_path / "b1" / "journal" / "current" / "VERSION").read_bytes())
    assert journal_cookie.bookie_id == "127.0.0.1:4000"
    assert journal_cookie.ledger_dirs == (str(tmp_path / "b1" / "ledgers"),)

    # Another ledger directory added: the cookies name one directory, the config two.
    flags = bookie_flags(tmp_path / "b1", bookieId="127.0.0.1:4000")
    flags["ledgerDirectories"] += "," + str(tmp_path / "b1" / "more")
    moved = BookieService(load_config(flags), uri, reactor)
    with pytest.raises(ConflictError, match="ledger directories differ"):
        await moved.start()
    # The same directories under another bookie id.
    with pytest.raises(ConflictError, match="bookie ids differ"):
        await start_bookie(tmp_path, uri=uri, bookieId="127.0.0.1:4001")
    # Metadata of another cluster (new instance id): the old cookies do not belong there.
    other_uri = metadata_uri(tmp_path / "other")
    with pytest.raises(ConflictError, match="cluster instance ids differ"):
        await start_bookie(tmp_path, uri=other_uri, bookieId="127.0.0.1:4000")
    # The refusals released everything: the bookie still starts as it was.
    service = await start_bookie(tmp_path, uri=uri, bookieId="127.0.0.1:4000")
    await service.stop()


@twisted_test
async def test_refuses_an_uninitialised_cluster(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="cluster init"):
        await start_bookie(tmp_path, uri=f"sqlite://{tmp_path / 'empty.db'}")


@twisted_test
async def test_admin_http(tmp_path: Path) -> None:
    service = await start_bookie(tmp_path, httpServerPort="0", httpServerEnabled="true")
    try:
        assert service.http_port
        base = f"http://127.0.0.1:{service.http_port}"

        def scenario() -> tuple[bytes, dict[str, object], str]:
            with client(service) as c:
                c.add_many(5, [b"x" * 100] * 10)
                assert c.add(5, 10, b"y", key=bytes(20)).rc == wire.ReturnCode.EUA
            beat = urllib.request.urlopen(base + "/heartbeat", timeout=10).read()
            info = json.loads(urllib.request.urlopen(base + "/api/v1/bookie/info", timeout=10).read())
            metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
            return beat, info, metrics

        beat, info, metrics = await in_thread(scenario)
        assert beat == b"OK\n"
        assert info["id"] == service.bookie_id and info["state"] == "read-write"
        assert info["ledgers"] == 1 and "disk_usage" in info and "journal_position" in info
        assert "bkctl_bookie_adds_total 10\n" in metrics
        assert 'bkctl_bookie_errors_total{rc="EUA"} 1\n' in metrics
        assert 'bkctl_bookie_journal_fsync_latency_seconds_bucket{le="+Inf"}' in metrics
        assert "bkctl_bookie_journal_fsync_latency_seconds_count" in metrics
        assert "# TYPE bkctl_bookie_journal_queue_depth gauge" in metrics
    finally:
        await service.stop()


@twisted_test
async def test_bad_frames_do_not_hurt_other_clients(tmp_path: Path) -> None:
    service = await start_bookie(tmp_path)
    try:

        def scenario() -> None:
            with client(service) as good, client(service) as bad:
                assert good.add(1, 0, b"a").rc == EOK
                bad.send_raw(b"\x7f\xff\xff\xff" + b"junk")  # a 2 GiB frame length
                assert bad.closed_by_peer()
                with client(service) as unknown:
                    unknown.send_payloads([wire.encode_unknown_request(2, 9, 0, b"")])
                    (reply,) = unknown.receive(1)
                    assert isinstance(reply, wire.UnknownResponse)
                assert good.add(1, 1, b"b").rc == EOK
                assert good.read(1, 1).entry == package(1, 1, b"b")

        await in_thread(scenario)
        assert service.factory.metrics.frames_rejected == 1
    finally:
        await service.stop()
