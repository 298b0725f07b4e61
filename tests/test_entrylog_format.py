"""Entry log codec: golden Java log, header, records, padding, ledgers map, locations, lastId."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bkctl.errors import ProtocolError
from bkctl.model import DigestType
from bkctl.protocol import entry
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol.entrylog_format import EntryLogHeader, RecordKind
from bkctl.protocol.scanning import ScanStop, StopStatus
from tests.conftest import JAVA_BOOKIES
from tests.storage_builders import entry_log_bytes, packaged

LEDGERS = JAVA_BOOKIES / "bookie1" / "ledgers" / "current"


def scan_all(
    data: bytes, start: int = ef.HEADER_SIZE
) -> tuple[list[tuple[int, RecordKind, bytes]], ScanStop]:
    items: list[tuple[int, RecordKind, bytes]] = []
    gen = ef.scan_records(data, start, 0, True)
    while True:
        try:
            offset, kind, body = next(gen)
        except StopIteration as stop:
            return items, stop.value
        items.append((offset, kind, bytes(body)))


def test_golden_java_entry_log() -> None:
    data = (LEDGERS / "0.log").read_bytes()
    assert ef.decode_header(data) == EntryLogHeader(1, 0, 0)
    assert ef.encode_header(EntryLogHeader(1)) == data[: ef.HEADER_SIZE]
    records, stop = scan_all(data)
    assert stop == ScanStop(StopStatus.END, len(data))
    assert len(records) == 903 and {k for _, k, _ in records} == {RecordKind.DATA}
    offset, _, body = records[0]
    assert offset == 1024 and ef.record_key(body) == (0, 0)
    assert entry.parse_entry(body, DigestType.CRC32).payload == b"L0-E0"
    assert ef.decode_last_id((LEDGERS / "lastId").read_bytes()) == 1
    assert ef.encode_last_id(1) == (LEDGERS / "lastId").read_bytes()


def test_locations_and_names() -> None:
    assert ef.entry_location(0, 36664) == 36664
    assert ef.split_location(ef.entry_location(5, 1028)) == (5, 1028)
    assert ef.log_file_name(0x1F) == "1f.log" and ef.parse_log_file_name("1f.log") == 0x1F
    assert ef.parse_log_file_name("lastId") is None
    with pytest.raises(ProtocolError):
        ef.entry_location(-1, 0)
    with pytest.raises(ProtocolError):
        ef.decode_last_id(b"zz\n")


@pytest.mark.parametrize("version", [0, 1])
def test_round_trip_with_ledgers_map(version: int) -> None:
    entries = [packaged(lid, e) for lid in (3, 1, 2) for e in range(5)]
    data, locations = entry_log_bytes(9, entries, version, with_map=True)
    header = ef.decode_header(data)
    assert header.version == version and header.ledgers_count == 3
    records, stop = scan_all(data)
    assert stop.status is StopStatus.END
    assert [b for _, k, b in records if k is RecordKind.DATA] == entries
    maps = [b for _, k, b in records if k is RecordKind.LEDGERS_MAP]
    assert [o for o, k, _ in records if k is RecordKind.LEDGERS_MAP] == [header.ledgers_map_offset]
    assert ef.decode_ledgers_map_batch(maps[0]) == [(1, 5 * (36 + 5 + 4)), (2, 225), (3, 225)]
    for (offset, _, body), data_entry in zip(records, entries, strict=False):
        assert locations[ef.record_key(data_entry)] == ef.entry_location(9, offset + 4)
        assert body == data_entry


def test_ledgers_map_batches_of_10000() -> None:
    items = [(i, i * 10) for i in range(25_000)]
    encoded = ef.encode_ledgers_map(items)
    records, stop = scan_all(encoded, 0)
    assert stop.status is StopStatus.END
    assert [len(ef.decode_ledgers_map_batch(b)) for _, _, b in records] == [10_000, 10_000, 5_000]
    assert struct.unpack_from(">i", encoded)[0] == 20 + 16 * 10_000


def test_padding_runs_and_tail() -> None:
    one = ef.encode_record(packaged(1, 0))
    # Like Java's scanner we step byte by byte: negative words, then zeros, up to the next size word.
    data = ef.encode_header(EntryLogHeader(1)) + one + b"\xff\xff\xff\xf0\0" + b"\0" * 100 + one + b"\0\0\0"
    records, stop = scan_all(data)
    kinds = [k for _, k, _ in records]
    assert kinds == [RecordKind.DATA, RecordKind.PADDING, RecordKind.DATA]
    assert records[1][0] == 1024 + len(one) and len(records[1][2]) == 105
    assert stop.status is StopStatus.END


def test_padding_across_buffers_resumes() -> None:
    one = ef.encode_record(packaged(1, 0))
    data = b"\0" * 50 + one
    gen = ef.scan_records(data[:30], 0, 0, False)
    items = list(_drain(gen))
    assert items[0][:2] == (0, RecordKind.PADDING)
    stop = items[-1]
    assert isinstance(stop, ScanStop) and stop.status is StopStatus.NEED_MORE
    rest = list(_drain(ef.scan_records(data[stop.position :], 0, stop.position, True)))
    assert [i[1] for i in rest[:-1]] == [RecordKind.PADDING, RecordKind.DATA]
    assert rest[-2][0] == 50


def _drain(gen):  # type: ignore[no-untyped-def]
    while True:
        try:
            yield next(gen)
        except StopIteration as stop:
            yield stop.value
            return


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (struct.pack(">i", 1 << 30), "exceeds"),
        (struct.pack(">i", 10) + b"\1" * 10, "shorter than ledger id"),
        (struct.pack(">i", 60) + b"\1" * 20, "truncated record"),
        (b"\0\1", "truncated size prefix"),
    ],
)
def test_scan_errors(tail: bytes, reason: str) -> None:
    data = ef.encode_header(EntryLogHeader(1)) + ef.encode_record(packaged(1, 0)) + tail
    records, stop = scan_all(data)
    assert len(records) == 1 and stop.status is StopStatus.ERROR
    assert reason in (stop.reason or "")


def test_header_errors() -> None:
    with pytest.raises(ProtocolError):
        ef.decode_header(b"BKLX" + bytes(1020))
    with pytest.raises(ProtocolError):
        ef.decode_header(b"BKLO\0\0\0\x05" + bytes(1016))
    with pytest.raises(ProtocolError):
        ef.decode_header(b"BKLO")
    with pytest.raises(ProtocolError):
        ef.decode_ledgers_map_batch(struct.pack(">qqi", -1, -2, 2) + bytes(16))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**62)), max_size=50))
def test_ledgers_map_round_trip(items: list[tuple[int, int]]) -> None:
    encoded = ef.encode_ledgers_map(items)
    records, _ = scan_all(encoded, 0)
    decoded = [pair for _, _, body in records for pair in ef.decode_ledgers_map_batch(body)]
    assert decoded == items


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=2000), st.booleans())
def test_arbitrary_bytes_raise_only_protocol_error(data: bytes, at_eof: bool) -> None:
    for decoder in (ef.decode_header, ef.decode_ledgers_map_batch, ef.decode_last_id, ef.record_key):
        with contextlib.suppress(ProtocolError):
            decoder(data)
    for _ in _bounded(ef.scan_records(data, 0, 0, at_eof), len(data) + 2):
        pass


def _bounded(gen, limit):  # type: ignore[no-untyped-def]
    for count, item in enumerate(_drain(gen)):
        assert count <= limit
        yield item


@pytest.mark.parametrize("bookie", ["bookie1", "bookie2", "bookie3"])
def test_every_java_entry_log_re_encodes_byte_for_byte(bookie: str) -> None:
    data = (JAVA_BOOKIES / bookie / "ledgers" / "current" / "0.log").read_bytes()
    records, stop = scan_all(data)
    assert stop == ScanStop(StopStatus.END, len(data))
    rebuilt = bytearray(ef.encode_header(ef.decode_header(data)))
    for offset, kind, body in records:
        assert (offset, kind) == (len(rebuilt), RecordKind.DATA)
        rebuilt += ef.encode_record(body)
    assert bytes(rebuilt) == data
