"""Auditor election, compatible with Java's AuditorElector.

Each daemon casts an ephemeral-sequential vote `underreplication/auditorelection/V_<seq>` holding
`bookieId: "<id>"`; the lowest live vote wins and copies its vote into the `auditorelection` node
itself; every other daemon watches only its predecessor (no herd on each change). A lost session
takes the vote with it: the daemon stops auditing (if it was the auditor) and votes again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from twisted.internet import threads
from twisted.internet.defer import Deferred, succeed

from bkctl.metadata.at_stop import within_stop_wait
from bkctl.metadata.autorecovery import UR_ELECTION
from bkctl.metadata.layout import Layout
from bkctl.metadata.store import Subscription, name_of

log = logging.getLogger("bkctl.recovery.election")


class AuditorElection:
    """One daemon's vote; `on_elected()` / `on_demoted()` run on the reactor thread."""

    def __init__(
        self,
        layout: Layout,
        bookie_id: str,
        reactor: Any,
        on_elected: Callable[[], object],
        on_demoted: Callable[[], object],
    ) -> None:
        self._layout, self._bookie_id, self._reactor = layout, bookie_id, reactor
        self._on_elected, self._on_demoted = on_elected, on_demoted
        self.vote_path: str | None = None
        self.is_auditor = False
        self._watch: Subscription | None = None
        self._session_sub: Subscription | None = None
        self._stopped = False
        self._voting = False  # a vote is being cast: one at a time, so a daemon never holds two

    def start(self) -> Deferred[None]:
        self._session_sub = self._layout.store.on_session_lost(self._session_lost_from_thread)
        return self._vote()

    def stop(self) -> Deferred[None]:
        """Withdraw the vote so another daemon takes over at once (not after our session expires)."""
        self._stopped = True
        for sub in (self._watch, self._session_sub):
            if sub is not None:
                sub.cancel()
        self._demote()
        vote, self.vote_path = self.vote_path, None
        if vote is None:
            return succeed(None)
        withdrawn = self._in_thread(self._delete_quietly, vote)
        return within_stop_wait(
            withdrawn, "autorecovery stop: withdrawing the auditor vote", self._reactor, log
        )

    def _in_thread(self, function: Callable[..., Any], *args: Any) -> Deferred[Any]:
        return threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(), function, *args)

    def _vote(self, old_vote: str | None = None) -> Deferred[None]:
        def voted(path: str) -> Deferred[None]:
            self._voting = False
            self.vote_path = path
            if path != old_vote:
                log.info("auditor election: %s voted %s", self._bookie_id, name_of(path))
            return self._elect()

        def failed(failure: Any) -> Any:
            self._voting = False
            return failure

        self._voting = True
        return self._in_thread(self._cast_vote, old_vote).addCallbacks(voted, failed)

    def _cast_vote(self, old_vote: str | None) -> str:
        """A new vote, unless `old_vote` is still there: an ephemeral node outlives no expiry, so it
        was cast in this session (two events of one expiry, the session loss and a vanished vote,
        each ask to vote again: one vote must come of them)."""
        if old_vote is not None and self._layout.store.exists(old_vote) is not None:
            return old_vote
        return self._layout.add_auditor_vote(self._bookie_id)

    def _elect(self) -> Deferred[None]:
        if self._stopped or self.vote_path is None:
            return succeed(None)
        return self._in_thread(self._elect_blocking, self.vote_path).addErrback(self._retry_later)

    def _elect_blocking(self, vote_path: str) -> None:
        names = [name for name, _ in self._layout.auditor_votes()]
        mine = name_of(vote_path)
        if mine not in names:  # our vote vanished (a session loss, or deleted by hand): vote again
            self._reactor.callFromThread(self.revote, vote_path)
            return
        index = names.index(mine)
        if index == 0:
            self._layout.set_elected_auditor(self._bookie_id)
            self._reactor.callFromThread(self._promote)
            return
        predecessor = self._layout.ur_path(UR_ELECTION, names[index - 1])
        if self._watch is not None:
            self._watch.cancel()
        self._watch = self._layout.store.watch_data(predecessor, self._predecessor_changed)

    def _predecessor_changed(self, data: bytes | None, _stat: object) -> None:
        if data is None:  # the predecessor's vote is gone: we may be first now
            if self._watch is not None:
                self._watch.cancel()
            self._reactor.callFromThread(self._elect)

    def _promote(self) -> None:
        if not self.is_auditor and not self._stopped:
            self.is_auditor = True
            log.info("auditor election: %s is the auditor", self._bookie_id)
            self._on_elected()

    def _demote(self) -> None:
        if self.is_auditor:
            self.is_auditor = False
            self._on_demoted()

    def _session_lost_from_thread(self) -> None:
        self._reactor.callFromThread(self.revote)

    def revote(self, vanished: str | None = None, *, requeue: bool = False) -> None:
        """Vote again after a session loss (`vanished` None) or because `vanished` was not among the
        votes; skipped when a vote is being cast or `vanished` was replaced already. `requeue`
        withdraws a live vote first: the daemon goes to the back of the line."""
        if self._stopped or self._voting or (vanished is not None and vanished != self.vote_path):
            return
        log.warning("auditor election: %s voting again", self._bookie_id)
        self._demote()
        old_vote, self.vote_path = self.vote_path, None
        if requeue and old_vote is not None:
            self._voting = True
            withdrawn = self._in_thread(self._delete_quietly, old_vote)
            withdrawn.addBoth(lambda _: setattr(self, "_voting", False))
            withdrawn.addCallback(lambda _: self._vote()).addErrback(self._retry_later)
            return
        self._vote(old_vote).addErrback(self._retry_later)

    def _retry_later(self, failure: Any) -> None:
        if self._stopped:
            return
        log.warning("auditor election: %s; retrying in %.0f s", failure.getErrorMessage(), RETRY_S)
        self._reactor.callLater(RETRY_S, self._retry)

    def _retry(self) -> None:
        if not self._stopped:
            retry = self._elect if self.vote_path is not None else self._vote
            if not self._voting:
                retry().addErrback(self._retry_later)

    def _delete_quietly(self, path: str) -> None:
        try:
            self._layout.store.delete(path)
        except Exception as exc:  # the session's end removes it anyway
            log.debug("auditor vote %s not deleted: %s", path, exc)


RETRY_S = 1.0  # local bound
