"""Journal codec: golden bytes from a real Java bookie, encoder rules, round trips, garbage."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bkctl.errors import ProtocolError
from bkctl.model import DigestType
from bkctl.protocol import entry
from bkctl.protocol import journal_format as jf
from bkctl.protocol.journal_format import RecordKind
from bkctl.protocol.scanning import StopStatus
from tests.conftest import JAVA_BOOKIES
from tests.storage_builders import PASSWORD, journal_bytes, ledger_journal_bodies, packaged

JOURNAL = JAVA_BOOKIES / "bookie1" / "journal" / "current" / "1a200fa8f95.txn"


def scan_all(
    data: bytes, version: int | None = None
) -> tuple[list[tuple[int, RecordKind, bytes]], jf.ScanStop]:
    version = jf.decode_header(data) if version is None else version
    items: list[tuple[int, RecordKind, bytes]] = []
    gen = jf.scan_records(data, jf.data_start(version), 0, version, True)
    while True:
        try:
            offset, kind, body = next(gen)
        except StopIteration as stop:
            return items, stop.value
        items.append((offset, kind, bytes(body)))


def test_golden_java_journal() -> None:
    data = JOURNAL.read_bytes()
    assert data[:8] == b"BKLG\x00\x00\x00\x06" and not any(data[8:512])
    assert jf.decode_header(data) == 6
    records, stop = scan_all(data)
    assert stop == jf.ScanStop(StopStatus.END, 463360)
    first_offset, kind, body = records[0]
    assert (first_offset, kind) == (512, RecordKind.MASTER_KEY)
    assert jf.decode_master_key(body) == (0, bytes.fromhex("3b56e4145429cee1d2a84df4f6a4cb8ad7173a46"))
    fences = [r for r in records if r[1] is RecordKind.FENCE]
    assert [(o, jf.record_key(b)) for o, _, b in fences] == [(393728, (2, jf.METAENTRY_ID_FENCE_KEY))]
    # Every padding record is exactly what our encoder writes at that position: same alignment rule.
    for offset, kind, body in records:
        if kind is RecordKind.PADDING:
            assert data[offset : offset + 8 + len(body)] == jf.encode_padding(offset)
            assert (offset + 8 + len(body)) % 512 == 0


def test_golden_data_records_rebuild_byte_for_byte() -> None:
    data = JOURNAL.read_bytes()
    records, _ = scan_all(data)
    for offset, kind, body in records[:50]:
        if kind is RecordKind.DATA:
            ledger_id, entry_id = jf.record_key(body)
            assert entry.digest_matches(body, DigestType.CRC32)
            assert body == packaged(ledger_id, entry_id, DigestType.CRC32)[:16] + body[16:]
            assert entry.parse_entry(body, DigestType.CRC32).payload == f"L{ledger_id}-E{entry_id}".encode()
            assert data[offset : offset + 4] == struct.pack(">i", len(body))


def test_golden_last_mark() -> None:
    raw = (JAVA_BOOKIES / "bookie1" / "ledgers" / "current" / "lastMark").read_bytes()
    assert jf.decode_last_mark(raw) == (1795312750485, 463360)
    assert jf.encode_last_mark(1795312750485, 463360) == raw
    assert jf.journal_file_name(1795312750485) == "1a200fa8f95.txn"
    assert jf.parse_journal_file_name("1a200fa8f95.txn") == 1795312750485


@pytest.mark.parametrize(
    ("version", "size", "start"), [(1, 0, 0), (2, 8, 8), (3, 8, 8), (4, 8, 8), (5, 512, 512), (6, 512, 512)]
)
def test_header_sizes(version: int, size: int, start: int) -> None:
    header = jf.encode_header(version)
    assert len(header) == size and jf.data_start(version) == start
    assert jf.decode_header(header + b"\0" * 8) == version


def test_header_errors() -> None:
    assert jf.decode_header(b"XXXX\0\0\0\x06") == 1  # no magic: V1, records from 0, like BookKeeper
    with pytest.raises(ProtocolError):
        jf.decode_header(b"BKLG\0\0\0\x07")
    with pytest.raises(ProtocolError):
        jf.encode_header(0)


@pytest.mark.parametrize(
    ("position", "pad"),
    [(512, None), (605, 411), (1073, 455), (1020, 508), (1017, 511), (1016, 0), (1018, 510), (1023, 505)],
)
def test_padding_rule(position: int, pad: int | None) -> None:
    # pad = align - pos % align; if pad < 8: pad = align - (8 - pad) else pad -= 8.
    assert jf.padding_size(position) == pad
    record = jf.encode_padding(position)
    if pad is not None:
        assert (position + len(record)) % 512 == 0 and len(record) == 8 + pad
        assert record[:4] == b"\xff\xff\xff\x00"


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6])
def test_round_trip_every_version(version: int) -> None:
    bodies = ledger_journal_bodies(7, 20, DigestType.MAC, version)
    data = journal_bytes(version, bodies, pad_every=3) + b"\0" * 4
    records, stop = scan_all(data)
    assert stop.status is StopStatus.END
    assert [b for _, k, b in records if k is not RecordKind.PADDING] == bodies
    kinds = {k for _, k, _ in records}
    assert (RecordKind.PADDING in kinds) == (version >= 5)
    assert (RecordKind.EXPLICIT_LAC in kinds) == (version >= 6)
    lac_bodies = [b for _, k, b in records if k is RecordKind.EXPLICIT_LAC]
    for body in lac_bodies:
        _ledger_id, lac_body = jf.decode_explicit_lac(body)
        assert entry.decode_lac_body(lac_body) == (7, 19)
        assert len(lac_body) == 16 + 20
    assert entry.mac_key(PASSWORD)


def test_resumable_scan_need_more() -> None:
    data = journal_bytes(6, ledger_journal_bodies(1, 30, DigestType.CRC32C), pad_every=4)
    expected, _ = scan_all(data)
    got: list[tuple[int, RecordKind, bytes]] = []
    position = 512
    cut = 700
    while True:
        buf = data[position:cut]
        gen = jf.scan_records(buf, 0, position, 6, cut >= len(data))
        while True:
            try:
                offset, kind, body = next(gen)
            except StopIteration as stop:
                result = stop.value
                break
            got.append((offset, kind, bytes(body)))
        if result.status is not StopStatus.NEED_MORE:
            break
        position, cut = result.position, cut + 333
    assert result.status is StopStatus.END and got == expected


@pytest.mark.parametrize(
    ("tail", "reason", "truncated"),
    [
        (struct.pack(">i", -5), "negative length", False),
        (struct.pack(">i", 1 << 30), "exceeds", False),
        (struct.pack(">i", 40) + b"\1" * 10, "truncated record", True),
        (b"\0\0", "truncated length prefix", True),
        (struct.pack(">ii", jf.PADDING_MASK, -3), "bad padding", False),
        (struct.pack(">ii", jf.PADDING_MASK, 100), "truncated padding", True),
        (struct.pack(">i", 8) + b"\1" * 8, "shorter than ledger id", False),
        (struct.pack(">i", 20) + struct.pack(">qqi", 1, -0x1000, 999), "master key length", False),
    ],
)
def test_scan_errors(tail: bytes, reason: str, truncated: bool) -> None:
    good = journal_bytes(6, [packaged(1, 0)])
    records, stop = scan_all(good + tail)
    assert len(records) == 1
    assert stop.status is StopStatus.ERROR and stop.position == len(good)
    assert reason in (stop.reason or "") and stop.truncated == truncated


def test_padding_is_an_error_before_v5() -> None:
    data = journal_bytes(4, [packaged(1, 0)]) + jf.encode_padding(100)
    _, stop = scan_all(data)
    assert stop.status is StopStatus.ERROR and "negative length" in (stop.reason or "")


def test_unknown_special_entry_id() -> None:
    data = journal_bytes(6, [struct.pack(">qq", 3, -0x77)])
    records, stop = scan_all(data)
    assert [k for _, k, _ in records] == [RecordKind.UNKNOWN] and stop.status is StopStatus.END


def test_encoder_bounds() -> None:
    with pytest.raises(ProtocolError):
        jf.encode_record(b"")
    with pytest.raises(ProtocolError):
        jf.encode_master_key(1, b"k" * 2000)
    with pytest.raises(ProtocolError):
        jf.decode_last_mark(b"\0" * 15)
    assert jf.parse_journal_file_name("VERSION") is None
    assert jf.journal_file_name(-1) == "ffffffffffffffff.txn"
    assert jf.parse_journal_file_name("ffffffffffffffff.txn") == -1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=16, max_size=300), max_size=20), st.integers(2, 6))
def test_round_trip_hypothesis(bodies: list[bytes], version: int) -> None:
    # Record bodies starting with a non-negative entry id are DATA whatever follows.
    bodies = [b[:8] + b"\0" + b[9:] for b in bodies]
    data = journal_bytes(version, bodies, pad_every=2)
    records, stop = scan_all(data)
    assert stop.status is StopStatus.END
    assert [b for _, k, b in records if k is not RecordKind.PADDING] == bodies


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=2000), st.integers(1, 6), st.booleans())
def test_arbitrary_bytes_raise_only_protocol_error(data: bytes, version: int, at_eof: bool) -> None:
    with contextlib.suppress(ProtocolError):
        jf.decode_header(data)
    gen = jf.scan_records(data, 0, 0, version, at_eof)
    for _ in range(len(data) + 2):
        try:
            offset, _kind, body = next(gen)
        except StopIteration:
            break
        assert 0 <= offset < len(data) or len(data) == 0
        for decoder in (jf.decode_master_key, jf.decode_explicit_lac, jf.record_key, jf.decode_last_mark):
            with contextlib.suppress(ProtocolError):
                decoder(body)


@pytest.mark.parametrize("bookie", ["bookie1", "bookie2", "bookie3"])
def test_every_java_journal_re_encodes_byte_for_byte(bookie: str) -> None:
    """Header, every record and every padding record re-encoded gives the file up to its end mark."""
    (path,) = (JAVA_BOOKIES / bookie / "journal" / "current").glob("*.txn")
    data = path.read_bytes()
    records, stop = scan_all(data)
    assert stop.status is StopStatus.END
    rebuilt = bytearray(jf.encode_header(jf.decode_header(data)))
    for offset, kind, body in records:
        assert offset == len(rebuilt)
        rebuilt += jf.encode_padding(offset) if kind is RecordKind.PADDING else jf.encode_record(body)
    assert bytes(rebuilt) == data[: stop.position]
    assert not any(data[stop.position :])  # the rest is preallocated zeros
