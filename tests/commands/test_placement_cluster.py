"""Rack-aware placement on real bookie processes: six `bkctl bookie start` processes in 3 racks x 2
(Pulsar's rack map, set with `bkctl bookie rack set`) and Java's RackawareEnsemblePlacementPolicy keys in
a conf file. One cluster serves the checks in order: new ledgers, recovery with a target breaking the
policy (refused, then --force in a dry run), recovery without target, a whole rack down (copies restored
loudly outside the policy), `ledger check` and `doctor` naming what is misplaced, the auditor's
placement check moving the replicas once the rack is back, then `bookie decommission` and a bookie's
own autorecovery (`bookie start --autorecovery`) healing a killed bookie, with minNumRacksPerWriteQuorum=2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkctl.errors import ExitCode
from bkctl.metadata.layout import Layout
from bkctl.metadata.stores import open_store
from bkctl.model import LedgerMetadata
from tests.commands.sandbox_proc import bkctl, bkctl_all, registered
from tests.commands.test_sandbox_supervision import bookie_pids, until
from tests.conftest import REPO

pytestmark = pytest.mark.slow

HEAL_S = 180.0  # a placement check, marks, copies and swaps on a loaded machine: bounded
COMMAND_S = 240.0  # one command (several at once in test_2) on a loaded machine: bounded
READY_S = 240.0  # six bookie processes starting at once on a loaded machine: bounded

CONF = """\
ensemblePlacementPolicy=org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy
reppDnsResolverClass=org.apache.pulsar.bookie.rackawareness.BookieRackAffinityMapping
minNumRacksPerWriteQuorum=3
"""


class Racked:
    def __init__(self, uri: str, data: Path, conf: Path, racks: dict[str, str]) -> None:
        self.uri, self.data, self.conf, self.racks = uri, data, conf, racks
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ledgers: list[int] = []
        self.dead: list[str] = []
        self.misplaced: list[int] = []  # ledgers restored outside the policy while a rack was down

    def run(self, *args: str) -> tuple[int, str, str]:
        done = bkctl(*args, metadata=self.uri, timeout_s=COMMAND_S)
        return done.returncode, done.stdout, done.stderr

    def metadata(self, ledger: int) -> LedgerMetadata:
        """Read straight from the metadata store: fast to poll (a `bkctl` process per read is not)."""
        with open_store(self.uri) as store:
            return Layout(store).read_ledger(ledger).value

    def ensembles(self, ledger: int) -> list[list[str]]:
        return [list(s.ensemble) for s in self.metadata(ledger).segments]

    def quorum(self, ledger: int) -> int:
        return self.metadata(ledger).write_quorum

    def assert_within_policy(self, ledger: int, racks: int = 3) -> None:
        quorum = self.quorum(ledger)
        for ensemble in self.ensembles(ledger):
            size = len(ensemble)
            sets = [[ensemble[(i + j) % size] for j in range(quorum)] for i in range(size)]
            for members in sets:
                assert len({self.racks[b] for b in members}) >= min(quorum, racks), (ledger, ensemble)

    def all_within(self, racks: int, without: str) -> bool:
        """Every write set of every ledger across `racks` racks, and `without` in no ensemble."""
        try:
            for ledger in self.ledgers:
                assert without not in str(self.ensembles(ledger))
                self.assert_within_policy(ledger, racks)
        except AssertionError:
            return False
        return True

    def live(self) -> list[str]:
        return sorted(b for b in self.racks if b not in self.dead)

    def live_per_rack(self) -> dict[str, int]:
        return {rack: [self.racks[b] for b in self.live()].count(rack) for rack in set(self.racks.values())}

    def busiest(self, rack: str) -> str:
        """The live bookie of `rack` in the most ensembles: the one whose loss asks most of placement."""
        members = [b for b in self.live() if self.racks[b] == rack]
        named = [str(self.ensembles(ledger)) for ledger in self.ledgers]
        return max(members, key=lambda b: (sum(b in e for e in named), b))

    def add_bookie(self, rack: str, *args: str) -> str:
        """One more bookie process (`bookie start` with `args`), put in `rack`; its id."""
        n = len(list(self.data.iterdir()))
        self.procs += _bookies(self.data, self.uri, first=n, count=1, args=args)
        port = (self.data / f"b{n}" / "port").read_text().strip()
        listed = json.loads(self.run("bookie", "list", "-o", "json")[1])
        bookie = str(next(r["bookie_id"] for r in listed if r["bookie_id"].endswith(f":{port}")))
        assert self.run("bookie", "rack", "set", bookie, rack)[0] == 0
        self.racks[bookie] = rack
        return bookie

    def assert_whole(self) -> None:
        """`ledger check --full` of every ledger is exit 0: every entry on every bookie of its write set."""
        checks = [["ledger", "check", str(ledger), "--full", "-o", "json"] for ledger in self.ledgers]
        for check in bkctl_all(checks, self.uri, timeout_s=COMMAND_S):
            assert check.returncode == 0, (check.args, check.stdout, check.stderr)

    def kill(self, bookie: str) -> None:
        os.kill(bookie_pids(self.data)[int(bookie.rsplit(":", 1)[1])], signal.SIGKILL)
        self.dead.append(bookie)
        gone = f"{bookie} unregistered"
        until(lambda: bookie not in registered(self.uri), gone, timeout_s=COMMAND_S)


@pytest.fixture(scope="module")
def racked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Racked]:
    base = tmp_path_factory.mktemp("placement")
    uri = f"sqlite://{base / 'metadata.db'}"
    assert bkctl("cluster", "init", metadata=uri).returncode == 0
    procs = _bookies(base / "bookies", uri)
    shared: list[subprocess.Popen[bytes]] = procs  # with the bookies the checks add
    try:
        ids = sorted(
            row["bookie_id"] for row in json.loads(bkctl("bookie", "list", "-o", "json", metadata=uri).stdout)
        )
        assert len(ids) == 6, ids
        racks = {bookie: f"/rack{i // 2}" for i, bookie in enumerate(ids)}
        for bookie, rack in racks.items():
            done = bkctl("bookie", "rack", "set", bookie, rack, metadata=uri)
            assert done.returncode == 0, done.stderr
        conf = base / "bk_client.conf"
        conf.write_text(CONF)
        cluster = Racked(uri, base / "bookies", conf, racks)
        cluster.procs = shared
        yield cluster
    finally:
        for proc in shared:
            if proc.poll() is None:
                proc.terminate()
        for proc in shared:
            proc.wait(READY_S)


def _bookies(
    data: Path, uri: str, first: int = 0, count: int = 6, args: tuple[str, ...] = ()
) -> list[subprocess.Popen[bytes]]:
    """Bookie processes (`bkctl bookie start`, SQLite metadata), each waited for up to READY_S: on
    a loaded machine six interpreters starting at once take a while, which a sandbox's own bound misses."""
    procs = []
    for n in range(first, first + count):
        home = data / f"b{n}"
        home.mkdir(parents=True)
        command = ["bookie", "start", "--port", "0", "--port-file", str(home / "port"), "-j", str(home / "j")]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "bkctl", *command, "-l", str(home / "l"), *args, "--metadata", uri],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=(home / "bookie.log").open("wb"),
            )
        )
    for n in range(first, first + count):
        until(lambda n=n: (data / f"b{n}" / "port").exists(), f"bookie {n} serving", timeout_s=READY_S)  # type: ignore[misc]
    return procs


def step_1_rack_list_shows_pulsars_map(racked: Racked) -> None:
    code, out, err = racked.run("bookie", "rack", "list", "-o", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert {r["bookie"]: r["rack"] for r in rows} == racked.racks
    assert {r["state"] for r in rows} == {"rw"}


def step_2_new_ledgers_span_the_racks(racked: Racked) -> None:
    shapes = [["-E", "3", "-Qw", "2", "-Qa", "2"]] * 4 + [["-E", "3", "-Qw", "3", "-Qa", "2"]] * 2
    writes = bkctl_all(
        [
            ["ledger", "write", "--entries", "30", "--conf", str(racked.conf), *s, "-o", "json"]
            for s in shapes
        ],
        racked.uri,
        timeout_s=COMMAND_S,
    )
    for write in writes:
        assert write.returncode == 0, write.stderr
        racked.ledgers.append(json.loads(write.stdout)["ledger_id"])
    for ledger in racked.ledgers:
        racked.assert_within_policy(ledger)


def step_3_a_target_breaking_the_policy_is_refused_unless_forced(racked: Racked) -> None:
    victim = racked.ensembles(racked.ledgers[0])[0][0]
    racked.kill(victim)
    ensemble = racked.ensembles(racked.ledgers[0])[0]
    # a bookie in the rack of the victim's neighbour: that write set would span one rack
    neighbour = ensemble[1]
    wrong = next(b for b, r in racked.racks.items() if r == racked.racks[neighbour] and b != neighbour)
    args = ("recover", racked.uri, victim, wrong, "--ledger", str(racked.ledgers[0]), "--dry-run")
    code, out, err = racked.run(*args, "--conf", str(racked.conf), "-o", "json")
    assert code == ExitCode.PROBLEMS_FOUND, err
    assert f"target {wrong} breaks the placement policy" in err and "--force" in err
    code, out, err = racked.run(*args, "--conf", str(racked.conf), "--force", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["plan"][0]["new_ensemble"][0] == wrong


def step_4_recovery_without_target_stays_within_the_policy(racked: Racked) -> None:
    code, out, err = racked.run(
        "recover", racked.uri, racked.dead[0], "--conf", str(racked.conf), "-o", "json"
    )
    assert code == 0, err
    assert json.loads(out)["placement_fallbacks"] == []
    for ledger in racked.ledgers:
        assert racked.dead[0] not in str(racked.ensembles(ledger))
        racked.assert_within_policy(ledger)
    racked.assert_whole()


def step_5_a_rack_down_restores_the_copies_loudly(racked: Racked) -> None:
    rack = racked.racks[racked.dead[0]]
    mate = next(b for b, r in racked.racks.items() if r == rack and b != racked.dead[0])
    had = {ledger for ledger in racked.ledgers if mate in str(racked.ensembles(ledger))}
    racked.kill(mate)
    code, out, err = racked.run("recover", racked.uri, mate, "--conf", str(racked.conf), "-o", "json")
    assert code == 0, err
    # Two racks left: no ensemble of 3 can give every write set (Qw=2: an odd cycle; Qw=3) the racks
    # it needs, so every ledger that was on the lost rack is restored outside the policy, said loudly.
    fallbacks = {f["ledger_id"] for f in json.loads(out)["placement_fallbacks"]}
    assert fallbacks == had and had >= {ledger for ledger in racked.ledgers if racked.quorum(ledger) == 3}
    assert err.count("outside the placement policy") == len(had)
    racked.misplaced = sorted(had)
    racked.assert_whole()


def step_6_ledger_check_names_the_misplaced_segment(racked: Racked) -> None:
    wide = next(ledger for ledger in racked.ledgers if racked.quorum(ledger) == 3)
    code, out, err = racked.run("ledger", "check", str(wide), "--conf", str(racked.conf), "-o", "json")
    assert code == ExitCode.PROBLEMS_FOUND, err
    report = json.loads(out)
    assert all(f["state"] == "ok" for f in report["fragments"]) and len(report["placement"]) == 1
    assert "breaks the placement policy" in err and "spans 2 rack(s), needs 3" in err
    code, _, err = racked.run("ledger", "check", str(wide), "-o", "json")  # no policy: nothing to judge
    assert code == 0, err
    # doctor counts them, exactly
    code, out, err = racked.run("doctor", "--conf", str(racked.conf), "-o", "json")
    facts = json.loads(out)
    assert facts["placement_not_adhering"] == len(racked.misplaced) > 0
    assert facts["placement_checked"] == len(racked.ledgers)
    assert f"placement: {len(racked.misplaced)} of 6 closed ledger(s) break the policy" in err


def step_7_the_rack_back_the_placement_check_moves_them(racked: Racked) -> None:
    # the lost rack "comes back": a live bookie is put there (the rack map's watch sees it)
    lost_rack = racked.racks[racked.dead[0]]
    moved = sorted(b for b in racked.racks if racked.racks[b] != lost_rack and b not in racked.dead)[0]
    assert racked.run("bookie", "rack", "set", moved, lost_rack)[0] == 0
    racked.racks[moved] = lost_rack
    conf = racked.conf.with_name("bk_server.conf")
    conf.write_text(
        CONF + "auditorPeriodicPlacementPolicyCheckInterval=3600\n"
        "repairedPlacementPolicyNotAdheringBookieEnable=true\n"
        "auditorPeriodicBookieCheckInterval=0\nauditorPeriodicCheckInterval=0\n"
    )
    daemon = subprocess.Popen(
        [sys.executable, "-m", "bkctl", "autorecovery", "start", "--conf", str(conf)],
        env={**os.environ, "BKCTL_METADATA": racked.uri},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        until(lambda: racked.all_within(3, racked.dead[0]), "every ledger within the policy again", HEAL_S)
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=60)
    assert "placement check" in err
    racked.assert_whole()


def _two_racks_conf(racked: Racked, name: str) -> Path:
    conf = racked.conf.with_name(name)
    conf.write_text(CONF.replace("minNumRacksPerWriteQuorum=3", "minNumRacksPerWriteQuorum=2"))
    return conf


def step_8_decommission_keeps_the_write_sets_across_the_racks(racked: Racked) -> None:
    # 3 racks of 2, 1 and 1 live bookies: one more makes 2, 2 and 1
    count = racked.live_per_rack()
    single = sorted(rack for rack, n in count.items() if n == 1)
    racked.add_bookie(single[-1])
    # the busiest bookie of the other rack of 2: its Qw=2 ensembles of 3 (one bookie per rack) can
    # take only its mate, not the bookie just added (a random choice: wrong 1 time in 2)
    rack = next(r for r, n in count.items() if n == 2)
    retired = racked.busiest(rack)
    racked.kill(retired)
    conf = _two_racks_conf(racked, "two_racks_client.conf")
    code, out, err = racked.run("bookie", "decommission", retired, "--conf", str(conf), "-y", "-o", "json")
    assert code == 0, (out, err)
    assert racked.all_within(2, retired), [racked.ensembles(ledger) for ledger in racked.ledgers]
    racked.assert_whole()


def step_9_a_bookies_own_autorecovery_heals_within_the_policy(racked: Racked) -> None:
    conf = _two_racks_conf(racked, "two_racks_server.conf")
    # live bookies in racks of 2, 1 and 1: the healer (its policy keys in its bk_server.conf) makes 2, 2, 1
    count = racked.live_per_rack()
    healer = racked.add_bookie(
        sorted(r for r, n in count.items() if n == 1)[0], "--autorecovery", "--conf", str(conf)
    )
    # the busiest bookie of the rack of 2: its Qw=2 ensembles of 3 (one bookie per rack) can take its
    # mate, never the bookie left in the healer's rack (a random choice: wrong 1 time in 2)
    victim = racked.busiest(next(r for r, n in count.items() if n == 2))
    assert victim != healer
    racked.kill(victim)
    until(lambda: racked.all_within(2, victim), f"{victim} healed within the policy", timeout_s=HEAL_S)
    racked.assert_whole()


STEPS = (
    step_1_rack_list_shows_pulsars_map,
    step_2_new_ledgers_span_the_racks,
    step_3_a_target_breaking_the_policy_is_refused_unless_forced,
    step_4_recovery_without_target_stays_within_the_policy,
    step_5_a_rack_down_restores_the_copies_loudly,
    step_6_ledger_check_names_the_misplaced_segment,
    step_7_the_rack_back_the_placement_check_moves_them,
    step_8_decommission_keeps_the_write_sets_across_the_racks,
    step_9_a_bookies_own_autorecovery_heals_within_the_policy,
)


def test_the_steps_in_order_on_one_cluster(racked: Racked) -> None:
    """The steps build on each other on one cluster (a rack down, then back, then a decommission), so they
    are one test: pytest-xdist may hand a module's tests to two workers, and a step alone would meet a
    cluster its predecessors never touched."""
    for step in STEPS:
        step(racked)
