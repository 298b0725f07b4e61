"""The one error tree of bkctl, each class with a unique, documented exit code (docs/cli.md).

Every failure an operator can meet is one of these; `bkctl.cli.main` turns it into a one-line message
on stderr and the class's exit code, so shell scripts can branch on `$?` without parsing text.
"""

from __future__ import annotations

from enum import IntEnum, unique


@unique
class ExitCode(IntEnum):
    """Process exit codes. Never renumber: scripts depend on them."""

    OK = 0
    ERROR = 1
    USAGE = 2
    PROBLEMS_FOUND = 3
    NOT_FOUND = 4
    FENCED = 5
    UNAVAILABLE = 6
    CORRUPT = 7
    TIMEOUT = 8
    UNAUTHORIZED = 9
    CONFLICT = 10
    CLOSED = 11
    READ_ONLY = 12
    LOCKED = 13
    DECLINED = 14
    BUSY = 15
    INTERRUPTED = 130


class BkctlError(Exception):
    """Base of every error bkctl reports; `exit_code` is what the process exits with."""

    exit_code: ExitCode = ExitCode.ERROR


class UsageError(BkctlError):
    """Bad arguments or options that the parser could not catch (e.g. conflicting flags)."""

    exit_code = ExitCode.USAGE


class ProblemsFound(BkctlError):
    """A check ran to completion and found problems (audit, consistency check, under-replication)."""

    exit_code = ExitCode.PROBLEMS_FOUND


class NotFoundError(BkctlError):
    """A ledger, entry, bookie, file or metadata node does not exist."""

    exit_code = ExitCode.NOT_FOUND


class FencedError(BkctlError):
    """The ledger is fenced: a non-recovery add was refused (BookKeeper EFENCED)."""

    exit_code = ExitCode.FENCED


class UnavailableError(BkctlError):
    """A metadata store or bookie could not be reached or is not serving."""

    exit_code = ExitCode.UNAVAILABLE


class CorruptDataError(BkctlError):
    """Bytes on disk, on the wire or in metadata do not decode as the format says."""

    exit_code = ExitCode.CORRUPT


class ProtocolError(CorruptDataError):
    """A codec in bkctl.protocol met bytes it cannot decode; the only error codecs raise."""


class TimeoutError_(BkctlError):
    """An operation did not complete within its bound (named so it does not shadow the builtin)."""

    exit_code = ExitCode.TIMEOUT


class UnauthorizedError(BkctlError):
    """Wrong ledger password / master key (BookKeeper EUA)."""

    exit_code = ExitCode.UNAUTHORIZED


class AccessDeniedError(UnauthorizedError):
    """Credentials missing or refused: a ZooKeeper ACL (NoAuth), SASL with ZooKeeper or a bookie."""


class ConflictError(BkctlError):
    """A compare-and-swap lost, or a node that must not exist already does."""

    exit_code = ExitCode.CONFLICT


class BadVersionError(ConflictError):
    """A metadata write carried a stale version (ZooKeeper BadVersion)."""


class NodeExistsError(ConflictError):
    """A metadata node to be created already exists."""


class NotEmptyError(ConflictError):
    """A metadata node to be deleted still has children (ZooKeeper NotEmpty)."""


class EphemeralParentError(ConflictError):
    """A node was to be created under an ephemeral node, which may have no children (ZooKeeper rule)."""


class SessionExpiredError(UnavailableError):
    """The metadata session expired: its ephemeral nodes are gone; the store opens a new session."""


class LedgerClosedError(BkctlError):
    """The ledger is closed: it takes no more adds."""

    exit_code = ExitCode.CLOSED


class ReadOnlyError(BkctlError):
    """The bookie or store is read-only (BookKeeper EREADONLY), or a directory it must write is."""

    exit_code = ExitCode.READ_ONLY


def exit_code_table() -> list[tuple[int, str, str]]:
    """(code, name, meaning) for every exit code, as documented in docs/cli.md."""
    meanings = {
        ExitCode.OK: "success",
        ExitCode.ERROR: "unexpected error",
        ExitCode.USAGE: "bad arguments or options",
        ExitCode.PROBLEMS_FOUND: "the check ran and found problems",
        ExitCode.NOT_FOUND: "ledger, entry, bookie, file or node not found",
        ExitCode.FENCED: "ledger fenced",
        ExitCode.UNAVAILABLE: "metadata store or bookie unavailable",
        ExitCode.CORRUPT: "corrupt or undecodable data",
        ExitCode.TIMEOUT: "timed out",
        ExitCode.UNAUTHORIZED: "wrong password / master key, or credentials missing or refused",
        ExitCode.CONFLICT: "concurrent update lost or node exists",
        ExitCode.CLOSED: "ledger closed",
        ExitCode.READ_ONLY: "read-only",
        ExitCode.LOCKED: "a bookie directory is in use by another process",
        ExitCode.DECLINED: "declined at a confirmation prompt: nothing changed",
        ExitCode.BUSY: "another recover of that bookie is running",
        ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
    }
    return [(int(code), code.name, meanings[code]) for code in ExitCode]


class Declined(BkctlError):
    """The operator answered no at a confirmation prompt; nothing was changed."""

    exit_code = ExitCode.DECLINED


class Interrupted(BkctlError):
    """Ctrl-C stopped a command that first finished what it had started (and said how far it got)."""

    exit_code = ExitCode.INTERRUPTED


class DirectoryLockedError(BkctlError):
    """A bookie directory is in use by another process (its lock file is held)."""

    exit_code = ExitCode.LOCKED


class RecoveryBusyError(BkctlError):
    """Another `bkctl recover` holds the lock of a bookie to recover (in the metadata store)."""

    exit_code = ExitCode.BUSY
