"""Java's admin HTTP endpoints on an in-process bookie (127.0.0.1, port 0): paths, methods, JSON shapes
and status codes, success and error cases; the runtime read-only switch; is_ready."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bkctl.admin.http_endpoint import Reply
from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from bkctl.model import LedgerMetadata, Segment
from bkctl.protocol import wire
from bkctl.server.admin_bookie import NOT_SERVING, bookie_info_answer, readable
from bkctl.server.bookie_status import STATUS_NAME, decode_status
from bkctl.server.service import BookieService
from tests.server_net.live import in_thread, metadata_uri, registrations_of, start_bookie, twisted_test
from tests.server_net.wire_client import WireClient

HTTP = {"httpServerEnabled": "true", "httpServerPort": "0"}
ADMIN = {**HTTP, "httpServerAdminEnabled": "true"}


def call(port: int, method: str, path: str, body: object = None, raw: bytes | None = None) -> tuple[int, str]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def call_json(port: int, method: str, path: str, body: object = None) -> tuple[int, Any]:
    code, text = call(port, method, path, body)
    return code, json.loads(text)


def bkctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bkctl", *args], capture_output=True, text=True, timeout=120, check=False
    )


async def http_bookie(tmp_path: Path, **keys: str) -> tuple[str, BookieService, int]:
    """A bookie with its admin HTTP endpoint on a fresh cluster: (metadata URI, service, HTTP port)."""
    uri = metadata_uri(tmp_path)
    service = await start_bookie(tmp_path, uri=uri, **keys)
    assert service.http_port is not None
    return uri, service, service.http_port


def with_layout(uri: str, action: Any) -> Any:
    with SqliteStore(uri.removeprefix("sqlite://")) as store:
        return action(Layout(store))


@twisted_test
async def test_gc_sub_paths_and_unknown_paths(tmp_path: Path) -> None:
    service = await start_bookie(tmp_path, gcWaitTime="0", **HTTP)
    port = service.http_port
    assert port is not None and service.gc is not None
    try:

        def scenario() -> None:
            # An unknown path answers 404 and does nothing, whatever endpoint it is under.
            for path in ("/api/v1/bookie/gc/x", "/api/v1/bookie/info/x", "/api/v1", "/api/v1/nope", "/"):
                assert call(port, "PUT", path, {})[0] == 404, path
            assert service.gc is not None and service.gc.metrics.runs == 0
            # Java 4.16's suspend/resume: PUT changes, GET shows; resume has no GET.
            assert call_json(port, "GET", "/api/v1/bookie/gc/suspend_compaction") == (
                200,
                {"isMajorGcSuspended": "false", "isMinorGcSuspended": "false"},
            )
            suspend = "/api/v1/bookie/gc/suspend_compaction"
            code, said = call_json(port, "PUT", suspend, {"suspendMajor": True})
            assert code == 200 and said.startswith("Suspend majorGC on BookieServer: ")
            assert service.gc.major_suspended and not service.gc.minor_suspended
            assert call(port, "PUT", "/api/v1/bookie/gc/suspend_compaction", {})[0] == 400
            assert call(port, "PUT", "/api/v1/bookie/gc/suspend_compaction")[0] == 400
            assert call(port, "PUT", "/api/v1/bookie/gc/suspend_compaction", raw=b"{nope")[0] == 400
            assert call(port, "DELETE", "/api/v1/bookie/gc/suspend_compaction")[0] == 404
            assert service.gc.metrics.runs == 0  # none of those started a GC
            assert call(port, "GET", "/api/v1/bookie/gc/resume_compaction")[0] == 404
            code, said = call_json(
                port, "PUT", "/api/v1/bookie/gc/resume_compaction", {"resumeMajor": True, "resumeMinor": True}
            )
            assert code == 200 and "Resume minorGC" in said and not service.gc.major_suspended
            # gc itself: a wrong method is Java's 404, a bad body 400.
            assert call(port, "DELETE", "/api/v1/bookie/gc")[0] == 404
            assert call(port, "PUT", "/api/v1/bookie/gc", raw=b"[1")[0] == 400
            assert call_json(port, "GET", "/api/v1/bookie/gc") == (200, {"is_in_force_gc": "false"})

        await in_thread(scenario)
        # A suspended major compaction is skipped even when forced; minor still runs.
        service.gc.major_suspended = True
        report = await service.gc.trigger(force_major=True)
        assert report["compaction"] != "major"
    finally:
        await service.stop()


@twisted_test
async def test_bookie_endpoints(tmp_path: Path) -> None:
    uri, service, port = await http_bookie(tmp_path, **ADMIN)
    metadata = LedgerMetadata(1, 1, 1, (Segment(0, (service.bookie_id,)),))
    ledger_id = await in_thread(with_layout, uri, lambda layout: layout.create_ledger(metadata)[0])
    try:

        def scenario() -> None:
            assert call(port, "GET", "/heartbeat") == (200, "OK\n")
            assert call(port, "PUT", "/heartbeat") == (200, "OK\n")  # any method, as Java's
            code, info = call_json(port, "GET", "/api/v1/bookie/info")
            assert code == 200 and info["totalSpace"] >= info["freeSpace"] > 0
            assert info["id"] == service.bookie_id
            assert call(port, "PUT", "/api/v1/bookie/info")[0] == 404
            assert call_json(port, "GET", "/api/v1/bookie/state") == (
                200,
                {
                    "running": True,
                    "readOnly": False,
                    "shuttingDown": False,
                    "availableForHighPriorityWrites": True,
                    "state": "read-write",
                    "readOnlyForcedBy": None,
                },
            )
            assert call(port, "PUT", "/api/v1/bookie/state")[0] == 404
            assert call(port, "GET", "/api/v1/bookie/is_ready") == (200, "")
            assert call(port, "PUT", "/api/v1/bookie/is_ready")[0] == 404
            code, marks = call_json(port, "GET", "/api/v1/bookie/last_log_mark")
            assert code == 200 and all(k.startswith("LastLogMark: Journal Id - ") for k in marks)
            assert all(v.startswith("Pos - ") for v in marks.values())
            assert call_json(port, "GET", "/api/v1/bookie/list_bookies") == (200, {service.bookie_id: None})
            assert call_json(port, "GET", "/api/v1/bookie/list_bookies?type=ro") == (200, {})
            assert call_json(port, "GET", "/api/v1/bookie/list_bookies?print_hostnames=true") == (
                200,
                {service.bookie_id: "127.0.0.1"},
            )
            code, cluster = call_json(port, "GET", "/api/v1/bookie/cluster_info")
            assert code == 200 and cluster["writableBookiesCount"] == 1 and cluster["auditorElected"] is False
            code, conf = call_json(port, "GET", "/api/v1/config/server_config")
            assert code == 200 and conf["httpServerAdminEnabled"] == "true"
            assert call(port, "PUT", "/api/v1/config/server_config", {"gcWaitTime": "1"})[0] == 400
            assert call(port, "DELETE", "/api/v1/config/server_config")[0] == 404
            # Ledgers, from the metadata store.
            assert call_json(port, "GET", "/api/v1/ledger/list") == (200, {str(ledger_id): None})
            code, listed = call_json(port, "GET", "/api/v1/ledger/list?print_metadata=true")
            serialized = listed[str(ledger_id)]  # Java's: LedgerMetadataSerDe's bytes as a string
            assert code == 200 and serialized.startswith("BookieMetadataFormatVersion\t3\n")
            assert service.bookie_id in serialized
            decoded = "/api/v1/ledger/list?print_metadata=true&decode_meta=true"
            code, listed = call_json(port, "GET", decoded)
            assert code == 200 and listed[str(ledger_id)]["allEnsembles"] == {
                "0": [{"id": service.bookie_id}]
            }
            assert (
                listed[str(ledger_id)]["ledgerId"] == ledger_id and listed[str(ledger_id)]["password"] is None
            )
            code, one = call_json(port, "GET", f"/api/v1/ledger/metadata?ledger_id={ledger_id}")
            assert code == 200 and one[str(ledger_id)]["ensembleSize"] == 1
            assert call(port, "GET", "/api/v1/ledger/metadata?ledger_id=999999")[0] == 500  # Java's
            assert call(port, "GET", "/api/v1/ledger/metadata")[0] == 404
            assert call(port, "GET", "/api/v1/ledger/delete?ledger_id=1")[0] == 404  # Java: DELETE only
            assert call(port, "DELETE", "/api/v1/ledger/delete")[0] == 404
            assert call(port, "DELETE", "/api/v1/ledger/delete?ledger_id=999999")[0] == 200  # Java's
            code, said = call_json(port, "DELETE", f"/api/v1/ledger/delete?ledger_id={ledger_id}")
            assert (code, said) == (200, f"Deleted ledger: {ledger_id}")
            assert call_json(port, "GET", "/api/v1/ledger/list") == (200, {})
            assert call(port, "POST", "/metrics")[0] == 403

        await in_thread(scenario)
    finally:
        await service.stop()


@twisted_test
async def test_autorecovery_endpoints(tmp_path: Path) -> None:
    uri, service, port = await http_bookie(tmp_path, **ADMIN)
    base = "/api/v1/autorecovery"
    try:

        def scenario() -> None:
            assert call_json(port, "GET", f"{base}/status") == (200, {"enabled": True})
            assert call(port, "PUT", f"{base}/status")[0] == 400
            assert call_json(port, "PUT", f"{base}/status?enabled=false") == (200, {"enabled": False})
            assert call(port, "PUT", f"{base}/trigger_audit")[0] == 404  # disabled: Java's 404
            assert call_json(port, "PUT", f"{base}/status?enabled=true") == (200, {"enabled": True})
            assert call(port, "DELETE", f"{base}/status")[0] == 404
            assert call(port, "GET", f"{base}/who_is_auditor") == (404, "No auditor elected")
            assert call(port, "GET", f"{base}/list_under_replicated_ledger")[0] == 404
            with_layout(uri, lambda layout: layout.mark_underreplicated(7, ["127.0.0.1:1"]))
            listed = f"{base}/list_under_replicated_ledger"
            assert call_json(port, "GET", listed) == (200, [7])
            assert call_json(port, "GET", f"{listed}?printmissingreplica=true") == (
                200,
                {"7": ["127.0.0.1:1"]},
            )
            assert call(port, "GET", f"{listed}?missingreplica=127.0.0.1:2")[0] == 404
            assert call_json(port, "GET", f"{listed}?excludingmissingreplica=127.0.0.1:2") == (200, [7])
            assert call(port, "PUT", f"{base}/lost_bookie_recovery_delay", {"delay_seconds": 5}) == (
                200,
                "Success set lostBookieRecoveryDelay to 5",
            )
            assert call(port, "GET", f"{base}/lost_bookie_recovery_delay") == (
                200,
                "lostBookieRecoveryDelay value: 5",
            )
            assert call(port, "PUT", f"{base}/lost_bookie_recovery_delay", {"x": 1})[0] == 404
            assert call(port, "PUT", f"{base}/lost_bookie_recovery_delay", raw=b"{")[0] == 500

        await in_thread(scenario)
    finally:
        await service.stop()


@twisted_test
async def test_destructive_endpoints_need_the_admin_key(tmp_path: Path) -> None:
    # The admin server listens where httpServerHost says, and logs every request with its caller.
    service = await start_bookie(tmp_path, name="elsewhere", httpServerHost="127.0.0.2", **HTTP)
    assert service._http_listener.getHost().host == "127.0.0.2"
    await service.stop()
    service = await start_bookie(tmp_path, **HTTP)
    port = service.http_port
    assert port is not None
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("bkctl.http").addHandler(handler)
    logging.getLogger("bkctl.http").setLevel(logging.INFO)
    try:

        def scenario() -> None:
            for method, path in (
                ("PUT", "/api/v1/bookie/state/readonly"),
                ("DELETE", "/api/v1/ledger/delete?ledger_id=1"),
                ("PUT", "/api/v1/config/server_config"),
                ("PUT", "/api/v1/bookie/expand_storage"),
                ("PUT", "/api/v1/autorecovery/status?enabled=false"),
                ("PUT", "/api/v1/autorecovery/lost_bookie_recovery_delay"),
            ):
                code, said = call(port, method, path, {"readOnly": True})
                assert code == 403 and "httpServerAdminEnabled" in said, path
            assert call_json(port, "GET", "/api/v1/bookie/state/readonly") == (200, {"readOnly": False})
            refused = bkctl("bookie", "readonly", "--http", f"127.0.0.1:{port}")
            assert refused.returncode == 9 and "httpServerAdminEnabled" in refused.stderr

        await in_thread(scenario)
        assert service.state == "read-write"
        logged = [r.getMessage() for r in records]
        assert "admin http PUT /api/v1/bookie/state/readonly from 127.0.0.1" in logged
    finally:
        logging.getLogger("bkctl.http").removeHandler(handler)
        logging.getLogger("bkctl.http").setLevel(logging.NOTSET)
        await service.stop()


@twisted_test
async def test_read_only_switch(tmp_path: Path) -> None:
    uri, service, port = await http_bookie(tmp_path, **ADMIN)
    path = "/api/v1/bookie/state/readonly"
    try:

        def scenario() -> None:
            with WireClient("127.0.0.1", service.port) as client:
                assert client.add(1, 0, b"x").rc == wire.ReturnCode.EOK
                assert call_json(port, "PUT", path, {"readOnly": True}) == (200, {"readOnly": True})
                # The answer comes once the registration moved: adds refused, reads served.
                assert registrations_of(uri) == ([], [service.bookie_id])
                assert client.add(1, 1, b"y").rc == wire.ReturnCode.EREADONLY
                assert client.read(1, 0).rc == wire.ReturnCode.EOK
                assert call(port, "GET", "/api/v1/bookie/is_ready") == (200, "")  # read-only is ready too
                assert call_json(port, "PUT", path, {"readOnly": False}) == (200, {"readOnly": False})
                assert registrations_of(uri) == ([service.bookie_id], [])
                assert client.add(1, 1, b"y").rc == wire.ReturnCode.EOK
            assert call(port, "PUT", path, raw=b"{")[0] == 500  # Java's parse error
            assert call(port, "PUT", path)[0] == 500
            assert call(port, "PUT", path, {"readOnly": "yes"})[0] == 400
            assert call(port, "DELETE", path)[0] == 404

        await in_thread(scenario)
        assert not (tmp_path / "b1" / "ledgers" / "current" / STATUS_NAME).exists()  # not asked to persist
    finally:
        await service.stop()


@twisted_test
async def test_forced_read_only_cannot_be_lifted(tmp_path: Path) -> None:
    service = await start_bookie(tmp_path, forceReadOnlyBookie="true", **ADMIN)
    port = service.http_port
    assert port is not None
    try:
        code, said = await in_thread(call, port, "PUT", "/api/v1/bookie/state/readonly", {"readOnly": False})
        assert code == 400 and "forceReadOnlyBookie" in said
        sanity = await in_thread(call_json, port, "GET", "/api/v1/bookie/sanity")
        assert sanity == (200, {"passed": False, "readOnly": True})
        refused = await in_thread(bkctl, "bookie", "writable", "--http", f"127.0.0.1:{port}")
        assert refused.returncode == 10 and "forceReadOnlyBookie" in refused.stderr
        assert service.state == "read-only"
    finally:
        await service.stop()


@twisted_test
async def test_persisted_read_only(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    service = await start_bookie(tmp_path, uri=uri, bookieId="127.0.0.1:4000", **ADMIN)
    status = tmp_path / "b1" / "ledgers" / "current" / STATUS_NAME
    try:
        assert service.http_port is not None
        switched = await in_thread(
            bkctl, "bookie", "readonly", service.bookie_id, "--persist", "--metadata", uri
        )
        assert switched.returncode == 0, switched.stderr
        assert "is read-only (kept across restarts)" in switched.stderr
        decoded = decode_status(status.read_bytes())
        assert decoded is not None and decoded[0] is True
    finally:
        await service.stop()
    # Kept across a restart only with the key (or the switch's persist): read-only at once.
    again: BookieService = await start_bookie(
        tmp_path, uri=uri, bookieId="127.0.0.1:4000", persistBookieStatusEnabled="true", **ADMIN
    )
    try:
        assert again.state == "read-only"
        assert await in_thread(registrations_of, uri) == ([], [again.bookie_id])
        assert again.http_port is not None
        await in_thread(call, again.http_port, "PUT", "/api/v1/bookie/state/readonly", {"readOnly": False})
        decoded = decode_status(status.read_bytes())
        assert decoded is not None and decoded[0] is False
    finally:
        await again.stop()


@twisted_test
async def test_the_daemon_serves_the_autorecovery_endpoints(tmp_path: Path) -> None:
    from twisted.internet import reactor

    from bkctl.recovery.metrics import metrics_site

    uri = metadata_uri(tmp_path)
    store = SqliteStore(uri.removeprefix("sqlite://"))
    listener = reactor.listenTCP(0, metrics_site(None, Layout(store)), interface="127.0.0.1")
    port = listener.getHost().port
    try:

        def scenario() -> None:
            assert call(port, "GET", "/heartbeat") == (200, "OK\n")
            assert call_json(port, "GET", "/api/v1/autorecovery/status") == (200, {"enabled": True})
            assert call(port, "PUT", "/api/v1/autorecovery/status?enabled=false")[0] == 403  # no admin key
            assert call(port, "GET", "/api/v1/autorecovery/who_is_auditor") == (404, "No auditor elected")
            assert call(port, "GET", "/api/v1/bookie/state")[0] == 404  # a daemon has no bookie endpoints

        await in_thread(scenario)
    finally:
        await listener.stopListening()
        store.close()


@twisted_test
async def test_is_ready_only_once_registered(tmp_path: Path) -> None:
    uri = metadata_uri(tmp_path)
    # Another session holds the registration (a previous incarnation killed -9): the bookie serves
    # its admin port but is not ready until it has registered.
    holder = SqliteStore(uri.removeprefix("sqlite://"))
    Layout(holder).register_bookie("127.0.0.1:4001")
    service = await start_bookie(tmp_path, uri=uri, bookieId="127.0.0.1:4001", **HTTP)
    port = service.http_port
    assert port is not None
    try:
        assert await in_thread(call, port, "GET", "/api/v1/bookie/is_ready") == (
            503,
            "Bookie is not fully started yet",
        )
        code, state = await in_thread(call_json, port, "GET", "/api/v1/bookie/state")
        assert code == 200 and state["running"] is False
        holder.close()  # its session ends: the bookie registers

        def ready() -> bool:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if call(port, "GET", "/api/v1/bookie/is_ready")[0] == 200:
                    return True
                time.sleep(0.1)
            return False

        assert await in_thread(ready)
    finally:
        await service.stop()


@twisted_test
async def test_ledger_read_and_sanity(tmp_path: Path) -> None:
    from twisted.internet import reactor

    from bkctl.commands.bookie_server import attach_entry_reader

    uri, service, port = await http_bookie(tmp_path, **HTTP)
    reader = attach_entry_reader(service, reactor, service.config)
    try:

        def scenario() -> None:
            args = ("ledger", "write", "-n", "12", "-E", "1", "-Qw", "1", "-Qa", "1", "--metadata", uri)
            written = bkctl(*args, "-o", "json")
            assert written.returncode == 0, written.stderr
            ledger_id = json.loads(written.stdout)["ledger_id"]
            path = f"/api/v1/ledger/read?ledger_id={ledger_id}"
            code, entries = call_json(port, "GET", path)
            assert code == 200 and entries == {str(e): f"L{ledger_id}-E{e}" for e in range(12)}
            code, some = call_json(port, "GET", f"{path}&start_entry_id=3&end_entry_id=4")
            assert (code, some) == (200, {"3": f"L{ledger_id}-E3", "4": f"L{ledger_id}-E4"})
            code, paged = call_json(port, "GET", f"{path}&page=1")
            assert code == 200 and paged["Entries for page: "] == "1" and len(paged) == 13
            assert call(port, "GET", f"{path}&start_entry_id=5&end_entry_id=4")[0] == 500
            assert call(port, "GET", "/api/v1/ledger/read")[0] == 404
            assert call(port, "GET", "/api/v1/ledger/read?ledger_id=999999")[0] == 500  # Java's
            assert call(port, "PUT", path)[0] == 404
            assert call_json(port, "GET", "/api/v1/bookie/sanity") == (
                200,
                {"passed": True, "readOnly": False},
            )
            assert call(port, "PUT", "/api/v1/bookie/sanity")[0] == 404

        await in_thread(scenario)
    finally:
        await reader.close()
        await service.stop()


@twisted_test
async def test_decommission_and_recover_bookie(tmp_path: Path) -> None:
    from twisted.internet import reactor

    from bkctl.commands.bookie_server import attach_entry_reader

    uri, first, port = await http_bookie(tmp_path, **ADMIN)
    others = [await start_bookie(tmp_path, name=name, uri=uri) for name in ("b2", "b3")]
    client = attach_entry_reader(first, reactor, first.config)
    base = "/api/v1/autorecovery"
    try:
        quorums = ("--ensemble-size", "2", "--write-quorum", "2", "--ack-quorum", "2")
        written = await in_thread(
            bkctl, "ledger", "write", "-n", "20", *quorums, "--metadata", uri, "-o", "json"
        )
        assert written.returncode == 0, written.stderr
        ledger_id = json.loads(written.stdout)["ledger_id"]
        segments = await in_thread(
            with_layout, uri, lambda layout: layout.read_ledger(ledger_id).value.segments
        )
        # A bookie of the ensemble other than the one asked (the third takes its copies).
        victim = next(s for s in others if s.bookie_id in segments[0].ensemble)
        others.remove(victim)
        await victim.stop()

        def scenario() -> None:
            assert call(port, "PUT", f"{base}/decommission") == (
                500,
                "Null request body for DecommissionService.",
            )
            assert call(port, "PUT", f"{base}/decommission", {"x": 1})[0] == 404
            assert call(port, "PUT", f"{base}/bookie")[0] == 404
            assert call(port, "PUT", f"{base}/bookie", {"bookie_src": []})[0] == 404
            assert call(port, "GET", f"{base}/bookie")[0] == 404
            said = call(port, "PUT", f"{base}/decommission", {"bookie_src": victim.bookie_id})
            assert said == (200, f"Success send decommission Bookie command {victim.bookie_id}")
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                ensembles = with_layout(uri, lambda layout: layout.read_ledger(ledger_id).value.segments)
                cookie = with_layout(uri, lambda layout: layout.read_cookie(victim.bookie_id))
                if cookie is None and all(victim.bookie_id not in s.ensemble for s in ensembles):
                    return
                time.sleep(0.2)
            raise AssertionError(f"bookie {victim.bookie_id} still named: {ensembles}, cookie {cookie}")

        await in_thread(scenario)
    finally:
        await client.close()  # opened by the decommission
        for service in (first, *others):
            await service.stop()


@twisted_test
async def test_list_bookie_info_expand_storage_and_server_config(tmp_path: Path) -> None:
    import re

    from twisted.internet import reactor

    from bkctl.commands.bookie_server import attach_entry_reader

    uri, service, port = await http_bookie(tmp_path, **ADMIN)
    other = await start_bookie(tmp_path, name="b2", uri=uri)
    assert service.gc is not None
    # Before `bookie start` attaches its client the bookie cannot ask the others.
    assert await in_thread(call, port, "GET", "/api/v1/bookie/list_bookie_info") == (503, NOT_SERVING)
    client = attach_entry_reader(service, reactor, service.config)
    try:

        def scenario() -> None:
            # Java's strings: each read-write bookie's free/total disk bytes, then the cluster's sums.
            code, listed = call_json(port, "GET", "/api/v1/bookie/list_bookie_info")
            assert code == 200 and list(listed) == [
                *sorted([service.bookie_id, other.bookie_id]),
                "ClusterInfo: ",
            ]
            size = r"(\d+)(\(\d+(\.\d+)?[KMGT]B\))?"
            frees = []
            for bookie in (service.bookie_id, other.bookie_id):
                shown = re.fullmatch(f": {{Free: {size}, Total: {size}}},", listed[bookie])
                assert shown is not None, listed[bookie]
                assert 0 < int(shown.group(1)) <= int(shown.group(4))
                frees.append(int(shown.group(1)))
            cluster = re.fullmatch(f"{{Free: {size}, Total: {size}}}", listed["ClusterInfo: "])
            assert cluster is not None and int(cluster.group(1)) == sum(frees)
            assert call(port, "PUT", "/api/v1/bookie/list_bookie_info")[0] == 404
            # A registered bookie that does not answer is left out, as Java's BookieInfoReader leaves it.
            with SqliteStore(uri.removeprefix("sqlite://")) as store:
                layout = Layout(store)
                layout.register_bookie("127.0.0.1:1")
                assert "127.0.0.1:1" in layout.bookies()
                code, again = call_json(port, "GET", "/api/v1/bookie/list_bookie_info")
                assert code == 200 and list(again) == list(listed)
            # expand_storage: the running directories agree with the cookies, nothing new to add.
            expand = "/api/v1/bookie/expand_storage"
            assert call(port, "PUT", expand) == (200, "Success expand storage")
            running = ",".join(str(d) for d in service.config.ledger_dirs)
            assert call(port, "PUT", expand, {"ledgerDirectories": running}) == (
                200,
                "Success expand storage",
            )
            code, said = call(port, "PUT", expand, {"ledgerDirectories": f"{running},/tmp/bk-new-disk"})
            assert code == 500 and "/tmp/bk-new-disk" in said and "restart" in said
            assert call(port, "GET", expand)[0] == 404
            # server_config PUT: the GC's keys take effect at its next run; any other key is refused whole.
            conf = "/api/v1/config/server_config"
            assert call(
                port, "PUT", conf, {"majorCompactionThreshold": 0.5, "compactionRateByEntries": "500"}
            ) == (
                200,
                "Success set server config.",
            )
            assert call_json(port, "GET", conf)[1]["majorCompactionThreshold"] == "0.5"
            code, said = call(
                port, "PUT", conf, {"minorCompactionThreshold": 0.1, "journalDirectories": "/x"}
            )
            assert code == 400 and "journalDirectories" in said
            assert call(port, "PUT", conf, {"majorCompactionThreshold": 5})[0] == 400  # out of range
            assert call(port, "PUT", conf, {"majorCompactionThreshold": [1]})[0] == 400
            assert call(port, "PUT", conf, raw=b"{")[0] == 500  # Java's: its JSON parse fails
            assert call(port, "PUT", conf)[0] == 500  # Java's: no body is "", which fails it too

        await in_thread(scenario)
        assert service.gc.settings.major_threshold == 0.5 and service.gc.settings.rate_entries == 500
        assert service.gc.settings.minor_threshold == 0.2  # the refused body changed nothing
        assert service.config.major_compaction_threshold == 0.5
    finally:
        await client.close()
        for bookie in (service, other):
            await bookie.stop()


def test_java_readable_sizes() -> None:
    assert [readable(v) for v in (0, 999, 1000, 1500, 1_234_567, 10**12, 5 * 10**15)] == [
        "",
        "",
        "(1KB)",
        "(1.5KB)",
        "(1.234MB)",
        "(1TB)",
        "(5000TB)",
    ]
    assert bookie_info_answer({}) == Reply("Not found any Bookie info.", 404, is_json=False)
