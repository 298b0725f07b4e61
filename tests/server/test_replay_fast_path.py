"""Replay's fast path (runs of DATA records copied whole) against the record-by-record path.

Both paths must leave byte-identical entry logs and index files, and the same reads, for journals
mixing data, master key, fence, explicit LAC, unknown and padding records, across read chunk
boundaries, entry log rotations, mid-replay index writes and torn tails.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bkctl import limits
from bkctl.files.entrylog import entry_log_records, ledger_sizes, open_entry_log
from bkctl.model import DigestType
from bkctl.protocol import entry
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import journal_format as jf
from bkctl.protocol.wire import ReturnCode as RC
from bkctl.server import replay as replay_module
from bkctl.server import storage as storage_module
from bkctl.server.storage import Storage
from tests.server.helpers import KEY, Durable, ThreadedClock, abandon, config, ledger_dirs, packaged
from tests.storage_builders import journal_bytes, write

UNKNOWN_SPECIAL_ID = -0x3000  # no record kind of ours: replay skips it
Started = tuple[Storage, replay_module.ReplayReport]


def _body(ledger_id: int, entry_id: int, size: int) -> bytes:
    return packaged(ledger_id, entry_id, bytes([entry_id % 251]) * size)


def _lac(ledger_id: int, entry_id: int) -> bytes:
    lac_body = entry.encode_lac_body(DigestType.CRC32C, ledger_id, entry_id)
    return jf.encode_explicit_lac(ledger_id, lac_body)


def _unknown_special(ledger_id: int) -> bytes:
    return struct.pack(">qq", ledger_id, UNKNOWN_SPECIAL_ID)


def mixed_bodies() -> list[bytes]:
    """Five ledgers keyed at different times, a deleted one (no key), duplicates, a sparse entry id."""
    bodies = [jf.encode_master_key(1, KEY), jf.encode_master_key(2, KEY)]
    for entry_id in range(300):
        bodies.append(_body(1, entry_id, 10 + entry_id * 37 % 3000))
        bodies.append(_body(2, entry_id, 100))
        if entry_id == 50:
            bodies += [jf.encode_master_key(3, KEY), _body(99, 0, 40), jf.encode_fence(2)]
        if entry_id >= 50:
            bodies.append(_body(3, entry_id - 50, 500 + entry_id))
        if entry_id % 40 == 7:
            bodies += [_lac(1, entry_id), _body(99, entry_id, 40), _body(1, entry_id, 20)]  # a re-add
        if entry_id == 120:
            bodies += [jf.encode_master_key(4, KEY), _body(4, 5000, 64), _body(4, 0, 64)]
            bodies.append(_unknown_special(5))
    return bodies


def write_journal(directory: Path, data: bytes) -> Path:
    return write(directory / "journal" / "current" / jf.journal_file_name(7), data)


def replayed(directory: Path, fast: bool, monkeypatch: pytest.MonkeyPatch, **overrides: Any) -> Started:
    """A storage started on `directory` (replay done), with replay's fast path on or off."""
    with monkeypatch.context() as patch:
        if not fast:
            real = replay_module.replay
            patch.setattr(
                storage_module,
                "replay",
                lambda d, mark, apply, take=None, written=None, progress=None: real(
                    d, mark, apply, None, written, progress
                ),
            )
        storage = Storage(config(directory, **overrides), Durable(), ThreadedClock())
        return storage, storage.start()


def counted_takes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The records each call of replay's fast path takes, from now on."""
    taken: list[int] = []
    real_take = storage_module.take_runs

    def take(runs: Any, buffer: bytearray, pos: int, end: int) -> tuple[int, int]:
        stop, count = real_take(runs, buffer, pos, end)
        taken.append(count)
        return stop, count

    monkeypatch.setattr(storage_module, "take_runs", take)
    return taken


def close(*storages: Storage) -> None:
    for storage in storages:
        abandon(storage)
        storage._close_files(None)


def stored_files(directory: Path) -> Iterator[tuple[str, bytes]]:
    """Entry logs, index files and lastId (lastMark names the new journal, whose id is the time)."""
    current = directory / "ledgers" / "current"
    for path in sorted(current.rglob("*")):
        if path.is_file() and path.name != "lastMark":
            yield str(path.relative_to(current)), path.read_bytes()


def reads(storage: Storage, ledgers: range, entries: range) -> list[object]:
    found: list[object] = []
    for ledger_id in ledgers:
        found.append((storage.is_fenced(ledger_id), storage.explicit_lac(ledger_id)))
        found += [storage.read(ledger_id, entry_id) for entry_id in (*entries, -1)]
    return found


def assert_same_replay(
    tmp_path: Path, data: bytes, monkeypatch: pytest.MonkeyPatch, **overrides: Any
) -> tuple[Started, Started]:
    """Replay `data` with and without the fast path; both storages are returned started."""
    for name in ("fast", "slow"):
        write_journal(tmp_path / name, data)
    fast, fast_report = replayed(tmp_path / "fast", True, monkeypatch, **overrides)
    slow, slow_report = replayed(tmp_path / "slow", False, monkeypatch, **overrides)
    assert list(stored_files(tmp_path / "fast")) == list(stored_files(tmp_path / "slow"))
    assert reads(fast, range(7), range(310)) == reads(slow, range(7), range(310))
    assert fast.read(99, 0)[0] == RC.ENOLEDGER
    fast_report.seconds = slow_report.seconds = 0.0
    fast_report.stops = [stop.replace(str(tmp_path / "fast"), "") for stop in fast_report.stops]
    slow_report.stops = [stop.replace(str(tmp_path / "slow"), "") for stop in slow_report.stops]
    assert fast_report == slow_report
    return (fast, fast_report), (slow, slow_report)


@pytest.mark.parametrize("chunk_size", [16 * 1024, 64 * 1024 + 3, replay_module.READ_CHUNK_SIZE])
@pytest.mark.parametrize("log_size_limit", [1024 * 1024 * 1024, 50_000])
@pytest.mark.parametrize(
    ("slots_max", "slots_min"),
    # as shipped; rounds bounded by the maximum; rounds of 16 slots per ledger among 7 (the minimum 40)
    [(storage_module.REPLAY_SLOTS_MAX, storage_module.REPLAY_SLOTS_MIN), (97, 97), (10_000, 40)],
)
def test_mixed_journal_same_files_and_reads(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    chunk_size: int,
    log_size_limit: int,
    slots_max: int,
    slots_min: int,
) -> None:
    monkeypatch.setattr(replay_module, "READ_CHUNK_SIZE", chunk_size)
    monkeypatch.setattr(storage_module, "REPLAY_SLOTS_MAX", slots_max)
    monkeypatch.setattr(storage_module, "REPLAY_SLOTS_MIN", slots_min)
    monkeypatch.setattr(storage_module, "REPLAY_SLOTS_PER_LEDGER", 16)
    data = journal_bytes(6, mixed_bodies(), pad_every=13)
    (fast, report), (slow, _) = assert_same_replay(
        tmp_path, data + bytes(4096), monkeypatch, log_size_limit=log_size_limit
    )
    assert fast.read(1, 47) == (RC.EOK, _body(1, 47, 20))  # the re-add, journaled last, wins
    assert fast.read(4, 5000) == (RC.EOK, _body(4, 5000, 64)) and fast.read(4, 1) == (RC.ENOENTRY, b"")
    assert fast.read(3, -1) == (RC.EOK, _body(3, 249, 799))
    assert fast.is_fenced(2) and fast.explicit_lac(1) == _lac(1, 287)[20:]
    assert report.skipped == 1 + 8 + 1 and not report.stops  # the deleted ledger's records, the unknown one
    if log_size_limit < 1024 * 1024:
        assert fast._writer.rotations > 3
    close(fast, slow)


def test_log_rotated_by_a_record_by_record_add_counts_the_runs_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each ledger's first entry goes record by record; when it is the one that rotates the entry log,
    the full log's ledgers map must still count the runs the fast path wrote to it just before."""
    bodies = []
    for ledger_id in range(1, 41):
        bodies.append(jf.encode_master_key(ledger_id, KEY))
        bodies += [_body(ledger_id, entry_id, 50 + ledger_id) for entry_id in range(3)]
    (fast, _), (slow, _) = assert_same_replay(
        tmp_path, journal_bytes(6, bodies), monkeypatch, log_size_limit=4096
    )
    assert fast._writer.rotations >= 3
    for path in sorted((tmp_path / "fast" / "ledgers" / "current").glob("*.log")):
        log = open_entry_log(path)
        if log.header is not None and log.header.ledgers_map_offset:
            scanned: dict[int, int] = {}
            for _, kind, body in entry_log_records(log):
                if kind is ef.RecordKind.DATA:
                    ledger_id = ef.record_key(body)[0]
                    scanned[ledger_id] = scanned.get(ledger_id, 0) + 4 + len(body)
            assert ledger_sizes(log).sizes == scanned, path.name
    close(fast, slow)


@pytest.mark.parametrize("cut_into", [3, 500])
def test_torn_tail_mid_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut_into: int) -> None:
    """A journal cut inside a record: both paths replay up to it and report the same stop."""
    monkeypatch.setattr(replay_module, "READ_CHUNK_SIZE", 64 * 1024)
    bodies = [jf.encode_master_key(1, KEY)] + [_body(1, e, 1000) for e in range(200)]
    data = journal_bytes(6, bodies)
    cut_record = jf.SECTOR_SIZE + len(jf.encode_record(bodies[0])) + 150 * (4 + len(bodies[1]))
    (fast, report), (slow, _) = assert_same_replay(tmp_path, data[: cut_record + cut_into], monkeypatch)
    assert report.entries == 150 and len(report.stops) == 1 and f"offset {cut_record}" in report.stops[0]
    assert fast.read(1, -1) == (RC.EOK, bodies[150]) and fast.read(1, 150) == (RC.ENOENTRY, b"")
    close(fast, slow)


def test_biggest_record_across_a_real_chunk_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default chunk holds any whole record: one straddling its end is read again from its start."""
    big = limits.ENTRY_SIZE_MAX - 64
    sizes = [1024 * 1024] * 9 + [big, 100, big, 100]
    bodies = [jf.encode_master_key(1, KEY)] + [_body(1, e, size) for e, size in enumerate(sizes)]
    data = journal_bytes(6, bodies, pad_every=2)
    assert len(data) > replay_module.READ_CHUNK_SIZE
    (fast, _), (slow, _) = assert_same_replay(tmp_path, data, monkeypatch)
    assert all(fast.read(1, e) == (RC.EOK, bodies[1 + e]) for e in range(len(sizes)))
    close(fast, slow)


def test_record_over_the_limit_is_corrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole record, in one chunk, one byte over the record limit: the codec's corrupt record."""
    size = limits.JOURNAL_RECORD_SIZE_MAX + 1
    data = journal_bytes(6, [jf.encode_master_key(1, KEY), _body(1, 0, 10)])
    oversize = struct.pack(">iqq", size, 1, 1) + bytes(size - 16)
    (fast, report), (slow, _) = assert_same_replay(tmp_path, data + oversize + bytes(8), monkeypatch)
    assert report.entries == 1 and f"offset {len(data)}: record length {size}" in report.stops[0]
    close(fast, slow)


_RECORDS = st.lists(
    st.one_of(
        st.tuples(st.just("data"), st.integers(0, 4), st.integers(0, 40), st.integers(0, 2500)),
        st.tuples(st.sampled_from(["key", "fence", "lac", "unknown", "pad"]), st.integers(0, 4)),
    ),
    max_size=120,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=_RECORDS, tail_cut=st.integers(0, 40))
def test_random_journals_same_files_and_reads(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    records: list[Any],
    tail_cut: int,
) -> None:
    monkeypatch.setattr(replay_module, "READ_CHUNK_SIZE", 8 * 1024)
    out = bytearray(jf.encode_header(6))
    for record in records:
        kind, ledger_id = record[0], record[1]
        if kind == "data":
            out += jf.encode_record(_body(ledger_id, record[2], record[3]))
        elif kind == "pad":
            out += jf.encode_padding(len(out))
        else:
            special = {
                "key": jf.encode_master_key(ledger_id, KEY),
                "fence": jf.encode_fence(ledger_id),
                "lac": _lac(ledger_id, 3),
                "unknown": _unknown_special(ledger_id),
            }
            out += jf.encode_record(special[kind])
    data = bytes(out[: max(jf.SECTOR_SIZE, len(out) - tail_cut)])
    (fast, _), (slow, _) = assert_same_replay(tmp_path_factory.mktemp("random"), data, monkeypatch)
    close(fast, slow)


def test_fast_path_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard against a silently dead fast path: only each ledger's first entry goes record by record."""
    taken = counted_takes(monkeypatch)
    bodies = [jf.encode_master_key(1, KEY)] + [_body(1, e, 200) for e in range(500)]
    write_journal(tmp_path, journal_bytes(6, bodies, pad_every=100))
    storage, report = replayed(tmp_path, True, monkeypatch)
    assert sum(taken) == 499 and report.entries == 500
    assert os.path.getsize(storage._writer.path) > 500 * 200
    close(storage)


def test_fast_path_takes_records_alternating_between_ledger_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The db engine over two dirs: consecutive records go to different dirs (ledger L to dir L mod 2),
    and still every record but each ledger's first is taken by the fast path, in chunks of many."""
    taken = counted_takes(monkeypatch)
    bodies = [jf.encode_master_key(1, KEY), jf.encode_master_key(2, KEY)]
    bodies += [_body(1 + e % 2, e // 2, 200) for e in range(1000)]
    write_journal(tmp_path, journal_bytes(6, bodies, pad_every=100))
    dirs = ledger_dirs(tmp_path, 2)
    for directory in dirs:
        (directory / "current").mkdir(parents=True, exist_ok=True)
    storage, report = replayed(tmp_path, True, monkeypatch, engine="db", ledger_dirs=dirs)
    assert sum(taken) == 998 and report.entries == 1000 and max(taken) > 90
    for ledger_id in (1, 2):
        assert [storage.read(ledger_id, e) for e in range(500)] == [
            (RC.EOK, _body(ledger_id, e, 200)) for e in range(500)
        ]
    close(storage)


@pytest.mark.parametrize("log_size_limit", [1024 * 1024 * 1024, 50_000])
@pytest.mark.parametrize("slots_max", [storage_module.REPLAY_SLOTS_MAX, 97])
def test_db_over_three_dirs_same_entry_logs_and_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_size_limit: int, slots_max: int
) -> None:
    """Records alternating ledger dirs (ledger L in dir L mod 3): each dir's entry logs come out byte
    for byte as the record-by-record path writes them, rotations included, and every read agrees;
    also when the locations go to RocksDB (through its WAL) in many batches."""
    monkeypatch.setattr(replay_module, "READ_CHUNK_SIZE", 64 * 1024 + 3)
    monkeypatch.setattr(storage_module, "REPLAY_SLOTS_MAX", slots_max)
    data = journal_bytes(6, mixed_bodies(), pad_every=13) + bytes(4096)
    results = {}
    for name in ("fast", "slow"):
        write_journal(tmp_path / name, data)
        dirs = ledger_dirs(tmp_path / name, 3)
        for directory in dirs:
            (directory / "current").mkdir(parents=True, exist_ok=True)
        storage, report = replayed(
            tmp_path / name,
            name == "fast",
            monkeypatch,
            engine="db",
            ledger_dirs=dirs,
            log_size_limit=log_size_limit,
        )
        logs = [(p.name, p.read_bytes()) for d in dirs for p in sorted((d / "current").glob("*.log"))]
        results[name] = (logs, reads(storage, range(7), range(310)), report.entries)
        close(storage)
    assert results["fast"] == results["slow"]
    assert len(results["fast"][0]) >= (10 if log_size_limit < 1024 * 1024 else 3)  # rotations in each dir
