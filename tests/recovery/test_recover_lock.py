"""The manual recovery's per-bookie lock on both metadata stores: a second session is refused with the
holder named, the holder's release or the end of its session frees it, and a release never deletes
another session's lock."""

from __future__ import annotations

import os
import time

import pytest

from bkctl.errors import ExitCode, RecoveryBusyError
from bkctl.metadata.layout import Layout
from bkctl.recovery import recover_lock
from tests.conftest import StoreTarget

BOOKIE, OTHER = "127.0.0.1:3181", "127.0.0.1:3182"


def until_taken(layout: Layout, bookies: list[str], bound_s: float = 30.0) -> None:
    deadline = time.monotonic() + bound_s
    while True:
        try:
            recover_lock.take(layout, bookies)
            return
        except RecoveryBusyError:
            assert time.monotonic() < deadline, "the lock was not freed"
            time.sleep(0.1)


def test_one_recover_per_bookie(store_target: StoreTarget) -> None:
    first, second = Layout(store_target.open()), Layout(store_target.open())
    recover_lock.take(first, [BOOKIE])
    with pytest.raises(RecoveryBusyError, match=f"pid {os.getpid()}") as refused:
        recover_lock.take(second, [OTHER, BOOKIE])
    assert refused.value.exit_code == ExitCode.BUSY
    recover_lock.take(second, [OTHER])  # all or none: the refused take left OTHER free
    recover_lock.release(second, [OTHER])
    recover_lock.release(second, [BOOKIE])  # not its lock: kept
    with pytest.raises(RecoveryBusyError):
        recover_lock.take(second, [BOOKIE])
    recover_lock.release(first, [BOOKIE])
    recover_lock.take(second, [BOOKIE])
    # The holder's session ends (the process died): the lock goes with it.
    store_target.expire(second.store)
    until_taken(first, [BOOKIE])
