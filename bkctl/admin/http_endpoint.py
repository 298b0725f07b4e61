"""What every admin HTTP endpoint shares, as Java's HttpRouter and HttpEndpointService behave.

- Exact paths: an endpoint has no sub-paths unless it names them (`gc/suspend_compaction`); anything
  else under it answers 404, never the endpoint's own action.
- A method an endpoint does not serve answers 404 with Java's sentence (Java's services do so, not 405);
  `/metrics` answers 403, as Java's MetricsService.
- Destructive endpoints (`ADMIN`) answer 403 unless `httpServerAdminEnabled=true`: an open port must
  not delete ledgers or drain a bookie.
- Every request is logged with its caller: changes at INFO, reads at DEBUG (a scrape every 15 s
  would otherwise fill the log).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

log = logging.getLogger("bkctl.http")

JSON = b"application/json"
TEXT = b"text/plain; charset=utf-8"
ADMIN_KEY = "httpServerAdminEnabled"


class Endpoint(Resource):
    """One of Java's endpoints: `on_GET`, `on_PUT`, ... methods answer; others get `wrong_method`."""

    isLeaf = False
    wrong_method = "Not found method. Should be GET method"
    wrong_method_code = 404
    admin_methods: ClassVar[frozenset[str]] = frozenset()  # need httpServerAdminEnabled
    admin_enabled: Callable[[], bool] = staticmethod(lambda: False)

    def __init__(self) -> None:
        Resource.__init__(self)  # type: ignore[no-untyped-call]

    def getChild(self, path: bytes, request: Any) -> Any:
        return NOT_FOUND

    def render(self, request: Any) -> Any:
        method = request.method.decode("ascii", "replace")
        caller = request.getClientAddress()
        who = getattr(caller, "host", str(caller))
        level = logging.DEBUG if method in ("GET", "HEAD") else logging.INFO
        log.log(level, "admin http %s %s from %s", method, request.uri.decode("utf-8", "replace"), who)
        handler = getattr(self, f"on_{method}", None)
        if handler is None:
            return text(request, self.wrong_method, self.wrong_method_code)
        if method in self.admin_methods and not self.admin_enabled():
            path = request.path.decode("utf-8", "replace")
            log.warning("admin http %s %s from %s refused: %s is not set", method, path, who, ADMIN_KEY)
            return text(request, f"{method} {path} needs {ADMIN_KEY}=true in the config", 403)
        return handler(request)


class NotFound(Resource):
    """404 for a path no endpoint names (twisted's NoResource answers HTML)."""

    isLeaf = True

    def render(self, request: Any) -> bytes:
        return text(request, "Not found", 404)


class PathNode(Endpoint):
    """A path that is only a prefix of endpoints (`/api/v1`): 404 for itself, as any unknown path."""

    def render(self, request: Any) -> bytes:
        return text(request, "Not found", 404)


def path_node(parent: Any, *names: bytes) -> Any:
    """The PathNodes `names` under `parent` (made as needed); the last one."""
    node = parent
    for name in names:
        child = node.children.get(name)
        if child is None:
            child = PathNode()
            put(node, name, child)
        node = child
    return node


class Heartbeat(Endpoint):
    """`OK` to any method, as Java's HeartbeatService."""

    def on_GET(self, request: Any) -> bytes:
        return text(request, "OK\n")

    on_PUT = on_POST = on_DELETE = on_GET


NOT_FOUND: Any = NotFound()  # type: ignore[no-untyped-call]


def put(parent: Any, name: bytes, child: Any) -> None:
    """`parent.putChild` (typed Any: twisted.web's zope interfaces do not type-check)."""
    parent.putChild(name, child)


def text(request: Any, body: str, code: int = 200) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", TEXT)
    return body.encode()


def json_answer(request: Any, value: object, code: int = 200) -> bytes:
    """Java's JsonUtil output: JSON (a string answer is a JSON string, as Java's toJson of a String)."""
    request.setResponseCode(code)
    request.setHeader(b"content-type", JSON)
    return json.dumps(value, indent=2).encode() + b"\n"


def json_body(request: Any) -> Any:
    """The request's JSON body, or None when it has none; ValueError when it is not JSON."""
    raw = request.content.read() if request.content is not None else b""
    if not raw.strip():
        return None
    return json.loads(raw)


def json_object(request: Any, bad: str, empty: str, code: int) -> dict[str, Any] | bytes:
    """The body as a JSON object (a non-object is `{}`), or the answer refusing it: `empty` when there is
    none, `bad` followed by the parse error when it is not JSON, with `code` (Java's differ by endpoint)."""
    try:
        body = json_body(request)
    except ValueError as exc:
        return text(request, f"{bad}{exc}", code)
    if body is None:
        return text(request, empty, code)
    return body if isinstance(body, dict) else {}


def param(request: Any, name: str) -> str | None:
    values = request.args.get(name.encode())
    return values[0].decode("utf-8", "replace") if values else None


@dataclass(frozen=True)
class Reply:
    """An answer computed off the reactor: JSON, or Java's plain sentences (`is_json=False`)."""

    body: object
    code: int = 200
    is_json: bool = True


def send(request: Any, reply: Reply) -> bytes:
    if reply.is_json:
        return json_answer(request, reply.body, reply.code)
    return text(request, str(reply.body), reply.code)


def answer_when_done(request: Any, result: Deferred[Any]) -> Any:
    """Answer `result` when it fires (a Reply, or a value for a 200 JSON answer; 500 with the error if it
    fails). NOT_DONE_YET now."""
    gone: list[object] = []  # the client went away: nothing to answer
    request.notifyFinish().addErrback(gone.append)

    def answer(value: object) -> None:
        if gone:
            return
        if isinstance(value, Failure):
            log.error("admin http %s failed: %s", request.path.decode(), value.getErrorMessage())
            value = Reply(f"ERROR handling request: {value.getErrorMessage()}", 500, is_json=False)
        request.write(send(request, value if isinstance(value, Reply) else Reply(value)))
        request.finish()

    result.addBoth(answer)
    return NOT_DONE_YET
