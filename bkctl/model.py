"""Domain values shared by every layer: frozen dataclasses whose constructors enforce invariants."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from bkctl import limits
from bkctl.errors import ProtocolError, UsageError

# BookKeeper's special entry ids (journal records and wire requests).
LAST_ENTRY_ID = -1  # read request: "the last entry this bookie has"
INVALID_ENTRY_ID = -1  # last_entry_id of an empty ledger / LAC before the first add
METAENTRY_ID_LEDGER_KEY = -0x1000
METAENTRY_ID_FENCE_KEY = -0x2000
METAENTRY_ID_FORCE_LEDGER = -0x4000
METAENTRY_ID_LEDGER_EXPLICITLAC = -0x8000


class DigestType(Enum):
    """Entry digest types; `.value` is the number in ledger metadata (LedgerMetadataFormat.DigestType)."""

    CRC32 = 1
    MAC = 2
    CRC32C = 3
    DUMMY = 4

    @property
    def digest_size(self) -> int:
        return _DIGEST_SIZES[self]

    @classmethod
    def parse(cls, text: str) -> DigestType:
        """Accept BookKeeper's spellings (`crc32c`, `MAC`, `hmac`, `dummy`), case-insensitively."""
        name = text.strip().upper()
        if name == "HMAC":
            name = "MAC"
        try:
            return cls[name]
        except KeyError:
            raise UsageError(f"unknown digest type {text!r}: use crc32, crc32c, mac or dummy") from None


_BOOKIE_NAME = re.compile(r"[A-Za-z0-9:._-]{1,255}")
_DIGEST_SIZES = {DigestType.CRC32: 8, DigestType.MAC: 20, DigestType.CRC32C: 4, DigestType.DUMMY: 0}


class LedgerState(Enum):
    """Ledger states; `.value` is the number in LedgerMetadataFormat.State."""

    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3


@dataclass(frozen=True, order=True)
class BookieId:
    """A bookie's address identity, `host:port` (ids may also be names: see check_name)."""

    host: str
    port: int

    def __post_init__(self) -> None:
        if not self.host or any(c.isspace() or c in "/," for c in self.host):
            raise ValueError(f"bad bookie host {self.host!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"bad bookie port {self.port}")

    @classmethod
    def parse(cls, text: str) -> BookieId:
        """Parse `host:port`; raise UsageError with the offending text otherwise."""
        host, sep, port = text.strip().rpartition(":")
        try:
            if not sep or not port.isdigit():
                raise ValueError
            return cls(host, int(port))
        except ValueError:
            raise UsageError(f"bad bookie id {text!r}: expected host:port") from None

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @staticmethod
    def check_name(text: str) -> str:
        """A bookie id as Java 4.12+ allows (`bookieId`): host:port or a name of letters, digits and
        `:._-`, not `readonly`; UsageError otherwise. Clients find a named bookie by its registration."""
        if not _BOOKIE_NAME.fullmatch(text) or text == "readonly":
            raise UsageError(
                f"bad bookie id {text!r}: expected host:port or a name of letters, digits and :._-"
            )
        return text


@dataclass(frozen=True)
class Segment:
    """One ensemble of a ledger, serving entries from `first_entry_id` until the next segment's first."""

    first_entry_id: int
    ensemble: tuple[str, ...]


@dataclass(frozen=True)
class LedgerMetadata:
    """Ledger metadata as stored in the metadata store (BookKeeper LedgerMetadataFormat v3).

    Bookies in ensembles are kept as the exact strings stored, so metadata naming a bookie id that is not
    `host:port` still round-trips byte for byte.
    """

    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    segments: tuple[Segment, ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = INVALID_ENTRY_ID
    length: int = 0
    digest: DigestType | None = DigestType.CRC32C
    password: bytes | None = b""
    ctime: int | None = None
    custom_metadata: tuple[tuple[str, bytes], ...] = ()
    c_token: int | None = None
    # Whether field 9 (ackQuorumSize) was present when decoded; needed to re-encode byte for byte.
    ack_quorum_stored: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        if not limits.ENSEMBLE_SIZE_MAX >= self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise ProtocolError(
                f"ledger metadata needs E >= Qw >= Qa >= 1, got E={self.ensemble_size} "
                f"Qw={self.write_quorum} Qa={self.ack_quorum}"
            )
        if len(self.segments) > limits.SEGMENTS_MAX:
            raise ProtocolError(f"ledger metadata has {len(self.segments)} segments")
        previous = -1
        for segment in self.segments:
            if len(segment.ensemble) != self.ensemble_size:
                raise ProtocolError(
                    f"segment at entry {segment.first_entry_id} has {len(segment.ensemble)} bookies, "
                    f"ensemble size is {self.ensemble_size}"
                )
            if segment.first_entry_id < previous:
                raise ProtocolError("ledger metadata segments are not in entry order")
            previous = segment.first_entry_id

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def segment_for(self, entry_id: int) -> Segment:
        """The segment whose ensemble stores `entry_id`."""
        chosen = self.segments[0]
        for segment in self.segments:
            if segment.first_entry_id > entry_id:
                break
            chosen = segment
        return chosen

    def segment_last_entry(self, index: int) -> int:
        """Last entry id of segment `index` (the ledger's last entry, or LAC-unknown -1, for the last one)."""
        if index + 1 < len(self.segments):
            return self.segments[index + 1].first_entry_id - 1
        return self.last_entry_id
