"""Options shared by the commands that create and write ledgers (`ledger create|write|simpletest`,
`bench write`, `sandbox --demo`): quorums, digest, password, and the entry payloads they write; and the
--password of the commands that open an existing ledger as an operator."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer

from bkctl.errors import UsageError

if TYPE_CHECKING:
    from bkctl.model import DigestType


class DigestName(StrEnum):
    crc32 = "crc32"
    crc32c = "crc32c"
    mac = "mac"
    dummy = "dummy"

    def to_type(self) -> DigestType:
        from bkctl.model import DigestType

        return DigestType[self.name.upper()]


EnsembleOption = Annotated[int, typer.Option("--ensemble-size", "-E", min=1, help="Ensemble size.")]
WriteQuorumOption = Annotated[
    int, typer.Option("--write-quorum", "-Qw", min=1, help="Write quorum (copies of each entry).")
]
AckQuorumOption = Annotated[
    int, typer.Option("--ack-quorum", "-Qa", min=1, help="Ack quorum (copies before an add is acknowledged).")
]
DigestOption = Annotated[
    DigestName, typer.Option("--digest", case_sensitive=False, help="Entry digest type.")
]
PasswordOption = Annotated[
    str,
    typer.Option(
        "--password",
        envvar="BKCTL_LEDGER_PASSWORD",
        help="Ledger password (UTF-8; default empty).",
        show_default=False,
    ),
]
# Opening an existing ledger as an operator: without --password, the one its metadata stores (see
# bkctl.recovery.checker.admin_open); given, it must match the stored one.
AdminPasswordOption = Annotated[
    str | None,
    typer.Option(
        "--password",
        envvar="BKCTL_LEDGER_PASSWORD",
        help="Ledger password (UTF-8). Default: the one the ledger's metadata stores (format v3), "
        "else empty. Given, it must match the stored one (exit 9).",
        show_default=False,
    ),
]
TimeoutOption = Annotated[
    int | None,
    typer.Option(
        "--timeout-ms", min=1, help="Per-request bookie timeout (default 5000 ms).", show_default=False
    ),
]


class WireProtocol(StrEnum):
    v2 = "v2"
    v3 = "v3"


ProtocolOption = Annotated[
    WireProtocol | None,
    typer.Option(
        "--protocol",
        envvar="BKCTL_PROTOCOL",
        case_sensitive=False,
        help="Bookie wire protocol: v2 (default) or v3 (protobuf, Java's default; env BKCTL_PROTOCOL).",
        show_default=False,
    ),
]

TEMPLATE_DEFAULT = "L{ledger}-E{entry}"
FILLER = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def password_bytes(password: str) -> bytes:
    return password.encode("utf-8")


def admin_password(password: str | None) -> bytes | None:
    """--password of an administrative open: None opens with the stored password."""
    return None if password is None else password_bytes(password)


def check_template(template: str) -> str:
    """The template must format with `ledger` and `entry` only (a typo is a usage error, not a crash)."""
    try:
        template.format(ledger=0, entry=0)
    except (KeyError, IndexError, ValueError) as exc:
        raise UsageError(
            f"--template {template!r}: only {{ledger}} and {{entry}} may be used ({exc!r})"
        ) from None
    return template


def payload(ledger_id: int, entry_id: int, template: str, size: int | None) -> bytes:
    """The entry `entry_id` writes: the template's text, or with `size` that text padded with A-Z (or
    cut) to exactly `size` bytes, so a reader can check every byte."""
    text = template.format(ledger=ledger_id, entry=entry_id).encode("utf-8")
    if size is None:
        return text
    if len(text) >= size:
        return text[:size]
    missing = size - len(text) - 1
    repeats = missing // len(FILLER) + 1
    return (text + b"-" + FILLER * repeats)[:size]
