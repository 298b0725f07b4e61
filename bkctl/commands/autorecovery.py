"""`bkctl autorecovery`: the cluster-wide autorecovery switches and who the auditor is."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from bkctl import limits
from bkctl.commands.options import MetadataOption, Problems, open_layout
from bkctl.commands.output import OutputOption, message, resolve, write_mapping
from bkctl.commands.running import StartOutcome, run_until_stopped
from bkctl.errors import NotFoundError, UsageError
from bkctl.metadata.autorecovery import RATE_UNLIMITED

app = typer.Typer(
    help="Autorecovery: status, enable/disable, auditor, lost bookie delay, copy rate.", no_args_is_help=True
)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="autorecovery")


def auditor_fields(layout: Any, problems: Problems) -> dict[str, Any]:
    """`auditor`: the live election winner, else the last elected one; `auditor_running` tells which."""
    current = layout.current_auditor(problems)
    return {"auditor": current or layout.last_elected_auditor(), "auditor_running": current is not None}


@app.command("status")
def status(metadata: MetadataOption = None, output: OutputOption = None) -> None:
    """Whether autorecovery is enabled, the auditor, lostBookieRecoveryDelay and the ledgers in work."""
    fmt = resolve(output)
    problems = Problems()
    with open_layout(metadata) as layout:
        document: dict[str, Any] = {"enabled": layout.autorecovery_enabled()}
        document.update(auditor_fields(layout, problems))
        document["lost_bookie_recovery_delay_s"] = layout.lost_bookie_recovery_delay()
        document["replication_rate_bytes_per_s"] = layout.replication_rate()
        entries = list(layout.underreplicated_ledgers(problems))
        statuses = layout.daemon_statuses()
        bytes_left = estimated_bytes_left(layout, entries)
    document["underreplicated_count"] = len(entries)
    document["being_replicated"] = [
        {"ledger_id": e.ledger_id, "replication_worker": e.replication_worker}
        for e in entries
        if e.replication_worker is not None
    ]
    document["daemons"] = daemon_documents(statuses, problems)
    document.update(progress_fields(len(entries), bytes_left, document["daemons"]))
    write_mapping(document, fmt)
    problems.raise_if_any()


def estimated_bytes_left(layout: Any, entries: list[Any]) -> int:
    """What the marks still ask to copy: for each marked ledger, each replica it lost held about the
    ledger's length x write quorum / ensemble size (an open ledger counts what it has so far)."""
    replicas = {e.ledger_id: len(e.mark.replicas) for e in entries}
    total = 0.0
    for ledger_id, md in layout.read_ledgers(replicas):
        total += md.length * md.write_quorum / max(1, md.ensemble_size) * replicas[ledger_id]
    return round(total)


def progress_fields(ledgers_left: int, bytes_left: int, daemons: list[dict[str, Any]]) -> dict[str, Any]:
    """The daemons' rates together and the time left at them: the slower of the bytes and the ledgers
    (many small ledgers are bound by the work per ledger, not by bytes)."""
    bytes_per_s = sum(float(d.get("bytes_per_s") or 0) for d in daemons)
    ledgers_per_s = sum(float(d.get("ledgers_per_s") or 0) for d in daemons)
    times = [
        left / rate for left, rate in ((bytes_left, bytes_per_s), (ledgers_left, ledgers_per_s)) if rate > 0
    ]
    eta = None if not ledgers_left else (round(max(times)) if times else None)
    return {
        "bytes_left": bytes_left,
        "bytes_per_s": round(bytes_per_s),
        "ledgers_per_s": round(ledgers_per_s, 1),
        "eta_s": eta,
    }


def daemon_documents(statuses: dict[str, bytes], problems: Problems) -> list[dict[str, Any]]:
    """The status each running daemon publishes (bkctl daemons only; Java's are not listed)."""
    documents = []
    for name, data in sorted(statuses.items()):
        try:
            documents.append(json.loads(data))
        except ValueError:
            problems(f"daemon {name}", "status is not JSON")
    return documents


@app.command("enable")
def enable(metadata: MetadataOption = None) -> None:
    """Enable autorecovery (delete the disable flag); replication workers resume."""
    with open_layout(metadata) as layout:
        changed = layout.set_autorecovery_enabled(True)
    message("autorecovery enabled" if changed else "autorecovery was already enabled: nothing to do")


@app.command("disable")
def disable(metadata: MetadataOption = None) -> None:
    """Disable autorecovery (create the disable flag); workers and audits pause."""
    with open_layout(metadata) as layout:
        changed = layout.set_autorecovery_enabled(False)
    message("autorecovery disabled" if changed else "autorecovery was already disabled: nothing to do")


@app.command("whoisauditor")
def whoisauditor(metadata: MetadataOption = None, output: OutputOption = None) -> None:
    """The auditor: the lowest live election vote. With none, the last elected one, flagged as not running.

    Exit 4 when no auditor was ever elected.
    """
    fmt = resolve(output)
    problems = Problems()
    with open_layout(metadata) as layout:
        document = auditor_fields(layout, problems)
    if document["auditor"] is None:
        raise NotFoundError("no auditor elected")
    if not document["auditor_running"]:
        message(f"bkctl: warning: auditor {document['auditor']} has no election vote: it is not running")
    write_mapping(document, fmt)
    problems.raise_if_any()


@app.command("lost-bookie-recovery-delay")
def lost_bookie_recovery_delay(
    set_s: Annotated[
        int | None,
        typer.Option("--set", min=0, help="Set it (seconds; 0 = audit a lost bookie at once)."),
    ] = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Show or set how long the auditor waits before auditing a lost bookie (null: never set)."""
    fmt = resolve(output)
    with open_layout(metadata) as layout:
        if set_s is not None:
            layout.set_lost_bookie_recovery_delay(set_s)
            message(f"lostBookieRecoveryDelay set to {set_s} s")
        value = layout.lost_bookie_recovery_delay()
    write_mapping({"lost_bookie_recovery_delay_s": value}, fmt)


@app.command("set-rate")
def set_rate(
    rate: Annotated[
        str,
        typer.Argument(
            help="Bytes/s for every daemon together: 5M, 500K, 1G, 2000000, or unlimited (K/M/G: 10^3/6/9)."
        ),
    ],
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Set the cluster's copy budget (replicationRateByBytes for all autorecovery daemons together):
    each running daemon copies at most its share (the rate over the daemons running), at once."""
    fmt = resolve(output)
    bytes_per_s = parse_rate(rate)
    with open_layout(metadata) as layout:
        layout.set_replication_rate(bytes_per_s)
        value = layout.replication_rate()
    message(f"replication rate set to {rate_text(value)}")
    write_mapping({"replication_rate_bytes_per_s": value}, fmt)


_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmg]?)(?:b(?:/s)?)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_rate(text: str) -> int:
    """`5M` -> 5,000,000 bytes/s; `unlimited` -> RATE_UNLIMITED; UsageError otherwise."""
    if text.strip().lower() in ("unlimited", "none", "off"):
        return RATE_UNLIMITED
    found = _RATE.fullmatch(text.strip())
    value = 0 if found is None else round(float(found.group(1)) * _UNITS[found.group(2).lower()])
    if found is None or value < 1:
        raise UsageError(f"rate {text!r}: give bytes/s as 5M, 500K, 1G, 2000000 or unlimited")
    return value


def rate_text(value: int | None) -> str:
    if value is None:
        return "not set (each daemon's replicationRateByBytes)"
    return "unlimited" if value == RATE_UNLIMITED else f"{value:,} B/s"


@app.command("trigger-audit")
def trigger_audit(metadata: MetadataOption = None) -> None:
    """Ask the auditor to audit now (Java's triggeraudit): rewrites lostBookieRecoveryDelay unchanged."""
    with open_layout(metadata) as layout:
        delay = layout.lost_bookie_recovery_delay()
        layout.set_lost_bookie_recovery_delay(0 if delay is None else delay)
        auditor = layout.current_auditor()
    if auditor is None:
        message("bkctl: warning: no auditor is running: the audit runs when one is elected")
    else:
        message(f"audit triggered (auditor {auditor})")


@app.command("start")
def start(
    metadata: MetadataOption = None,
    bookie_id: Annotated[
        str | None,
        typer.Option("--bookie-id", help="The bookie this daemon runs beside: copies go there (as Java's)."),
    ] = None,
    conf: Annotated[
        Path | None,
        typer.Option(
            "--conf",
            "-c",
            envvar="BKCTL_CONF",
            help="A bk_server.conf: the autorecovery, placement policy and security keys are read.",
        ),
    ] = None,
    parallel: Annotated[
        int, typer.Option("--parallel", min=1, max=64, help="Ledgers repaired at once.")
    ] = limits.REPLICATION_PARALLEL_DEFAULT,
    http_port: Annotated[
        int | None,
        typer.Option(
            "--http-port",
            min=0,
            max=65535,
            help="Serve /metrics and the admin HTTP API here, on the conf's httpServerHost (127.0.0.1).",
        ),
    ] = None,
) -> None:
    """Run an autorecovery daemon in the foreground (BookKeeper's AutoRecoveryMain) until SIGTERM/Ctrl-C:
    a vote for auditor, the auditor while elected, and a replication worker."""
    from bkctl.commands.options import conf_properties, metadata_choice

    properties = conf_properties(conf)
    uri = metadata_choice(metadata or properties.get("metadataServiceUri"))
    daemon_id = bookie_id or f"{socket.gethostname()}:{os.getpid()}"
    run_daemon(uri, daemon_id, bookie_id, properties, parallel, http_port)


def run_daemon(
    uri: str,
    daemon_id: str,
    local_bookie: str | None,
    properties: dict[str, str],
    parallel: int,
    http_port: int | None = None,
) -> None:
    """The reactor until SIGTERM / Ctrl-C; a daemon that cannot start exits with its error's code."""
    from twisted.internet import reactor as the_reactor
    from twisted.internet import threads

    from bkctl.commands.options import open_layout
    from bkctl.recovery.config import daemon_config
    from bkctl.recovery.daemon import autorecovery_daemon
    from bkctl.recovery.policy import placement_from_properties
    from bkctl.tls import client_settings

    reactor: Any = the_reactor
    auditor_config, worker_config = daemon_config(properties, parallel=parallel)
    tls = client_settings(properties)  # the conf's TLS keys, as Java's AutoRecoveryMain; else --tls
    for name in ("bkctl.recovery", "bkctl.http"):
        logging.getLogger(name).setLevel(logging.INFO)  # a daemon says what it does, and who asked
    outcome = StartOutcome(reactor)
    with open_layout(uri, daemon=True) as layout:
        policy = placement_from_properties(properties, layout.store)
        daemon = autorecovery_daemon(
            layout, reactor, daemon_id, local_bookie=local_bookie,
            auditor_config=auditor_config, worker_config=worker_config, tls=tls,
            placement_policy=policy,
        )  # fmt: skip

        recoveries: list[Any] = []  # the admin endpoints' ledger client, with --http-port

        def started(_: object) -> None:
            where = ""
            if http_port is not None:
                from bkctl.commands.bookie_server import AdminClient
                from bkctl.recovery.metrics import metrics_site

                admin = properties.get("httpServerAdminEnabled", "").strip().lower() == "true"
                recoveries.append(
                    AdminClient(layout, daemon_id, reactor, properties)
                )  # recover, decommission
                site = metrics_site(daemon, layout, admin, recoveries[0])
                # Loopback unless the conf names an address: the port serves admin endpoints too.
                host = properties.get("httpServerHost", "").strip() or "127.0.0.1"
                listener = reactor.listenTCP(http_port, site, interface=host)
                port = listener.getHost().port
                where = f" (metrics on {host}:{port}/metrics, and /api/v1/autorecovery/*)"
            message(f"autorecovery daemon {daemon_id} running on {uri}{where}")

        def stop() -> Any:
            # The store closes before the reactor joins its threads: a metadata call still retrying
            # through an outage then gives up, instead of holding the exit for the metadata deadline.
            stopped = daemon.stop()
            stopped.addBoth(lambda _: recoveries[0].close() if recoveries else None)
            return stopped.addBoth(lambda _: threads.deferToThread(layout.store.close))

        reactor.callWhenRunning(lambda: daemon.start().addCallbacks(started, outcome.failed))
        reactor.addSystemEventTrigger("before", "shutdown", stop)
        run_until_stopped(reactor)
    outcome.raise_failure("autorecovery daemon failed")
    message(f"autorecovery daemon {daemon_id} stopped")
