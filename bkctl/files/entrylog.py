"""Entry log files on disk: header, streamed records, per-ledger sizes (ledgers map or scan)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bkctl.errors import ProtocolError
from bkctl.files.chunks import FileScan, file_size, read_at
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol.entrylog_format import EntryLogHeader, RecordKind, ScanItem
from bkctl.protocol.scanning import ScanStop, StopStatus


@dataclass(frozen=True)
class EntryLogFile:
    path: Path
    log_id: int | None  # from the `<hex>.log` name
    size: int
    header: EntryLogHeader | None  # None: empty (preallocated) file, or a header we could not decode
    header_error: str | None = None

    @property
    def empty(self) -> bool:
        return self.size == 0


def open_entry_log(path: Path) -> EntryLogFile:
    """Read the header; a bad header is kept as `header_error` so the records can still be scanned."""
    size = file_size(path)
    log_id = ef.parse_log_file_name(path.name)
    if size == 0:
        return EntryLogFile(path, log_id, size, None)
    try:
        header = ef.decode_header(read_at(path, 0, ef.HEADER_SIZE))
    except ProtocolError as exc:
        return EntryLogFile(path, log_id, size, None, f"offset 0: {exc}")
    return EntryLogFile(path, log_id, size, header)


def entry_log_records(log: EntryLogFile, chunk_size: int = 0) -> FileScan[ScanItem]:
    """Every record after the 1024-byte header, the ledgers map batches included."""
    return FileScan(log.path, ef.HEADER_SIZE, _scan, chunk_size)


def _scan(buf: bytes, start: int, base: int, at_eof: bool) -> Any:
    return ef.scan_records(buf, start, base, at_eof)


@dataclass
class LedgerSizes:
    """Bytes per ledger in one entry log (each entry counted with its 4-byte size prefix)."""

    source: str  # "ledgers-map" or "scan"
    sizes: dict[int, int]
    stop: ScanStop | None


def ledger_sizes(log: EntryLogFile) -> LedgerSizes:
    """From the ledgers map when the header points to one, else by scanning every record."""
    if log.header is not None and log.header.ledgers_map_offset:
        return _sizes_from_map(log)
    sizes: dict[int, int] = {}
    scan = entry_log_records(log)
    for _, kind, body in scan:
        if kind is RecordKind.DATA:
            ledger_id = ef.record_key(body)[0]
            sizes[ledger_id] = sizes.get(ledger_id, 0) + len(body) + 4
    return LedgerSizes("scan", sizes, scan.stop)


def _sizes_from_map(log: EntryLogFile) -> LedgerSizes:
    assert log.header is not None
    sizes: dict[int, int] = {}
    scan = FileScan(log.path, log.header.ledgers_map_offset, _scan)
    for offset, kind, body in scan:
        problem = None
        if kind is RecordKind.LEDGERS_MAP:
            try:
                sizes.update(ef.decode_ledgers_map_batch(body))
            except ProtocolError as exc:
                problem = str(exc)
        elif kind is not RecordKind.PADDING:
            problem = f"{kind.value} record inside the ledgers map"
        if problem:
            return LedgerSizes("ledgers-map", sizes, ScanStop(StopStatus.ERROR, offset, problem))
    stop = scan.stop
    if stop is not None and not stop.is_error and len(sizes) != log.header.ledgers_count:
        reason = f"ledgers map holds {len(sizes)} ledgers, header says {log.header.ledgers_count}"
        stop = ScanStop(StopStatus.ERROR, log.header.ledgers_map_offset, reason)
    return LedgerSizes("ledgers-map", sizes, stop)
