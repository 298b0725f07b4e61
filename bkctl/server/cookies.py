"""A bookie's cookies: `current/VERSION` in every journal, ledger and index directory, and
`<root>/cookies/<bookie id>` in the metadata store. Blocking code (the service calls it in a thread).

Like BookKeeper, a bookie refuses to start when any cookie disagrees with its configuration (bookie id,
directories, cluster instance id): a disk mounted in the wrong place or a bookie pointed at another
cluster must not serve, or acknowledge, data it does not have.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from bkctl.errors import ConflictError, CorruptDataError, NotFoundError, ProtocolError
from bkctl.metadata.layout import Layout
from bkctl.protocol import metadata_format as mf
from bkctl.protocol.metadata_format import Cookie
from bkctl.server.config import BookieConfig
from bkctl.server.fileio import write_durably

log = logging.getLogger("bkctl.bookie")

VERSION_FILE = "VERSION"
CURRENT = "current"


@dataclass(frozen=True)
class StoredCookie:
    """One cookie found: where (a VERSION file path, or the metadata node path) and what, or why not."""

    location: str
    cookie: Cookie | None
    problem: str | None = None
    version: int | None = None  # the metadata node's version, for a CAS update


def all_dirs(config: BookieConfig) -> list[Path]:
    """Journal, ledger and index directories, each once, in that order."""
    return list(dict.fromkeys([*config.journal_dirs, *config.ledger_dirs, *config.effective_index_dirs]))


def labelled_dirs(config: BookieConfig) -> list[tuple[str, Path]]:
    """(kind, directory) for every directory of the bookie, each once: what a message names it."""
    labelled = [("journal directory", d) for d in config.journal_dirs]
    labelled += [("ledger directory", d) for d in config.ledger_dirs]
    labelled += [("index directory", d) for d in config.effective_index_dirs]
    first: dict[Path, str] = {}
    for kind, directory in labelled:
        first.setdefault(directory, kind)  # a directory named twice keeps its first kind
    return [(kind, directory) for directory, kind in first.items()]


def expected_cookie(config: BookieConfig, bookie_id: str, instance_id: str | None) -> Cookie:
    return Cookie.create(
        bookie_id,
        [str(d) for d in config.journal_dirs],
        [str(d) for d in config.ledger_dirs],
        instance_id,
        None if config.index_dirs is None else [str(d) for d in config.index_dirs],
    )


def read_local_cookie(directory: Path) -> StoredCookie:
    path = directory / CURRENT / VERSION_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return StoredCookie(str(path), None)
    except OSError as exc:
        return StoredCookie(str(path), None, f"unreadable: {exc}")
    try:
        return StoredCookie(str(path), mf.decode_cookie(data))
    except ProtocolError as exc:
        return StoredCookie(str(path), None, f"not a cookie: {exc}")


def read_metadata_cookie(layout: Layout, bookie_id: str) -> StoredCookie:
    path = layout.cookie_path(bookie_id)
    try:
        found = layout.read_cookie(bookie_id)
    except CorruptDataError as exc:
        return StoredCookie(path, None, str(exc))
    if found is None:
        return StoredCookie(path, None)
    return StoredCookie(path, found.value, version=found.version)


def write_local_cookie(directory: Path, cookie: Cookie) -> None:
    """Write `current/VERSION` atomically and durably (temp file, fsync, rename, fsync the dir)."""
    current = directory / CURRENT
    current.mkdir(parents=True, exist_ok=True)
    write_durably(current / VERSION_FILE, mf.encode_cookie(cookie))


def has_data(directory: Path) -> bool:
    """Whether `current/` holds anything but a cookie (journals, entry logs, index files, lastMark)."""
    current = directory / CURRENT
    if not current.is_dir():
        return False
    return any(p.name not in (VERSION_FILE, VERSION_FILE + ".tmp") for p in current.iterdir())


def check_cookies(config: BookieConfig, layout: Layout, bookie_id: str) -> Cookie:
    """Verify (or, on a bookie's first start, write) every cookie; return this bookie's cookie.

    Raises NotFoundError when the cluster is not initialised and ConflictError naming every
    difference when a cookie disagrees.
    """
    instance_id = layout.instance_id()
    if instance_id is None:
        raise NotFoundError(
            f"no BookKeeper cluster at {layout.root} in the metadata store: run `bkctl cluster init` first"
        )
    expected = expected_cookie(config, bookie_id, instance_id)
    dirs = all_dirs(config)
    local = [read_local_cookie(d) for d in dirs]
    remote = read_metadata_cookie(layout, bookie_id)
    if all(s.cookie is None and s.problem is None for s in [*local, remote]):
        return _first_start(config, layout, dirs, expected)
    problems = _problems(expected, [*local, remote])
    if problems:
        raise ConflictError(
            f"bookie {bookie_id} refuses to start, its cookies do not match: "
            + "; ".join(problems)
            + " (a moved disk: `bkctl bookie cookie update`; a wiped one: `bkctl bookie format`)"
        )
    return expected


def _problems(expected: Cookie, stored: list[StoredCookie]) -> list[str]:
    problems: list[str] = []
    for found in stored:
        if found.problem is not None:
            problems.append(f"{found.location}: {found.problem}")
        elif found.cookie is None:
            problems.append(f"{found.location}: missing while other cookies exist")
        else:
            problems.extend(f"{found.location}: {p}" for p in mf.cookie_mismatch(expected, found.cookie))
    return problems


def _first_start(config: BookieConfig, layout: Layout, dirs: list[Path], cookie: Cookie) -> Cookie:
    with_data = [str(d) for d in dirs if has_data(d)]
    if with_data:
        raise ConflictError(
            f"directories {', '.join(with_data)} hold data but no cookie: refusing to adopt them "
            "(`bkctl bookie format` wipes them)"
        )
    for directory in dirs:
        write_local_cookie(directory, cookie)
    layout.write_cookie(cookie)
    log.info(
        "bookie %s: first start, cookies written to %d directories and %s",
        cookie.bookie_id,
        len(dirs),
        layout.cookie_path(cookie.bookie_id),
    )
    return cookie


def update_cookies(config: BookieConfig, layout: Layout, bookie_id: str) -> tuple[Cookie, list[str]]:
    """Rewrite every cookie to match `config` (BookKeeper's updatecookie, for a disk that moved or a new
    bookie id). The cluster's instance id is kept; a local cookie of another cluster is refused.
    Returns the new cookie and what was written."""
    instance_id = layout.instance_id()
    if instance_id is None:
        raise NotFoundError(f"no BookKeeper cluster at {layout.root}: run `bkctl cluster init` first")
    dirs = all_dirs(config)
    local = [read_local_cookie(d) for d in dirs]
    old_ids = {s.cookie.bookie_id for s in local if s.cookie is not None}
    foreign = [
        s.location for s in local if s.cookie is not None and s.cookie.instance_id not in (None, instance_id)
    ]
    if foreign:
        raise ConflictError(
            f"cookies {', '.join(foreign)} belong to another cluster (instance id is not {instance_id}); "
            "refusing to update them"
        )
    if not any(s.cookie is not None for s in local):
        raise NotFoundError(
            f"no cookie in {', '.join(map(str, dirs))}: nothing to update (a new bookie just starts)"
        )
    cookie = expected_cookie(config, bookie_id, instance_id)
    written = []
    for directory in dirs:
        write_local_cookie(directory, cookie)
        written.append(str(directory / CURRENT / VERSION_FILE))
    remote = read_metadata_cookie(layout, bookie_id)
    layout.write_cookie(cookie, remote.version)
    written.append(layout.cookie_path(bookie_id))
    for old_id in sorted(old_ids - {bookie_id}):
        _delete_old_cookie(layout, old_id)
        written.append(f"deleted {layout.cookie_path(old_id)}")
    return cookie, written


def _delete_old_cookie(layout: Layout, old_id: str) -> None:
    if old_id in layout.bookies() or old_id in layout.bookies(readonly=True):
        raise ConflictError(f"bookie {old_id} is still registered: stop it before renaming its cookie")
    with contextlib.suppress(NotFoundError):
        layout.delete_cookie(old_id)


def format_bookie(config: BookieConfig, layout: Layout | None, bookie_id: str) -> list[str]:
    """Wipe `current/` of every directory and delete the metadata cookie; what was removed."""
    if layout is not None and (bookie_id in layout.bookies() or bookie_id in layout.bookies(readonly=True)):
        raise ConflictError(f"bookie {bookie_id} is registered (running?): stop it before formatting")
    removed = []
    for directory in all_dirs(config):
        current = directory / CURRENT
        if current.is_dir():
            _remove_tree(current)
            removed.append(str(current))
    if layout is not None:
        try:
            layout.delete_cookie(bookie_id)
            removed.append(layout.cookie_path(bookie_id))
        except NotFoundError:
            pass
    return removed


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path)
