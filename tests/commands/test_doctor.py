"""`bkctl doctor` as a subprocess: healthy on a fresh sandbox of bookie processes (disk usage from their
admin HTTP info), then each fault it must name with exit 3: autorecovery disabled, a bookie killed; on a
real ZooKeeper, a cluster with no bookie and no auditor, a foreign cookie and an under-replicated mark;
and a store that is not there."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from bkctl.metadata.layout import Layout
from bkctl.metadata.sqlite import SqliteStore
from bkctl.metadata.zookeeper import ZooKeeperStore
from bkctl.protocol.metadata_format import Cookie
from tests.commands.sandbox_proc import bkctl, registered
from tests.commands.test_sandbox_supervision import bookie_pids, start, until

SESSION_EXPIRY_WAIT_S = 60.0  # a killed bookie's registration goes with its session (10 s), bounded


def doctor(uri: str, *args: str) -> tuple[int, dict[str, object], str]:
    done = bkctl("doctor", "-o", "json", *args, metadata=uri)
    return done.returncode, json.loads(done.stdout), done.stderr


def states(document: dict[str, object]) -> dict[str, str]:
    return {c["check"]: c["state"] for c in document["checks"]}  # type: ignore[attr-defined]


def test_healthy_sandbox_then_autorecovery_disabled_then_a_bookie_killed(tmp_path: Path) -> None:
    sandbox, uri, bookies = start(tmp_path, "--no-restart")
    try:
        code, document, err = doctor(uri)
        assert code == 0, err
        assert document["healthy"] is True and document["bookies_rw"] == 3
        assert set(document) == {  # the JSON contract (docs/cli.md)
            "healthy", "checks", "bookies", "instance_id", "layout", "root", "bookies_rw", "bookies_ro",
            "bookies_down", "underreplicated_count", "autorecovery_enabled", "auditor", "auditor_running",
            "last_audit_ms", "last_check_all_ledgers_ms",
        }  # fmt: skip
        assert [c["check"] for c in document["checks"]] == [  # type: ignore[attr-defined]
            "metadata", "instance_id", "bookies", "disk", "indexes", "underreplicated", "autorecovery",
            "auditor", "last_audit",
        ]  # fmt: skip
        found = states(document)
        assert found.pop("last_audit") in ("ok", "unknown")  # the auditor's first check may be under way
        assert set(found.values()) == {"ok"}, document
        disks = [b["disk_used_fraction"] for b in document["bookies"]]  # type: ignore[attr-defined]
        assert len(disks) == 3 and all(isinstance(d, float) and 0 < d < 1 for d in disks)
        table = bkctl("doctor", "-o", "table", metadata=uri)
        assert table.returncode == 0 and table.stdout.splitlines()[0].split() == ["CHECK", "STATE", "DETAIL"]

        assert bkctl("autorecovery", "disable", metadata=uri).returncode == 0
        code, document, err = doctor(uri)
        assert code == 3 and document["healthy"] is False
        assert states(document)["autorecovery"] == "problem" and "autorecovery: disabled" in err

        victim = bookies[0]
        os.kill(bookie_pids(tmp_path / "sb")[int(victim.rsplit(":", 1)[1])], signal.SIGKILL)

        until(lambda: victim not in registered(uri), "the killed bookie unregistered", SESSION_EXPIRY_WAIT_S)
        assert doctor(uri)[1]["bookies_down"] == 1
        plain = bkctl("doctor", "-o", "plain", metadata=uri)
        assert plain.returncode == 3
        assert f"bookie\t{victim}\tdown\tyes\tunknown (down)" in plain.stdout.splitlines()
        assert f"down: {victim}" in plain.stderr
    finally:
        assert sandbox.stop(signal.SIGINT) == 0


def test_zookeeper_cluster_without_bookies_with_a_foreign_cookie_and_a_mark(zk_chroot: str) -> None:
    init = bkctl("cluster", "init", metadata=zk_chroot)
    assert init.returncode == 0, init.stderr
    code, document, err = doctor(zk_chroot)
    assert code == 3
    found = states(document)
    assert (found["metadata"], found["bookies"], found["auditor"], found["disk"]) == (
        "ok",
        "problem",
        "problem",
        "unknown",
    )
    assert "no read-write bookie" in err and "no auditor" in err

    with ZooKeeperStore(zk_chroot) as store:
        layout = Layout(store)
        layout.write_cookie(Cookie.create("10.0.0.9:3181", ["/j"], ["/l"], instance_id="another-cluster"))
        layout.mark_underreplicated(7, ["10.0.0.9:3181"])
    code, document, err = doctor(zk_chroot)
    assert code == 3 and document["underreplicated_count"] == 1
    checks = {c["check"]: c["detail"] for c in document["checks"]}  # type: ignore[attr-defined]
    assert "10.0.0.9:3181 (cookie of instance another-cluster)" in checks["instance_id"]
    assert "down: 10.0.0.9:3181" in checks["bookies"]
    assert checks["underreplicated"] == "1 ledger(s) marked: 7"


def test_no_store_is_one_problem_and_the_rest_unknown(tmp_path: Path) -> None:
    code, document, err = doctor(f"sqlite://{tmp_path / 'none.db'}")
    assert code == 3
    found = states(document)
    assert found.pop("metadata") == "problem" and set(found.values()) == {"unknown"}
    assert "no metadata store" in err and not (tmp_path / "none.db").exists()


def test_a_foreign_layout_is_a_problem_and_a_bad_option_a_usage_error(tmp_path: Path) -> None:
    uri = f"sqlite://{tmp_path / 'md.db'}"
    assert bkctl("cluster", "init", metadata=uri).returncode == 0
    with SqliteStore(tmp_path / "md.db") as store:
        layout = Layout(store)
        store.set(layout.path("LAYOUT"), b"2\norg.apache.bookkeeper.meta.FlatLedgerManagerFactory:1")
    code, document, err = doctor(uri)
    assert code == 3 and states(document)["metadata"] == "problem"
    assert "FlatLedgerManagerFactory" in err
    assert bkctl("doctor", "--disk-warn", "2", metadata=uri).returncode == 2
    assert bkctl("doctor", "--metadata", "").returncode == 2
