"""Over-replicated ledgers: copies this bookie holds of ledgers whose metadata no longer names it in any
segment (left by an ensemble change, or by a recovery that copied its entries elsewhere while the bookie
was away). Java's GC removes them (ScanAndCompareGarbageCollector, `gcOverreplicatedLedgerWaitTime`);
so does bkctl's, by the same rules plus one:

- the check runs at most once per `gcOverreplicatedLedgerWaitTime` (Java's key; default one day, 0 = off),
  the first time that long after the bookie started;
- only a closed ledger is a candidate (an open one may change its ensembles again to name this bookie);
- a ledger whose replication lock is held (a worker copying it, maybe to this very bookie) is kept; for
  the others the lock is taken, the metadata read again under it, and the copy deleted while it is held,
  so that no worker makes this bookie a replica again in between;
- bkctl's addition: a ledger this bookie wrote to within the wait time is kept (a manual recovery copies
  entries to a bookie before its metadata names it, and takes no lock);
- any doubt (metadata or lock that cannot be read or taken) keeps the ledger until the next check.

The blocking calls (`locked_candidates`, `release`) run in a pool thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from bkctl.errors import NotFoundError
from bkctl.metadata.layout import Layout
from bkctl.model import LedgerMetadata, LedgerState

log = logging.getLogger("bkctl.bookie")


def over_replicated(metadata: LedgerMetadata, bookie_id: str) -> bool:
    """Closed, and no segment's ensemble names `bookie_id`."""
    if metadata.state is not LedgerState.CLOSED:
        return False
    return not any(bookie_id in segment.ensemble for segment in metadata.segments)


class OverReplication:
    """When the check is due, and which held ledgers it may delete (each returned with its lock held)."""

    def __init__(
        self, layout: Layout, bookie_id: str, wait_ms: int, clock: Callable[[], float] = time.time
    ) -> None:
        self.layout = layout
        self.bookie_id = bookie_id
        self.wait_s = wait_ms / 1000.0
        self._clock = clock
        self.last_check = clock()  # as Java: the first check one wait after the start

    def due(self) -> bool:
        return self.wait_s > 0 and self._clock() - self.last_check > self.wait_s

    def checked(self) -> None:
        self.last_check = self._clock()

    def locked_candidates(self, ledgers: Iterable[tuple[int, Path | None]]) -> list[int]:
        """The ledgers (id, index file) to delete as over-replicated, each with its replication lock
        now held by this bookie's metadata session (blocking)."""
        now = time.time()
        locked = []
        for ledger_id, index_path in ledgers:
            if _written_within(index_path, now, self.wait_s):
                continue
            if self._lock_if_over_replicated(ledger_id):
                locked.append(ledger_id)
        return locked

    def _lock_if_over_replicated(self, ledger_id: int) -> bool:
        try:
            # Read first without the lock: most ledgers are named, and need no lock node written.
            if not self._over_replicated(ledger_id) or self.layout.replication_locked(ledger_id):
                return False
            if not self.layout.acquire_replication_lock(ledger_id, self.bookie_id):
                return False  # a worker took it meanwhile
        except Exception as exc:
            log.warning("over-replicated check: ledger %d kept: %s", ledger_id, exc)
            return False
        try:
            if self._over_replicated(ledger_id):  # again, under the lock
                return True
        except Exception as exc:
            log.warning("over-replicated check: ledger %d kept: %s", ledger_id, exc)
        self.release([ledger_id])
        return False

    def _over_replicated(self, ledger_id: int) -> bool:
        try:
            metadata = self.layout.read_ledger(ledger_id).value
        except NotFoundError:
            return False  # deleted: the plain ledger GC takes it
        return over_replicated(metadata, self.bookie_id)

    def release(self, ledger_ids: Iterable[int]) -> None:
        """Drop the locks taken by `locked_candidates` (blocking; a lost session dropped them already)."""
        for ledger_id in ledger_ids:
            try:
                self.layout.release_lock(ledger_id)
            except Exception as exc:
                log.error("over-replicated check: lock of ledger %d not released: %s", ledger_id, exc)


def _written_within(index_path: Path | None, now: float, seconds: float) -> bool:
    """Whether the ledger's index file changed within `seconds` (no index file: entries only in
    memory, written just now)."""
    if index_path is None:
        return True
    try:
        return now - os.stat(index_path).st_mtime < seconds
    except FileNotFoundError:
        return True
