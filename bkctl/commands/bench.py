"""`bkctl bench write|read`: a load generator through the ledger client.

write: N ledgers, D adds in flight in total (spread over the ledgers), fixed-size entries, for T
seconds; read: D single-entry reads in flight over a closed ledger, cycling through its entries.
Prints ops/s, MB/s and latency percentiles (p50/p95/p99/max, from every operation's latency). A rich
progress line goes to stderr on a terminal only. See docs/commands/bench.md.
"""

from __future__ import annotations

import contextlib
import time
from array import array
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bkctl import limits
from bkctl.commands.ledger_options import (
    AckQuorumOption,
    DigestName,
    DigestOption,
    EnsembleOption,
    ProtocolOption,
    TimeoutOption,
    WriteQuorumOption,
)
from bkctl.commands.options import MetadataOption, PlacementConfOption, PlacementKeysOption
from bkctl.commands.output import OutputFormat, OutputOption, message, resolve, write_json, write_mapping
from bkctl.commands.running import run_client
from bkctl.errors import BkctlError, UsageError

if TYPE_CHECKING:
    from bkctl.client.client import Client
    from bkctl.client.ledger import LedgerHandle

app = typer.Typer(help="Load generators: write and read throughput and latency.", no_args_is_help=True)

DurationOption = Annotated[
    float, typer.Option("--duration", "-t", min=0.1, max=86_400, help="Seconds of load.")
]
OutstandingOption = Annotated[
    int,
    typer.Option("--outstanding", "-D", min=1, max=limits.CLIENT_ADDS_IN_FLIGHT_MAX, help="Ops in flight."),
]
EntrySizeOption = Annotated[
    int, typer.Option("--entry-size", "-s", min=1, max=limits.ENTRY_SIZE_MAX, help="Bytes per entry.")
]
WARMUP_S = 1.0  # local bound
PROGRESS_INTERVAL_S = 0.5  # local bound


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="bench")


class Recorder:
    """Latencies (ms, float32) of operations completed after the warm-up, and the measuring window."""

    def __init__(self, clock: Any, warmup_s: float) -> None:
        self.clock = clock
        self.latencies_ms = array("f")
        self.measure_from = clock() + warmup_s
        self.measure_to = 0.0
        self.done = 0  # every completed op, warm-up included (for the progress line)
        self.errors = 0

    def record(self, started: float) -> None:
        now = self.clock()
        self.done += 1
        if started >= self.measure_from:
            self.latencies_ms.append((now - started) * 1000)
            self.measure_to = now

    def summary(self, entry_size: int) -> dict[str, Any]:
        count = len(self.latencies_ms)
        elapsed = max(self.measure_to - self.measure_from, 1e-9)
        ordered = sorted(self.latencies_ms)
        return {
            "ops": count,
            "seconds": round(elapsed, 3),
            "ops_per_s": round(count / elapsed, 1),
            "mb_per_s": round(count * entry_size / elapsed / 1e6, 2),
            "latency_ms": {
                "p50": _percentile(ordered, 0.50),
                "p95": _percentile(ordered, 0.95),
                "p99": _percentile(ordered, 0.99),
                "max": round(ordered[-1], 3) if ordered else None,
            },
            "errors": self.errors,
        }


def _percentile(ordered: list[float], fraction: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 3)


# --- write ----------------------------------------------------------------------------------------------


@app.command("write")
def bench_write(
    ledgers: Annotated[int, typer.Option("--ledgers", "-l", min=1, max=1000, help="Ledgers written.")] = 1,
    entry_size: EntrySizeOption = 1024,
    outstanding: OutstandingOption = 512,
    duration: DurationOption = 10.0,
    ensemble_size: EnsembleOption = 3,
    write_quorum: WriteQuorumOption = 2,
    ack_quorum: AckQuorumOption = 2,
    digest: DigestOption = DigestName.crc32c,
    timeout_ms: TimeoutOption = None,
    protocol: ProtocolOption = None,
    conf: PlacementConfOption = None,
    placement: PlacementKeysOption = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Add fixed-size entries for --duration seconds with --outstanding adds in flight; print adds/s,
    MB/s and add latency percentiles (after a 1 s warm-up). The ledgers are closed, not deleted."""
    if outstanding < ledgers:
        raise UsageError(f"--outstanding {outstanding} is fewer than --ledgers {ledgers}")
    fmt = resolve(output)

    async def work(client: Client) -> dict[str, Any]:
        handles = [
            await client.create_ledger(ensemble_size, write_quorum, ack_quorum, digest=digest.to_type())
            for _ in range(ledgers)
        ]
        recorder = Recorder(time.perf_counter, min(WARMUP_S, duration / 4))
        await _WriteLoad(handles, b"x" * entry_size, outstanding, recorder).run(duration)
        for lh in handles:
            await lh.close()
        return _document("write", recorder, entry_size, outstanding, duration) | {
            "ledgers": [lh.ledger_id for lh in handles],
            "ensemble_size": ensemble_size,
            "write_quorum": write_quorum,
            "ack_quorum": ack_quorum,
        }

    _print(_run(metadata, work, timeout_ms, protocol, (conf, placement)), fmt)


def _run(metadata: str | None, work: Any, timeout_ms: int | None, protocol: str | None, placed: Any) -> Any:
    """The benchmark on a client; `placed`: (--conf, --placement)."""
    conf, placement = placed
    return run_client(
        metadata, work, request_timeout_ms=timeout_ms, protocol=protocol, conf=conf, placement=placement
    )


class _WriteLoad:
    """`outstanding` ops kept in flight until `stop_at`; subclasses say how an op starts (`_issuers`)."""

    unit = "adds"

    def __init__(
        self, handles: list[LedgerHandle], data: bytes, outstanding: int, recorder: Recorder
    ) -> None:
        self.handles, self.data, self.outstanding, self.recorder = handles, data, outstanding, recorder
        self.stop_at = 0.0
        self.in_flight = 0
        self.failure: BkctlError | None = None
        self.finished: Any = None

    async def run(self, duration: float) -> None:
        from twisted.internet.defer import Deferred

        self.stop_at = self.recorder.clock() + duration
        self.finished = Deferred()
        with _Progress(self.handles[0].client.reactor, self.recorder, duration, self.unit):
            for issue in self._issuers():
                issue()
            await self.finished
        if self.failure is not None:
            raise self.failure

    def _issuers(self) -> list[Callable[[], None]]:
        """One function per op to keep in flight, each starting the first op of its slot."""
        streams = [_AddStream(self, lh) for lh in self.handles]
        return [streams[i % len(streams)].issue for i in range(self.outstanding)]

    def _done(self, started: float, error: BaseException | None) -> bool:
        """Count one finished op; whether to issue another."""
        self.in_flight -= 1
        if error is None:
            self.recorder.record(started)
        else:
            self.recorder.errors += 1
            if self.failure is None:
                self.failure = error if isinstance(error, BkctlError) else BkctlError(repr(error))
        if self.failure is None and self.recorder.clock() < self.stop_at:
            return True
        if self.in_flight == 0 and not self.finished.called:
            self.finished.callback(None)
        return False


class _AddStream:
    """The adds of one ledger. Acknowledgements come in entry order, so their start times wait in a
    FIFO and one bound method serves every add (no closure per add: it cost as much as the add path)."""

    def __init__(self, load: _WriteLoad, lh: LedgerHandle) -> None:
        self.load, self.lh = load, lh
        self.started: deque[float] = deque()

    def issue(self) -> None:
        self.load.in_flight += 1
        self.started.append(self.load.recorder.clock())
        self.lh.add_callback(self.load.data, self.acknowledged)

    def acknowledged(self, _: int, error: BkctlError | None) -> None:
        if self.load._done(self.started.popleft(), error):
            self.issue()


# --- read -----------------------------------------------------------------------------------------------


@app.command("read")
def bench_read(
    ledger_id: Annotated[
        int | None,
        typer.Argument(help="A closed ledger to read (default: write --entries first).", show_default=False),
    ] = None,
    entries: Annotated[
        int, typer.Option("--entries", "-n", min=1, max=10_000_000, help="Entries written when no ledger.")
    ] = 10_000,
    entry_size: EntrySizeOption = 1024,
    outstanding: Annotated[
        int, typer.Option("--outstanding", "-D", min=1, max=limits.CLIENT_READS_IN_FLIGHT_MAX * 16)
    ] = 64,
    duration: DurationOption = 10.0,
    password: Annotated[
        str | None,
        typer.Option(
            "--password", help="Ledger password (default: the one an existing ledger's metadata stores)."
        ),
    ] = None,
    timeout_ms: TimeoutOption = None,
    protocol: ProtocolOption = None,
    conf: PlacementConfOption = None,
    placement: PlacementKeysOption = None,
    metadata: MetadataOption = None,
    output: OutputOption = None,
) -> None:
    """Single-entry reads, --outstanding in flight, cycling through a closed ledger's entries for
    --duration seconds; print reads/s, MB/s and read latency percentiles."""
    fmt = resolve(output)

    async def work(client: Client) -> dict[str, Any]:
        lh = await _ledger_to_read(client, ledger_id, entries, entry_size, password)
        if lh.last_add_confirmed < 0:
            raise UsageError(f"ledger {lh.ledger_id} has no entries")
        recorder = Recorder(time.perf_counter, min(WARMUP_S, duration / 4))
        await _ReadLoad(lh, outstanding, recorder).run(duration)
        size = lh.length // (lh.last_add_confirmed + 1)
        return _document("read", recorder, size, outstanding, duration) | {"ledgers": [lh.ledger_id]}

    _print(_run(metadata, work, timeout_ms, protocol, (conf, placement)), fmt)


async def _ledger_to_read(
    client: Client, ledger_id: int | None, entries: int, entry_size: int, password: str | None
) -> LedgerHandle:
    if ledger_id is not None:  # opened as an administrator: the stored password unless one is given
        secret = None if password is None else password.encode()
        return await client.open_ledger(ledger_id, secret, recovery=False)
    from bkctl.commands.ledger_write import write_entries

    lh = await client.create_ledger(3, 2, 2, password=(password or "").encode())
    message(f"bench: writing {entries} entries of {entry_size} bytes to ledger {lh.ledger_id}")
    await write_entries(lh, (b"r" * entry_size for _ in range(entries)))
    await lh.close()
    return lh


class _ReadLoad(_WriteLoad):
    unit = "reads"

    def __init__(self, lh: LedgerHandle, outstanding: int, recorder: Recorder) -> None:
        super().__init__([lh], b"", outstanding, recorder)
        self.next_entry = 0

    def _issuers(self) -> list[Callable[[], None]]:
        return [self._issue] * self.outstanding

    def _issue(self) -> None:
        lh = self.handles[0]
        self.in_flight += 1
        entry_id = self.next_entry
        self.next_entry = (entry_id + 1) % (lh.last_add_confirmed + 1)
        started = self.recorder.clock()
        lh.read(entry_id).addCallbacks(self._read, self._read_failed, (started,), {}, (started,))

    def _read(self, _: object, started: float) -> None:
        if self._done(started, None):
            self._issue()

    def _read_failed(self, failure: Any, started: float) -> None:
        if self._done(started, failure.value):
            self._issue()


# --- output ---------------------------------------------------------------------------------------------


def _document(
    mode: str, recorder: Recorder, entry_size: int, outstanding: int, duration: float
) -> dict[str, Any]:
    return {
        "mode": mode,
        "entry_size": entry_size,
        "outstanding": outstanding,
        "duration_s": duration,
        **recorder.summary(entry_size),
    }


def _print(document: dict[str, Any], fmt: OutputFormat) -> None:
    if fmt is OutputFormat.json:
        write_json(document)
        return
    flat = {k: v for k, v in document.items() if k != "latency_ms"}
    flat.update({f"latency_{k}_ms": v for k, v in document["latency_ms"].items()})
    write_mapping(flat, fmt)


class _Progress:
    """The load's bar (commands/progress.py): elapsed of the planned seconds, and the recent rate."""

    def __init__(self, reactor: Any, recorder: Recorder, duration: float, unit: str) -> None:
        self.reactor, self.recorder, self.duration, self.unit = reactor, recorder, duration, unit
        self.shown = contextlib.ExitStack()
        self.loop: Any = None

    def __enter__(self) -> _Progress:
        from twisted.internet.task import LoopingCall

        from bkctl.commands.progress import bar, wanted

        if not wanted():
            return self
        self.bar = self.shown.enter_context(bar("bench", self.duration, "s", rate=False))
        self.started = self.recorder.clock()
        self.last = (self.started, 0)
        self.loop = LoopingCall(self._tick)
        self.loop.clock = self.reactor
        self.loop.start(PROGRESS_INTERVAL_S, now=False)
        return self

    def _tick(self) -> None:
        now, done = self.recorder.clock(), self.recorder.done
        rate = (done - self.last[1]) / max(now - self.last[0], 1e-9)
        self.last = (now, done)
        self.bar.update(now - self.started, info=f"{rate:,.0f} {self.unit}/s")

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None and self.loop.running:
            self.loop.stop()
        self.shown.close()
