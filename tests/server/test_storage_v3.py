"""Storage for the v3 operations: explicit LAC written through the journal (replayed, checkpointed),
FORCE_LEDGER, the bookie's LAC of a ledger, LAC watches of long-poll reads, disk space."""

from __future__ import annotations

import shutil
from pathlib import Path

from bkctl.files.index import ledger_index_path, open_index
from bkctl.model import DigestType
from bkctl.protocol.entry import encode_lac_body
from bkctl.protocol.wire import ReturnCode as RC
from tests.server.helpers import KEY, OTHER_KEY, Durable, abandon, packaged, started, twisted_test, wait_until

LAC_1, LAC_2, LAC_3 = (encode_lac_body(DigestType.CRC32C, 3, lac) for lac in (1, 2, 3))


@twisted_test
async def test_explicit_lac_is_journaled_replayed_and_checkpointed(tmp_path: Path) -> None:
    durable = Durable()
    storage = started(tmp_path, durable)
    assert storage.write_lac(3, KEY, LAC_1, "lac") == RC.EOK  # a ledger not seen yet is made
    assert storage.write_lac(3, OTHER_KEY, LAC_2, "bad") == RC.EUA
    assert storage.write_lac(3, KEY, b"x" * 2000, "big") == RC.EBADREQ
    assert storage.write_lac(3, KEY, b"short", "short") == RC.EBADREQ
    assert storage.write_lac(3, KEY, encode_lac_body(DigestType.CRC32C, 4, 1), "other") == RC.EBADREQ
    assert storage.force_ledger(3, "force") == RC.EOK
    await wait_until(lambda: "lac" in durable.tokens and "force" in durable.tokens)
    assert storage.explicit_lac(3) == LAC_1
    abandon(storage)  # no checkpoint: replay brings it back from the journal
    again = started(tmp_path)
    assert again.explicit_lac(3) == LAC_1
    assert again.write_lac(3, KEY, LAC_2, None) == RC.EOK
    await again.checkpoint()
    await again.stop()
    assert open_index(ledger_index_path(3, tmp_path / "ledgers")).header.explicit_lac == LAC_2
    third = started(tmp_path)
    assert third.explicit_lac(3) == LAC_2
    third.set_read_only(True)
    assert third.write_lac(3, KEY, LAC_3, None) == RC.EREADONLY  # as Java's read-only bookie
    await third.stop()


@twisted_test
async def test_lac_of_the_last_entry_and_watches(tmp_path: Path) -> None:
    storage = started(tmp_path)
    assert storage.last_add_confirmed(4) == (RC.ENOLEDGER, -1)
    woken: list[str] = []
    for entry_id in range(3):  # packaged(): entry e carries LAC e - 1
        assert storage.add(4, entry_id, KEY, packaged(4, entry_id), False, None) == RC.EOK
    assert storage.last_add_confirmed(4) == (RC.EOK, 1)
    assert not storage.watch_lac(4, 0, lambda: woken.append("past"))  # LAC 1 > 0: answer now
    assert storage.watch_lac(4, 1, lambda: woken.append("a"))
    assert storage.watch_lac(4, 2, lambda: woken.append("b"))
    cancelled = lambda: woken.append("cancelled")  # noqa: E731
    assert storage.watch_lac(4, 1, cancelled)
    storage.unwatch_lac(4, cancelled)
    storage.add(4, 3, KEY, packaged(4, 3), False, None)  # LAC 2: wakes "a" only
    assert woken == ["a"]
    assert storage.fence(4, KEY, None) == RC.EOK  # a fence ends every poll
    assert woken == ["a", "b"]
    assert not storage.watch_lac(4, 10, lambda: woken.append("fenced"))
    # An explicit LAC raises the bookie's LAC and wakes a long poll, as in Java (FileInfo.setExplicitLac).
    assert storage.watch_lac(5, -1, lambda: woken.append("explicit")) is False  # no such ledger
    assert storage.write_lac(5, KEY, encode_lac_body(DigestType.CRC32C, 5, 7), None) == RC.EOK
    assert storage.last_add_confirmed(5) == (RC.EOK, 7)
    assert storage.watch_lac(5, 7, lambda: woken.append("explicit"))
    assert storage.write_lac(5, KEY, encode_lac_body(DigestType.CRC32C, 5, 8), None) == RC.EOK
    assert woken[-1] == "explicit"
    await storage.checkpoint()
    assert storage.last_add_confirmed(4) == (RC.EOK, 2)
    total, free = storage.disk_space()
    usage = shutil.disk_usage(tmp_path)
    assert total == usage.total and 0 < free <= total
    await storage.stop()
