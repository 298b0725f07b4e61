"""Entry payloads that anyone can recompute from (ledger, entry) alone: the checker needs no copy of
what the writers sent, only which entries were acknowledged."""

from __future__ import annotations

import hashlib

SIZE_MIN = 16
SIZE_MAX = 512


def payload(ledger_id: int, entry_id: int) -> bytes:
    """16..512 bytes, a function of the ledger and entry ids."""
    digest = hashlib.blake2b(f"{ledger_id}:{entry_id}".encode(), digest_size=16).digest()
    size = SIZE_MIN + int.from_bytes(digest[:2], "big") % (SIZE_MAX - SIZE_MIN + 1)
    return (digest * (size // len(digest) + 1))[:size]
