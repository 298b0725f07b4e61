"""Metadata calls made while a process stops: waited for a bounded time, and never failing the stop.

A bookie's unregister and an autorecovery daemon's vote withdrawal are retried through an outage like
any metadata call (retry.py, up to the metadata deadline: 120 s by default). At stop that held back a
bookie's journal drain and last checkpoint, and an operator's Ctrl-C, for two minutes while ZooKeeper
was away. What they remove is ephemeral: it goes when the session expires anyway. The process then
closes its store, which ends the call's retries.
"""

from __future__ import annotations

import logging
from typing import Any

from twisted.internet import defer
from twisted.internet.defer import Deferred

from bkctl import limits
from bkctl.errors import BkctlError


def within_stop_wait(call: Deferred[Any], what: str, reactor: Any, log: logging.Logger) -> Deferred[None]:
    """`call` waited for at most limits.METADATA_AT_STOP_S; a timeout or a failure is one log line."""
    wait_s = limits.METADATA_AT_STOP_S

    def failed(failure: Any) -> None:
        if failure.check(defer.TimeoutError):
            log.warning(
                "%s: the metadata store did not answer within %.0f s; stopping anyway (it goes when the "
                "session expires)",
                what,
                wait_s,
            )
        elif failure.check(BkctlError):
            log.error("%s failed: %s", what, failure.getErrorMessage())
        else:
            log.error("%s failed", what, exc_info=(failure.type, failure.value, failure.getTracebackObject()))

    return call.addTimeout(wait_s, reactor).addCallbacks(lambda _: None, failed)
