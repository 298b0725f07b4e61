"""Check the digest of stored entries when the ledger's digest type may be unknown."""

from __future__ import annotations

import struct

from crc32c import crc32c

from bkctl.model import DigestType
from bkctl.protocol.entry import HEADER_SIZE, digest_matches, infer_digest, mac_key

_CRC32C_VALUE = struct.Struct(">I")


class DigestChecker:
    """Digest type and verdict per entry: the given type, else the one inferred for its ledger.

    Without `--digest`, the first entry of a ledger whose checksum matches (CRC32C, CRC32, or MAC when
    a password is given) fixes the ledger's type, so a later corrupt entry of that ledger is reported
    as failing rather than as unverifiable. Entries of a ledger whose type is still unknown give None.
    """

    def __init__(self, digest: DigestType | None = None, password: bytes | None = None) -> None:
        self.forced = digest
        self.key = mac_key(password) if password is not None else None
        self.by_ledger: dict[int, DigestType] = {}

    def check(self, ledger_id: int, entry: bytes | memoryview) -> tuple[DigestType | None, bool | None]:
        """(digest type, matches) of a packaged entry; (None, None) when nothing is known or matched."""
        digest = self.forced or self.by_ledger.get(ledger_id)
        if digest is not None:
            return digest, self._matches(entry, digest)
        digest = infer_digest(entry, self.key)
        if digest is None:
            return None, None
        self.by_ledger[ledger_id] = digest
        return digest, True

    def _matches(self, entry: bytes | memoryview, digest: DigestType) -> bool | None:
        if digest is DigestType.CRC32C:
            return crc32c_matches(entry)
        if digest is DigestType.MAC and self.key is None:
            return None  # cannot verify a MAC without the password
        return digest_matches(entry, digest, self.key)


def crc32c_matches(entry: bytes | memoryview) -> bool:
    """The CRC32C check without intermediate objects: the hot path of a summary scan."""
    if len(entry) < HEADER_SIZE + 4:
        return False
    view = memoryview(entry)
    expected: int = _CRC32C_VALUE.unpack_from(view, HEADER_SIZE)[0]
    return int(crc32c(view[HEADER_SIZE + 4 :], crc32c(view[:HEADER_SIZE]))) == expected


def split_payload(entry: bytes | memoryview, digest: DigestType | None) -> memoryview:
    """The payload of a packaged entry: after the 32-byte header and the digest of `digest`'s size.

    With an unknown digest, everything after the header (digest bytes included) is returned.
    """
    size = HEADER_SIZE + (digest.digest_size if digest is not None else 0)
    return memoryview(entry)[size:]
