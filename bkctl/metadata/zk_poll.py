"""kazoo's threading handler with its `select` on poll(2).

kazoo's connection thread waits for its socket through `handler.select` before every read and write;
its own builds a `selectors.DefaultSelector` (an epoll instance: create, register, wait, close: four
system calls and a dozen Python calls) for each wait. With thousands of small requests a second
(a recovery's metadata work) that was a large part of the client's CPU per request: one `select.poll`
object and one poll(2) call does the same wait.
"""

from __future__ import annotations

import math
import select
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

_READ = select.POLLIN | select.POLLPRI
_FAILED = select.POLLERR | select.POLLHUP | select.POLLNVAL  # reported to readers and writers: their
# next recv or send raises, and kazoo reconnects


def _fd(obj: Any) -> int:
    return obj if isinstance(obj, int) else int(obj.fileno())


def poll_select(
    rlist: list[Any], wlist: list[Any], xlist: list[Any], timeout: float | None = None
) -> tuple[list[Any], list[Any], list[Any]]:
    """select(2)'s contract (the ready readers and writers; nothing exceptional) on one poll(2)."""
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be non-negative")
    masks: dict[int, int] = {}
    for obj in rlist:
        masks[_fd(obj)] = masks.get(_fd(obj), 0) | _READ
    for obj in wlist:
        masks[_fd(obj)] = masks.get(_fd(obj), 0) | select.POLLOUT
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    # poll(2) counts milliseconds: rounded up, or a wait of 0.4 ms would spin without sleeping
    ready = dict(poller.poll(None if timeout is None else math.ceil(timeout * 1000)))
    readers = [obj for obj in rlist if ready.get(_fd(obj), 0) & (_READ | _FAILED)]
    writers = [obj for obj in wlist if ready.get(_fd(obj), 0) & (select.POLLOUT | _FAILED)]
    return readers, writers, []


class PollHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's SequentialThreadingHandler, waiting with `poll_select`."""

    def select(self, *args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], list[Any]]:
        return poll_select(*args, **kwargs)
