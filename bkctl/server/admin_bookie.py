"""Java's bookie admin endpoints (BookKeeper 4.14-4.17 `server/http/service/*`): the bookie's state, the
read-only switch, readiness, GC compaction suspension, last log mark, config, and the cluster views a
bookie answers from the metadata store (bookies, ledgers, cluster_info).

Paths, methods, parameters, JSON shapes and status codes are Java's; bkctl adds fields, never changes
them. What reads the metadata store runs in a pool thread. See docs/bookie.md, "Admin HTTP".
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
from collections.abc import Callable
from decimal import ROUND_DOWN, Decimal
from typing import Any, Protocol

from twisted.internet import threads
from twisted.internet.defer import Deferred

from bkctl.admin.http_endpoint import (
    Endpoint,
    Reply,
    answer_when_done,
    json_answer,
    json_body,
    json_object,
    param,
    text,
)
from bkctl.errors import BkctlError, ConflictError, NotFoundError, UsageError
from bkctl.metadata.layout import Layout
from bkctl.model import LedgerMetadata, LedgerState
from bkctl.protocol.metadata_format import encode_ledger_metadata
from bkctl.server import cookies
from bkctl.server.config import KEYS, BookieConfig
from bkctl.server.gc_dirs import Collector
from bkctl.server.storage import Storage

log = logging.getLogger("bkctl.http")

NOT_SERVING = "the bookie is not serving yet"
EntryReader = Callable[[int, int, int], Deferred[list[tuple[int, bytes]]]]
BookieInfos = Callable[[], Deferred[dict[str, tuple[int, int]]]]  # {bookie: (free, total disk bytes)}


class AdminView(Protocol):
    """What these endpoints read and change of a BookieService."""

    bookie_id: str
    state: str
    config: BookieConfig
    storage: Storage | None
    gc: Collector | None
    layout: Layout | None

    @property
    def ready(self) -> bool: ...

    def read_only_forced_by(self) -> str | None: ...

    def switch_read_only(self, read_only: bool, persist: bool = False) -> Deferred[Any]: ...

    # Reads entries first..last (-1: to the last confirmed) of any ledger through a ledger client,
    # set by whoever runs the bookie (commands/bookie_server.py): server/ never imports client/.
    entry_reader: EntryReader | None
    sanity_check: Callable[[], Deferred[bool]] | None
    bookie_infos: BookieInfos | None  # GET_BOOKIE_INFO of every read-write bookie, through the same client


class BookieEndpoint(Endpoint):
    def __init__(self, bookie: AdminView) -> None:
        Endpoint.__init__(self)
        self.bookie = bookie
        self.admin_enabled = lambda: bookie.config.http_admin_enabled

    def in_thread(self, request: Any, function: Callable[[Layout], object]) -> Any:
        """Answer with what `function(layout)` returns, run in a pool thread."""
        layout = self.bookie.layout
        if layout is None:
            return text(request, NOT_SERVING, 503)
        return answer_when_done(request, threads.deferToThread(_guarded, function, layout))


def _guarded(function: Callable[[Layout], object], layout: Layout) -> object:
    """Java answers a failed metadata read 500 (its ErrorHttpService); bkctl says why."""
    try:
        return function(layout)
    except NotFoundError as exc:
        return Reply(str(exc), 404, is_json=False)
    except BkctlError as exc:
        return Reply(f"ERROR handling request: {exc}", 500, is_json=False)


# --- state ----------------------------------------------------------------------------------------


class State(BookieEndpoint):
    wrong_method = "Only support GET method to retrieve bookie state."

    def on_GET(self, request: Any) -> bytes:
        bookie = self.bookie
        return json_answer(
            request,
            {
                "running": bookie.ready,
                "readOnly": bookie.state == "read-only",
                "shuttingDown": bookie.state in ("stopping", "stopped"),
                "availableForHighPriorityWrites": bookie.state == "read-write",
                "state": bookie.state,  # bkctl
                "readOnlyForcedBy": bookie.read_only_forced_by(),  # bkctl: None, or why it cannot be lifted
            },
        )


class ReadOnly(BookieEndpoint):
    """GET `{"readOnly": bool}`; PUT the same to switch (Java's BookieStateReadOnlyService), with
    `"persist": true` (bkctl) to keep it across restarts. Answers once the registration has moved."""

    wrong_method = "Unsupported method. Should be GET or PUT method"
    admin_methods = frozenset({"PUT"})

    def on_GET(self, request: Any) -> bytes:
        return json_answer(request, {"readOnly": self.bookie.state == "read-only"})

    def on_PUT(self, request: Any) -> Any:
        if self.bookie.storage is None:
            return text(request, NOT_SERVING, 503)
        try:
            body = json_body(request)
        except ValueError as exc:
            return text(request, f"bad request body: {exc}", 500)  # Java: its JSON parse error, a 500
        if body is None:
            return text(request, "bad request body: none", 500)  # Java parses "" and fails: 500
        if not isinstance(body, dict) or not isinstance(body.get("readOnly"), bool):
            return text(request, 'the body must be {"readOnly": true} or {"readOnly": false}', 400)
        wanted = body["readOnly"]
        is_read_only = self.bookie.state == "read-only"
        forced = self.bookie.read_only_forced_by()
        if is_read_only and not wanted and forced is not None:
            refused = f"Bookie is in forceReadOnly mode, cannot transit to writable mode ({forced})"
            return text(request, refused, 400)
        if wanted and not is_read_only and not self.bookie.config.read_only_mode_enabled:
            return text(request, "Bookie is disabled ReadOnly mode, cannot transit to readOnly mode", 400)
        moved = self.bookie.switch_read_only(wanted, persist=body.get("persist") is True)  # bkctl's key
        now = moved.addCallback(lambda _: {"readOnly": self.bookie.state == "read-only"})
        return answer_when_done(request, now)


class IsReady(BookieEndpoint):
    """200 once the journal is replayed and the bookie registered, 503 before (and while stopping)."""

    wrong_method = "Only support GET method check if bookie is ready."

    def on_GET(self, request: Any) -> bytes:
        if self.bookie.ready:
            return text(request, "", 200)
        return text(request, "Bookie is not fully started yet", 503)


class Sanity(BookieEndpoint):
    """Java 4.16's `{"passed": bool, "readOnly": bool}`: a ledger written to this bookie alone, read
    back and deleted (`bkctl bookie sanity`); a forced read-only bookie is not tested. One at a time."""

    wrong_method = "Only support GET method to retrieve bookie sanity state."

    def __init__(self, bookie: AdminView) -> None:
        BookieEndpoint.__init__(self, bookie)
        self.running = False

    def on_GET(self, request: Any) -> Any:
        if self.bookie.config.read_only:
            return json_answer(request, {"passed": False, "readOnly": True})
        check = self.bookie.sanity_check
        if check is None:
            return text(request, NOT_SERVING, 503)
        if self.running:
            return text(
                request, "Timing out due to max number of sanity request are running concurrently", 500
            )
        self.running = True

        def done(passed: object) -> object:
            self.running = False
            return passed

        tested = check().addBoth(done).addCallback(lambda passed: {"passed": passed, "readOnly": False})
        return answer_when_done(request, tested)


# --- GC compaction suspension ------------------------------------------------------------------------


class SuspendCompaction(BookieEndpoint):
    """PUT `{"suspendMajor": true, "suspendMinor": true}`; GET the state (Java 4.16's endpoint)."""

    wrong_method = (
        "Not found method. Should be PUT to suspend major or minor compaction, "
        "Or GET to get compaction state."
    )
    verb, keys = "Suspend", ("suspendMajor", "suspendMinor")

    def on_GET(self, request: Any) -> bytes:
        gc = self.bookie.gc
        if gc is None:
            return text(request, NOT_SERVING, 503)
        state = {"isMajorGcSuspended": gc.major_suspended, "isMinorGcSuspended": gc.minor_suspended}
        return json_answer(request, {key: str(value).lower() for key, value in state.items()})

    def on_PUT(self, request: Any) -> bytes:
        gc = self.bookie.gc
        if gc is None:
            return text(request, NOT_SERVING, 503)
        body = json_object(request, "bad request body: ", "Empty request body", 400)
        if isinstance(body, bytes):
            return body
        major_key, minor_key = self.keys
        if body.get(major_key) is None and body.get(minor_key) is None:
            return text(request, f"No {major_key} or {minor_key} params found", 400)
        suspend = self.verb == "Suspend"
        done = []
        if body.get(major_key) is True:
            gc.major_suspended = suspend
            done.append(f"{self.verb} majorGC on BookieServer: {self.bookie.bookie_id}")
        if body.get(minor_key) is True:
            gc.minor_suspended = suspend
            done.append(f"{self.verb} minorGC on BookieServer: {self.bookie.bookie_id}")
        log.warning("compaction: major %s, minor %s", _word(gc.major_suspended), _word(gc.minor_suspended))
        return json_answer(request, ", ".join(done))


def _word(suspended: bool) -> str:
    return "suspended" if suspended else "allowed"


class ResumeCompaction(SuspendCompaction):
    wrong_method = (
        "Not found method. Should be PUT to resume major or minor compaction, Or GET to get compaction state."
    )
    verb, keys = "Resume", ("resumeMajor", "resumeMinor")
    on_GET = None  # type: ignore[assignment]  # Java's answers GET 404


# --- journal and config --------------------------------------------------------------------------------


class LastLogMark(BookieEndpoint):
    """Java's `{"LastLogMark: Journal Id - <id>(<hex>.txn)": "Pos - <offset>"}` per journal."""

    def on_GET(self, request: Any) -> bytes:
        storage = self.bookie.storage
        if storage is None:
            return text(request, NOT_SERVING, 503)
        marks = {}
        for journal_id, offset in storage.last_marks_written:
            marks[f"LastLogMark: Journal Id - {journal_id}({journal_id:x}.txn)"] = f"Pos - {offset}"
        return json_answer(request, marks)


# bk_server.conf keys that PUT server_config changes in the running bookie: the GC reads them at each
# run (server/gc.py `settings`) -> (BookieConfig field, GcSettings field). Every other key is read once,
# at start, by what it configures: changing it in the running conf would only pretend.
DYNAMIC_KEYS: dict[str, tuple[str, str]] = {
    "minorCompactionThreshold": ("minor_compaction_threshold", "minor_threshold"),
    "minorCompactionInterval": ("minor_compaction_interval_s", "minor_interval_s"),
    "majorCompactionThreshold": ("major_compaction_threshold", "major_threshold"),
    "majorCompactionInterval": ("major_compaction_interval_s", "major_interval_s"),
    "compactionRateByEntries": ("compaction_rate_by_entries", "rate_entries"),
    "compactionRateByBytes": ("compaction_rate_by_bytes", "rate_bytes"),
}


class ServerConfig(BookieEndpoint):
    """GET: the configuration as Java's `conf.asJson()` (key -> value as text). PUT `{"key": value}`:
    Java sets any key; bkctl sets the keys of DYNAMIC_KEYS (the GC's next run uses them) and refuses
    any other with 400 naming it, changing nothing of a body that names one."""

    wrong_method = "Request body not found. should contains k-v pairs"
    admin_methods = frozenset({"PUT"})

    def on_GET(self, request: Any) -> bytes:
        return json_answer(request, self.bookie.config.as_properties())

    def on_PUT(self, request: Any) -> bytes:
        try:
            body = json_body(request)
        except ValueError as exc:
            return text(request, f"bad request body: {exc}", 500)  # Java: its JSON parse error, a 500
        if body is None:
            return text(request, "Request body not found. should contains k-v pairs", 500)  # as Java
        if not isinstance(body, dict):
            return text(request, "Request body not found. should contains k-v pairs", 404)
        fixed = sorted(str(key) for key in body if key not in DYNAMIC_KEYS)
        if fixed:
            changeable = ", ".join(DYNAMIC_KEYS)
            refused = f"keys not changeable while the bookie runs: {', '.join(fixed)}; set them and restart"
            return text(request, f"{refused} (changeable at run time: {changeable})", 400)
        try:
            given = {key: _conf_text(value) for key, value in body.items()}
            parsed = {field: value for key, v in given.items() for field, value in KEYS[key](key, v).items()}
        except UsageError as exc:
            return text(request, str(exc), 400)
        self._apply(given, parsed)
        return text(request, "Success set server config.", 200)

    def _apply(self, given: dict[str, str], parsed: dict[str, Any]) -> None:
        bookie = self.bookie
        properties = {**dict(bookie.config.properties), **given}
        bookie.config = dataclasses.replace(bookie.config, **parsed, properties=tuple(properties.items()))
        gc = bookie.gc
        if gc is not None:
            changes = {DYNAMIC_KEYS[key][1]: parsed[DYNAMIC_KEYS[key][0]] for key in given}
            gc.settings = dataclasses.replace(gc.settings, **changes)
        log.warning("admin http: server config set: %s", ", ".join(f"{k}={v}" for k, v in given.items()))


def _conf_text(value: object) -> str:
    """A JSON value as the conf file's text (Java's setProperty takes the object; its getters parse it)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise UsageError(f"config value {json.dumps(value)}: expected a number or a string")
    return str(value)


class ExpandStorage(BookieEndpoint):
    """PUT (Java's ExpandStorageService): Java adds the conf's new ledger/index directories to the cookies
    at run time. bkctl's bookie uses the directories it started with: it checks them against the cookies
    (local and in the metadata store) and answers Java's "Success expand storage" when they agree (nothing
    new to add); new directories are added at start (edit the conf, `bkctl bookie cookie update`, restart).
    A body naming directory keys (bkctl) that differ from the running ones is refused with Java's 500."""

    wrong_method = "Not found method. Should be PUT method"
    admin_methods = frozenset({"PUT"})
    DIR_KEYS = {
        "journalDirectories": "journal_dirs",
        "ledgerDirectories": "ledger_dirs",
        "indexDirectories": "index_dirs",
    }

    def on_PUT(self, request: Any) -> Any:
        try:
            body = json_body(request)
        except ValueError as exc:
            return text(request, f"bad request body: {exc}", 400)
        config, bookie_id = self.bookie.config, self.bookie.bookie_id
        wanted = body if isinstance(body, dict) else {}
        new = []
        for key, field in self.DIR_KEYS.items():
            if key in wanted:
                running = getattr(config, field) or config.effective_index_dirs
                listed = [p.strip() for p in str(wanted[key]).split(",") if p.strip()]
                new += [p for p in listed if p not in {str(d) for d in running}]
        if new:
            refused = (
                f"Exception while updating cookie for storage expansion: bkctl adds directories only at "
                f"start, not while the bookie runs: {', '.join(new)}; add them to the conf, run `bkctl "
                "bookie cookie update` and restart the bookie"
            )
            return text(request, refused, 500)

        def checked(layout: Layout) -> Reply:
            try:
                cookies.check_cookies(config, layout, bookie_id)
            except (ConflictError, NotFoundError) as exc:
                log.error("expand_storage: %s", exc)
                return Reply(f"Exception while updating cookie for storage expansion: {exc}", 500, False)
            return Reply("Success expand storage", 200, is_json=False)

        return self.in_thread(request, checked)


class ListBookieInfo(BookieEndpoint):
    """Java's `{"<bookie>": ": {Free: N(h), Total: N(h)},", ..., "ClusterInfo: ": "{Free: N(h), Total:
    N(h)}"}` (h: Java's readable size, e.g. `(1.5GB)`) of each registered read-write bookie answering
    GET_BOOKIE_INFO; 404 "Not found any Bookie info." when none answers."""

    wrong_method = "Not found method. Should be GET method"

    def on_GET(self, request: Any) -> Any:
        ask = self.bookie.bookie_infos
        if ask is None:
            return text(request, NOT_SERVING, 503)
        return answer_when_done(request, ask().addCallback(bookie_info_answer))


def bookie_info_answer(infos: dict[str, tuple[int, int]]) -> object:
    if not infos:
        return Reply("Not found any Bookie info.", 404, is_json=False)
    output = {
        bookie: f": {{Free: {free}{readable(free)}, Total: {total}{readable(total)}}},"
        for bookie, (free, total) in infos.items()
    }
    free, total = sum(f for f, _ in infos.values()), sum(t for _, t in infos.values())
    output["ClusterInfo: "] = f"{{Free: {free}{readable(free)}, Total: {total}{readable(total)}}}"
    return output


def readable(value: int) -> str:
    """Java's ListBookieInfoService.getReadable: `(1.234GB)` in powers of 1000, 3 decimals rounded
    down, trailing zeros dropped; "" below 1000."""
    units = ("", "KB", "MB", "GB", "TB")
    count, scaled = 0, Decimal(value)
    while scaled >= 1000 and count < len(units) - 1:
        scaled, count = scaled / 1000, count + 1
    if count == 0:
        return ""
    shown = format(scaled.quantize(Decimal("0.001"), rounding=ROUND_DOWN), "f").rstrip("0").rstrip(".")
    return f"({shown}{units[count]})"


# --- cluster views from the metadata store ---------------------------------------------------------------


class ListBookies(BookieEndpoint):
    """`?type=rw|ro`, `?print_hostnames=true`: `{"<bookie id>": "<host>" | null}`."""

    def on_GET(self, request: Any) -> Any:
        read_only = param(request, "type") == "ro"
        hostnames = param(request, "print_hostnames") == "true"

        def listed(layout: Layout) -> dict[str, str | None]:
            bookies = layout.bookies(readonly=read_only)
            return {b: (b.rpartition(":")[0] or b) if hostnames else None for b in bookies}

        return self.in_thread(request, listed)


class ClusterInfo(BookieEndpoint):
    wrong_method = "Only GET is supported."

    def on_GET(self, request: Any) -> Any:
        return self.in_thread(request, cluster_info)


def cluster_info(layout: Layout) -> dict[str, Any]:
    writable, read_only = layout.bookies(), layout.bookies(readonly=True)
    total = len(set(layout.cookie_bookies()) | set(writable) | set(read_only))
    auditor = layout.current_auditor()
    return {
        "auditorElected": auditor is not None,
        "auditorId": auditor or "",
        "clusterUnderReplicated": next(iter(layout.underreplicated_ids()), None) is not None,
        "ledgerReplicationEnabled": layout.autorecovery_enabled(),
        "totalBookiesCount": total,
        "writableBookiesCount": len(writable),
        "readonlyBookiesCount": len(read_only),
        "unavailableBookiesCount": total - len(writable) - len(read_only),
    }


class ListLedgers(BookieEndpoint):
    """`{"<id>": null}`, or with `?print_metadata=true` (`&page=N`, 100 a page) each ledger's metadata:
    Java's serialized form as a string (its LedgerMetadataSerDe bytes read as UTF-8), or with
    `&decode_meta=true` as JSON fields. The password is left out of both."""

    PAGE = 100

    def on_GET(self, request: Any) -> Any:
        with_metadata = param(request, "print_metadata") == "true"
        decode = param(request, "decode_meta") == "true"
        page_text = param(request, "page")
        try:
            page = int(page_text) if with_metadata and page_text is not None else -1
        except ValueError:
            return text(request, f"page: not a number: {page_text}", 500)

        def listed(layout: Layout) -> dict[str, Any]:
            ids = sorted(layout.ledger_ids())
            if not with_metadata:
                return {str(i): None for i in ids}
            if page > 0:
                ids = ids[(page - 1) * self.PAGE : page * self.PAGE]
            return {str(i): shown(i, layout.read_ledger(i).value, decode) for i in ids}

        return self.in_thread(request, listed)


class LedgerMetadataEndpoint(BookieEndpoint):
    """`?ledger_id=N`: `{"N": <metadata>}`; an unknown ledger 500 (Java's), saying so."""

    def on_GET(self, request: Any) -> Any:
        ledger_id = _ledger_id(param(request, "ledger_id"))
        if ledger_id is None:
            return text(request, "Not found method. Should be GET method", 404)

        def read(layout: Layout) -> object:
            try:
                return {str(ledger_id): java_metadata(ledger_id, layout.read_ledger(ledger_id).value)}
            except NotFoundError as exc:
                return Reply(f"ERROR handling request: {exc}", 500, is_json=False)

        return self.in_thread(request, read)


class DeleteLedger(BookieEndpoint):
    """DELETE `?ledger_id=N` (needs httpServerAdminEnabled): removes its metadata; the bookies' GC
    removes its entries."""

    wrong_method = "Not found method. Should be DELETE method"
    admin_methods = frozenset({"DELETE"})

    def on_DELETE(self, request: Any) -> Any:
        ledger_id = _ledger_id(param(request, "ledger_id"))
        if ledger_id is None:
            return text(request, "Not ledger found. Should provide ledger_id=<id>", 404)

        def delete(layout: Layout) -> str:
            try:
                layout.read_ledger(ledger_id)
            except NotFoundError:  # Java answers 200: deleting a ledger that is not there succeeds
                log.warning("admin http: ledger %d not deleted: no such ledger", ledger_id)
                return f"Deleted ledger: {ledger_id}"
            layout.delete_ledger(ledger_id)
            log.warning("admin http: ledger %d deleted", ledger_id)
            return f"Deleted ledger: {ledger_id}"

        return self.in_thread(request, delete)


class ReadLedgerEntries(BookieEndpoint):
    """`?ledger_id=N[&start_entry_id=S][&end_entry_id=E][&page=P]`: Java's `{"<entry id>": "<payload as
    ASCII>"}` (with `"Entries for page: ": "P"`), read through a ledger client as an administrator.
    At most PAGE entries an answer (Java reads the whole range: a big ledger would fill the bookie's
    memory); an unknown ledger 500 (Java's), saying so."""

    wrong_method = "Not found method. Should be GET method, with ledger_id provided"
    PAGE = 1000

    def on_GET(self, request: Any) -> Any:
        ledger_id = _ledger_id(param(request, "ledger_id"))
        reader = self.bookie.entry_reader
        if ledger_id is None:
            return text(request, self.wrong_method, 404)
        if reader is None:
            return text(request, NOT_SERVING, 503)
        try:
            first = int(param(request, "start_entry_id") or 0)
            last = int(param(request, "end_entry_id") or -1)
            page = int(param(request, "page") or -1)
        except ValueError as exc:
            return text(request, f"bad parameter: {exc}", 500)  # Java: its NumberFormatException, a 500
        output: dict[str, str] = {}
        if page > 0:
            page_first, page_last = (page - 1) * self.PAGE, page * self.PAGE - 1
            first = page_first if first == 0 or first < page_first else first
            last = page_last if last == -1 or last > page_last else last
            output["Entries for page: "] = str(page)
        if last != -1 and first > last:
            conflict = (
                f"parameter for start_entry_id: {first} and end_entry_id: {last} conflict with page={page}"
            )
            return text(request, conflict, 500)
        last = first + self.PAGE - 1 if last == -1 or last - first >= self.PAGE else last
        read = reader(ledger_id, first, last)

        def answer(entries: list[tuple[int, bytes]]) -> object:
            for entry_id, payload in entries:
                output[str(entry_id)] = payload.decode("ascii", "replace")
            return output

        def failed(failure: Any) -> object:
            error = failure.value
            if isinstance(error, BkctlError):  # an unknown ledger included: Java's 500
                return Reply(f"ERROR handling request: {error}", 500, is_json=False)
            return failure

        return answer_when_done(request, read.addCallbacks(answer, failed))


def _ledger_id(value: str | None) -> int | None:
    try:
        return int(value) if value is not None and int(value) >= 0 else None
    except ValueError:
        return None


def shown(ledger_id: int, md: LedgerMetadata, decode: bool) -> object:
    """list's metadata: Java's JSON fields, or (its default) `new String(serDe.serialize(md), UTF_8)`,
    without the password."""
    if decode:
        return java_metadata(ledger_id, md)
    return encode_ledger_metadata(dataclasses.replace(md, password=None)).decode("utf-8", "replace")


def java_metadata(ledger_id: int, md: LedgerMetadata) -> dict[str, Any]:
    """What Jackson writes of Java's LedgerMetadataImpl, in its order; the password is null (Java writes
    it, base64: an HTTP answer is no place for it)."""
    return {
        "ledgerId": ledger_id,
        "metadataFormatVersion": 3,
        "ensembleSize": md.ensemble_size,
        "writeQuorumSize": md.write_quorum,
        "ackQuorumSize": md.ack_quorum,
        "state": md.state.name,
        "length": md.length,
        "lastEntryId": md.last_entry_id,
        "ctime": md.ctime if md.ctime is not None else -1,
        "digestType": md.digest.name if md.digest is not None else None,
        "password": None,
        "customMetadata": {key: base64.b64encode(value).decode() for key, value in md.custom_metadata},
        "closed": md.state is LedgerState.CLOSED,
        # A BookieId is an object to Jackson: {"id": "host:port"}.
        "allEnsembles": {str(s.first_entry_id): [{"id": b} for b in s.ensemble] for s in md.segments},
        "ctoken": md.c_token if md.c_token is not None else -1,
    }
