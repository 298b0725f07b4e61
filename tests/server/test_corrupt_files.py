"""Corrupt files under a bookie's storage (docs/reliability.md, "Corrupt files"): each case of the table.

Files are written by the storage engine, left as kill -9 leaves them (`abandon`) or stopped cleanly,
then damaged (a flipped byte, a truncation) and the storage started again on them. Whatever the damage,
a read answers the entry's exact bytes or an error (ENOENTRY, EIO), never other bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from twisted.internet import reactor

from bkctl.errors import CorruptDataError
from bkctl.files.marks import LAST_MARK_NAME
from bkctl.model import DigestType
from bkctl.protocol import entry as entry_codec
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import journal_format as jf
from bkctl.protocol.journal_format import RecordKind
from bkctl.protocol.wire import ReturnCode as RC
from bkctl.server.journal import list_journals
from bkctl.server.storage import ReplayReport, Storage
from tests.server.helpers import KEY, Durable, abandon, config, packaged, twisted_test, wait_until

LEDGERS = (1, 2, 3)
ENTRIES = 20


def flip(path: Path, offset: int, mask: int = 0xFF) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


def journal_path(tmp_path: Path) -> Path:
    (_, path), *_ = list_journals(tmp_path / "journal" / "current")
    return path


def record_offsets(path: Path) -> dict[tuple[int, int], tuple[int, int]]:
    """(ledger, entry) -> (file offset of its DATA record's length prefix, body size)."""
    data = path.read_bytes()
    version = jf.decode_header(data[:8])
    found = {}
    for offset, kind, body in jf.scan_records(data, jf.data_start(version), 0, version, True):
        if kind is RecordKind.DATA:
            found[jf.record_key(body)] = (offset, len(body))
    return found


def has_tokens(durable: Durable, count: int) -> Callable[[], bool]:
    return lambda: len(durable.tokens) == count


async def written(tmp_path: Path, batches: int = 1, checkpoint: bool = False, **overrides: object) -> None:
    """LEDGERS x ENTRIES entries in `batches` group commits, then kill -9 (or a clean stop after a
    checkpoint when `checkpoint`)."""
    durable = Durable()
    storage = Storage(config(tmp_path, **overrides), durable, reactor)
    storage.start()
    per_batch = ENTRIES // batches
    for batch in range(batches):
        for entry_id in range(batch * per_batch, (batch + 1) * per_batch):
            for ledger_id in LEDGERS:
                assert (
                    storage.add(ledger_id, entry_id, KEY, packaged(ledger_id, entry_id), False, 0) == RC.EOK
                )
        await wait_until(has_tokens(durable, (batch + 1) * per_batch * len(LEDGERS)))  # one group commit
    if checkpoint:
        await storage.checkpoint()
        await storage.stop()
    else:
        abandon(storage)


def restarted(tmp_path: Path) -> tuple[Storage, ReplayReport]:
    storage = Storage(config(tmp_path), Durable(), reactor)
    return storage, storage.start()


def served(storage: Storage) -> dict[tuple[int, int], int]:
    """Every entry's read result code; AssertionError if any read gives bytes other than the entry's."""
    codes = {}
    for ledger_id in LEDGERS:
        for entry_id in range(ENTRIES):
            rc, data = storage.read(ledger_id, entry_id)
            assert rc != RC.EOK or data == packaged(ledger_id, entry_id), (ledger_id, entry_id)
            codes[(ledger_id, entry_id)] = rc
    return codes


def missing(codes: dict[tuple[int, int], int]) -> dict[tuple[int, int], int]:
    return {key: rc for key, rc in codes.items() if rc != RC.EOK}


# --- journal ---------------------------------------------------------------------------------------


@twisted_test
async def test_journal_flipped_payload_mid_file_skips_only_that_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await written(tmp_path)
    path = journal_path(tmp_path)
    offset, size = record_offsets(path)[(2, 5)]
    flip(path, offset + 4 + size - 1)  # the last payload byte
    with caplog.at_level(logging.WARNING, "bkctl.bookie"):
        storage, report = restarted(tmp_path)
    assert report.rejected == [f"{path} offset {offset}: ledger 2 entry 5: CRC32C digest mismatch"]
    assert f"journal {path}: record at offset {offset} skipped" in caplog.text
    assert missing(served(storage)) == {(2, 5): RC.ENOENTRY}
    await storage.stop()


@twisted_test
async def test_journal_flipped_header_of_a_record_skips_only_that_record(tmp_path: Path) -> None:
    """The entry id flipped (1 -> 3 entry 5 -> 5 ^ 0x10): the digest, which covers the ids, fails."""
    await written(tmp_path)
    path = journal_path(tmp_path)
    offset, _ = record_offsets(path)[(1, 5)]
    flip(path, offset + 4 + 15, 0x10)
    storage, report = restarted(tmp_path)
    assert len(report.rejected) == 1 and f"offset {offset}:" in report.rejected[0]
    assert missing(served(storage)) == {(1, 5): RC.ENOENTRY}
    await storage.stop()


@twisted_test
async def test_journal_flipped_last_record_is_skipped(tmp_path: Path) -> None:
    await written(tmp_path)
    path = journal_path(tmp_path)
    offset, size = record_offsets(path)[(3, ENTRIES - 1)]
    flip(path, offset + 4 + size - 1)
    storage, report = restarted(tmp_path)
    assert len(report.rejected) == 1 and not report.stops
    assert missing(served(storage)) == {(3, ENTRIES - 1): RC.ENOENTRY}
    await storage.stop()


@twisted_test
async def test_journal_flipped_length_mid_file_resyncs_at_the_next_group(tmp_path: Path) -> None:
    """A length field cannot be skipped over: replay finds the next group commit (512-aligned, whole
    records, a verified digest) and goes on there; only the damaged group's records are lost."""
    await written(tmp_path, batches=4)
    path = journal_path(tmp_path)
    offset, _ = record_offsets(path)[(1, 5)]  # the second group's first record
    flip(path, offset, 0x40)  # length + 1 GiB
    storage, report = restarted(tmp_path)
    assert len(report.resyncs) == 1 and report.resyncs[0].startswith(f"{path} offsets {offset}-")
    lost = missing(served(storage))
    assert set(lost) == {(ledger_id, e) for ledger_id in LEDGERS for e in range(5, 10)}
    assert set(lost.values()) == {RC.ENOENTRY}
    await storage.stop()


@twisted_test
async def test_journal_truncated_mid_record_recovers_up_to_it(tmp_path: Path) -> None:
    await written(tmp_path)
    path = journal_path(tmp_path)
    offset, size = record_offsets(path)[(3, ENTRIES - 1)]
    with path.open("r+b") as f:
        f.truncate(offset + 4 + size // 2)
    storage, report = restarted(tmp_path)
    assert len(report.stops) == 1 and f"offset {offset}:" in report.stops[0] and not report.resyncs
    assert missing(served(storage)) == {(3, ENTRIES - 1): RC.ENOENTRY}
    await storage.stop()


@twisted_test
async def test_journal_flipped_header_refuses_to_start(tmp_path: Path) -> None:
    await written(tmp_path)
    path = journal_path(tmp_path)
    flip(path, 0)  # the magic
    storage = Storage(config(tmp_path), Durable(), reactor)
    with pytest.raises(CorruptDataError, match=f"{path} offset 0: corrupt journal header"):
        storage.start()


@twisted_test
async def test_journal_tail_record_corrupt_told_by_the_ledgers_stored_entries(tmp_path: Path) -> None:
    """The first tail record of a ledger matches no digest: its checkpointed entries say CRC32C."""
    durable = Durable()
    storage = Storage(config(tmp_path), durable, reactor)
    storage.start()
    for entry_id in range(5):
        storage.add(1, entry_id, KEY, packaged(1, entry_id), False, entry_id)
    await wait_until(lambda: len(durable.tokens) == 5)
    await storage.checkpoint()
    storage.add(1, 5, KEY, packaged(1, 5), False, 5)
    storage.add(2, 0, KEY, packaged(2, 0), False, 6)  # a ledger with no stored entries: its first record
    storage.add(2, 1, KEY, packaged(2, 1), False, 7)
    await wait_until(lambda: len(durable.tokens) == 8)
    abandon(storage)
    path = max(p for _, p in list_journals(tmp_path / "journal" / "current"))
    offsets = record_offsets(path)
    for key in ((1, 5), (2, 0)):
        offset, size = offsets[key]
        flip(path, offset + 4 + size - 1)
    again, report = restarted(tmp_path)
    assert [line.split(": ", 1)[1] for line in report.rejected] == [
        "ledger 1 entry 5: matches no digest, its stored entries are CRC32C"
    ]
    # Ledger 2's entry 0 was stored unchecked, then dropped once entry 1 showed the ledger is CRC32C.
    assert again.read(1, 5)[0] == RC.ENOENTRY and again.read(2, 0)[0] == RC.ENOENTRY
    assert again.read(2, 1) == (RC.EOK, packaged(2, 1))
    assert all(again.read(1, e) == (RC.EOK, packaged(1, e)) for e in range(5))
    await again.stop()


@twisted_test
async def test_journal_mac_ledger_records_are_taken_unchecked(tmp_path: Path) -> None:
    """A bookie cannot check a MAC digest (no password): such records are replayed, not rejected."""
    durable = Durable()
    storage = Storage(config(tmp_path), durable, reactor)
    storage.start()
    mac = entry_codec.mac_key(b"pw")
    bodies = [entry_codec.package_entry(DigestType.MAC, 9, e, e - 1, 0, b"mac", mac) for e in range(10)]
    for entry_id, body in enumerate(bodies):
        storage.add(9, entry_id, KEY, body, False, entry_id)
    await wait_until(lambda: len(durable.tokens) == 10)
    abandon(storage)
    again, report = restarted(tmp_path)
    assert report.entries == 10 and not report.rejected
    assert all(again.read(9, e) == (RC.EOK, body) for e, body in enumerate(bodies))
    await again.stop()


# --- entry log and index ---------------------------------------------------------------------------


def stored_record(storage: Storage, ledger_id: int, entry_id: int) -> tuple[Path, int, Path, int]:
    """(entry log, offset of the stored entry, index file, offset of its slot)."""
    location, index_path, slot_offset = storage._index.location(ledger_id, entry_id)
    log_id, offset = ef.split_location(location)
    assert index_path is not None
    return (
        storage.config.ledger_dirs[0] / "current" / ef.log_file_name(log_id),
        offset,
        index_path,
        slot_offset,
    )


async def checkpointed(tmp_path: Path, *keys: tuple[int, int]) -> list[tuple[Path, int, Path, int]]:
    """Every entry written and checkpointed, the bookie stopped; where `keys` are stored."""
    await written(tmp_path, checkpoint=True)
    probe, _ = restarted(tmp_path)
    found = [stored_record(probe, *key) for key in keys]
    await probe.stop()
    return found


@twisted_test
async def test_entry_log_flipped_payload_is_an_eio_never_bytes(tmp_path: Path) -> None:
    for log_path, offset, _, _ in await checkpointed(tmp_path, (1, 7), (2, 0)):
        flip(log_path, offset + len(packaged(1, 7)) - 1)
    storage, _ = restarted(tmp_path)
    # (2, 0) is the first entry of its ledger read: the digest type comes from its neighbour.
    assert storage.read(2, 0) == (RC.EIO, b"")
    assert missing(served(storage)) == {(1, 7): RC.EIO, (2, 0): RC.EIO}
    await storage.stop()


@twisted_test
async def test_entry_log_truncated_entries_past_the_cut_are_eio(tmp_path: Path) -> None:
    ((log_path, offset, _, _),) = await checkpointed(tmp_path, (3, 10))
    with log_path.open("r+b") as f:
        f.truncate(offset + 3)
    storage, _ = restarted(tmp_path)
    lost = missing(served(storage))
    assert (3, 10) in lost and set(lost.values()) == {RC.EIO}
    assert len(lost) < len(LEDGERS) * ENTRIES  # the entries before the cut are served
    await storage.stop()


@twisted_test
async def test_index_flipped_slot_is_an_eio_never_bytes(tmp_path: Path) -> None:
    ((_, _, index_path, slot_offset),) = await checkpointed(tmp_path, (1, 3))
    flip(index_path, slot_offset + 7, 0x08)  # the entry's offset in its log, 8 bytes off
    storage, _ = restarted(tmp_path)
    assert missing(served(storage)) == {(1, 3): RC.EIO}
    await storage.stop()


@twisted_test
async def test_index_truncated_entries_past_the_cut_are_missing(tmp_path: Path) -> None:
    ((_, _, index_path, slot_offset),) = await checkpointed(tmp_path, (2, 12))
    with index_path.open("r+b") as f:
        f.truncate(slot_offset)
    storage, _ = restarted(tmp_path)
    assert missing(served(storage)) == {(2, e): RC.ENOENTRY for e in range(12, ENTRIES)}
    await storage.stop()


@twisted_test
async def test_index_flipped_header_makes_its_ledger_eio(tmp_path: Path) -> None:
    ((_, _, index_path, _),) = await checkpointed(tmp_path, (3, 0))
    flip(index_path, 0)  # the magic
    storage, _ = restarted(tmp_path)
    assert missing(served(storage)) == {(3, e): RC.EIO for e in range(ENTRIES)}
    await storage.stop()


# --- lastMark --------------------------------------------------------------------------------------


async def checkpointed_then_more(tmp_path: Path) -> Path:
    """Entries 0-9 checkpointed (lastMark written), 10-19 only in the journal; kill -9."""
    durable = Durable()
    storage = Storage(config(tmp_path), durable, reactor)
    storage.start()
    for entry_id in range(ENTRIES):
        if entry_id == ENTRIES // 2:
            await wait_until(lambda: len(durable.tokens) == len(LEDGERS) * ENTRIES // 2)
            await storage.checkpoint()
        for ledger_id in LEDGERS:
            storage.add(ledger_id, entry_id, KEY, packaged(ledger_id, entry_id), False, 0)
    await wait_until(lambda: len(durable.tokens) == len(LEDGERS) * ENTRIES)
    abandon(storage)
    return tmp_path / "ledgers" / "current" / LAST_MARK_NAME


@twisted_test
async def test_last_mark_truncated_replays_every_journal(tmp_path: Path) -> None:
    mark = await checkpointed_then_more(tmp_path)
    with mark.open("r+b") as f:
        f.truncate(10)
    storage, report = restarted(tmp_path)
    assert report.start_mark == (-1, 0)
    assert not missing(served(storage))
    await storage.stop()


@pytest.mark.parametrize(("byte", "what"), [(0, "journal id far ahead"), (15, "offset into a record")])
@twisted_test
async def test_last_mark_flipped_serves_no_wrong_bytes(tmp_path: Path, byte: int, what: str) -> None:
    mark = await checkpointed_then_more(tmp_path)
    flip(mark, byte, 0x40 if byte == 0 else 0x05)
    storage, _ = restarted(tmp_path)
    codes = served(storage)  # asserts no read gives wrong bytes
    if byte == 0:  # the journal was written after the mark: replayed whole
        assert not missing(codes), what
    await storage.stop()
