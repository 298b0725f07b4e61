"""Opening a metadata store from its URI: the one place that knows every backend.

It sits above `store.py` (the API) and the backends that implement it, so none of them imports upward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from bkctl import limits
from bkctl.metadata.layout import Layout
from bkctl.metadata.retry import RetryPolicy
from bkctl.metadata.store import (
    MetadataLocation,
    MetadataStore,
    check_session_timeout,
    default_sqlite_path,
    parse_metadata_uri,
)


def open_store(
    uri: str | MetadataLocation,
    *,
    session_timeout_ms: int = limits.METADATA_SESSION_TIMEOUT_MS,
    connect_timeout_ms: int = limits.METADATA_CONNECT_TIMEOUT_MS,
    retry: RetryPolicy | None = None,
    wait_for_server: bool = False,
) -> MetadataStore:
    """Open the store a metadata URI names; UnavailableError (one line) if it cannot be reached in time.

    `retry`: how operations ride through outages (default: RetryPolicy.from_env(), docs/metadata.md).
    `wait_for_server`: for daemons, a ZooKeeper that is away at the start is waited for up to the retry
    deadline instead of the connect timeout.
    """
    location = parse_metadata_uri(uri) if isinstance(uri, str) else uri
    check_session_timeout(session_timeout_ms)
    if location.backend == "sqlite":
        from bkctl.metadata.sqlite import SqliteStore

        assert location.path is not None
        return SqliteStore(
            location.path,
            session_timeout_ms=session_timeout_ms,
            connect_timeout_ms=connect_timeout_ms,
            create_dirs=location.path == default_sqlite_path(),
            retry=retry,
        )
    from bkctl.metadata.zookeeper import ZooKeeperStore

    return ZooKeeperStore(
        location.hosts,
        session_timeout_ms=session_timeout_ms,
        connect_timeout_ms=connect_timeout_ms,
        retry=retry,
        wait_for_server=wait_for_server,
    )


@contextmanager
def layout_at(uri: str) -> Iterator[Layout]:
    """The cluster layout at `uri` (its store and ledgers root), closed on exit; no initialized check."""
    location = parse_metadata_uri(uri)
    with open_store(location) as store:
        yield Layout(store, location.root)
