"""Bookies in BookKeeper's layout: registration (ephemeral, read-write or read-only, with the bookie's
service info) and cookies.
"""

from __future__ import annotations

import contextlib

from bkctl import limits
from bkctl.errors import (
    ConflictError,
    CorruptDataError,
    NodeExistsError,
    NotFoundError,
    ProtocolError,
    UsageError,
)
from bkctl.metadata.nodes import AVAILABLE, COOKIES, READONLY, LayoutBase, Versioned
from bkctl.protocol import metadata_format as mf
from bkctl.protocol.metadata_format import Cookie


def _check_bookie_name(bookie_id: str) -> None:
    if not bookie_id or "/" in bookie_id or bookie_id in (".", "..", READONLY):
        raise UsageError(f"bad bookie id {bookie_id!r}")
    if len(bookie_id) > limits.METADATA_PATH_LENGTH_MAX // 4:
        raise UsageError(f"bookie id of {len(bookie_id)} characters is too long")


class BookiesLayout(LayoutBase):
    """`available/<bookie>`, `available/readonly/<bookie>` and `cookies/<bookie>`."""

    # --- bookies ------------------------------------------------------------------------------------

    def bookie_path(self, bookie_id: str, *, readonly: bool = False) -> str:
        _check_bookie_name(bookie_id)
        return self.path(AVAILABLE, READONLY, bookie_id) if readonly else self.path(AVAILABLE, bookie_id)

    def register_bookie(
        self,
        bookie_id: str,
        service_info: mf.BookieServiceInfo | None = None,
        *,
        readonly: bool = False,
    ) -> str:
        """Register a bookie with an ephemeral node of this store's session; return its path.

        Read-only registration removes our read-write node (and the other way round), as Java does.
        ConflictError if another session still holds the node (a previous incarnation whose session
        has not expired yet); idempotent for our own session.
        """
        path = self.bookie_path(bookie_id, readonly=readonly)
        data = mf.encode_bookie_service_info(service_info or mf.BookieServiceInfo())
        self.store.ensure_path(self.path(AVAILABLE, READONLY))
        try:
            self.store.create(path, data, ephemeral=True)
        except NodeExistsError:
            stat = self.store.exists(path)
            if stat is not None and stat.ephemeral_owner != self.store.session_id:
                raise ConflictError(
                    f"bookie {bookie_id} is still registered by session {stat.ephemeral_owner:#x} ({path})"
                ) from None
        self._unregister(self.bookie_path(bookie_id, readonly=not readonly))
        return path

    def unregister_bookie(self, bookie_id: str) -> None:
        """Remove the bookie's read-write and read-only registrations (if ours or not, both)."""
        self._unregister(self.bookie_path(bookie_id))
        self._unregister(self.bookie_path(bookie_id, readonly=True))

    def _unregister(self, path: str) -> None:
        with contextlib.suppress(NotFoundError):
            self.store.delete(path)

    def bookies(self, *, readonly: bool = False) -> list[str]:
        """Registered bookie ids: read-write (children of `available` but `readonly`) or read-only."""
        parent = self.path(AVAILABLE, READONLY) if readonly else self.path(AVAILABLE)
        names = self._children_or_none(parent) or []
        return [n for n in names if readonly or n != READONLY]

    def bookie_service_info(self, bookie_id: str, *, readonly: bool = False) -> mf.BookieServiceInfo:
        data, _ = self.store.get(self.bookie_path(bookie_id, readonly=readonly))
        return mf.decode_bookie_service_info(data)

    def bookie_rpc_address(self, bookie_id: str) -> tuple[str, int] | None:
        """Where a registered bookie takes requests: its `bookie-rpc` endpoint, as Java clients resolve
        ids; None when unregistered or not stated."""
        return self.bookie_endpoint(bookie_id, "bookie-rpc")

    def bookie_endpoint(self, bookie_id: str, protocol: str) -> tuple[str, int] | None:
        """Where a registered bookie serves `protocol` (`bookie-rpc`, `http`), from its read-write
        registration first, then read-only; None when unregistered or not stated."""
        for readonly in (False, True):
            data = self._data_or_none(self.bookie_path(bookie_id, readonly=readonly))
            if data is None:
                continue
            endpoints = mf.decode_bookie_service_info(data).endpoints
            for endpoint in endpoints:
                if endpoint.protocol == protocol and endpoint.host and endpoint.port > 0:
                    return endpoint.host, endpoint.port
            return None
        return None

    # --- cookies ------------------------------------------------------------------------------------

    def cookie_path(self, bookie_id: str) -> str:
        _check_bookie_name(bookie_id)
        return self.path(COOKIES, bookie_id)

    def cookie_bookies(self) -> list[str]:
        """Bookies that have a cookie: BookKeeper's "all bookies"."""
        return self._children_or_none(self.path(COOKIES)) or []

    def read_cookie(self, bookie_id: str) -> Versioned[Cookie] | None:
        path = self.cookie_path(bookie_id)
        node = self._node_or_none(path)
        if node is None:
            return None
        try:
            return Versioned(mf.decode_cookie(node[0]), node[1].version)
        except ProtocolError as exc:
            raise CorruptDataError(f"cookie {path}: {exc}") from exc

    def write_cookie(self, cookie: Cookie, version: int | None = None) -> int:
        """Create (version None) or CAS-replace the bookie's cookie; the node's new version."""
        path, data = self.cookie_path(cookie.bookie_id), mf.encode_cookie(cookie)
        if version is None:
            try:
                self.store.create(path, data, make_parents=True)
            except NodeExistsError:
                raise ConflictError(f"bookie {cookie.bookie_id} already has a cookie ({path})") from None
            return 0
        return self.store.set(path, data, version).version

    def delete_cookie(self, bookie_id: str, version: int = -1) -> None:
        self.store.delete(self.cookie_path(bookie_id), version)
