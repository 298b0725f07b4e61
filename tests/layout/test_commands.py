"""The metadata commands against a real Java cluster's ZooKeeper dumps, on SQLite and on ZooKeeper.

Commands run in-process through `bkctl.cli.main` (as the console script does), so every answer below
is the exact stdout / exit code an operator gets.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from bkctl.cli import main
from bkctl.errors import ExitCode
from bkctl.metadata.layout import Layout
from bkctl.model import LedgerMetadata, LedgerState, Segment
from tests.layout.conftest import LoadedDump

B1, B2, B3, B4 = (f"127.0.0.1:3318{i}" for i in (1, 2, 3, 4))
INSTANCE_ID = "76a3f9d8-1a95-4d6d-9ea6-d348aaecafd7"


def bkctl(capsys: pytest.CaptureFixture[str], dump: LoadedDump, *args: str) -> tuple[int, str, str]:
    """Run `bkctl ARGS --metadata <dump>`; (exit code, stdout, stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main([*args, "--metadata", dump.uri])
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def bkctl_json(capsys: pytest.CaptureFixture[str], dump: LoadedDump, *args: str) -> Any:
    code, out, err = bkctl(capsys, dump, *args, "-o", "json")
    assert code == 0, err
    return json.loads(out)


def _inspect(
    ledger_id: int, state: str, last: int, length: int, ensemble: list[str], digest: str, version: int
):  # type: ignore[no-untyped-def]
    return {
        "ledger_id": ledger_id,
        "state": state,
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 2,
        "digest": digest,
        "last_entry_id": last,
        "length": length,
        "ctime": None,
        "custom_metadata": {},
        "segments": [{"first_entry_id": 0, "last_entry_id": last, "ensemble": ensemble}],
        "format_version": 3,
        "metadata_version": version,
    }


# --- dump 1: ledgers 0-3 just written, ledger 1 still open -----------------------------------------


def test_dump1_ledger_list(capsys: pytest.CaptureFixture[str], dump1: LoadedDump) -> None:
    assert bkctl_json(capsys, dump1, "ledger", "list") == [{"ledger_id": i} for i in range(4)]
    assert bkctl(capsys, dump1, "ledger", "list", "-o", "plain")[1] == "0\n1\n2\n3\n"
    assert bkctl_json(capsys, dump1, "ledger", "list", "--bookie", B3) == [{"ledger_id": i} for i in range(4)]


def test_dump1_ledger_inspect(capsys: pytest.CaptureFixture[str], dump1: LoadedDump) -> None:
    assert bkctl_json(capsys, dump1, "ledger", "inspect", "1") == _inspect(
        1, "OPEN", -1, 0, [B3, B1, B2], "CRC32", 0
    )
    assert bkctl_json(capsys, dump1, "ledger", "inspect", "0") == _inspect(
        0, "CLOSED", 999, 6890, [B1, B2, B3], "CRC32", 1
    )
    assert bkctl_json(capsys, dump1, "ledger", "inspect", "2") == _inspect(
        2, "CLOSED", 99, 590, [B3, B1, B2], "CRC32", 2
    )


def test_dump1_bookies_and_cluster(capsys: pytest.CaptureFixture[str], dump1: LoadedDump) -> None:
    assert bkctl_json(capsys, dump1, "bookie", "list") == [
        {"bookie_id": b, "state": "rw"} for b in (B1, B2, B3)
    ]
    assert bkctl_json(capsys, dump1, "cluster", "info") == {
        "instance_id": INSTANCE_ID,
        "root": "/ledgers",
        "layout": "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1",
        "bookies_rw": [B1, B2, B3],
        "bookies_ro": [],
        "ledger_count": 4,
        "underreplicated_count": 0,
        "auditor": None,
        "auditor_running": False,
        "autorecovery_enabled": True,
        "lost_bookie_recovery_delay_s": None,
    }
    code, _, err = bkctl(capsys, dump1, "autorecovery", "whoisauditor")
    assert (code, err) == (ExitCode.NOT_FOUND, "bkctl: error: no auditor elected\n")


# --- dump 5: after bookie 3 died and was recovered onto bookie 4 -----------------------------------


def test_dump5_ledger_list(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    assert bkctl_json(capsys, dump5, "ledger", "list") == [{"ledger_id": i} for i in range(11)]
    assert bkctl_json(capsys, dump5, "ledger", "list", "--bookie", B3) == []
    assert bkctl_json(capsys, dump5, "ledger", "list", "--bookie", B4) == [
        {"ledger_id": i} for i in range(11)
    ]


@pytest.mark.parametrize(
    ("ledger_id", "expected"),
    [
        (0, _inspect(0, "CLOSED", 999, 6890, [B1, B2, B4], "CRC32", 2)),
        (1, _inspect(1, "CLOSED", 49, 290, [B4, B1, B2], "CRC32", 3)),
        (2, _inspect(2, "CLOSED", 99, 590, [B4, B1, B2], "CRC32", 3)),
        (3, _inspect(3, "CLOSED", 199, 1290, [B2, B1, B4], "CRC32", 2)),
        (4, _inspect(4, "CLOSED", 2999, 22890, [B4, B1, B2], "CRC32C", 2)),
        (5, _inspect(5, "CLOSED", 99, 590, [B1, B4, B2], "MAC", 2)),
        (6, _inspect(6, "CLOSED", 19, 110, [B1, B4, B2], "CRC32", 2)),
        (10, _inspect(10, "CLOSED", 4, 30, [B4, B2, B1], "CRC32", 2)),
    ],
)
def test_dump5_ledger_inspect(
    capsys: pytest.CaptureFixture[str], dump5: LoadedDump, ledger_id: int, expected: dict[str, Any]
) -> None:
    assert bkctl_json(capsys, dump5, "ledger", "inspect", str(ledger_id)) == expected


def test_ledger_inspect_table(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    code, out, _ = bkctl(capsys, dump5, "ledger", "inspect", "5", "-o", "table")
    assert code == 0
    assert "\nstate:             CLOSED\n" in out and "\ndigest:            MAC\n" in out
    assert out.endswith(f"FIRST ENTRY  LAST ENTRY  ENSEMBLE\n          0          99  {B1},{B4},{B2}\n")


def test_ledger_inspect_plain_is_one_raw_value_per_field(
    capsys: pytest.CaptureFixture[str], dump5: LoadedDump
) -> None:
    """`-o plain` put `1795478926818 (2026-...)` in one field and mixed key/value
    lines with segment rows. Now (docs/cli.md): `key<TAB>value` lines, the ctime as its bare number,
    then one `segment<TAB>first<TAB>last<TAB>ensemble` line per segment."""
    ctime = 1795478926818
    md = LedgerMetadata(
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        segments=(Segment(0, (B1, B2, B4)), Segment(100, (B1, B3, B4))),
        state=LedgerState.CLOSED,
        last_entry_id=149,
        length=1500,
        ctime=ctime,
        custom_metadata=(("application", b"demo"),),
    )
    Layout(dump5.store).create_ledger(md, ledger_id=77)
    code, out, err = bkctl(capsys, dump5, "ledger", "inspect", "77", "-o", "plain")
    assert code == 0, err
    lines = [line.split("\t") for line in out.splitlines()]
    pairs = dict(line for line in lines if line[0] != "segment")
    assert all(len(line) == 2 for line in lines if line[0] != "segment")
    assert pairs["ctime"] == str(ctime)  # the number alone: no date beside it
    assert (pairs["ledger_id"], pairs["state"], pairs["last_entry_id"]) == ("77", "CLOSED", "149")
    assert pairs["custom_metadata"] == '{"application": "demo"}'
    # Segment rows come after every key/value line, each led by its key, with its own fields.
    firsts = [i for i, line in enumerate(lines) if line[0] == "segment"]
    assert firsts == list(range(len(lines) - 2, len(lines)))
    assert lines[-2:] == [
        ["segment", "0", "99", f"{B1},{B2},{B4}"],
        ["segment", "100", "149", f"{B1},{B3},{B4}"],
    ]


def test_missing_ledger_exits_4(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    code, out, err = bkctl(capsys, dump5, "ledger", "inspect", "11")
    assert (code, out) == (ExitCode.NOT_FOUND, "")
    assert err == "bkctl: error: ledger 11 does not exist (/ledgers/00/0000/L0011)\n"


def test_dump5_bookies(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    assert bkctl_json(capsys, dump5, "bookie", "list") == [
        {"bookie_id": b, "state": "rw"} for b in (B1, B2, B4)
    ]
    assert bkctl_json(capsys, dump5, "bookie", "list", "--ro") == []
    assert bkctl_json(capsys, dump5, "bookie", "list", "--all") == [
        {"bookie_id": B1, "state": "rw"},
        {"bookie_id": B2, "state": "rw"},
        {"bookie_id": B3, "state": "down"},
        {"bookie_id": B4, "state": "rw"},
    ]
    assert bkctl(capsys, dump5, "bookie", "list", "-o", "plain")[1] == f"{B1}\trw\n{B2}\trw\n{B4}\trw\n"
    code, _, err = bkctl(capsys, dump5, "bookie", "list", "--rw", "--ro")
    assert code == ExitCode.USAGE and "at most one" in err


def test_dump5_cluster_info(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    assert bkctl_json(capsys, dump5, "cluster", "info") == {
        "instance_id": INSTANCE_ID,
        "root": "/ledgers",
        "layout": "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1",
        "bookies_rw": [B1, B2, B4],
        "bookies_ro": [],
        "ledger_count": 11,
        "underreplicated_count": 0,
        "auditor": "127.0.0.1:33189",
        "auditor_running": False,
        "autorecovery_enabled": True,
        "lost_bookie_recovery_delay_s": 0,
    }


def test_dump5_autorecovery(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    assert bkctl_json(capsys, dump5, "autorecovery", "status") == {
        "enabled": True,
        "auditor": "127.0.0.1:33189",
        "auditor_running": False,
        "lost_bookie_recovery_delay_s": 0,
        "replication_rate_bytes_per_s": None,
        "underreplicated_count": 0,
        "being_replicated": [],
        "daemons": [],
        "bytes_left": 0,
        "bytes_per_s": 0,
        "ledgers_per_s": 0.0,
        "eta_s": None,
    }
    code, out, err = bkctl(capsys, dump5, "autorecovery", "whoisauditor", "-o", "plain")
    assert (code, out) == (0, "auditor\t127.0.0.1:33189\nauditor_running\tfalse\n")
    assert "not running" in err
    assert bkctl_json(capsys, dump5, "autorecovery", "lost-bookie-recovery-delay") == {
        "lost_bookie_recovery_delay_s": 0
    }


def test_autorecovery_switches(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    assert bkctl(capsys, dump5, "autorecovery", "disable")[0] == 0
    assert bkctl_json(capsys, dump5, "autorecovery", "status")["enabled"] is False
    code, _, err = bkctl(capsys, dump5, "autorecovery", "disable")
    assert code == 0 and "already disabled" in err
    assert bkctl(capsys, dump5, "autorecovery", "enable")[0] == 0
    assert Layout(dump5.store).autorecovery_enabled()
    for value in ("60", "0"):
        doc = bkctl_json(capsys, dump5, "autorecovery", "lost-bookie-recovery-delay", "--set", value)
        assert doc == {"lost_bookie_recovery_delay_s": int(value)}
    assert (
        bkctl(capsys, dump5, "autorecovery", "lost-bookie-recovery-delay", "--set", "-1")[0] == ExitCode.USAGE
    )


def test_set_rate_writes_the_cluster_budget(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    assert bkctl_json(capsys, dump5, "autorecovery", "status")["replication_rate_bytes_per_s"] is None
    for given, stored in (("5M", 5_000_000), ("1.5k", 1500), ("2000000", 2_000_000), ("unlimited", -1)):
        doc = bkctl_json(capsys, dump5, "autorecovery", "set-rate", given)
        assert doc == {"replication_rate_bytes_per_s": stored}
    assert Layout(dump5.store).replication_rate() == -1
    for bad in ("fast", "0", "5T"):
        code, _, err = bkctl(capsys, dump5, "autorecovery", "set-rate", bad)
        assert code == ExitCode.USAGE and err.count("\n") == 1, (bad, err)


def test_trigger_audit_rewrites_the_delay(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    layout = Layout(dump5.store)
    before = layout.store.get(layout.ur_path("lostBookieRecoveryDelay"))[1].version
    code, _, err = bkctl(capsys, dump5, "autorecovery", "trigger-audit")
    assert code == 0 and "no auditor is running" in err
    value, stat = layout.store.get(layout.ur_path("lostBookieRecoveryDelay"))
    assert (value, stat.version) == (b"0", before + 1)  # same value, new version: auditors audit now


def test_status_lists_the_daemons(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    Layout(dump5.store).publish_daemon_status("w1", b'{"daemon": "w1", "copying": [7]}')
    assert bkctl_json(capsys, dump5, "autorecovery", "status")["daemons"] == [
        {"daemon": "w1", "copying": [7]}
    ]


def test_status_estimates_what_is_left(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    layout = Layout(dump5.store)
    (ledger_id, md), *_ = [(i, md) for i, md in layout.read_ledgers(layout.ledger_ids()) if md.length]
    layout.mark_underreplicated(ledger_id, [B1, B2])
    layout.publish_daemon_status("w1", b'{"bytes_per_s": 100, "ledgers_per_s": 0.5}')
    layout.publish_daemon_status("w2", b'{"bytes_per_s": 100, "ledgers_per_s": 0.5}')
    doc = bkctl_json(capsys, dump5, "autorecovery", "status")
    left = round(md.length * md.write_quorum / md.ensemble_size * 2)
    assert (doc["bytes_left"], doc["bytes_per_s"], doc["ledgers_per_s"]) == (left, 200, 1.0)
    assert doc["eta_s"] == max(round(left / 200), 1)


def test_auditor_with_a_live_vote(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    Layout(dump5.store).add_auditor_vote(B2)
    assert bkctl_json(capsys, dump5, "autorecovery", "whoisauditor") == {
        "auditor": B2,
        "auditor_running": True,
    }


def test_underreplicated_list(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    layout = Layout(dump5.store)
    layout.mark_underreplicated(0, [B3], ctime_ms=1000)
    layout.mark_underreplicated(4, [B3, B1], ctime_ms=2000)
    layout.mark_underreplicated(70_000, [B2], ctime_ms=None)
    layout.lock_underreplicated(4, "worker-host")
    everything = [
        {"ledger_id": 0, "missing_replicas": [B3], "ctime": 1000, "replication_worker": None},
        {"ledger_id": 4, "missing_replicas": [B3, B1], "ctime": 2000, "replication_worker": "worker-host"},
        {"ledger_id": 70_000, "missing_replicas": [B2], "ctime": None, "replication_worker": None},
    ]
    assert bkctl_json(capsys, dump5, "underreplicated", "list") == everything
    assert bkctl_json(capsys, dump5, "underreplicated", "list", "--missing-replica", B3) == everything[:2]
    assert bkctl_json(capsys, dump5, "underreplicated", "list", "--exclude-missing-replica", B1) == [
        everything[0],
        everything[2],
    ]
    assert bkctl_json(capsys, dump5, "underreplicated", "list", "--count") == {"count": 3}
    args = ("underreplicated", "list", "--count", "--missing-replica", B3, "-o", "plain")
    assert bkctl(capsys, dump5, *args)[1] == "2\n"
    args = ("underreplicated", "list", "--print-missing-replica", "--print-replication-worker", "-o", "plain")
    assert bkctl(capsys, dump5, *args)[1] == (
        f"0\t1000\t{B3}\t-\n4\t2000\t{B3},{B1}\tworker-host\n70000\t-\t{B2}\t-\n"
    )
    status = bkctl_json(capsys, dump5, "autorecovery", "status")
    assert status["underreplicated_count"] == 3
    assert status["being_replicated"] == [{"ledger_id": 4, "replication_worker": "worker-host"}]
    assert bkctl_json(capsys, dump5, "cluster", "info")["underreplicated_count"] == 3


def test_cluster_init(capsys: pytest.CaptureFixture[str], dump5: LoadedDump) -> None:
    code, _, err = bkctl(capsys, dump5, "cluster", "init")
    assert code == ExitCode.CONFLICT and INSTANCE_ID in err
    code, _, err = bkctl(capsys, dump5, "cluster", "init", "--force")  # stdin is not a terminal here
    assert code == ExitCode.USAGE and "--yes" in err
    doc = bkctl_json(capsys, dump5, "cluster", "init", "--force", "--yes", "--instance-id", "new-id")
    assert doc == {"instance_id": "new-id", "root": "/ledgers"}
    assert bkctl_json(capsys, dump5, "ledger", "list") == []
    assert bkctl_json(capsys, dump5, "cluster", "info")["instance_id"] == "new-id"
