#!/usr/bin/env python3
"""Compare the admin HTTP answers of a Java BookKeeper bookie and a bkctl bookie of one cluster, request
by request: the status code, whether the answer is JSON and of which kind (object, string, ...), and for
objects the keys and their values' kinds (bkctl may add keys; another status or kind, or a key Java has and
bkctl lacks, is a difference). scripts/java-interop-admin starts both and runs this; by
hand: two running bookies with `httpServerEnabled=true` (bkctl's also `httpServerAdminEnabled=true`).

Usage: compare.py JAVA_HOST:PORT BKCTL_HOST:PORT LEDGER JAVA_VICTIM BKCTL_VICTIM
       compare.py --daemon JAVA_HOST:PORT BKCTL_HOST:PORT
LEDGER is read by both; each VICTIM is a ledger that side deletes. With --daemon, two autorecovery
daemons (Java's AutoRecoveryMain, `bkctl autorecovery start`) are asked what a daemon serves: /heartbeat,
/metrics and /api/v1/autorecovery/*. Exit 0 when every answer matches, 3
when some differ (listed), 2 for bad arguments. Listed but not counted: endpoints Java added after 4.14.8
(sanity, compaction suspension, entry location compaction; 404 on a 4.14.8 bookie), GET /metrics when the
Java bookie has no Prometheus stats provider (500 there), and answers Java changed later, where bkctl
answers as the later Java (a PUT to gc reads its body from 4.16 on: bad JSON is 400 there, 4.14.8
ignores the body), and a config PUT of a key bkctl reads only at start (Java sets it, without effect;
bkctl refuses it with 400). Keys that are data (a journal id in last_log_mark's, ledger and entry ids)
are compared with their hex and decimal numbers as N; server_config's keys are each bookie's
configuration, so only its status is compared.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.error
import urllib.request

BAD_JSON = b"{not json"
LATER = "later"  # added to Java after 4.14.8: a 4.14.8 bookie answers 404
NO_STATS = "no-stats"  # Java answers 500 without a stats provider that exports metrics
NEWER = "as 4.16+"  # Java changed this answer after 4.14.8; bkctl answers as the later one
OWN_KEYS = "own keys"  # the keys are the bookie's own configuration: the status only
REFUSED = "bkctl refuses"  # Java sets any config key (most without effect); bkctl only those it applies

B = "/api/v1/bookie"
AR = "/api/v1/autorecovery"
L = "/api/v1/ledger"
CONFIG = "/api/v1/config/server_config"

# (method, path, body, note): what both bookies are asked, in this order. A body of bytes is sent as is;
# anything else as JSON. {ledger}, {victim}: see the usage.
REQUESTS: list[tuple[str, str, object, str | None]] = [
    ("GET", "/heartbeat", None, None),
    ("PUT", "/heartbeat", None, None),
    ("GET", CONFIG, None, OWN_KEYS),
    ("PUT", CONFIG, {"minorCompactionThreshold": "0.2"}, None),
    ("PUT", CONFIG, {"journalMaxGroupWaitMSec": "2"}, REFUSED),
    ("PUT", CONFIG, BAD_JSON, None),
    ("PUT", CONFIG, None, None),
    ("DELETE", CONFIG, None, None),
    ("GET", "/metrics", None, NO_STATS),
    ("POST", "/metrics", None, None),
    ("GET", f"{L}/list", None, None),
    ("GET", f"{L}/list?print_metadata=true", None, None),
    ("GET", f"{L}/list?print_metadata=true&decode_meta=true", None, None),
    ("PUT", f"{L}/list", None, None),
    ("GET", f"{L}/metadata?ledger_id={{ledger}}", None, None),
    ("GET", f"{L}/metadata", None, None),
    ("GET", f"{L}/metadata?ledger_id=987654321", None, None),
    ("PUT", f"{L}/metadata?ledger_id={{ledger}}", None, None),
    ("GET", f"{L}/read?ledger_id={{ledger}}&end_entry_id=9", None, None),
    ("GET", f"{L}/read?ledger_id={{ledger}}&start_entry_id=5&end_entry_id=2", None, None),
    ("GET", f"{L}/read?ledger_id=987654321", None, None),
    ("GET", f"{L}/read", None, None),
    ("PUT", f"{L}/read?ledger_id={{ledger}}", None, None),
    ("GET", f"{L}/delete?ledger_id={{victim}}", None, None),
    ("DELETE", f"{L}/delete", None, None),
    ("DELETE", f"{L}/delete?ledger_id=987654321", None, None),
    ("DELETE", f"{L}/delete?ledger_id={{victim}}", None, None),
    ("GET", f"{B}/list_bookies", None, None),
    ("GET", f"{B}/list_bookies?type=ro", None, None),
    ("GET", f"{B}/list_bookies?type=rw&print_hostnames=true", None, None),
    ("GET", f"{B}/list_bookies?type=nope", None, None),
    ("PUT", f"{B}/list_bookies", None, None),
    ("GET", f"{B}/list_bookie_info", None, None),
    ("PUT", f"{B}/list_bookie_info", None, None),
    ("GET", f"{B}/last_log_mark", None, None),
    ("PUT", f"{B}/last_log_mark", None, None),
    ("GET", f"{B}/list_disk_file", None, None),
    ("GET", f"{B}/list_disk_file?file_type=journal", None, None),
    ("PUT", f"{B}/list_disk_file", None, None),
    ("PUT", f"{B}/expand_storage", None, None),
    ("GET", f"{B}/expand_storage", None, None),
    ("GET", f"{B}/gc", None, None),
    ("PUT", f"{B}/gc", {}, None),
    ("PUT", f"{B}/gc", BAD_JSON, NEWER),
    ("DELETE", f"{B}/gc", None, None),
    ("GET", f"{B}/gc_details", None, None),
    ("PUT", f"{B}/gc_details", None, None),
    ("GET", f"{B}/gc/suspend_compaction", None, LATER),
    ("PUT", f"{B}/gc/suspend_compaction", {"suspendMajor": True}, LATER),
    ("PUT", f"{B}/gc/resume_compaction", {"resumeMajor": True}, LATER),
    ("GET", f"{B}/entry_location_compact", None, LATER),
    ("GET", f"{B}/state", None, None),
    ("PUT", f"{B}/state", None, None),
    ("GET", f"{B}/state/readonly", None, None),
    ("PUT", f"{B}/state/readonly", {"readOnly": True}, None),
    ("GET", f"{B}/state", None, None),
    ("GET", f"{B}/list_bookies?type=ro", None, None),
    ("PUT", f"{B}/state/readonly", {"readOnly": False}, None),
    ("PUT", f"{B}/state/readonly", BAD_JSON, None),
    ("PUT", f"{B}/state/readonly", None, None),
    ("DELETE", f"{B}/state/readonly", None, None),
    ("GET", f"{B}/is_ready", None, None),
    ("PUT", f"{B}/is_ready", None, None),
    ("GET", f"{B}/sanity", None, LATER),
    ("GET", f"{B}/info", None, None),
    ("PUT", f"{B}/info", None, None),
    ("GET", f"{B}/cluster_info", None, None),
    ("PUT", f"{B}/cluster_info", None, None),
    ("GET", f"{AR}/status", None, None),
    ("PUT", f"{AR}/status", None, None),
    ("PUT", f"{AR}/status?enabled=true", None, None),
    ("DELETE", f"{AR}/status", None, None),
    ("GET", f"{AR}/list_under_replicated_ledger", None, None),
    ("GET", f"{AR}/list_under_replicated_ledger?printmissingreplica=true", None, None),
    ("PUT", f"{AR}/list_under_replicated_ledger", None, None),
    ("GET", f"{AR}/who_is_auditor", None, None),
    ("PUT", f"{AR}/who_is_auditor", None, None),
    ("GET", f"{AR}/lost_bookie_recovery_delay", None, None),
    ("PUT", f"{AR}/lost_bookie_recovery_delay", {"delay_seconds": 30}, None),
    ("GET", f"{AR}/lost_bookie_recovery_delay", None, None),
    ("PUT", f"{AR}/lost_bookie_recovery_delay", BAD_JSON, None),
    ("DELETE", f"{AR}/lost_bookie_recovery_delay", None, None),
    ("PUT", f"{AR}/trigger_audit", None, None),
    ("GET", f"{AR}/trigger_audit", None, None),
    ("PUT", f"{AR}/decommission", None, None),
    ("PUT", f"{AR}/decommission", {"x": 1}, None),
    ("PUT", f"{AR}/decommission", {"bookie_src": "127.0.0.1:1"}, None),
    ("PUT", f"{AR}/decommission", BAD_JSON, None),
    ("GET", f"{AR}/decommission", None, None),
    ("PUT", f"{AR}/bookie", None, None),
    ("PUT", f"{AR}/bookie", {"bookie_src": ["127.0.0.1:2"], "delete_cookie": False}, None),
    ("PUT", f"{AR}/bookie", BAD_JSON, None),
    ("GET", f"{AR}/bookie", None, None),
    ("GET", "/api/v1/no/such/path", None, None),
    ("GET", f"{B}/gc/nope", None, None),
]


TEXT = object()  # an answer that is not JSON (Java's plain sentences, an empty body)


def ask(endpoint: str, method: str, path: str, body: object) -> tuple[int, object]:
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    # JSON's content type: with urllib's default (a form) Jetty would take a PUT's body as parameters.
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(f"http://{endpoint}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, TEXT


def kind(value: object) -> str:
    if value is TEXT:
        return "text"
    for name, types in (("bool", bool), ("number", int | float), ("string", str), ("list", list)):
        if isinstance(value, types):
            return name
    return "object" if isinstance(value, dict) else "null"


def fields(value: object) -> dict[str, object]:
    """An object's keys, numbers in them as N -> their values."""
    if not isinstance(value, dict):
        return {}
    return {NUMBER.sub("N", str(key)): item for key, item in value.items()}


NUMBER = re.compile(r"\b(?=[0-9a-f]*[0-9])[0-9a-f]+\b")  # decimal or hex, with at least one digit


def shape_differences(java: object, ours: object, own_keys: bool, path: str = "") -> list[str]:
    """How bkctl's answer differs in shape from Java's: its kind (text, object, string...), a key Java
    has that bkctl lacks, a key whose value has another kind, down the objects and lists (their first
    elements) both have. Extra bkctl
    keys are allowed; null matches anything (Java writes null for what it has not)."""
    if java is None or ours is None:
        return []
    if kind(java) != kind(ours):
        return [f"{path.rstrip('.') or 'answer'} is {kind(ours)}, java {kind(java)}"]
    if own_keys:
        return []
    if isinstance(java, list) and isinstance(ours, list):  # by their first elements
        return shape_differences(java[0], ours[0], False, f"{path}[0].") if java and ours else []
    java_fields, our_fields = fields(java), fields(ours)
    found = [f"lacks {path}{key!r}" for key in sorted(set(java_fields) - set(our_fields))]
    for key in sorted(set(java_fields) & set(our_fields)):
        found += shape_differences(java_fields[key], our_fields[key], False, f"{path}{key!r}.")
    return found


def daemon_requests() -> list[tuple[str, str, object, str | None]]:
    return [r for r in REQUESTS if r[1].startswith((AR, "/heartbeat", "/metrics", "/api/v1/no/"))]


def compare(
    java: str,
    bkctl: str,
    ledger: str,
    victims: tuple[str, str],
    requests: list[tuple[str, str, object, str | None]],
) -> int:
    """Print one line a request; the number of differences."""
    differences = expected = 0
    for method, template, body, note in requests:
        java_path = template.format(ledger=ledger, victim=victims[0])
        our_path = template.format(ledger=ledger, victim=victims[1])
        java_status, java_json = ask(java, method, java_path, body)
        our_status, our_json = ask(bkctl, method, our_path, body)
        shape = shape_differences(java_json, our_json, note == OWN_KEYS)
        same = java_status == our_status and not shape
        known = (
            (note == LATER and java_status == 404)
            or (note == NO_STATS and java_status == 500)
            or note in (NEWER, REFUSED)
        )
        shown = template.replace("{ledger}", "L").replace("{victim}", "V")
        shown += " <bad json>" if body == BAD_JSON else f" {json.dumps(body)}" if body is not None else ""
        if same:
            verdict, tail = "ok  ", ""
        else:
            verdict = "know" if known else "DIFF"
            tail = f"  <- bkctl {our_status}" + "".join(f", {what}" for what in shape)
            tail += f" ({note})" if known else ""
            differences += not known
            expected += known
        print(f"{verdict} {method:6} {shown:78} java {java_status}{tail}")
    total = len(requests)
    print(
        f"{total - differences - expected} of {total} answers match, {expected} differ as known "
        f"(marked 'know', with why), {differences} differences",
        file=sys.stderr,
    )
    return differences


def main() -> int:
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "--daemon":
        return 3 if compare(args[1], args[2], "0", ("0", "0"), daemon_requests()) else 0
    if len(args) != 5:
        print((__doc__ or "").split("\n\n")[1], file=sys.stderr)
        return 2
    java, bkctl, ledger, java_victim, bkctl_victim = args
    return 3 if compare(java, bkctl, ledger, (java_victim, bkctl_victim), REQUESTS) else 0


if __name__ == "__main__":
    sys.exit(main())
