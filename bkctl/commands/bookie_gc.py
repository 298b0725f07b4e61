"""`bkctl bookie gc`: trigger a bookie's garbage collection over its admin HTTP endpoint (Java's
`PUT /api/v1/bookie/gc`) and, with --wait, show what the run did."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Annotated, Any

import typer

from bkctl.commands.bookie import app
from bkctl.commands.options import MetadataOption, open_layout
from bkctl.commands.output import OutputFormat, OutputOption, message, resolve, write_json, write_mapping
from bkctl.errors import (
    BkctlError,
    ConflictError,
    NotFoundError,
    UnauthorizedError,
    UnavailableError,
    UsageError,
)

# A run with --wait may compact gigabytes; the HTTP answer comes once it is done.
WAIT_TIMEOUT_S = 24 * 3600.0  # local bound
TRIGGER_TIMEOUT_S = 30.0  # local bound
# The report's fields shown by -o table/plain, in this order.
SUMMARY = (
    "ledgers_deleted",
    "overreplicated_deleted",
    "unindexed_kept",
    "entry_logs_removed",
    "entry_logs_compacted",
    "compaction",
    "entries_moved",
    "bytes_moved",
    "bytes_reclaimed",
    "seconds",
    "errors",
)


def register(root: typer.Typer) -> None:
    """The command is added to the `bookie` group at import."""


@app.command("gc")
def bookie_gc(
    bookie: Annotated[
        str | None, typer.Argument(help="Bookie id; its admin endpoint is read from its registration.")
    ] = None,
    http: Annotated[
        str | None, typer.Option("--http", help="The bookie's admin HTTP endpoint, HOST:PORT.")
    ] = None,
    major: Annotated[bool, typer.Option("--major", help="Force a major compaction.")] = False,
    minor: Annotated[bool, typer.Option("--minor", help="Force a minor compaction.")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the run and show its report.")] = False,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Trigger garbage collection (deleted ledgers, empty entry logs, compaction when due or forced)."""
    if major and minor:
        raise UsageError("give at most one of --major and --minor")
    endpoint = admin_endpoint(bookie, http, metadata)
    body = {"forceMajor": major, "forceMinor": minor}
    answer = put_json(f"http://{endpoint}/api/v1/bookie/gc{'?wait=true' if wait else ''}", body, wait)
    if not wait:
        message(str(answer))
        return
    fmt = resolve(output)
    if fmt is OutputFormat.json:
        write_json(answer)
    else:
        write_mapping({key: _shown(answer.get(key)) for key in SUMMARY}, fmt)


def _shown(value: Any) -> Any:
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return "-" if value is None else value


def admin_endpoint(bookie: str | None, http: str | None, metadata: str | None) -> str:
    """HOST:PORT of a bookie's admin HTTP endpoint: `--http`, else the one the bookie registered."""
    if (bookie is None) == (http is None):
        raise UsageError("give a bookie id or --http HOST:PORT (one of them)")
    if http is not None and not is_host_port(http):
        raise UsageError(f"--http {http!r}: give HOST:PORT, e.g. 127.0.0.1:8000")
    return http if http is not None else registered_http(bookie or "", metadata)


def is_host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def registered_http(bookie_id: str, metadata: str | None) -> str:
    with open_layout(metadata) as layout:
        address = layout.bookie_endpoint(bookie_id, "http")
        registered = bookie_id in (*layout.bookies(), *layout.bookies(readonly=True))
    if address is not None:
        return f"{address[0]}:{address[1]}"
    if registered:
        raise NotFoundError(f"bookie {bookie_id} registers no admin HTTP endpoint (give --http)")
    raise NotFoundError(f"bookie {bookie_id} is not registered (give --http HOST:PORT)")


# An admin endpoint's refusal -> the error (and exit code) it means; others are BkctlError.
HTTP_ERRORS: dict[int, type[BkctlError]] = {
    400: ConflictError,  # e.g. a forced read-only state the switch cannot lift
    403: UnauthorizedError,  # httpServerAdminEnabled is not set
    404: NotFoundError,
    503: UnavailableError,  # the bookie is starting
}


def put_json(url: str, body: dict[str, bool], wait: bool) -> Any:
    """PUT `body` to a bookie's admin endpoint; its JSON answer. Refusals raise HTTP_ERRORS."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT")
    try:
        with urllib.request.urlopen(request, timeout=WAIT_TIMEOUT_S if wait else TRIGGER_TIMEOUT_S) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        error = HTTP_ERRORS.get(exc.code, BkctlError)
        raise error(f"{url}: HTTP {exc.code}: {exc.read().decode(errors='replace').strip()}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UnavailableError(f"{url}: cannot reach the bookie's admin endpoint: {reason}") from None
    except ValueError as exc:
        raise BkctlError(f"{url}: the answer is not JSON: {exc}") from None
