"""Fault points for crash tests: `BKCTL_FAULT_POINT=<name>` makes the process kill itself (SIGKILL, as a
kill -9) the first time it reaches the point of that name. Unset (always, outside tests), a fault point
costs one comparison with None.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Final

log = logging.getLogger("bkctl.bookie")

FAULT_POINT: Final = os.environ.get("BKCTL_FAULT_POINT") or None


def fault_point(name: str) -> None:
    """Die here with SIGKILL when BKCTL_FAULT_POINT names this point (flushes nothing, as a kill -9)."""
    if FAULT_POINT is not None and name == FAULT_POINT:
        log.warning("fault point %s: killing the process", name)
        os.kill(os.getpid(), signal.SIGKILL)
