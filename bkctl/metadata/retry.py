"""Riding through metadata store outages: retry an operation until a deadline, safely.

A ZooKeeper pause (GC, leader election, a network blip) loses the connection and maybe the session; an
operation that meets it is retried with a bounded exponential backoff (Java's zkRetryBackoffStartMs /
zkRetryBackoffMaxMs) until the deadline (`BKCTL_METADATA_TIMEOUT_MS`, `--metadata-timeout`, default
limits.METADATA_RETRY_DEADLINE_MS). kazoo reconnects, and opens a new session after an expiry, by
itself; this layer only waits and asks again. An operation whose first try may have been applied before
the connection dropped is only called a failure when the store shows it was not ours: the backend passes
`applied()`, asked after a retry met a conflict (NodeExists, BadVersion, NotFound) to tell.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from bkctl import limits
from bkctl.errors import ConflictError, NotFoundError, SessionExpiredError, UnavailableError, UsageError

log = logging.getLogger("bkctl.metadata")
T = TypeVar("T")
DEADLINE_ENV = "BKCTL_METADATA_TIMEOUT_MS"
# The default deadline, in session timeouts: long enough for a pause that expires every session (a GC
# pause, a leader election) and the new session after it.
SESSIONS_PER_DEADLINE = limits.METADATA_RETRY_DEADLINE_MS // limits.METADATA_SESSION_TIMEOUT_MS


@dataclass(frozen=True)
class RetryPolicy:
    deadline_ms: int = limits.METADATA_RETRY_DEADLINE_MS
    backoff_start_ms: int = limits.METADATA_RETRY_BACKOFF_START_MS
    backoff_max_ms: int = limits.METADATA_RETRY_BACKOFF_MAX_MS

    @classmethod
    def from_env(cls, session_timeout_ms: int | None = None) -> RetryPolicy:
        """BKCTL_METADATA_TIMEOUT_MS, else SESSIONS_PER_DEADLINE session timeouts (10 s -> 120 s)."""
        text = os.environ.get(DEADLINE_ENV, "").strip()
        if not text:
            if session_timeout_ms is None:
                return cls()
            deadline = min(session_timeout_ms * SESSIONS_PER_DEADLINE, limits.METADATA_RETRY_DEADLINE_MS_MAX)
            return cls(deadline_ms=deadline)
        try:
            deadline = int(text)
        except ValueError:
            raise UsageError(f"{DEADLINE_ENV}={text!r} is not a number of milliseconds") from None
        if not 0 <= deadline <= limits.METADATA_RETRY_DEADLINE_MS_MAX:
            raise UsageError(f"{DEADLINE_ENV}={deadline}: must be 0..{limits.METADATA_RETRY_DEADLINE_MS_MAX}")
        return cls(deadline_ms=deadline)


def retrying(
    what: str,
    attempt: Callable[[], T],
    policy: RetryPolicy,
    *,
    is_closed: Callable[[], bool],
    applied: Callable[[], T | None] | None = None,
) -> T:
    """`attempt()` until it succeeds, fails for a reason an outage does not explain, or the deadline.

    UnavailableError and SessionExpiredError are outages. After one, a conflict may be our own earlier
    try that reached the store: `applied()` returns the result it would have had, or None.
    """
    deadline = time.monotonic() + policy.deadline_ms / 1000
    delay = policy.backoff_start_ms / 1000
    retried = False
    while True:
        try:
            return attempt()
        except (ConflictError, NotFoundError):
            if retried and applied is not None:
                done = applied()
                if done is not None:
                    log.info("%s: applied before the connection dropped", what)
                    return done
            raise
        except (UnavailableError, SessionExpiredError) as exc:
            if is_closed() or time.monotonic() + delay > deadline:
                raise
            if not retried:
                log.warning("%s: %s; retrying for up to %.0f s", what, exc, policy.deadline_ms / 1000)
            retried = True
            time.sleep(delay)
            delay = min(delay * 2, policy.backoff_max_ms / 1000)
