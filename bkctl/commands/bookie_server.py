"""`bkctl bookie start|format|cookie`: run a bookie, wipe one, look at or fix its cookies.

Twisted and the server package are imported inside the commands, so `bkctl --help` stays fast.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bkctl.commands.bookie import app
from bkctl.commands.options import MetadataOption, confirm
from bkctl.commands.output import Column, OutputFormat, OutputOption, message, resolve, write_json, write_rows
from bkctl.commands.running import StartOutcome, freeze_heap, run_until_stopped
from bkctl.commands.sandbox_procs import die_with_parent
from bkctl.errors import UsageError

if TYPE_CHECKING:
    from bkctl.server.config import BookieConfig

cookie_app = typer.Typer(name="cookie", help="Show or update a bookie's cookies.", no_args_is_help=True)
app.add_typer(cookie_app, name="cookie")

ConfOption = Annotated[
    Path | None,
    typer.Option(
        "--conf", "-c", envvar="BKCTL_CONF", help="A bk_server.conf (Java properties); flags override it."
    ),
]
PortOption = Annotated[int | None, typer.Option("--port", "-p", help="bookiePort (0: any free port).")]
JournalDirOption = Annotated[
    list[Path] | None, typer.Option("--journal-dir", "-j", help="journalDirectories (repeat for more).")
]
LedgerDirOption = Annotated[
    list[Path] | None, typer.Option("--ledger-dir", "-l", help="ledgerDirectories (repeat for more).")
]
IndexDirOption = Annotated[
    list[Path] | None, typer.Option("--index-dir", "-i", help="indexDirectories (default: the ledger dirs).")
]
BookieIdOption = Annotated[
    str | None,
    typer.Option("--bookie-id", help="bookieId (default <advertised address or 127.0.0.1>:<port>)."),
]
AdvertisedOption = Annotated[str | None, typer.Option("--advertised-address", help="advertisedAddress.")]
StorageOption = Annotated[
    str | None,
    typer.Option(
        "--storage",
        help="Ledger storage: interleaved (.idx files, the default) or db (DbLedgerStorage, RocksDB"
        " indexes); sets ledgerStorageClass.",
    ),
]


def storage_class(storage: str | None) -> str | None:
    """The ledgerStorageClass of a --storage value (None: the conf's, else interleaved)."""
    from bkctl.server.ledger_storage import ENGINE_CLASSES

    if storage is None:
        return None
    if storage not in ENGINE_CLASSES:
        raise UsageError(f"--storage {storage}: expected one of {', '.join(ENGINE_CLASSES)}")
    return ENGINE_CLASSES[storage]


def register(root: typer.Typer) -> None:
    """The commands are added to the `bookie` group (bkctl.commands.bookie) at import."""


def _config(
    conf: Path | None,
    port: int | None = None,
    journal_dirs: list[Path] | None = None,
    ledger_dirs: list[Path] | None = None,
    index_dirs: list[Path] | None = None,
    bookie_id: str | None = None,
    advertised_address: str | None = None,
    **keys: str | None,
) -> BookieConfig:
    from bkctl.commands.options import conf_properties
    from bkctl.server.config import load_config

    properties = conf_properties(conf)
    flags: dict[str, str | None] = {
        "bookiePort": None if port is None else str(port),
        "journalDirectories": _join(journal_dirs),
        "ledgerDirectories": _join(ledger_dirs),
        "indexDirectories": _join(index_dirs),
        "bookieId": bookie_id,
        "advertisedAddress": advertised_address,
        **keys,
    }
    return load_config(properties, {k: v for k, v in flags.items() if v is not None})


def _join(paths: list[Path] | None) -> str | None:
    if not paths:
        return None
    if any("," in str(p) for p in paths):
        raise UsageError(f"a directory name contains ',': {[str(p) for p in paths]}")
    return ",".join(str(p) for p in paths)


def _metadata_uri(option: str | None, config: BookieConfig) -> str:
    from bkctl.metadata.store import resolve_metadata_uri

    return option or config.metadata_uri or resolve_metadata_uri(None)


# --- start --------------------------------------------------------------------------------------------


@app.command("start")
def start(
    conf: ConfOption = None,
    port: PortOption = None,
    journal_dir: JournalDirOption = None,
    ledger_dir: LedgerDirOption = None,
    index_dir: IndexDirOption = None,
    metadata: MetadataOption = None,
    bookie_id: BookieIdOption = None,
    advertised_address: AdvertisedOption = None,
    http_port: Annotated[
        int | None, typer.Option("--http-port", help="Serve /heartbeat, /api/v1/bookie/info, /metrics here.")
    ] = None,
    readonly: Annotated[
        bool, typer.Option("--readonly", "-r", help="Start read-only (forceReadOnlyBookie).")
    ] = False,
    bind: Annotated[str | None, typer.Option("--bind", help="bindAddress to listen on.")] = None,
    storage: StorageOption = None,
    port_file: Annotated[
        Path | None, typer.Option("--port-file", help="Write the bound port here once serving (for scripts).")
    ] = None,
    autorecovery: Annotated[
        bool,
        typer.Option(
            "--autorecovery",
            help="Also run an autorecovery daemon in this process (autoRecoveryDaemonEnabled).",
        ),
    ] = False,
) -> None:
    """Run a bookie in the foreground until SIGTERM or Ctrl-C (then flush, checkpoint, unregister)."""
    config = _config(
        conf,
        port,
        journal_dir,
        ledger_dir,
        index_dir,
        bookie_id,
        advertised_address,
        httpServerEnabled=None if http_port is None else "true",
        httpServerPort=None if http_port is None else str(http_port),
        forceReadOnlyBookie="true" if readonly else None,
        bindAddress=bind,
        ledgerStorageClass=storage_class(storage),
    )
    uri = _metadata_uri(metadata, config)
    for name in ("bkctl.bookie", "bkctl.recovery", "bkctl.http"):
        server_log = logging.getLogger(name)
        if server_log.getEffectiveLevel() > logging.INFO:
            server_log.setLevel(logging.INFO)  # a server logs what it does; -v adds debug
    _warn_unused_keys(config)
    from bkctl.commands.options import conf_properties

    properties = conf_properties(conf)
    with_daemon = autorecovery or properties.get("autoRecoveryDaemonEnabled", "").strip().lower() == "true"
    if with_daemon:
        from bkctl.tls import client_settings

        client_settings(properties)  # its TLS as a client must be usable before the bookie starts
    _run(config, uri, port_file, properties if with_daemon else None)


def _warn_unused_keys(config: BookieConfig) -> None:
    """Once, at WARNING: the conf's keys that change nothing here (a Java conf holds many)."""
    from bkctl.metadata.zk_auth import ENABLE_SECURITY_KEY
    from bkctl.recovery.config import DAEMON_KEYS
    from bkctl.sasl import CLIENT_KEYS as SASL_CLIENT_KEYS
    from bkctl.tls import CLIENT_KEYS

    used_elsewhere = {*DAEMON_KEYS, *CLIENT_KEYS, *SASL_CLIENT_KEYS, ENABLE_SECURITY_KEY}
    unused = [key for key in config.unused_keys if key not in used_elsewhere]
    if unused:
        logging.getLogger("bkctl.bookie").warning(
            "config keys not implemented by bkctl, ignored (%d): %s", len(unused), ", ".join(unused)
        )


def _run(config: BookieConfig, uri: str, port_file: Path | None, autorecovery: dict[str, str] | None) -> None:

    from functools import partial

    from twisted.internet import reactor as the_reactor

    from bkctl.commands.options import open_store_told
    from bkctl.server.service import BookieService, retry_policy

    reactor: Any = the_reactor
    # Started while ZooKeeper is away, the bookie waits for it (its metadata deadline): said on stderr.
    opener = partial(open_store_told, session_timeout_ms=config.zk_timeout_ms, retry=retry_policy(config))
    service = BookieService(config, uri, reactor, store_opener=opener)
    outcome = StartOutcome(reactor)
    daemon: list[Any] = []
    readers: list[Any] = []

    def serving(_: object) -> None:
        readers.append(attach_entry_reader(service, reactor, config))
        if autorecovery is not None:
            daemon.append(_start_daemon(service, reactor, autorecovery, outcome.failed))
        freeze_heap()  # the heap built so far (config, metadata, caches) lives as long as the bookie
        if port_file is not None:
            port_file.write_text(f"{service.port}\n")
        http = (
            "" if service.http_port is None else f" (admin http on {config.listen_host}:{service.http_port})"
        )
        message(f"bookie {service.bookie_id} serving on {config.listen_host}:{service.port}{http}")

    def begin() -> None:
        replay_shown = _replay_progress(service)
        service.start().addBoth(_passing(replay_shown.close)).addCallbacks(serving, outcome.failed)

    def stop() -> Any:
        from twisted.internet import defer

        stopping = daemon[0].stop() if daemon else defer.succeed(None)
        stopping.addBoth(lambda _: readers[0].close() if readers else None)
        return stopping.addBoth(lambda _: service.stop())

    reactor.callWhenRunning(begin)
    reactor.addSystemEventTrigger("before", "shutdown", stop)
    reactor.callWhenRunning(die_with_parent)  # after the stop handlers: a dead sandbox's SIGTERM stops well
    run_until_stopped(reactor)
    outcome.raise_failure("bookie failed to start")


def _replay_progress(service: Any) -> contextlib.ExitStack:
    """A bar over the journal bytes replayed on start, on a terminal, from the replay's first word (not
    while the metadata store is awaited) and only when there is something to replay; closing the stack
    ends it."""
    from bkctl.commands.progress import bar, wanted

    shown = contextlib.ExitStack()
    if not wanted():
        return shown
    seen = [0, 0]  # bytes replayed, bytes found to replay
    replay_bar: list[Any] = []

    def told(replayed: int, found: int) -> None:
        seen[0] += replayed
        seen[1] += found
        if not replay_bar and seen[1]:
            replay_bar.append(shown.enter_context(bar("replay", seen[1], unit_bytes=True)))
        if replay_bar:
            replay_bar[0].update(seen[0], seen[1])

    service.replay_progress = told
    return shown


def _passing(action: Callable[[], object]) -> Callable[[object], object]:
    """A callback that runs `action` and hands the result (or failure) on unchanged."""

    def run(result: object) -> object:
        action()
        return result

    return run


class AdminClient:
    """The ledger client of the admin endpoints `ledger/read`, `sanity`, `autorecovery/bookie` and
    `autorecovery/decommission` (Java's bookie and AutoRecoveryMain have a BookKeeperAdmin for them):
    opened at the first call, on the process's reactor and metadata session, with its TLS keys."""

    def __init__(self, layout: Any, bookie_id: str, reactor: Any, properties: dict[str, str]) -> None:
        self._layout, self._bookie_id, self._reactor, self._properties = (
            layout,
            bookie_id,
            reactor,
            properties,
        )
        self._client: Any = None

    def __call__(self, ledger_id: int, first: int, last: int) -> Any:
        from twisted.internet.defer import ensureDeferred

        return ensureDeferred(self._read(ledger_id, first, last))

    async def _read(self, ledger_id: int, first: int, last: int) -> list[tuple[int, bytes]]:
        from bkctl.recovery.checker import admin_open

        handle = await admin_open(self._opened(), ledger_id, recovery=False)
        end = handle.last_add_confirmed if last < 0 else min(last, handle.last_add_confirmed)
        if end < first:
            return []
        return [(entry.entry_id, entry.payload) for entry in await handle.read(first, end)]

    def sanity(self) -> Any:
        """Java's sanity test on this bookie alone (`bkctl bookie sanity`'s): True when it passed."""
        from twisted.internet.defer import ensureDeferred

        return ensureDeferred(self._sanity())

    async def _sanity(self) -> bool:
        from bkctl.commands.smoke import sanity_one

        row = await sanity_one(self._opened(), self._bookie_id, 10)
        return bool(row["ok"])

    def bookie_infos(self) -> Any:
        """Java's `BookKeeper.getBookieInfo()`: {bookie id: (free, total disk bytes)} of each registered
        read-write bookie that answers GET_BOOKIE_INFO (one that fails or times out is left out, as
        Java's BookieInfoReader leaves it out)."""
        from twisted.internet.defer import ensureDeferred

        return ensureDeferred(self._bookie_infos())

    async def _bookie_infos(self) -> dict[str, tuple[int, int]]:
        from twisted.internet import threads
        from twisted.internet.defer import Deferred, DeferredList

        from bkctl.protocol import wire_v3

        bookies = sorted(await threads.deferToThread(self._layout.bookies))
        pool = self._opened().bookies
        asked: list[Deferred[tuple[int, int] | None]] = []
        for bookie in bookies:
            answered: Deferred[tuple[int, int] | None] = Deferred()

            def told(rc: int, body: bytes, answered: Deferred[tuple[int, int] | None] = answered) -> None:
                if rc != 0 or len(body) != wire_v3.BOOKIE_INFO_BODY.size:
                    answered.callback(None)
                    return
                total, free = wire_v3.BOOKIE_INFO_BODY.unpack(body)
                answered.callback((free, total))

            pool.v3(bookie).bookie_info(told)
            asked.append(answered)
        results = await DeferredList(asked, consumeErrors=True)
        return {b: info for b, (ok, info) in zip(bookies, results, strict=True) if ok and info is not None}

    def _opened(self) -> Any:
        from bkctl.client.client import Client
        from bkctl.tls import client_settings

        if self._client is None:
            tls = client_settings(self._properties)  # the process's TLS keys, as a client's
            self._client = Client(self._layout, self._reactor, tls=tls)
        return self._client

    def recover_bookie(self, bookie: str, delete_cookie: bool) -> Any:
        from twisted.internet.defer import ensureDeferred

        from bkctl.commands.recover import recover_bookie

        return ensureDeferred(recover_bookie(self._opened(), bookie, delete_cookie))

    def decommission(self, bookie: str) -> Any:
        from twisted.internet.defer import ensureDeferred

        from bkctl.commands.recover import decommission

        return ensureDeferred(decommission(self._opened(), bookie))

    def close(self) -> Any:
        return self._client.close() if self._client is not None else None


def attach_entry_reader(service: Any, reactor: Any, config: BookieConfig) -> AdminClient:
    reader = AdminClient(service.layout, service.bookie_id, reactor, dict(config.properties))
    service.entry_reader, service.sanity_check = reader, reader.sanity
    service.bookie_infos = reader.bookie_infos
    return reader


def _start_daemon(service: Any, reactor: Any, properties: dict[str, str], failed: Any) -> Any:
    """Autorecovery beside the bookie, on its metadata session; copies go to this bookie (as Java's)."""
    from bkctl.recovery.config import daemon_config
    from bkctl.recovery.daemon import autorecovery_daemon
    from bkctl.recovery.policy import placement_from_properties
    from bkctl.tls import client_settings

    auditor_config, worker_config = daemon_config(properties)
    daemon = autorecovery_daemon(
        service.layout, reactor, service.bookie_id, local_bookie=service.bookie_id,
        auditor_config=auditor_config, worker_config=worker_config,
        tls=client_settings(properties),  # the bookie's TLS keys as a client's, as Java's
        placement_policy=placement_from_properties(properties, service.layout.store),
    )  # fmt: skip
    daemon.start().addErrback(failed)
    from bkctl.recovery.metrics import daemon_lines

    service.extra_metrics.append(lambda: daemon_lines(daemon, "replication_"))  # on the bookie's /metrics
    return daemon


# --- format -------------------------------------------------------------------------------------------


@app.command("format")
def format_(
    conf: ConfOption = None,
    journal_dir: JournalDirOption = None,
    ledger_dir: LedgerDirOption = None,
    index_dir: IndexDirOption = None,
    metadata: MetadataOption = None,
    bookie_id: BookieIdOption = None,
    port: PortOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Wipe the bookie's journal, ledger and index directories and delete its cookie (its data is gone:
    the cluster must re-replicate its ledgers)."""
    from bkctl.commands.options import open_layout
    from bkctl.server import cookies
    from bkctl.server.dirlock import locked

    config = _config(conf, port, journal_dir, ledger_dir, index_dir, bookie_id)
    the_id = _bookie_id(config)
    dirs = ", ".join(str(d) for d in cookies.all_dirs(config))
    if not yes:
        confirm(
            f"Wipe {dirs} and the cookie of bookie {the_id}?",
            declined=f"bookie {the_id} not formatted",
            needs_yes=f"format bookie {the_id}",
        )
    with (
        locked(cookies.labelled_dirs(config), "bkctl bookie format"),
        open_layout(_metadata_uri(metadata, config)) as layout,
    ):
        removed = cookies.format_bookie(config, layout, the_id)
    for what in removed:
        message(f"removed {what}")
    message(f"bookie {the_id} formatted")


def _bookie_id(config: BookieConfig) -> str:
    """The id the cookies were written for (a bookie started on port 0 named its real port), else
    the configured one."""
    from bkctl.server import cookies

    if config.bookie_id:
        return config.bookie_id
    for directory in cookies.all_dirs(config):
        found = cookies.read_local_cookie(directory).cookie
        if found is not None and found.bookie_id:
            return found.bookie_id
    if config.port == 0:
        raise UsageError("no cookie names this bookie and the port is 0: give --bookie-id or --port")
    return config.resolved_bookie_id()


# --- cookie show / update -----------------------------------------------------------------------------

COOKIE_COLUMNS = (
    Column("location", "LOCATION"),
    Column("bookie_id", "BOOKIE"),
    Column("instance_id", "INSTANCE"),
    Column("journal_dirs", "JOURNAL DIRS"),
    Column("ledger_dirs", "LEDGER DIRS"),
    Column("index_dirs", "INDEX DIRS"),
    Column("layout_version", "LAYOUT", numeric=True),
    Column("problem", "PROBLEM"),
)


@cookie_app.command("show")
def cookie_show(
    conf: ConfOption = None,
    journal_dir: JournalDirOption = None,
    ledger_dir: LedgerDirOption = None,
    index_dir: IndexDirOption = None,
    metadata: MetadataOption = None,
    bookie_id: BookieIdOption = None,
    port: PortOption = None,
    output: OutputOption = None,
) -> None:
    """Every cookie of the bookie: each directory's current/VERSION and the metadata store's."""
    from bkctl.commands.options import open_layout
    from bkctl.server import cookies

    fmt = resolve(output)
    config = _config(conf, port, journal_dir, ledger_dir, index_dir, bookie_id)
    the_id = _bookie_id(config)
    found = [cookies.read_local_cookie(d) for d in cookies.all_dirs(config)]
    with open_layout(_metadata_uri(metadata, config)) as layout:
        found.append(cookies.read_metadata_cookie(layout, the_id))
    rows = [_cookie_row(s) for s in found]
    if fmt is OutputFormat.json:
        write_json(rows)
    else:
        write_rows(rows, COOKIE_COLUMNS, fmt)


def _cookie_row(stored: Any) -> dict[str, Any]:
    cookie = stored.cookie
    if cookie is None:
        problem = stored.problem or "no cookie"
        return {"location": stored.location, "problem": problem} | dict.fromkeys(
            ("bookie_id", "instance_id", "journal_dirs", "ledger_dirs", "index_dirs", "layout_version")
        )
    return {
        "location": stored.location,
        "bookie_id": cookie.bookie_id,
        "instance_id": cookie.instance_id,
        "journal_dirs": list(cookie.journal_dirs),
        "ledger_dirs": list(cookie.ledger_dirs),
        "index_dirs": None if cookie.index_dirs is None else list(cookie.index_dirs),
        "layout_version": cookie.layout_version,
        "problem": None,
    }


@cookie_app.command("update")
def cookie_update(
    conf: ConfOption = None,
    journal_dir: JournalDirOption = None,
    ledger_dir: LedgerDirOption = None,
    index_dir: IndexDirOption = None,
    metadata: MetadataOption = None,
    bookie_id: BookieIdOption = None,
    port: PortOption = None,
    advertised_address: AdvertisedOption = None,
) -> None:
    """Rewrite the cookies to this configuration (BookKeeper's updatecookie): for a disk that moved,
    or a new bookie id. The bookie must be stopped; a new bookie id gets the old one's cookie."""
    from bkctl.commands.options import open_layout
    from bkctl.server import cookies
    from bkctl.server.dirlock import locked

    config = _config(conf, port, journal_dir, ledger_dir, index_dir, bookie_id, advertised_address)
    if not config.bookie_id and config.port == 0:
        raise UsageError("cookie update needs the bookie's id: give --bookie-id or --port")
    the_id = config.resolved_bookie_id()
    with (
        locked(cookies.labelled_dirs(config), "bkctl bookie cookie update"),
        open_layout(_metadata_uri(metadata, config)) as layout,
    ):
        if the_id in layout.bookies() or the_id in layout.bookies(readonly=True):
            from bkctl.errors import ConflictError

            raise ConflictError(
                f"bookie {the_id} is registered (running?): stop it before updating its cookies"
            )
        _, written = cookies.update_cookies(config, layout, the_id)
    for what in written:
        message(f"wrote {what}")
