"""/metrics under Java's names: every metric family bkctl writes is either one of Java 4.14.8's, with
Java's type (tests/data/java_metrics.txt), or bkctl's own with the `bkctl_` prefix."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from bkctl.recovery.metrics import autorecovery_lines
from tests.server_net.live import in_thread, start_bookie, twisted_test
from tests.server_net.wire_client import WireClient

JAVA = Path(__file__).parent.parent / "data" / "java_metrics.txt"


def java_metrics() -> dict[str, str]:
    lines = JAVA.read_text().splitlines()
    return dict(line.split() for line in lines if line and not line.startswith("#"))


def families(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))


def check_names(text: str) -> dict[str, str]:
    java = java_metrics()
    found = families(text)
    for name, kind in found.items():
        if not name.startswith("bkctl_"):
            assert java.get(name) == kind, f"{name} ({kind}) is not Java's: {java.get(name)}"
    return found


@twisted_test
async def test_bookie_metrics_have_java_names(tmp_path: Path) -> None:
    service = await start_bookie(tmp_path, httpServerEnabled="true", httpServerPort="0")
    try:
        assert service.gc is not None
        await service.gc.trigger(force_major=True)

        def scrape() -> str:
            with WireClient("127.0.0.1", service.port) as client:
                client.add_many(3, [b"x" * 100] * 5)
            url = f"http://127.0.0.1:{service.http_port}/metrics"
            return str(urllib.request.urlopen(url, timeout=10).read().decode())

        text = await in_thread(scrape)
        found = check_names(text)
        for name in (
            "bookie_SERVER_STATUS",
            "bookie_journal_JOURNAL_SYNC",
            "bookkeeper_server_ADD_ENTRY_REQUEST",
            "bookie_gc_THREAD_RUNTIME",
            "bookie_ledger_writable_dirs",
        ):
            assert name in found, name
        assert "bookie_SERVER_STATUS 1\n" in text
        assert 'bookkeeper_server_ADD_ENTRY_REQUEST_count{success="true"} 5\n' in text
        assert 'bookie_gc_THREAD_RUNTIME_count{success="true"} 1\n' in text
    finally:
        await service.stop()


def test_autorecovery_metrics_have_java_names() -> None:
    status = {"audits": 2, "ledgers_marked": 3, "ledgers_replicated": 4, "replication_failures": 1}
    for scope in ("", "replication_"):
        text = "".join(autorecovery_lines(status, scope))
        assert set(check_names(text)) == {
            f"{scope}auditor_NUM_UNDER_REPLICATED_LEDGERS",
            f"{scope}replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED",
            f"{scope}replication_worker_rereplicate",
        }
        assert f'{scope}replication_worker_rereplicate_count{{success="false"}} 1\n' in text
