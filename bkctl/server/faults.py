"""Fault points for crash tests: `BKCTL_FAULT_POINT=<name>` makes the process kill itself (SIGKILL, as a
kill -9) the first time it reaches the point of that name (`<name>*<n>`: the n-th time). Unset (always,
outside tests), a fault point costs one comparison with None.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Final

log = logging.getLogger("bkctl.bookie")

FAULT_POINT: Final = os.environ.get("BKCTL_FAULT_POINT") or None
# `<name>*<n>`: the n-th time the point is reached instead of the first (a point reached before the
# process has done what the test wants to see survive, e.g. before any add was acknowledged).
_NAME, _, _NTH = (FAULT_POINT or "").partition("*")
_reached = [int(_NTH) if _NTH.isdigit() else 1]


def fault_point(name: str) -> None:
    """Die here with SIGKILL when BKCTL_FAULT_POINT names this point (flushes nothing, as a kill -9)."""
    if FAULT_POINT is not None and name == _NAME:
        _reached[0] -= 1
        if _reached[0] > 0:
            return
        log.warning("fault point %s: killing the process", name)
        os.kill(os.getpid(), signal.SIGKILL)
