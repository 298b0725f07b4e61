"""Autorecovery faults with processes on a real ZooKeeper: bookie processes, autorecovery daemons (beside
the bookies or alone), `kill -9` and SIGSTOP. The test reads the metadata itself (a ZooKeeperStore of
its own) rather than through `bkctl` commands, so each look is milliseconds, not a process start.

Healed means: no under-replication mark and no lock left, no
ensemble naming the dead bookie or a bookie twice, and every entry on every bookie of its write set
(`ledger check --full`)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bkctl import limits
from bkctl.commands.sandbox_procs import BookieChild, start_children, stop_children
from bkctl.metadata.layout import UR_LOCKS, Layout
from bkctl.metadata.zk_server import ZooKeeperServer
from bkctl.metadata.zookeeper import ZooKeeperStore
from tests.commands.sandbox_proc import bkctl
from tests.commands.test_autorecovery_faults import HEAL_WAIT_S, daemon
from tests.commands.test_sandbox_supervision import until

pytestmark = pytest.mark.slow
SESSION_MS = 2000  # the bookies' zkTimeout (their daemons share the session)
PAUSE_S = 6.0  # three session timeouts: every session is past its timeout when ZooKeeper resumes
POLL_S = 0.02  # how often the first mark is looked for: an audit of hundreds of ledgers takes longer


@contextmanager
def zk_cluster(
    root: Path, uri: str, bookies: int, extra: tuple[str, ...] = ()
) -> Iterator[list[BookieChild]]:
    with ZooKeeperStore(uri) as store:
        Layout(store).init_cluster()
    children, _ = start_children(root, uri, bookies, 0, extra)
    try:
        yield children
    finally:
        stop_children(children)


def write_ledgers(uri: str, ledgers: int, seconds: float) -> None:
    """`ledgers` closed ledgers (E3/Qw2/Qa2) of 1 KiB entries from one process, for `seconds`."""
    done = bkctl(
        "bench", "write", "--ledgers", str(ledgers), "--duration", str(seconds), "-D", str(2 * ledgers),
        "-o", "json", metadata=uri, timeout_s=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def naming(layout: Layout, bookie: str) -> list[int]:
    return [
        i
        for i, md in layout.read_ledgers(layout.ledger_ids())
        if any(bookie in s.ensemble for s in md.segments)
    ]


def first_mark(layout: Layout) -> int | None:
    return next(iter(layout.underreplicated_ids()), None)


def healed(layout: Layout, dead: str) -> bool:
    return first_mark(layout) is None and not naming(layout, dead)


def assert_healed(layout: Layout, uri: str, dead: str, full_check: int) -> None:
    """The end state; the first `full_check` ledgers are read in full from every bookie of their write
    sets (each check is a process: all of them for hundreds of ledgers would take minutes)."""
    assert layout.store.children(layout.ur_path(UR_LOCKS)) == []
    ledgers = list(layout.read_ledgers(layout.ledger_ids()))
    for _, md in ledgers:
        for segment in md.segments:
            assert dead not in segment.ensemble and len(set(segment.ensemble)) == md.ensemble_size, md
    for ledger_id, _ in ledgers[:full_check]:
        check = bkctl("ledger", "check", str(ledger_id), "--full", "-o", "json", metadata=uri)
        assert check.returncode == 0, check.stdout + check.stderr


def daemon_statuses(layout: Layout) -> dict[str, dict[str, object]]:
    return {name: json.loads(data) for name, data in layout.daemon_statuses().items()}


def one_auditor(layout: Layout, live: set[str]) -> bool:
    """Exactly one auditor among the live daemons: one vote each, the lowest one's daemon says it
    audits, no other does (their published statuses, every 2 s)."""
    votes = [str(bookie) for _, bookie in layout.auditor_votes()]
    statuses = daemon_statuses(layout)
    auditors = [name for name, status in statuses.items() if status["auditor"]]
    return sorted(votes) == sorted(live) and set(statuses) == live and auditors == votes[:1]


def test_zookeeper_paused_past_the_session_timeout_while_a_lost_bookie_heals(tmp_path: Path) -> None:
    """Every bookie runs its daemon (`bookie start --autorecovery`); one is killed -9; as soon as its
    ledgers are marked (workers are taking locks) ZooKeeper stops for longer than any session. After
    SIGCONT the daemons vote again (exactly one vote each, one auditor), take the marks' locks again and
    heal. A pause does not guarantee the expiry (at SIGCONT the clients' reconnects race the server's
    expirer; most runs expire every session, see the votes printed): the end state is asserted either way."""
    conf = tmp_path / "bk_server.conf"
    conf.write_text(f"zkTimeout={SESSION_MS}\n")
    with ZooKeeperServer(tick_ms=200) as server:
        uri = server.hosts
        extra = ("--autorecovery", "--conf", str(conf))
        with zk_cluster(tmp_path, uri, 4, extra) as children, ZooKeeperStore(uri) as store:
            layout = Layout(store)
            write_ledgers(uri, 12, 3)
            ids = {child.bookie_id: child for child in children}
            until(lambda: one_auditor(layout, set(ids)), "one auditor among the four daemons", 60)
            dead = next(b for b in ids if b != layout.current_auditor())
            assert naming(layout, dead)
            ids[dead].proc.kill()
            live = set(ids) - {dead}
            until(lambda: first_mark(layout) is not None, "the dead bookie's ledgers marked", 60)
            votes_before = layout.auditor_votes()
            server.pause(PAUSE_S)
            until(lambda: healed(layout, dead), "healed after the pause", HEAL_WAIT_S)
            until(lambda: one_auditor(layout, live), "exactly one auditor after the pause", 60)
            assert_healed(layout, uri, dead, full_check=12)
            print(f"votes before the pause {votes_before}, after {layout.auditor_votes()}")
            assert all(child.proc.poll() is None for child in children if child.bookie_id != dead)


def test_the_auditor_killed_mid_audit_another_is_elected_and_completes_it(
    tmp_path: Path, zk_chroot: str
) -> None:
    """AuditorBookieTest's kill of the auditor, mid-audit: hundreds of ledgers, so the audit that marks
    them takes a while; the auditor is killed -9 as soon as its first mark is seen (a mark can come only
    from a running audit). The other daemon is elected once the dead one's session expires, audits
    again, and every ledger of the lost bookie is marked and healed."""
    uri = zk_chroot
    daemons = {}
    with zk_cluster(tmp_path, uri, 4) as children, ZooKeeperStore(uri) as store:
        try:
            layout = Layout(store)
            write_ledgers(uri, 300, 2)
            daemons = {name: daemon(uri, name) for name in ("10.0.0.1:1", "10.0.0.2:1")}
            until(lambda: layout.current_auditor() in daemons, "an auditor", 60)
            auditor = layout.current_auditor()
            assert auditor is not None
            dead = children[0].bookie_id
            affected = naming(layout, dead)
            children[0].proc.kill()
            deadline = time.monotonic() + 60
            while first_mark(layout) is None and time.monotonic() < deadline:
                time.sleep(POLL_S)
            marks_seen = sum(1 for _ in layout.underreplicated_ids())
            daemons[auditor].kill()  # kill -9 mid-audit (or, on a fast machine, just after it)
            print(f"auditor killed with {marks_seen} of {len(affected)} ledgers marked")
            assert marks_seen >= 1
            (other,) = set(daemons) - {auditor}
            until(lambda: layout.current_auditor() == other, "the other daemon elected", 60)
            until(lambda: healed(layout, dead), "every affected ledger marked and healed", HEAL_WAIT_S)
            assert_healed(layout, uri, dead, full_check=5)
            until(lambda: bool(daemon_statuses(layout).get(other, {}).get("audits")), "its audit", 30)
        finally:
            for proc in daemons.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(30)


def test_a_daemon_started_while_zookeeper_is_away_comes_up_when_it_is_back() -> None:
    """Found by the chaos checker: an autorecovery daemon restarted during a ZooKeeper pause exited
    ("not reachable within 5000 ms") and was gone for good. Daemons (and bookies) now wait for the
    store up to the metadata retry deadline."""
    with ZooKeeperServer(tick_ms=200) as server:
        uri = server.hosts  # a connect string: root /ledgers
        with ZooKeeperStore(uri) as store:
            Layout(store).init_cluster()
        proc = None
        try:
            paused = threading.Thread(target=server.pause, args=(PAUSE_S + 2,))
            paused.start()
            proc = daemon(uri, "late-daemon")
            paused.join()
            assert proc.poll() is None, "the daemon exited while ZooKeeper was away"
            with ZooKeeperStore(uri) as store:
                until(lambda: Layout(store).current_auditor() == "late-daemon", "its vote", 60)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)


def test_a_daemon_stops_promptly_when_zookeeper_is_frozen() -> None:
    """SIGTERM while ZooKeeper does not answer: the auditor vote's withdrawal is waited for
    METADATA_AT_STOP_S, not retried for the metadata deadline (it took 129 s)."""
    with ZooKeeperServer(tick_ms=200) as server:
        uri = server.hosts
        with ZooKeeperStore(uri) as store:
            Layout(store).init_cluster()
            proc = daemon(uri, "stopping-daemon")
            until(lambda: Layout(store).current_auditor() == "stopping-daemon", "its vote", 60)
        server.freeze()
        try:
            proc.terminate()
            proc.wait(limits.METADATA_AT_STOP_S + 20)  # a hang fails here (subprocess.TimeoutExpired)
            assert proc.returncode == 0
        finally:
            server.thaw()
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    log = Path("/tmp/daemon-stopping-daemon.log").read_text()
    assert "the auditor vote: the metadata store did not answer within 5 s; stopping anyway" in log
