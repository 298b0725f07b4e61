"""Java's /api/v1/autorecovery/* admin endpoints, answered from the metadata store: served by a bookie
and by the autorecovery daemon on its own port (`bkctl autorecovery start --http-port`).

Paths, parameters, bodies and codes are Java 4.14.8's (AutoRecoveryStatusService,
ListUnderReplicatedLedgerService, WhoIsAuditorService, TriggerAuditService,
LostBookieRecoveryDelayService). Every call reads or writes the store in a pool thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet import threads
from twisted.internet.defer import Deferred

from bkctl.admin.http_endpoint import (
    Endpoint,
    PathNode,
    Reply,
    answer_when_done,
    json_body,
    json_object,
    param,
    put,
    text,
)
from bkctl.errors import BkctlError
from bkctl.metadata.layout import Layout

log = logging.getLogger("bkctl.http")


class Recoveries(Protocol):
    """What runs a recovery for these endpoints: a ledger client's (set by whoever runs the process;
    server/ never imports client/ nor recovery/)."""

    def recover_bookie(self, bookie: str, delete_cookie: bool) -> Deferred[Any]: ...

    def decommission(self, bookie: str) -> Deferred[Any]: ...


class LayoutEndpoint(Endpoint):
    def __init__(
        self,
        layout: Callable[[], Layout | None],
        admin_enabled: Callable[[], bool],
        recoveries: Callable[[], Recoveries | None] = lambda: None,
    ) -> None:
        Endpoint.__init__(self)
        self.layout = layout
        self.admin_enabled = admin_enabled
        self.recoveries = recoveries

    def in_background(self, request: Any, what: str, started: Callable[[Recoveries], Deferred[Any]]) -> bytes:
        """Start a long recovery and answer at once (as Java's executor does); its end is logged."""
        recoveries = self.recoveries()
        if recoveries is None:
            return text(request, "no ledger client in this process yet", 503)
        log.warning("admin http: %s started", what)
        started(recoveries).addCallbacks(
            lambda _: log.warning("admin http: %s done", what),
            lambda failure: log.error("admin http: %s failed: %s", what, failure.getErrorMessage()),
        )
        return b""

    def in_thread(self, request: Any, function: Callable[[Layout], object]) -> Any:
        layout = self.layout()
        if layout is None:
            return text(request, "not connected to the metadata store yet", 503)
        return answer_when_done(request, threads.deferToThread(_guarded, function, layout))


def _guarded(function: Callable[[Layout], object], layout: Layout) -> object:
    """Java's services answer 404 "Exception when ..." for a failed metadata call."""
    try:
        return function(layout)
    except BkctlError as exc:
        return Reply(f"Exception when get.{exc}", 404, is_json=False)


class Status(LayoutEndpoint):
    """GET `{"enabled": bool}`; PUT `?enabled=true|false` switches it (answers the new state)."""

    wrong_method = "Not found method. Should be GET or PUT method"
    admin_methods = frozenset({"PUT"})

    def on_GET(self, request: Any) -> Any:
        return self.in_thread(request, lambda layout: {"enabled": layout.autorecovery_enabled()})

    def on_PUT(self, request: Any) -> Any:
        enabled = param(request, "enabled")
        if enabled is None:
            args = {k.decode(): v[0].decode() for k, v in request.args.items()}
            return text(request, f"Param 'enabled' not found in {args}", 400)

        def switch(layout: Layout) -> dict[str, bool]:
            layout.set_autorecovery_enabled(enabled.lower() == "true")  # Java's Boolean.parseBoolean
            now = layout.autorecovery_enabled()
            log.warning("admin http: autorecovery %s", "enabled" if now else "disabled")
            return {"enabled": now}

        return self.in_thread(request, switch)


class UnderReplicated(LayoutEndpoint):
    """GET `[ledger ids]`, or `{"id": [missing replicas]}` with `printmissingreplica`; filters
    `missingreplica=<bookie>` and `excludingmissingreplica=<bookie>`; 404 when none."""

    def on_GET(self, request: Any) -> Any:
        including = param(request, "missingreplica") or ""
        excluding = param(request, "excludingmissingreplica") or ""
        with_replicas = param(request, "printmissingreplica") is not None

        def listed(layout: Layout) -> object:
            found: dict[int, list[str]] = {}
            for ledger_id in layout.underreplicated_ids():
                mark = layout.read_underreplicated(ledger_id)
                replicas = list(mark.value.replicas) if mark is not None else []
                if (including and including not in replicas) or (excluding and excluding in replicas):
                    continue
                found[ledger_id] = replicas
            if not found:
                return Reply("No under replicated ledgers found", 404, is_json=False)
            return {str(k): v for k, v in found.items()} if with_replicas else list(found)

        return self.in_thread(request, listed)


class WhoIsAuditor(LayoutEndpoint):
    def on_GET(self, request: Any) -> Any:
        def auditor(layout: Layout) -> Reply:
            current = layout.current_auditor()
            if current is None:
                return Reply("No auditor elected", 404, is_json=False)
            return Reply(f"Auditor: {current}", is_json=False)

        return self.in_thread(request, auditor)


FAILED = "Exception when do operation."  # Java's prefix, its exception's message follows


class TriggerAudit(LayoutEndpoint):
    """PUT: rewrite lostBookieRecoveryDelay with its value; the auditor's watch runs an audit now."""

    wrong_method = "Not found method. Should be PUT method"

    def on_PUT(self, request: Any) -> Any:
        def trigger(layout: Layout) -> Reply:
            if not layout.autorecovery_enabled():
                return Reply(f"{FAILED}Autorecovery is disabled. So giving up!", 404, False)
            if layout.current_auditor() is None:
                return Reply(
                    f"{FAILED}No auditor elected, though Autorecovery is enabled. So giving up.", 404, False
                )
            layout.set_lost_bookie_recovery_delay(layout.lost_bookie_recovery_delay() or 0)
            return Reply("Success trigger audit.", is_json=False)

        return self.in_thread(request, trigger)


class LostBookieRecoveryDelay(LayoutEndpoint):
    """GET `lostBookieRecoveryDelay value: N`; PUT `{"delay_seconds": N}`."""

    wrong_method = "Not found method. Should be PUT method"
    admin_methods = frozenset({"PUT"})

    def on_GET(self, request: Any) -> Any:
        def delay(layout: Layout) -> Reply:
            value = layout.lost_bookie_recovery_delay()
            if value is None:
                return Reply("Exception when get lostBookieRecoveryDelay.not set", 404, False)
            return Reply(f"lostBookieRecoveryDelay value: {value}", is_json=False)

        return self.in_thread(request, delay)

    def on_PUT(self, request: Any) -> Any:
        try:
            body = json_body(request)
        except ValueError as exc:
            return text(request, f"bad request body: {exc}", 500)  # Java: its JSON parse error is a 500
        if body is None:
            return text(request, "Null request body for lostBookieRecoveryDelay.", 404)
        seconds = body.get("delay_seconds") if isinstance(body, dict) else None
        if not isinstance(seconds, int) or isinstance(seconds, bool) or not 0 <= seconds < 1 << 31:
            return text(request, "Request body not contains lostBookieRecoveryDelay.", 404)

        def store(layout: Layout) -> Reply:
            layout.set_lost_bookie_recovery_delay(seconds)
            log.warning("admin http: lostBookieRecoveryDelay set to %d s", seconds)
            return Reply(f"Success set lostBookieRecoveryDelay to {seconds}", is_json=False)

        return self.in_thread(request, store)


class RecoverBookie(LayoutEndpoint):
    """PUT `{"bookie_src": ["<bookie>"], "delete_cookie": bool}`: recover a stopped bookie's ledgers
    onto the others in the background (`bkctl recover`'s work); answers at once, as Java's."""

    wrong_method = "Not found method. Should be PUT method"
    admin_methods = frozenset({"PUT"})

    def on_PUT(self, request: Any) -> bytes:
        body = json_object(request, "ERROR parameters: ", "No request body provide.", 404)
        if isinstance(body, bytes):
            return body
        sources = body.get("bookie_src")
        if not isinstance(sources, list) or not sources or not isinstance(sources[0], str):
            return text(request, self.wrong_method, 404)
        bookie, delete_cookie = sources[0], body.get("delete_cookie") is True
        started = self.in_background(
            request, f"recovery of bookie {bookie}", lambda r: r.recover_bookie(bookie, delete_cookie)
        )
        return started or text(request, "Success send recovery request command.")


class Decommission(LayoutEndpoint):
    """PUT `{"bookie_src": "<bookie>"}`: `bkctl bookie decommission`'s work in the background."""

    wrong_method = "Not found method. Should be PUT method"
    admin_methods = frozenset({"PUT"})

    def on_PUT(self, request: Any) -> bytes:
        body = json_object(
            request,
            "Exception when send decommission command.",
            "Null request body for DecommissionService.",
            500,  # Java: no body and bad JSON both fail its JSON parse, a 500
        )
        if isinstance(body, bytes):
            return body
        bookie = body.get("bookie_src")
        if not isinstance(bookie, str) or not bookie:
            return text(request, "Request body not contains bookie_src.", 404)
        started = self.in_background(
            request, f"decommission of bookie {bookie}", lambda r: r.decommission(bookie)
        )
        return started or text(request, f"Success send decommission Bookie command {bookie}")


def autorecovery_resource(
    layout: Callable[[], Layout | None],
    admin_enabled: Callable[[], bool],
    recoveries: Callable[[], Recoveries | None] = lambda: None,
) -> Any:
    """The /api/v1/autorecovery node (typed Any: twisted.web's zope interfaces)."""
    node = PathNode()
    for name, endpoint in (
        (b"status", Status),
        (b"list_under_replicated_ledger", UnderReplicated),
        (b"who_is_auditor", WhoIsAuditor),
        (b"trigger_audit", TriggerAudit),
        (b"lost_bookie_recovery_delay", LostBookieRecoveryDelay),
        (b"bookie", RecoverBookie),
        (b"decommission", Decommission),
    ):
        put(node, name, endpoint(layout, admin_enabled, recoveries))
    return node
