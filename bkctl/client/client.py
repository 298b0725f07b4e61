"""`Client`: ledger operations over a metadata Layout and the bookies it lists: create, open with or
without recovery, delete. It makes `LedgerHandle`s (ledger.py) and recovers them (recovery.py), so it
sits above both; see docs/client.md.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from twisted.internet import defer, threads
from twisted.internet.defer import Deferred

from bkctl import limits
from bkctl.client import placement
from bkctl.client.bookie_client import BookieClients
from bkctl.client.ledger import LedgerHandle
from bkctl.client.recovery import recover
from bkctl.errors import UnauthorizedError, UsageError
from bkctl.metadata.layout import Layout
from bkctl.metadata.nodes import Versioned
from bkctl.model import DigestType, LedgerMetadata, LedgerState, Segment
from bkctl.sasl import ClientSasl, client_sasl_from_env
from bkctl.tls import TlsSettings, client_settings_from_env

T = TypeVar("T")


class Client:
    """Ledger operations over a metadata Layout and the bookies it lists, on one reactor."""

    def __init__(
        self,
        layout: Layout,
        reactor: Any = None,
        *,
        rng: random.Random | None = None,
        bookies: BookieClients | None = None,
        recovery_reads_in_flight: int = limits.CLIENT_RECOVERY_READS_IN_FLIGHT,
        protocol: str = "v2",
        tls: TlsSettings | None = None,
        sasl: ClientSasl | None = None,
        recovery_password: bytes = b"",
        recovery_digest: DigestType = DigestType.CRC32,
        placement_policy: placement.Placement | None = None,
        **bookie_options: int,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.layout = layout
        self.reactor = reactor
        self.rng = rng or random.Random()
        # Every chooser of bookies asks this one policy (client/placement.py).
        self.placement = placement_policy or placement.Placement(rng=self.rng)
        if bookies is None:
            tls = tls or client_settings_from_env(os.environ)  # `bkctl --tls ...` (cli.py)
            # protocol: the bookies' wire protocol, "v2" (default) or "v3" (BookieClients).
            sasl = sasl or client_sasl_from_env()  # `bkctl --conf ... --jaas ...` (bkctl/sasl.py)
            bookies = BookieClients(reactor, self._registered_address, protocol, tls, sasl, **bookie_options)
        self.bookies = bookies
        # Recovery reads kept in flight past the LAC; 1 reproduces a one-at-a-time reader's frames.
        self.recovery_reads_in_flight = recovery_reads_in_flight
        # An administrative open of a ledger whose metadata stores no password uses these (Java's
        # bookieRecoveryPasswd / bookieRecoveryDigestType client settings).
        self.recovery_password, self.recovery_digest = recovery_password, recovery_digest
        self.closing = False

    def in_thread(self, function: Callable[..., T], *args: Any) -> Deferred[T]:
        """Blocking metadata work, off the reactor thread."""
        return threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), function, *args)

    def close(self) -> Deferred[None]:
        self.closing = True
        return self.bookies.close()

    def _registered_address(self, bookie_id: str) -> Deferred[tuple[str, int] | None]:
        return self.in_thread(self.layout.bookie_rpc_address, bookie_id)

    # --- create -----------------------------------------------------------------------------------

    def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        *,
        digest: DigestType = DigestType.CRC32C,
        password: bytes = b"",
        custom_metadata: Sequence[tuple[str, bytes]] = (),
        ledger_id: int | None = None,
        ensemble: Sequence[str] | None = None,
    ) -> Deferred[LedgerHandle]:
        """A new OPEN ledger on `ensemble_size` random read-write bookies (or the given `ensemble`)."""
        return defer.ensureDeferred(
            self._create(
                ensemble_size,
                write_quorum,
                ack_quorum,
                digest,
                password,
                tuple(custom_metadata),
                ledger_id,
                ensemble,
            )
        )

    async def _create(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        digest: DigestType,
        password: bytes,
        custom: tuple[tuple[str, bytes], ...],
        ledger_id: int | None,
        chosen: Sequence[str] | None,
    ) -> LedgerHandle:
        _check_shape(ensemble_size, write_quorum, ack_quorum, password, custom)
        if chosen is None:
            available = await self.in_thread(self.layout.bookies)
            choice = await self.place(self.placement.new_ensemble, available, ensemble_size, write_quorum)
            ensemble = choice.bookies
        elif len(set(chosen)) != ensemble_size or len(chosen) != ensemble_size:
            raise UsageError(f"ensemble {list(chosen)} is not {ensemble_size} distinct bookies")
        else:
            ensemble = list(chosen)
        metadata = LedgerMetadata(
            ensemble_size,
            write_quorum,
            ack_quorum,
            (Segment(0, tuple(ensemble)),),
            digest=digest,
            password=password,
            ctime=int(time.time() * 1000),
            custom_metadata=custom,
        )
        created, version = await self.in_thread(self.layout.create_ledger, metadata, ledger_id)
        await self.bookies.resolve(ensemble)
        return LedgerHandle(self, created, metadata, version, password, digest, writable=True)

    def place(self, choose: Callable[..., T], *args: Any) -> Deferred[T]:
        """Run a placement method: in a thread when it may ask a rack source (a script, a znode
        cache), at once for the random policy."""
        if self.placement.aware:
            return self.in_thread(choose, *args)
        return defer.succeed(choose(*args))

    # --- open -------------------------------------------------------------------------------------

    def open_ledger(
        self,
        ledger_id: int,
        password: bytes | None = b"",
        *,
        recovery: bool = True,
        digest: DigestType | None = None,
        known: Versioned[LedgerMetadata] | None = None,
    ) -> Deferred[LedgerHandle]:
        """A read-only handle. With `recovery` an open ledger is fenced, recovered and closed first;
        without, the handle reads up to the last add confirmed the bookies report (never fences).

        `password=None` opens administratively, as Java's BookKeeperAdmin.openLedger: with the password
        and digest the metadata stores (format v3 stores them), else with the client's
        `recovery_password` and `recovery_digest` ("" and CRC32 by default, as Java's
        bookieRecoveryPasswd / bookieRecoveryDigestType). A given password must match a stored one
        (UnauthorizedError, exit 9). `known`: the ledger's metadata as just read by the caller (a
        recovery's scan), used instead of reading it again; a stale one fails its first update's
        compare-and-set, which reads it again."""
        return defer.ensureDeferred(self._open(ledger_id, password, recovery, digest, known))

    async def _open(
        self,
        ledger_id: int,
        password: bytes | None,
        recovery: bool,
        digest: DigestType | None,
        known: Versioned[LedgerMetadata] | None = None,
    ) -> LedgerHandle:
        versioned = known if known is not None else await self.in_thread(self.layout.read_ledger, ledger_id)
        md = versioned.value
        administrative_default = password is None and md.password is None
        fallback = DigestType.CRC32
        if password is None:
            password = self.recovery_password if md.password is None else md.password
            fallback = self.recovery_digest
        elif md.password is not None and md.password != password:
            raise UnauthorizedError(f"ledger {ledger_id}: wrong password")
        chosen = md.digest or digest or fallback
        if digest is not None and md.digest is not None and digest is not md.digest:
            raise UnauthorizedError(f"ledger {ledger_id}: digest is {md.digest.name}, not {digest.name}")
        await self.bookies.resolve(sorted({b for segment in md.segments for b in segment.ensemble}))
        handle = LedgerHandle(self, ledger_id, md, versioned.version, password, chosen, writable=False)
        if md.state is LedgerState.CLOSED:
            return handle
        if recovery:
            try:
                await recover(handle)
            except UnauthorizedError as exc:
                if administrative_default:  # the bookies refused "": say what would open it
                    hint = "its metadata stores no password: give --password"
                    raise UnauthorizedError(f"{exc}; {hint}") from exc
                raise
            return handle
        await handle.read_lac()
        return handle

    def delete_ledger(self, ledger_id: int) -> Deferred[None]:
        """Remove the ledger's metadata (bookies garbage-collect its entries later)."""
        return self.in_thread(self.layout.delete_ledger, ledger_id)


def _check_shape(
    ensemble_size: int,
    write_quorum: int,
    ack_quorum: int,
    password: bytes,
    custom: tuple[tuple[str, bytes], ...],
) -> None:
    if not limits.ENSEMBLE_SIZE_MAX >= ensemble_size >= write_quorum >= ack_quorum >= 1:
        raise UsageError(
            f"need {limits.ENSEMBLE_SIZE_MAX} >= ensemble >= write quorum >= ack quorum >= 1, got "
            f"{ensemble_size}/{write_quorum}/{ack_quorum}"
        )
    if len(password) > limits.PASSWORD_SIZE_MAX:
        raise UsageError(f"password of {len(password)} bytes: at most {limits.PASSWORD_SIZE_MAX}")
    if len(custom) > limits.CUSTOM_METADATA_MAX:
        raise UsageError(f"{len(custom)} custom metadata entries: at most {limits.CUSTOM_METADATA_MAX}")
