"""`bkctl sandbox`: a local cluster for trying bkctl, in the foreground until Ctrl-C.

Bookies run in this process, on one reactor, with their data under --data-dir and, unless --metadata
says otherwise, an SQLite metadata store inside it (a user's other clusters are never touched). Ports
are fixed (--base-port, default 3181..): cookies name bookie ids (host:port), so a sandbox restarted on
the same data dir finds its bookies again. `--demo` writes, reads, checks and fences a ledger, prints
what it did and stops. See docs/commands/sandbox.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bkctl import limits
from bkctl.commands.options import check_output_dir
from bkctl.commands.output import OutputFormat, OutputOption, message, resolve, write_mapping, write_text
from bkctl.commands.running import StartOutcome, run_until_stopped
from bkctl.errors import UsageError

if TYPE_CHECKING:
    from bkctl.server.service import BookieService

DEFAULT_BASE_PORT = 3181


def register(root: typer.Typer) -> None:
    root.command("sandbox")(sandbox)


def default_data_dir() -> Path:
    home = os.environ.get("BKCTL_HOME")
    return Path(home) / "sandbox" if home else Path("bkctl-sandbox")


def sandbox(
    bookies: Annotated[
        int | None,
        typer.Option(
            "--bookies", "-n", min=1, max=limits.SANDBOX_BOOKIES_MAX, help="Bookies (default 3; --demo: 4)."
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            "-d",
            help="Bookie data (and SQLite metadata); default ./bkctl-sandbox or $BKCTL_HOME/sandbox.",
            show_default=False,
        ),
    ] = None,
    metadata: Annotated[
        str | None,
        typer.Option(
            "--metadata",
            help="Metadata store URI (default: sqlite://<data dir>/metadata.db).",
            show_default=False,
        ),
    ] = None,
    base_port: Annotated[
        int | None,
        typer.Option(
            "--base-port",
            min=0,
            max=65535 - limits.SANDBOX_BOOKIES_MAX,
            help="Bookie i listens on base + i - 1 (default 3181; 0: any free ports, not restartable; "
            "--demo defaults to 0).",
            show_default=False,
        ),
    ] = None,
    processes: Annotated[
        bool,
        typer.Option("--processes", help="Run each bookie in its own process (for benchmarks)."),
    ] = False,
    demo: Annotated[
        bool, typer.Option("--demo", help="Write, read back, check and fence a ledger, print it, stop.")
    ] = False,
    no_autorecovery: Annotated[
        bool, typer.Option("--no-autorecovery", help="Do not run an autorecovery daemon for the cluster.")
    ] = False,
    no_restart: Annotated[
        bool,
        typer.Option("--no-restart", help="With --processes: leave a bookie that dies down (say so only)."),
    ] = False,
    storage: Annotated[
        str,
        typer.Option(
            "--storage",
            help="Bookies' ledger storage: interleaved (.idx files) or db (DbLedgerStorage: RocksDB).",
        ),
    ] = "interleaved",
    output: OutputOption = None,
) -> None:
    """Start a local cluster: N bookies on an embedded SQLite store; stays up until Ctrl-C / SIGTERM.

    Prints `export BKCTL_METADATA=...` and the bookie ids; other terminals use them to run commands.
    """
    fmt = resolve(output)
    if no_restart and not processes:
        raise UsageError("--no-restart goes with --processes (in one process, no bookie dies alone)")
    root = (data_dir or default_data_dir()).absolute()
    check_output_dir(root, "--data-dir")
    uri = metadata or f"sqlite://{root / 'metadata.db'}"
    port = base_port if base_port is not None else (0 if demo else DEFAULT_BASE_PORT)
    count = bookies if bookies is not None else (4 if demo else 3)
    from bkctl.commands.bookie_server import storage_class

    storage_class(storage)  # a bad value is a usage error before anything starts
    sandbox = _Sandbox(root, uri, count, port, fmt, demo, processes, restart=not no_restart)
    sandbox.storage = storage
    sandbox.autorecovery = not no_autorecovery
    leftovers = _Leftovers(root, own_store=metadata is None)
    try:
        root.mkdir(parents=True, exist_ok=True)
        _init_cluster(uri)
        sandbox.run()
    except Exception as exc:
        # A start that failed leaves nothing it created, unless its error points at a file there (a
        # bookie's log, to read why it did not serve).
        if not sandbox.announced and str(root) not in str(exc):
            leftovers.remove()
        raise


class _Leftovers:
    """What a sandbox start creates in its data directory, removed when the start fails: everything new
    when the metadata store is the sandbox's own SQLite file (nothing outside names those bookies); with
    an outside store (its cookies name them) only new directories holding no file."""

    def __init__(self, root: Path, *, own_store: bool) -> None:
        self.root, self.own_store = root, own_store
        self.existed = root.exists()
        self.before = {p.name for p in root.iterdir()} if self.existed else set()

    def remove(self) -> None:
        import shutil

        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            if path.name in self.before or not (self.own_store or not _holds_files(path)):
                continue
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        if not self.existed and not any(self.root.iterdir()):
            self.root.rmdir()


def _holds_files(path: Path) -> bool:
    return not path.is_dir() or any(p.is_file() for p in path.rglob("*"))


def _init_cluster(uri: str) -> None:
    """`cluster init` on first use; an existing cluster is kept."""
    from bkctl.commands.options import open_layout

    with open_layout(uri, initialized=False) as layout:
        if layout.instance_id() is None:
            instance = layout.init_cluster()
            message(f"cluster initialized (instance id {instance})")


class _Sandbox:
    def __init__(
        self,
        root: Path,
        uri: str,
        count: int,
        base_port: int,
        fmt: OutputFormat,
        demo: bool,
        processes: bool,
        *,
        restart: bool = True,
    ) -> None:
        self.root, self.uri, self.count, self.base_port = root, uri, count, base_port
        self.fmt, self.demo, self.restart = fmt, demo, restart
        self.supervisor: Any = None
        self.autorecovery = True
        self.daemon: Any = None
        self.daemon_store: Any = None
        self.services: list[BookieService] = []
        self.processes = processes
        self.children: list[Any] = []
        self.child_ids: list[str] = []
        self.outcome: StartOutcome  # made with the reactor, in run()
        self.announced = False  # serving: the cluster is the operator's now, kept whatever happens
        self.storage = "interleaved"  # every bookie's --storage

    def run(self) -> None:
        from twisted.internet import reactor as the_reactor

        reactor: Any = the_reactor
        self.reactor = reactor
        if self.processes:
            from bkctl.commands.sandbox_procs import start_children

            storage = ("--storage", self.storage)
            self.children, self.child_ids = start_children(
                self.root, self.uri, self.count, self.base_port, storage
            )
        self.outcome = StartOutcome(reactor)
        reactor.callWhenRunning(lambda: self._go().addErrback(self.outcome.failed))
        reactor.addSystemEventTrigger("before", "shutdown", self._stop_all)
        run_until_stopped(reactor)
        self.outcome.raise_failure("sandbox failed")
        message("sandbox stopped")

    def _go(self) -> Any:
        from twisted.internet import defer

        return defer.ensureDeferred(self._start_and_maybe_demo())

    async def _start_and_maybe_demo(self) -> None:
        if not self.processes:
            for index in range(1, self.count + 1):
                self.services.append(await self._start_bookie(index))
        ids = self.child_ids or [str(s.bookie_id) for s in self.services]
        self._announce(ids)
        if self.autorecovery:
            await self._start_autorecovery()
        if self.outcome.stopping:
            return
        if self.children:
            from bkctl.commands.sandbox_procs import Supervisor

            self.supervisor = Supervisor(self.reactor, self.children, restart=self.restart)
            self.supervisor.start()
        if self.demo:
            from bkctl.commands.sandbox_demo import run_demo

            await run_demo(self.reactor, self.uri, self.fmt, self._kill_bookie if self.autorecovery else None)
            self.reactor.stop()
        else:
            message("sandbox running; Ctrl-C stops it")

    async def _start_autorecovery(self) -> None:
        """One autorecovery daemon for the cluster, in this process (BookieKeeper's AutoRecoveryMain)."""
        from twisted.internet import threads

        from bkctl.metadata.layout import Layout
        from bkctl.metadata.stores import open_store
        from bkctl.recovery.daemon import autorecovery_daemon
        from bkctl.recovery.worker import WorkerConfig

        store = await threads.deferToThread(open_store, self.uri)
        if self.outcome.stopping:  # stopped while the store opened: _stop_all has nothing of it to close
            await threads.deferToThread(store.close)
            return
        self.daemon_store = store
        # A sandbox is for seeing it work: an open ledger's writer gets 5 s, not Java's 30.
        config = WorkerConfig(open_ledger_grace_s=5.0, poll_interval_s=0.5)
        self.daemon = autorecovery_daemon(
            Layout(self.daemon_store), self.reactor, "sandbox-autorecovery", worker_config=config
        )
        await self.daemon.start()
        message("autorecovery running (an auditor and a replication worker; --no-autorecovery: none)")

    async def _kill_bookie(self, bookie_id: str) -> None:
        """The demo's dead machine: the bookie goes away (in-process: stopped; a child: SIGKILL)."""
        for child in self.children:
            if child.bookie_id == bookie_id:
                child.proc.kill()
                return
        await next(s for s in self.services if s.bookie_id == bookie_id).stop()

    async def _start_bookie(self, index: int) -> BookieService:
        from bkctl.commands.bookie_server import storage_class
        from bkctl.server.config import load_config
        from bkctl.server.service import BookieService

        base = self.root / f"bookie-{index}"
        port = 0 if self.base_port == 0 else self.base_port + index - 1
        config = load_config(
            {
                "bookiePort": str(port),
                "journalDirectories": str(base / "journal"),
                "ledgerDirectories": str(base / "ledgers"),
                "journalPreAllocSizeMB": "4",
                # admin HTTP (info, metrics, gc) on a free port, registered: `bkctl doctor` reads disks there
                "httpServerEnabled": "true",
                "httpServerPort": "0",
                "ledgerStorageClass": storage_class(self.storage) or "",
                "httpServerAdminEnabled": "true",  # a playground on 127.0.0.1: `bookie readonly` works
            }
        )
        service = BookieService(config, self.uri, self.reactor)
        await service.start()
        return service

    def _announce(self, ids: list[str]) -> None:
        self.announced = True
        document = {"metadata_uri": self.uri, "data_dir": str(self.root), "bookies": ids}
        if self.fmt is OutputFormat.json:
            # stdout holds one JSON value (the demo's document, with --demo): the line goes to stderr.
            message(f"export BKCTL_METADATA={self.uri}")
            if not self.demo:
                write_mapping(document, self.fmt)
            return
        write_text(f"export BKCTL_METADATA={self.uri}")
        write_mapping({"data_dir": str(self.root), "bookies": ",".join(ids)}, self.fmt)

    def _stop_all(self) -> Any:
        from twisted.internet import defer, threads

        if self.supervisor is not None:
            self.supervisor.stop()  # before the children get SIGTERM: their exits are no deaths
        # The daemon first: it would take the bookies going away for failures to repair.
        stopping = self.daemon.stop() if self.daemon is not None else defer.succeed(None)
        if self.daemon_store is not None:
            stopping.addBoth(lambda _: threads.deferToThread(self.daemon_store.close))
        stopping.addBoth(lambda _: defer.gatherResults([s.stop() for s in self.services], consumeErrors=True))
        if self.children:
            from bkctl.commands.sandbox_procs import stop_children

            stopping.addBoth(lambda _: threads.deferToThread(stop_children, self.children))
        return stopping
