"""Progress bars for people: on stderr, only when stderr is a terminal, drawn by rich; nothing otherwise.

Every command that can run longer than a few seconds shows one through `bar()`: a label, the bar, done
of total in the command's unit, the rate, the time left and a free text (`info`). Lower layers
(recovery, the bookie's replay, the Spark audit) never draw: they call a callback the command passes
in, and the command turns what it is told into `Bar.update` calls.

Nothing here touches stdout, whose bytes stay those of the output format. A command that streams its
data rows to a terminal (`inspect` as a table) passes `stdout_busy=True`: the rows are the progress
there, and a bar redrawn between them would tear them. While a bar is shown, `message()` lines and
log records are printed above it rather than through it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, Final, TypeVar

from bkctl.commands.output import on_terminal

T = TypeVar("T")

# Calls to Bar.update closer together than this are dropped (never the one that reaches the total): a
# per-record caller costs a clock read, not a lock and a redraw.
UPDATE_INTERVAL_S: Final = 0.1  # local bound
REFRESHES_PER_S: Final = 4  # local bound
BAR_WIDTH: Final = 20
# Items between two looks at the clock in `track`: a million-record scan pays for ~4k of them.
TRACK_EVERY: Final = 256


def wanted(stdout_busy: bool = False) -> bool:
    """A bar goes on a terminal's stderr, and not over rows streaming to the same screen."""
    if not on_terminal(sys.stderr):
        return False
    return not (stdout_busy and on_terminal(sys.stdout))


class Bar:
    """What a command tells the person waiting: `update` with absolute values, from any thread."""

    shows = False  # whether anything is drawn (a caller may skip work that only feeds the bar)

    def update(
        self,
        completed: float,
        total: float | None = None,
        *,
        info: str | None = None,
    ) -> None:
        """Nothing: no terminal to draw on."""


class _RichBar(Bar):
    shows = True

    def __init__(self, progress: Any, task: Any, total: float | None) -> None:
        self._progress, self._task = progress, task
        self._total = total
        self._shown = 0.0
        self._lock = threading.Lock()

    def update(
        self,
        completed: float,
        total: float | None = None,
        *,
        info: str | None = None,
    ) -> None:
        now = time.monotonic()
        total = self._total if total is None else total
        with self._lock:
            if now - self._shown < UPDATE_INTERVAL_S and (total is None or completed < total):
                return
            self._shown, self._total = now, total
        fields: dict[str, Any] = {} if info is None else {"info": info}
        self._progress.update(self._task, completed=completed, total=total, **fields)


@contextlib.contextmanager
def bar(
    label: str,
    total: float | None = None,
    unit: str = "",
    *,
    unit_bytes: bool = False,
    rate: bool = True,
    stdout_busy: bool = False,
) -> Iterator[Bar]:
    """A bar for the duration of the block, or a Bar that does nothing when no terminal is there.

    `unit` names what `completed` counts ("ledgers", "entries"); `unit_bytes` shows counts and rates as
    bytes (kB, MB...); `rate=False` leaves the rate out (a bar of elapsed seconds has its own, in
    `info`). `total` None: unknown yet (given by a later update), the bar pulses.
    """
    if not wanted(stdout_busy):
        yield Bar()
        return
    progress = _progress(unit, unit_bytes, rate)
    task = progress.add_task(label, total=total, info="")
    with _messages_above(progress):
        try:
            yield _RichBar(progress, task, total)
        finally:
            progress.stop()


def track(items: Iterable[T], progress: Bar, position: Any, total: float | None = None) -> Iterator[T]:
    """`items`, telling `progress` where we are (`position(item)`, e.g. a record's file offset) every
    TRACK_EVERY items, and at the end."""
    for count, item in enumerate(items, 1):
        if count % TRACK_EVERY == 0:
            progress.update(position(item), total)
        yield item
    if total is not None:
        progress.update(total, total)


def tracked(
    items: Iterable[T],
    label: str,
    total: float,
    position: Any,
    unit: str = "",
    *,
    unit_bytes: bool = False,
    stdout_busy: bool = False,
) -> Iterable[T]:
    """`items` under a bar of their own (shown while they are consumed), or `items` themselves, untouched
    and at full speed, when no bar is wanted."""
    if not wanted(stdout_busy):
        return items
    shown = bar(label, total, unit, unit_bytes=unit_bytes, stdout_busy=stdout_busy)
    return _tracked(items, position, total, shown)


def _tracked(
    items: Iterable[T], position: Any, total: float, shown: contextlib.AbstractContextManager[Bar]
) -> Iterator[T]:
    with shown as progress:
        yield from track(items, progress, position, total)


def _progress(unit: str, unit_bytes: bool, rate: bool) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
    from rich.table import Column

    from bkctl.commands.output import colour_wanted

    # soft_wrap: a long log line printed above the bar keeps its one line, as it would without a bar
    console = Console(
        stderr=True, color_system="auto" if colour_wanted() else None, highlight=False, soft_wrap=True
    )
    # One line whatever the terminal's width: the bar is short, the free text is cut (never wrapped).
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(bar_width=BAR_WIDTH),
        TaskProgressColumn(),
        _counts_column(unit, unit_bytes, rate),
        TimeRemainingColumn(),
        TextColumn(
            "{task.fields[info]}", markup=False, table_column=Column(no_wrap=True, overflow="ellipsis")
        ),
        console=console,
        transient=True,
        refresh_per_second=REFRESHES_PER_S,
        redirect_stdout=False,  # stdout is data: it never goes through the bar's console (stderr)
        redirect_stderr=True,
    )


def _counts_column(unit: str, unit_bytes: bool, rate: bool) -> Any:
    from rich.filesize import decimal
    from rich.progress import ProgressColumn
    from rich.table import Column
    from rich.text import Text

    def amount(value: float) -> str:
        if unit_bytes:
            return decimal(int(value))
        return f"{value:,.1f}" if 0 < value < 10 and value != int(value) else f"{value:,.0f}"

    name = "" if unit_bytes or not unit else f" {unit}"

    class Counts(ProgressColumn):
        """`done/total unit  rate/s` (`1.0 MB/2.0 MB  1.2 MB/s` for bytes): the rate is rich's, over
        the last 30 s."""

        def render(self, task: Any) -> Text:
            total = "?" if task.total is None else amount(task.total)
            speed = f"  {amount(task.speed)}/s" if rate and task.speed else ""
            return Text(f"{amount(task.completed)}/{total}{name}{speed}")

    return Counts(table_column=Column(no_wrap=True))


@contextlib.contextmanager
def _messages_above(progress: Any) -> Iterator[None]:
    """Start the bar with log records going through its console (printed above it, not through it),
    and put the log handlers back as they were when it ends."""
    stderr = sys.stderr
    progress.start()
    swapped = []
    if sys.stderr is not stderr:  # rich took stderr: the handlers that write to it follow
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is stderr:
                swapped.append(handler)
                handler.setStream(sys.stderr)
    try:
        yield
    finally:
        for handler in swapped:
            handler.setStream(stderr)
