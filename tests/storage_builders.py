"""Build journals, entry logs and index files with our encoders, for the storage and inspect tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from bkctl.model import DigestType
from bkctl.protocol import entry, entrylog_format, index_format, journal_format

PASSWORD = b"testpasswd"


def packaged(
    ledger_id: int, entry_id: int, digest: DigestType = DigestType.CRC32C, payload: bytes | None = None
) -> bytes:
    key = entry.mac_key(PASSWORD) if digest is DigestType.MAC else None
    data = payload if payload is not None else f"L{ledger_id}-E{entry_id}".encode()
    return entry.package_entry(digest, ledger_id, entry_id, entry_id - 1, 10 * (entry_id + 1), data, key)


def journal_bytes(version: int, bodies: Iterable[bytes], pad_every: int = 0, alignment: int = 512) -> bytes:
    """A journal of `version` holding `bodies`; with pad_every=n a padding record after every n records."""
    out = bytearray(journal_format.encode_header(version))
    for count, body in enumerate(bodies, 1):
        out += journal_format.encode_record(body)
        if pad_every and version >= journal_format.V_PADDING and count % pad_every == 0:
            out += journal_format.encode_padding(len(out), alignment)
    return bytes(out)


def ledger_journal_bodies(ledger_id: int, entries: int, digest: DigestType, version: int = 6) -> list[bytes]:
    bodies = []
    if version >= journal_format.V_MASTER_KEY:
        bodies.append(journal_format.encode_master_key(ledger_id, entry.master_key(PASSWORD)))
    bodies += [packaged(ledger_id, e, digest) for e in range(entries)]
    if version >= journal_format.V_EXPLICIT_LAC:
        key = entry.mac_key(PASSWORD) if digest is DigestType.MAC else None
        lac_body = entry.encode_lac_body(digest, ledger_id, entries - 1, key)
        bodies.append(journal_format.encode_explicit_lac(ledger_id, lac_body))
    if version >= journal_format.V_FENCE:
        bodies.append(journal_format.encode_fence(ledger_id))
    return bodies


def entry_log_bytes(
    log_id: int, entries: Sequence[bytes], version: int = 1, with_map: bool = False
) -> tuple[bytes, dict[tuple[int, int], int]]:
    """An entry log of `entries` (packaged) and {(ledger, entry): index location} of each."""
    body = bytearray()
    locations = {}
    sizes: dict[int, int] = {}
    for data in entries:
        ledger_id, entry_id = entrylog_format.record_key(data)
        locations[(ledger_id, entry_id)] = entrylog_format.entry_location(
            log_id, entrylog_format.HEADER_SIZE + len(body) + 4
        )
        body += entrylog_format.encode_record(data)
        sizes[ledger_id] = sizes.get(ledger_id, 0) + len(data) + 4
    header = entrylog_format.EntryLogHeader(version)
    if with_map:
        map_offset = entrylog_format.HEADER_SIZE + len(body)
        body += entrylog_format.encode_ledgers_map(sorted(sizes.items()))
        header = entrylog_format.EntryLogHeader(version, map_offset, len(sizes))
    return entrylog_format.encode_header(header) + bytes(body), locations


def index_bytes(header: index_format.IndexHeader, locations: dict[int, int]) -> bytes:
    return index_format.encode_header(header) + index_format.encode_slots(locations)


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
