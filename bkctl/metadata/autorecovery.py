"""Autorecovery in BookKeeper's layout: auditor election votes and the flags under `underreplication`
(disable, lostBookieRecoveryDelay, the auditor's check ctimes).
"""

from __future__ import annotations

import contextlib

from bkctl.errors import NodeExistsError, NotFoundError, ProtocolError, UsageError
from bkctl.metadata.nodes import COOKIES, INT_MAX, LayoutBase, ProblemSink, decode_node, log_problem
from bkctl.protocol import metadata_format as mf

UR_ELECTION = "auditorelection"
UR_DISABLE = "disable"
UR_LOST_BOOKIE_RECOVERY_DELAY = "lostBookieRecoveryDelay"
CHECK_CTIME_NODES = ("checkallledgersctime", "placementpolicycheckctime", "replicascheckctime")
VOTE_PREFIX = "V_"
# bkctl's own: each autorecovery daemon's status (JSON, ephemeral). Java reads only the nodes above and
# `ledgers`/`locks`, so an extra child of `underreplication` is invisible to it.
UR_DAEMONS = "bkctl-daemons"
# bkctl's own: the copy budget of every autorecovery daemon together, bytes/s as decimal text; -1: no
# limit (overriding the daemons' replicationRateByBytes); absent: the daemons' replicationRateByBytes
UR_REPLICATION_RATE = "bkctl-replication-rate"
# bkctl's own: per bookie, the creation zxid of its cookie as the auditor last audited it. A cookie made
# again (`bookie format`, then a start on empty disks under the same id) has a new one: the bookie came
# back empty, and the ledgers naming it are marked for a check and a refill.
UR_COOKIE_GENERATIONS = "bkctl-cookie-generations"
RATE_UNLIMITED = -1


def parse_vote_seq(name: str) -> int | None:
    digits = name[len(VOTE_PREFIX) :]
    ok = name.startswith(VOTE_PREFIX) and digits.isascii() and digits.isdigit()
    return int(digits) if ok else None


class AutorecoveryLayout(LayoutBase):
    """The auditor election and the flags autorecovery daemons watch."""

    # --- auditor election ---------------------------------------------------------------------------

    def add_auditor_vote(self, bookie_id: str) -> str:
        """Cast an ephemeral-sequential vote `auditorelection/V_<seq>`; return its path."""
        self.store.ensure_path(self.ur_path(UR_ELECTION))
        return self.store.create(
            self.ur_path(UR_ELECTION, VOTE_PREFIX),
            mf.encode_auditor_vote(bookie_id),
            ephemeral=True,
            sequential=True,
        )

    def auditor_votes(self, on_problem: ProblemSink = log_problem) -> list[tuple[str, str | None]]:
        """(vote node name, bookie id) of every live vote, lowest sequence (the winner) first."""
        names = self._children_or_none(self.ur_path(UR_ELECTION)) or []
        seqs = []
        for name in names:
            seq = parse_vote_seq(name)
            if seq is None:
                on_problem(self.ur_path(UR_ELECTION, name), "not an auditor vote")
            else:
                seqs.append((seq, name))
        votes = []
        for _, name in sorted(seqs):
            data = self._data_or_none(self.ur_path(UR_ELECTION, name))
            if data is None:
                continue
            try:
                votes.append((name, mf.decode_auditor_vote(data)))
            except ProtocolError as exc:
                on_problem(self.ur_path(UR_ELECTION, name), f"bad auditor vote: {exc}")
        return votes

    def current_auditor(self, on_problem: ProblemSink = log_problem) -> str | None:
        """The bookie of the lowest live vote (what Java's whoisauditor reports), or None."""
        votes = self.auditor_votes(on_problem)
        return votes[0][1] if votes else None

    def last_elected_auditor(self) -> str | None:
        """The vote the last winner copied into `auditorelection` (it stays after the auditor stops)."""
        data = self._data_or_none(self.ur_path(UR_ELECTION))
        return decode_node(self.ur_path(UR_ELECTION), data, mf.decode_auditor_vote) if data else None

    def set_elected_auditor(self, bookie_id: str) -> None:
        """The winner's copy of its vote in the election node itself, as Java's elector writes it."""
        self.store.ensure_path(self.ur_path(UR_ELECTION))
        self.store.set(self.ur_path(UR_ELECTION), mf.encode_auditor_vote(bookie_id))

    # --- daemon status (bkctl only) -----------------------------------------------------------------

    def publish_daemon_status(self, daemon_id: str, data: bytes) -> None:
        """Write this session's status node for the daemon (ephemeral: it goes with the daemon)."""
        path = self.ur_path(UR_DAEMONS, daemon_id)
        try:
            self.store.set(path, data)
            return
        except NotFoundError:
            pass
        self.store.ensure_path(self.ur_path(UR_DAEMONS))
        try:
            self.store.create(path, data, ephemeral=True)
        except NodeExistsError:  # a previous session's node, about to expire: overwrite it
            self.store.set(path, data)

    def daemon_statuses(self) -> dict[str, bytes]:
        """Daemon id -> its last published status, for the daemons alive now."""
        names = self._children_or_none(self.ur_path(UR_DAEMONS)) or []
        found = {name: self._data_or_none(self.ur_path(UR_DAEMONS, name)) for name in names}
        return {name: data for name, data in found.items() if data is not None}

    # --- flags --------------------------------------------------------------------------------------

    def autorecovery_enabled(self) -> bool:
        """True unless `underreplication/disable` exists."""
        return self.store.exists(self.ur_path(UR_DISABLE)) is None

    def set_autorecovery_enabled(self, enabled: bool) -> bool:
        """Create or delete the disable flag; False if it already was as asked (nothing changed)."""
        path = self.ur_path(UR_DISABLE)
        try:
            if enabled:
                self.store.delete(path)
            else:
                self.store.create(path, b"", make_parents=True)
        except (NotFoundError, NodeExistsError):
            return False
        return True

    def replication_rate(self) -> int | None:
        """The cluster's copy budget in bytes/s (RATE_UNLIMITED: none), or None if never set."""
        data = self._data_or_none(self.ur_path(UR_REPLICATION_RATE))
        return None if data is None else self.decode_replication_rate(data)

    def decode_replication_rate(self, data: bytes) -> int:
        """The node's bytes/s; CorruptDataError naming it when it is not a rate."""
        path = self.ur_path(UR_REPLICATION_RATE)
        return decode_node(path, data, _decode_rate, "bad replication rate: ")

    def set_replication_rate(self, bytes_per_s: int) -> None:
        """Write the cluster's copy budget (RATE_UNLIMITED: none); the daemons watch it."""
        if bytes_per_s != RATE_UNLIMITED and not 1 <= bytes_per_s <= 2**62:
            raise UsageError(f"replication rate {bytes_per_s} B/s: must be positive")
        path, data = self.ur_path(UR_REPLICATION_RATE), str(bytes_per_s).encode()
        try:
            self.store.set(path, data)
        except NotFoundError:
            self.store.create(path, data, make_parents=True)

    def cookie_generations(self, bookies: list[str]) -> dict[str, tuple[int, int | None]]:
        """Bookie -> (its cookie's creation zxid now, the one last audited or None), for those with one."""
        cookies = self.store.get_many([self.path(COOKIES, b) for b in bookies])
        seen = self.store.get_many([self.ur_path(UR_COOKIE_GENERATIONS, b) for b in bookies])
        found: dict[str, tuple[int, int | None]] = {}
        for bookie, cookie, record in zip(bookies, cookies, seen, strict=True):
            if cookie is not None:
                text = (record[0] if record is not None else b"").decode("ascii", "replace").strip()
                found[bookie] = (cookie[1].czxid, int(text) if text.isdigit() else None)
        return found

    def record_cookie_generation(self, bookie_id: str, czxid: int) -> None:
        path, data = self.ur_path(UR_COOKIE_GENERATIONS, bookie_id), str(czxid).encode()
        try:
            self.store.set(path, data)
        except NotFoundError:
            with contextlib.suppress(NodeExistsError):
                self.store.create(path, data, make_parents=True)

    def lost_bookie_recovery_delay(self) -> int | None:
        """Seconds an auditor waits before auditing a lost bookie; None if the node is absent."""
        path = self.ur_path(UR_LOST_BOOKIE_RECOVERY_DELAY)
        data = self._data_or_none(path)
        return None if data is None else decode_node(path, data, mf.decode_lost_bookie_recovery_delay)

    def set_lost_bookie_recovery_delay(self, delay_s: int) -> None:
        """Write the delay (0 is valid: audit at once); auditors watch the node and reschedule."""
        if not 0 <= delay_s <= INT_MAX:
            raise UsageError(f"lostBookieRecoveryDelay {delay_s} s: must be in [0, {INT_MAX}]")
        path, data = (
            self.ur_path(UR_LOST_BOOKIE_RECOVERY_DELAY),
            mf.encode_lost_bookie_recovery_delay(delay_s),
        )
        try:
            self.store.set(path, data)
        except NotFoundError:
            with contextlib.suppress(NodeExistsError):
                self.store.create(path, data, make_parents=True)
                return
            self.store.set(path, data)

    def check_ctime(self, name: str) -> int | None:
        """One of CHECK_CTIME_NODES: when the auditor last ran that check (ms), or None."""
        if name not in CHECK_CTIME_NODES:
            raise UsageError(f"unknown check {name!r}: one of {', '.join(CHECK_CTIME_NODES)}")
        data = self._data_or_none(self.ur_path(name))
        return None if data is None else mf.decode_check_ctime(data)

    def set_check_ctime(self, name: str, ctime_ms: int) -> None:
        if name not in CHECK_CTIME_NODES:
            raise UsageError(f"unknown check {name!r}: one of {', '.join(CHECK_CTIME_NODES)}")
        path, data = self.ur_path(name), mf.encode_check_ctime(ctime_ms)
        if self.store.exists(path) is None:
            with contextlib.suppress(NodeExistsError):
                self.store.create(path, data, make_parents=True)
                return
        self.store.set(path, data)


def _decode_rate(data: bytes) -> int:
    text = data.decode("ascii", "replace").strip()
    if not text.lstrip("-").isdigit() or (int(text) < 1 and int(text) != RATE_UNLIMITED):
        raise ProtocolError(f"{text[:40]!r} is not a rate in bytes/s")
    return int(text)
