"""Compaction's scan against a plain reference, on generated entry logs: with a sound index, exactly the
records the index names come out, whatever their sizes and the read size; with a damaged index or log,
either the same records come out or the log is kept (`error`): never a live record missing from an old
log that compaction would then remove."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import index_format as ixf
from bkctl.server import live_records
from bkctl.server.live_records import LiveRecords

LOG_ID = 5
Record = tuple[int, int, bytes]  # ledger, entry, stored entry

records_st = st.lists(
    st.tuples(st.integers(1, 3), st.integers(0, 3000), st.booleans()),  # ledger, payload size, live
    min_size=1,
    max_size=60,
)
damage_st = st.sampled_from(["none", "mid-record", "past-end", "bad-size", "truncated"])


def _write(
    tmp: Path, spec: list[tuple[int, int, bool]]
) -> tuple[Path, dict[int, Path], list[Record], list[int]]:
    """The log, the index files, the live records in log order, and every record's start."""
    data = bytearray(ef.encode_header(ef.EntryLogHeader(ef.HEADER_V1)))
    next_entry = {1: 0, 2: 0, 3: 0}
    slots: dict[int, dict[int, int]] = {1: {}, 2: {}, 3: {}}
    live: list[Record] = []
    for n, (ledger_id, size, is_live) in enumerate(spec):
        entry_id = next_entry[ledger_id]
        next_entry[ledger_id] += 1
        body = struct.pack(">qq", ledger_id, entry_id) + bytes([n % 251]) * size
        if is_live:
            slots[ledger_id][entry_id] = ef.entry_location(LOG_ID, len(data) + 4)
            live.append((ledger_id, entry_id, body))
        data += ef.encode_record_size(len(body)) + body
    log = tmp / f"{LOG_ID}.log"
    log.write_bytes(bytes(data))
    paths = {}
    for ledger_id, locations in slots.items():
        paths[ledger_id] = tmp / f"{ledger_id}.idx"
        header = ixf.encode_header(ixf.IndexHeader(ixf.V1, b"key"))
        paths[ledger_id].write_bytes(header + ixf.encode_slots(locations))
    return log, paths, live


def _damage(how: str, log: Path, paths: dict[int, Path], live: list[Record]) -> None:
    """One damage to the first live record's slot or bytes."""
    ledger_id, entry_id, _ = live[0]
    index = bytearray(paths[ledger_id].read_bytes())
    slot = ixf.slot_offset(entry_id)
    location = int.from_bytes(index[slot : slot + 8], "big")
    start = (location & 0xFFFFFFFF) - 4
    data = bytearray(log.read_bytes())
    if how == "mid-record":
        index[slot : slot + 8] = ef.entry_location(LOG_ID, start + 4 + 7).to_bytes(8, "big")
    elif how == "past-end":
        index[slot : slot + 8] = ef.entry_location(LOG_ID, len(data) + 50).to_bytes(8, "big")
    elif how == "bad-size":
        data[start : start + 4] = (7).to_bytes(4, "big")
    elif how == "truncated":
        data = data[: start + 30]  # the first live record cut short, everything after it gone
    paths[ledger_id].write_bytes(bytes(index))
    log.write_bytes(bytes(data))


def _scan(log: Path, paths: dict[int, Path], batch_bytes: int) -> tuple[list[Record], str | None]:
    records = LiveRecords(LOG_ID, log, paths)
    data = log.read_bytes()
    out: list[Record] = []
    while (batch := records.next_batch(batch_bytes)) is not None:
        assert batch.spans is not None and batch.runs is not None
        joined = b"".join(data[at : at + length] for at, length in batch.spans)
        assert len(joined) == sum(size for *_, size in batch.runs)
        for k in range(len(batch)):
            start = batch.starts[k]
            size = int.from_bytes(joined[start : start + 4], "big")
            body = joined[start + 4 : start + 4 + size]
            old = batch.old[k]
            assert data[(old & 0xFFFFFFFF) : (old & 0xFFFFFFFF) + size] == body  # the old location's bytes
            out.append((batch.ledgers[k], batch.entries[k], body))
    return out, records.error


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=records_st, damage=damage_st, chunk=st.sampled_from([64, 700, 4096, 256 * 1024]))
def test_the_scan_finds_every_live_record_or_keeps_the_log(
    tmp_path_factory: pytest.TempPathFactory, spec: list[tuple[int, int, bool]], damage: str, chunk: int
) -> None:
    tmp = tmp_path_factory.mktemp("log")
    log, paths, live = _write(tmp, spec)
    if damage != "none" and live:
        _damage(damage, log, paths, live)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(live_records, "READ_CHUNK", chunk)
        patch.setattr(live_records, "RUN_TAIL", min(chunk, live_records.RUN_TAIL))
        found, error = _scan(log, paths, batch_bytes=5000)
    key = lambda record: record[:2]  # noqa: E731
    if damage == "none" or not live:
        assert error is None
        assert sorted(found, key=key) == sorted(live, key=key)
    elif error is None:
        assert sorted(found, key=key) == sorted(live, key=key)
    else:
        assert set(found) <= set(live)  # what was copied is live; the log is kept for the rest
