"""The cluster's copy budget: replicationRateByBytes for every autorecovery daemon together.

Java applies replicationRateByBytes to each replication worker, so a cluster of N daemons copies at up
to N times it. Here it is the cluster's: the budget is `underreplication/bkctl-replication-rate` in the
metadata store (`bkctl autorecovery set-rate`; absent: the daemon's own replicationRateByBytes), and
each daemon copies at most its share, the budget over the daemons registered now (the ephemeral
status nodes under `underreplication/bkctl-daemons`). Both are watched: a new rate, a daemon that
starts or goes, and every share moves within one watch event, copies under way included.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from twisted.internet import threads
from twisted.internet.defer import Deferred

from bkctl.errors import BkctlError
from bkctl.metadata.autorecovery import RATE_UNLIMITED, UR_DAEMONS, UR_REPLICATION_RATE
from bkctl.metadata.layout import Layout
from bkctl.metadata.store import Subscription
from bkctl.recovery.replicator import Throttle

log = logging.getLogger("bkctl.recovery.budget")


def share(cluster_rate: int | None, daemons: int) -> float | None:
    """One daemon's bytes/s of the cluster's budget (None: no limit)."""
    if cluster_rate is None or cluster_rate == RATE_UNLIMITED:
        return None
    return cluster_rate / max(1, daemons)


class CopyBudget:
    """Keeps `throttle` (a daemon's repairs share it) at this daemon's share of the cluster's budget."""

    def __init__(
        self, layout: Layout, reactor: Any, throttle: Throttle, configured: int | None = None
    ) -> None:
        self._layout, self._reactor, self.throttle = layout, reactor, throttle
        self._configured = configured  # replicationRateByBytes of this daemon's configuration
        self.cluster_rate: int | None = configured
        self.daemons = 1
        self._subs: list[Subscription] = []

    def start(self) -> Deferred[None]:
        self._apply()
        return threads.deferToThreadPool(self._reactor, self._reactor.getThreadPool(), self._watch)

    def stop(self) -> None:
        for sub in self._subs:
            sub.cancel()
        self._subs.clear()

    def _watch(self) -> None:
        store = self._layout.store
        store.ensure_path(self._layout.ur_path(UR_DAEMONS))
        rate_path = self._layout.ur_path(UR_REPLICATION_RATE)
        self._subs.append(store.watch_data(rate_path, self._from_thread(self._rate_node)))
        daemons_path = self._layout.ur_path(UR_DAEMONS)
        self._subs.append(store.watch_children(daemons_path, self._from_thread(self._daemon_nodes)))

    def _from_thread(self, handler: Callable[..., None]) -> Callable[..., None]:
        return lambda *args: self._reactor.callFromThread(handler, *args)

    def _rate_node(self, data: bytes | None, _stat: object) -> None:
        if data is None:
            self.cluster_rate = self._configured
        else:
            try:
                self.cluster_rate = self._layout.decode_replication_rate(data)
            except BkctlError as exc:
                log.warning("%s; the budget stays at %s", exc, self.cluster_rate)
        self._apply()

    def _daemon_nodes(self, children: list[str] | None) -> None:
        self.daemons = max(1, len(children or ()))
        self._apply()

    def _apply(self) -> None:
        rate = share(self.cluster_rate, self.daemons)
        if rate != self.throttle.rate:
            log.info("copy budget: %s B/s of %s, %d daemons", rate, self.cluster_rate, self.daemons)
        self.throttle.set_rate(rate)
