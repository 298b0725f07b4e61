"""The operator's read-only switch kept across restarts: Java's BOOKIE_STATUS file
(`<ledger dir>/current/BOOKIE_STATUS`, one line `1,READ_ONLY|READ_WRITE,<ms>`), written in every ledger
directory when `persistBookieStatusEnabled=true` or the switch asks for it (`--persist`).

Unlike Java's, only an operator's switch is written: read-only for a full disk or a broken journal never
is, so a bookie never comes back read-only because its disk was full once. The newest readable line of
the directories wins; an unreadable file is ignored with a warning (the bookie starts writable).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from bkctl.server.fileio import fsync_directory

log = logging.getLogger("bkctl.bookie")

STATUS_NAME: Final = "BOOKIE_STATUS"
LAYOUT_VERSION: Final = 1
READ_ONLY: Final = "READ_ONLY"
READ_WRITE: Final = "READ_WRITE"


def encode_status(read_only: bool, when_ms: int) -> bytes:
    return f"{LAYOUT_VERSION},{READ_ONLY if read_only else READ_WRITE},{when_ms}\n".encode()


def decode_status(data: bytes) -> tuple[bool, int] | None:
    """(read_only, written ms), or None for a line that is not Java's."""
    parts = data.decode("ascii", "replace").strip().split(",")
    if len(parts) != 3 or parts[0] != str(LAYOUT_VERSION) or parts[1] not in (READ_ONLY, READ_WRITE):
        return None
    try:
        return parts[1] == READ_ONLY, int(parts[2])
    except ValueError:
        return None


def write_status(ledger_dirs: Iterable[Path], read_only: bool) -> None:
    """Write the status durably in every ledger directory (temporary file, fsync, rename, dir fsync)."""
    data = encode_status(read_only, int(time.time() * 1000))
    for ledger_dir in ledger_dirs:
        current = ledger_dir / "current"
        temporary = current / f"{STATUS_NAME}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(f"{temporary}: short write")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, current / STATUS_NAME)
        fsync_directory(current)


def read_status(ledger_dirs: Iterable[Path]) -> bool | None:
    """The persisted switch (True: read-only), or None when no directory holds a readable one."""
    newest: tuple[int, bool] | None = None
    for ledger_dir in ledger_dirs:
        path = ledger_dir / "current" / STATUS_NAME
        try:
            decoded = decode_status(path.read_bytes()[:256])
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("%s: not readable (%s); ignored", path, exc.strerror)
            continue
        if decoded is None:
            log.warning("%s: not a bookie status line; ignored", path)
            continue
        if newest is None or decoded[1] > newest[0]:
            newest = (decoded[1], decoded[0])
    return None if newest is None else newest[1]
