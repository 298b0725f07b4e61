"""Running a one-shot client command on the Twisted reactor.

`run_client(uri, work)` opens the metadata store (blocking, before the reactor starts), makes a
`Client`, runs the coroutine `work(client)` under `twisted.internet.task.react`, closes the client's
connections and returns the coroutine's result. A BkctlError raised inside the reactor reaches
`bkctl.cli.main` as itself (one line + its exit code), never as a traceback or exit 1.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bkctl.commands.options import open_layout, placement_keys
from bkctl.commands.output import OutputClosed, message
from bkctl.errors import BkctlError

if TYPE_CHECKING:
    from bkctl.client.client import Client
    from bkctl.client.placement import Placement
    from bkctl.metadata.layout import Layout

T = TypeVar("T")


def react(work: Callable[[Any], Awaitable[T]]) -> T:
    """Run `work(reactor)` to completion on the reactor; re-raise its exception here.

    `task.react` always ends in SystemExit; the outcome is kept aside so that the caller sees the
    coroutine's own result or error. Ctrl-C stops the reactor before `work` ends: KeyboardInterrupt.
    """
    from twisted.internet import defer, task

    outcome: list[tuple[bool, Any]] = []

    async def wrapped(reactor: Any) -> None:
        try:
            outcome.append((True, await work(reactor)))
        except BaseException as exc:  # re-raised below, outside the reactor
            outcome.append((False, exc))

    with contextlib.suppress(SystemExit):  # react() always exits; the outcome is kept above
        task.react(lambda reactor: defer.ensureDeferred(wrapped(reactor)))
    if not outcome:
        raise KeyboardInterrupt
    ok, value = outcome[0]
    if ok:
        return value  # type: ignore[no-any-return]
    if isinstance(value, BkctlError | KeyboardInterrupt | OutputClosed | BrokenPipeError):
        raise value  # a closed stdout (`| head`) ends the command quietly in cli.main
    raise BkctlError(f"{type(value).__name__}: {value}") from value


def freeze_heap() -> None:
    """Put everything alive now (imported modules, settings, open stores) out of the cyclic GC's sight.

    A busy loop then pays only for its own garbage: without this every gen-2 collection rescans the
    whole import-time heap (twisted, typer, kazoo, ...), a 30-80 ms pause that was most of the client's
    p99 under load (benchmarks/RESULTS.md). Young objects are collected less often for the same reason.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def run_client(
    metadata: str | None,
    work: Callable[[Client], Awaitable[T]],
    *,
    request_timeout_ms: int | None = None,
    protocol: str | None = None,
    conf: Path | None = None,
    placement: list[str] | None = None,
) -> T:
    """Open the cluster named by `metadata`, run `work(client)` on the reactor, close the client.
    `protocol`: the bookies' wire protocol, else $BKCTL_PROTOCOL (the root --protocol), else v2."""
    from bkctl.client.client import Client

    wire_protocol = protocol or os.environ.get("BKCTL_PROTOCOL") or "v2"
    options: dict[str, int] = {}
    if request_timeout_ms is not None:
        options["request_timeout_ms"] = request_timeout_ms
    with open_layout(metadata) as layout:
        policy = placement_policy(layout, conf, placement_keys(placement))

        async def main(reactor: Any) -> T:
            client = Client(
                layout,
                reactor,
                protocol=wire_protocol,
                placement_policy=policy,
                **options,  # type: ignore[arg-type]
            )
            freeze_heap()
            try:
                return await work(client)
            finally:
                await client.close()

        return react(main)


def placement_policy(layout: Layout, conf: Path | None, overrides: dict[str, str] | None = None) -> Placement:
    """The placement policy of `--conf FILE` (Java properties; $BKCTL_CONF through the option), its
    keys overridden by flags (`overrides`); the random policy without either."""
    from bkctl.commands.options import conf_properties
    from bkctl.recovery.policy import placement_from_properties

    properties = conf_properties(conf)
    properties.update(overrides or {})
    return placement_from_properties(properties, layout.store)


class interruptible:
    """Ctrl-C asks `write_entries` to stop sending (the adds in flight finish); a second one stops hard."""

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor
        self._previous: Any = None
        self.requested = False

    def __enter__(self) -> Callable[[], bool]:
        self._previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, self._on_sigint)
        return lambda: self.requested

    def __exit__(self, *_: object) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self, _signum: int, _frame: object) -> None:
        if self.requested:
            signal.signal(signal.SIGINT, self._previous)
            self._reactor.callFromThread(self._reactor.stop)
            return
        self.requested = True
        message("bkctl: interrupted: waiting for the adds in flight (Ctrl-C again to stop at once)")


class StartOutcome:
    """What a long-running command (bookie, autorecovery, sandbox) raises once its reactor has stopped:
    the first failure of what it starts, which stops the reactor.

    Once a stop is under way, a start still in flight fails because the stop closes its store or its
    connections ("metadata store is closed"): that is the stop, not a failure. A SIGTERM while ZooKeeper
    was frozen exited 6 instead of 0, telling a supervisor the daemon had died."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self.errors: list[BaseException] = []
        self.stopping = False  # Ctrl-C / SIGTERM / a failure seen: what is still starting gives up
        # Registered before the command's own stop trigger (triggers run in order): set when it runs.
        reactor.addSystemEventTrigger("before", "shutdown", self._stop_seen)

    def _stop_seen(self) -> None:
        self.stopping = True

    def failed(self, reason: Any) -> None:
        """An errback: the first failure before any stop is kept and stops the reactor."""
        from twisted.internet.error import ReactorNotRunning

        if self.stopping:
            return
        self.errors.append(reason.value)
        with contextlib.suppress(ReactorNotRunning):
            self.reactor.stop()

    def raise_failure(self, what: str) -> None:
        """After the reactor: the kept failure as a BkctlError (its own code), else nothing."""
        if not self.errors:
            return
        error = self.errors[0]
        if isinstance(error, BkctlError | KeyboardInterrupt):
            raise error
        raise BkctlError(f"{what}: {type(error).__name__}: {error}") from error


def run_until_stopped(reactor: Any) -> None:
    """`reactor.run()` for the long-running commands (bookie, autorecovery, sandbox): SIGINT or SIGTERM
    stops it; more of them while it shuts down (a second Ctrl-C, a supervisor's SIGTERM after a shell's)
    are taken as the same request, not each printed as a ReactorNotRunning traceback."""
    from twisted.internet.error import ReactorNotRunning

    def stop_once() -> None:
        with contextlib.suppress(ReactorNotRunning):
            reactor.stop()

    def on_signal(_signum: int, _frame: object) -> None:
        reactor.callFromThread(stop_once)

    def install() -> None:  # after Twisted's own handlers, which reactor.run installs
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, on_signal)

    # During startup, right after Twisted installs its handlers and before any callWhenRunning work: a
    # command that says it is ready there (the sandbox's export line) must already stop once on a signal.
    reactor.addSystemEventTrigger("during", "startup", install)
    reactor.run()
