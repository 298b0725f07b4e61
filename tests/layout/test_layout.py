"""bkctl.metadata.layout on both backends: paths, init, ids, ledger metadata, bookies, cookies,
under-replication, auditor votes and flags, checked against a real Java cluster's ZooKeeper dumps."""

from __future__ import annotations

import random
import threading
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bkctl.errors import BadVersionError, ConflictError, CorruptDataError, NotFoundError, UsageError
from bkctl.metadata import ledgers
from bkctl.metadata.layout import (
    INT_MAX,
    LEDGER_ID_MAX,
    Layout,
    ledger_subpath,
    parse_underreplicated_name,
    underreplicated_subpath,
)
from bkctl.metadata.store import MetadataStore
from bkctl.metadata.underreplication import UpperLevels
from bkctl.model import DigestType, LedgerMetadata, LedgerState, Segment
from bkctl.protocol import metadata_format as mf
from tests.conftest import StoreTarget
from tests.layout.conftest import DUMP_1, DUMP_5, LoadedDump, dump_bytes

B1, B2, B3, B4 = (f"127.0.0.1:3318{i}" for i in (1, 2, 3, 4))


class Problems(list[tuple[str, str]]):
    def __call__(self, path: str, why: str) -> None:
        self.append((path, why))


# --- paths -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ledger_id", "subpath"),
    [
        (0, "/00/0000/L0000"),
        (1, "/00/0000/L0001"),
        (1234567890, "/12/3456/L7890"),
        (INT_MAX - 1, "/21/4748/L3646"),
        (INT_MAX, "/000/0000/0021/4748/L3647"),
        ((1 << 32) | 5, "/000/0000/0042/9496/L7301"),
        (LEDGER_ID_MAX, "/922/3372/0368/5477/L5807"),
    ],
)
def test_ledger_paths(ledger_id: int, subpath: str) -> None:
    assert ledger_subpath(ledger_id) == subpath


@pytest.mark.parametrize(
    ("ledger_id", "subpath"),
    [(1, "/0000/0000/0000/0001/urL0000000001"), (1234567890, "/0000/0000/4996/02d2/urL1234567890")],
)
def test_underreplication_paths(ledger_id: int, subpath: str) -> None:
    assert underreplicated_subpath(ledger_id) == subpath
    assert parse_underreplicated_name(subpath.rsplit("/", 1)[1]) == ledger_id


@pytest.mark.parametrize("bad", [-1, LEDGER_ID_MAX + 1, "1"])
def test_bad_ledger_ids_are_usage_errors(bad: object) -> None:
    with pytest.raises(UsageError):
        ledger_subpath(bad)  # type: ignore[arg-type]


@given(st.integers(0, LEDGER_ID_MAX))
def test_every_ledger_path_encodes_its_id(ledger_id: int) -> None:
    parts = ledger_subpath(ledger_id).split("/")[1:]
    assert parts[-1][0] == "L"
    assert int("".join(parts).replace("L", "")) == ledger_id
    assert len(parts) == (3 if ledger_id < INT_MAX else 5)


# --- cluster init ------------------------------------------------------------------------------------


def test_init_creates_the_cluster_nodes(store: MetadataStore) -> None:
    layout = Layout(store)
    instance_id = layout.init_cluster()
    assert layout.instance_id() == instance_id
    assert layout.check_initialized() == mf.LedgerLayout()
    assert store.get("/ledgers/LAYOUT")[0] == dump_bytes(DUMP_1, "/ledgers/LAYOUT")
    assert store.get("/ledgers/underreplication/LAYOUT")[0] == dump_bytes(
        DUMP_5, "/ledgers/underreplication/LAYOUT"
    )
    for path in (
        "available",
        "available/readonly",
        "cookies",
        "underreplication/ledgers",
        "underreplication/locks",
    ):
        assert store.exists(f"/ledgers/{path}") is not None
    assert layout.autorecovery_enabled()


def test_init_twice_conflicts_and_force_wipes(store: MetadataStore) -> None:
    layout = Layout(store)
    first = layout.init_cluster()
    layout.create_ledger(_ledger())
    with pytest.raises(ConflictError, match=first):
        layout.init_cluster()
    second = layout.init_cluster(force=True)
    assert second != first and layout.instance_id() == second
    assert list(layout.ledger_ids()) == []


def test_uninitialized_cluster_is_not_found(store: MetadataStore) -> None:
    with pytest.raises(NotFoundError, match="no BookKeeper cluster"):
        Layout(store).check_initialized()


def test_other_root(store: MetadataStore) -> None:
    layout = Layout(store, "/bk/cluster-a")
    layout.init_cluster()
    ledger_id, _ = layout.create_ledger(_ledger())
    assert store.exists(f"/bk/cluster-a/00/0000/L{ledger_id:04d}") is not None
    assert list(layout.ledger_ids()) == [ledger_id]


# --- ledger ids -------------------------------------------------------------------------------------


def test_ledger_ids_are_sequential_and_leave_no_node(store: MetadataStore) -> None:
    layout = Layout(store)
    ids = [layout.new_ledger_id() for _ in range(5)]
    assert ids == sorted(set(ids)) and ids[0] >= 0
    assert store.children("/ledgers/idgen") == []


def test_ledger_ids_unique_under_concurrency(store_target: StoreTarget) -> None:
    layouts = [Layout(store_target.open()) for _ in range(3)]
    found: list[int] = []
    lock = threading.Lock()

    def make(layout: Layout) -> None:
        for _ in range(20):
            ledger_id = layout.new_ledger_id()
            with lock:
                found.append(ledger_id)

    threads = [threading.Thread(target=make, args=(layouts[i % 3],)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(found) == 120 and len(set(found)) == 120


def test_long_ledger_ids_once_idgen_long_exists(store: MetadataStore) -> None:
    layout = Layout(store)
    store.create("/ledgers/idgen-long", make_parents=True)
    first, second = layout.new_ledger_id(), layout.new_ledger_id()
    assert first == 1 << 32 and second == (1 << 32) | 1
    assert store.children("/ledgers/idgen-long") == ["HOB-0000000001"]
    ledger_id, _ = layout.create_ledger(_ledger(), second)
    assert store.exists("/ledgers/000/0000/0042/9496/L7297") is not None
    stored = layout.read_ledger(ledger_id).value
    assert stored.c_token and stored == _ledger(c_token=stored.c_token)


# --- ledger metadata --------------------------------------------------------------------------------


def _ledger(**changes: object) -> LedgerMetadata:
    base = LedgerMetadata(
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        segments=(Segment(0, (B3, B1, B2)),),
        digest=DigestType.CRC32,
        password=b"testpasswd",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_created_ledgers_match_java_bytes(store: MetadataStore) -> None:
    """Ledger 1 as Java wrote it while OPEN (dump 1), then ledger 0 as Java closed it."""
    layout = Layout(store)
    java_token = 2024662843881591317  # Java's random creation token of that ledger
    ledger_id, version = layout.create_ledger(_ledger(c_token=java_token), 1)
    assert store.get("/ledgers/00/0000/L0001")[0] == dump_bytes(DUMP_1, "/ledgers/00/0000/L0001")
    read = layout.read_ledger(ledger_id)
    assert (read.value, read.version) == (_ledger(c_token=java_token), version)
    assert layout.create_ledger(_ledger(c_token=java_token), 1) == (1, 0)  # a retried create of ours

    layout.create_ledger(_ledger(segments=(Segment(0, (B1, B2, B3)),)), 0)
    closed = layout.update_ledger(
        0, lambda md: replace(md, state=LedgerState.CLOSED, last_entry_id=999, length=6890)
    )
    assert closed.version == 1
    assert store.get("/ledgers/00/0000/L0000")[0] == dump_bytes(DUMP_1, "/ledgers/00/0000/L0000")


def test_generated_ids_skip_ledgers_created_under_explicit_ids(store: MetadataStore) -> None:
    """As Java's LedgerCreateOp: ledgers imported under their ids (the generator never saw them) are
    passed over by the next creates instead of failing them."""
    layout = Layout(store)
    for ledger_id in range(3):
        layout.create_ledger(_ledger(), ledger_id)
    created = [layout.create_ledger(_ledger())[0] for _ in range(2)]
    assert len(set(created)) == 2 and not set(created) & {0, 1, 2}


def test_ledger_cas(store: MetadataStore) -> None:
    layout = Layout(store)
    ledger_id, version = layout.create_ledger(_ledger())
    new_version = layout.write_ledger(ledger_id, _ledger(state=LedgerState.IN_RECOVERY), version)
    with pytest.raises(BadVersionError):
        layout.write_ledger(ledger_id, _ledger(state=LedgerState.CLOSED), version)
    assert layout.read_ledger(ledger_id).version == new_version
    with pytest.raises(ConflictError):
        layout.create_ledger(_ledger(), ledger_id)
    unchanged = layout.update_ledger(ledger_id, lambda md: None)
    assert unchanged.version == new_version
    layout.delete_ledger(ledger_id)
    with pytest.raises(NotFoundError, match=f"ledger {ledger_id}"):
        layout.read_ledger(ledger_id)


def test_update_ledger_retries_a_lost_race(store: MetadataStore) -> None:
    layout = Layout(store)
    ledger_id, _ = layout.create_ledger(_ledger())
    calls = []

    def change(md: LedgerMetadata) -> LedgerMetadata:
        calls.append(md.state)
        if len(calls) == 1:  # someone else wins between our read and our write
            layout.update_ledger(ledger_id, lambda m: replace(m, length=5))
        return replace(md, state=LedgerState.CLOSED)

    result = layout.update_ledger(ledger_id, change)
    assert len(calls) == 2 and (result.value.length, result.value.state) == (5, LedgerState.CLOSED)


def test_ledger_ids_of_the_java_dump(dump5: LoadedDump) -> None:
    layout = Layout(dump5.store)
    problems = Problems()
    assert list(layout.ledger_ids(problems)) == list(range(11))
    assert problems == []
    read = dict(layout.read_ledgers(range(12)))
    assert sorted(read) == list(range(11))
    assert read[4].digest is DigestType.CRC32C and read[5].digest is DigestType.MAC
    assert read[1].state is LedgerState.CLOSED and read[1].last_entry_id == 49


def test_walk_reports_and_skips_foreign_nodes(store: MetadataStore) -> None:
    layout = Layout(store)
    layout.init_cluster()
    for ledger_id in (3, 20_000, INT_MAX + 7):
        layout.create_ledger(_ledger(), ledger_id)
    store.create("/ledgers/00/0000/junk")
    store.create("/ledgers/00/xx", make_parents=True)
    store.create("/ledgers/pulsar-stuff")  # not in the ledger tree at all: skipped silently
    store.create("/ledgers/00/0000/L0009", b"garbage")
    problems = Problems()
    ids = list(layout.ledger_ids(problems))
    assert ids == [3, 9, 20_000, INT_MAX + 7]
    assert sorted(p for p, _ in problems) == ["/ledgers/00/0000/junk", "/ledgers/00/xx"]
    problems.clear()
    assert [i for i, _ in layout.read_ledgers(ids, problems)] == [3, 20_000, INT_MAX + 7]
    assert [p for p, _ in problems] == ["/ledgers/00/0000/L0009"]
    with pytest.raises(CorruptDataError, match="L0009"):
        layout.read_ledger(9)


def test_read_ledgers_batch_by_batch(store: MetadataStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several get_many batches: the caller's order, vanished ids skipped, malformed ones reported."""
    monkeypatch.setattr(ledgers, "READ_BATCH", 2)
    layout = Layout(store)
    layout.init_cluster()
    for ledger_id in (1, 2, 3, 5, 8):
        layout.create_ledger(_ledger(), ledger_id)
    store.set(layout.ledger_path(3), b"\xff not metadata")
    problems = Problems()
    assert [i for i, _ in layout.read_ledgers([8, 1, 4, 3, 2, 5], problems)] == [8, 1, 2, 5]
    assert [p for p, _ in problems] == ["/ledgers/00/0000/L0003"]
    assert problems[0][1].startswith("bad metadata: ")


# --- bookies and cookies -----------------------------------------------------------------------------


def test_bookies_of_the_java_dump(dump5: LoadedDump) -> None:
    layout = Layout(dump5.store)
    assert layout.bookies() == [B1, B2, B4]
    assert layout.bookies(readonly=True) == []
    assert layout.cookie_bookies() == [B1, B2, B3, B4]
    info = layout.bookie_service_info(B4)
    assert info.endpoints[0].port == 33184 and info.endpoints[0].protocol == "bookie-rpc"
    cookie = layout.read_cookie(B3)
    assert cookie is not None and cookie.value.instance_id == "76a3f9d8-1a95-4d6d-9ea6-d348aaecafd7"


def test_bookie_registration(store_target: StoreTarget) -> None:
    store, other = store_target.open(), store_target.open()
    layout = Layout(store)
    layout.init_cluster()
    path = layout.register_bookie(B1)
    assert layout.register_bookie(B1) == path  # idempotent within the session
    assert store.exists(path).ephemeral_owner == store.session_id  # type: ignore[union-attr]
    with pytest.raises(ConflictError, match="still registered"):
        Layout(other).register_bookie(B1)
    layout.register_bookie(B1, readonly=True)
    assert (layout.bookies(), layout.bookies(readonly=True)) == ([], [B1])
    layout.register_bookie(B1)
    assert (layout.bookies(), layout.bookies(readonly=True)) == ([B1], [])
    store.close()
    assert Layout(other).bookies() == []


def test_cookies(store: MetadataStore) -> None:
    layout = Layout(store)
    cookie = mf.Cookie.create(B1, ["/j"], ["/l"], "iid")
    assert layout.read_cookie(B1) is None
    assert layout.write_cookie(cookie) == 0
    with pytest.raises(ConflictError):
        layout.write_cookie(cookie)
    changed = replace(cookie, ledger_dirs=("/l", "/l2"))
    assert layout.write_cookie(changed, 0) == 1
    with pytest.raises(BadVersionError):
        layout.write_cookie(cookie, 0)
    assert layout.read_cookie(B1) == type(layout.read_cookie(B1))(changed, 1)  # type: ignore[misc]
    layout.delete_cookie(B1)
    assert layout.cookie_bookies() == []


# --- under-replication -------------------------------------------------------------------------------


def test_mark_and_remark_merges_replicas(store: MetadataStore) -> None:
    layout = Layout(store)
    assert layout.mark_underreplicated(1234567890, [B3], ctime_ms=1000)
    path = "/ledgers/underreplication/ledgers/0000/0000/4996/02d2/urL1234567890"
    assert store.get(path)[0] == b'replica: "127.0.0.1:33183"\nctime: 1000\n'
    assert not layout.mark_underreplicated(1234567890, [B3], ctime_ms=2000)  # nothing new: untouched
    assert layout.mark_underreplicated(1234567890, [B1, B3], ctime_ms=3000)
    mark = layout.read_underreplicated(1234567890)
    assert mark is not None and mark.version == 1
    assert mark.value == mf.UnderreplicatedLedger((B3, B1), 3000)
    assert layout.mark_underreplicated(7, [B2], ctime_ms=None)
    assert store.get("/ledgers/underreplication/ledgers/0000/0000/0000/0007/urL0000000007")[0] == (
        b'replica: "127.0.0.1:33182"\n'
    )
    assert list(layout.underreplicated_ids()) == [7, 1234567890]


def test_lock_and_mark_replicated_prunes_empty_parents(store_target: StoreTarget) -> None:
    store, worker2 = store_target.open(), store_target.open()
    layout = Layout(store)
    layout.init_cluster()
    layout.mark_underreplicated(1, [B3])
    layout.mark_underreplicated(2, [B3])
    layout.mark_underreplicated(1 << 20, [B3])
    version = layout.lock_underreplicated(1, "worker-1")
    assert version == 0 and layout.lock_holder(1) == "worker-1"
    assert Layout(worker2).lock_underreplicated(1, "worker-2") is None
    assert layout.lock_underreplicated(99) is None  # not marked
    entries = {e.ledger_id: e.replication_worker for e in layout.underreplicated_ledgers()}
    assert entries == {1: "worker-1", 2: None, 1 << 20: None}

    layout.mark_underreplicated(1, [B4])  # re-marked while being replicated: must survive
    assert not layout.mark_replicated(1, version)
    assert layout.lock_holder(1) is None and layout.read_underreplicated(1) is not None
    version = layout.lock_underreplicated(1, "worker-1")
    assert layout.mark_replicated(1, version)  # type: ignore[arg-type]
    assert store.exists("/ledgers/underreplication/ledgers/0000/0000/0000/0002") is not None  # sibling 2 kept
    assert layout.mark_replicated(2)
    assert store.children("/ledgers/underreplication/ledgers") == ["0000"]  # 1<<20 is under 0000/0000/0010
    assert layout.mark_replicated(1 << 20)
    assert store.children("/ledgers/underreplication/ledgers") == []
    assert not layout.mark_replicated(1 << 20)


def test_lock_vanishes_with_the_worker_session(store_target: StoreTarget) -> None:
    store, worker = store_target.open(), store_target.open()
    layout = Layout(store)
    layout.mark_underreplicated(5, [B3])
    assert Layout(worker).lock_underreplicated(5, "w") == 0
    worker.close()
    assert layout.lock_holder(5) is None


def test_a_lock_is_released_only_by_the_session_holding_it(store_target: StoreTarget) -> None:
    """A worker whose session expired mid-copy must not drop the lock another worker took since."""
    store, worker = store_target.open(), store_target.open()
    layout = Layout(store)
    layout.mark_underreplicated(5, [B3])
    assert Layout(worker).lock_underreplicated(5, "w2") == 0
    layout.release_lock(5)  # not this session's lock
    assert not layout.mark_replicated(5, 1)  # a stale version: the mark stays, and so does the lock
    assert layout.lock_holder(5) == "w2"
    assert Layout(worker).mark_replicated(5, 0) and layout.lock_holder(5) is None


def test_take_locks_free_marks_by_a_random_descent(store_target: StoreTarget) -> None:
    store, other = store_target.open(), store_target.open()
    layout = Layout(store)
    layout.init_cluster()
    marked = [1, 2, 3, 1 << 20, (1 << 40) + 5]
    for ledger_id in marked:
        assert layout.mark_underreplicated(ledger_id, [B3])
    assert Layout(other).lock_underreplicated(2, "other") is not None
    taken, seen = layout.take_underreplicated(3, "w", skip={3}, rng=random.Random(1))
    assert len(taken) == 3 and seen >= 3
    assert {t.ledger_id for t in taken} <= {1, 1 << 20, (1 << 40) + 5}  # 2 is locked, 3 skipped
    assert all(t.replicas == (B3,) and t.version == 0 for t in taken)
    assert all(layout.lock_holder(t.ledger_id) == "w" for t in taken)
    again, _ = layout.take_underreplicated(5, "w", rng=random.Random(2))
    assert [t.ledger_id for t in again] == [3]  # the rest are locked
    for mark in [*taken, *again]:  # one request each: the mark, its level and the lock
        assert layout.mark_replicated(mark.ledger_id, mark.version, mark.session_id)
        assert layout.lock_holder(mark.ledger_id) is None
    assert list(layout.underreplicated_ids()) == [2]
    assert store.children("/ledgers/underreplication/ledgers/0000/0000/0000") == ["0002"]
    assert layout.take_underreplicated(1, "w") == ([], 1)


def test_take_newest_first_takes_the_highest_ids(store: MetadataStore) -> None:
    layout = Layout(store)
    for ledger_id in (3, 70_000, 9, (1 << 33) + 1, 5):
        layout.mark_underreplicated(ledger_id, [B3])
    order = []
    for _ in range(5):
        (mark,), _ = layout.take_underreplicated(1, "w", skip=order, newest_first=True)
        order.append(mark.ledger_id)
    assert order == [(1 << 33) + 1, 70_000, 9, 5, 3]


def test_take_passes_over_a_mark_gone_after_the_listing_and_a_remark_survives(
    store_target: StoreTarget,
) -> None:
    store = store_target.open()
    layout = Layout(store)
    layout.mark_underreplicated(9, [B3])
    (mark,), _ = layout.take_underreplicated(1, "w")
    layout.mark_underreplicated(9, [B4])  # re-marked while being replicated: must survive
    assert not layout.mark_replicated(9, mark.version, mark.session_id)
    assert layout.lock_holder(9) is None and layout.read_underreplicated(9) is not None
    store.delete("/ledgers/underreplication/ledgers/0000/0000/0000/0009/urL0000000009")
    assert layout.take_underreplicated(1, "w")[0] == []  # its empty level is left: no lock kept
    assert layout.lock_holder(9) is None
    assert layout.mark_underreplicated(9, [B3])  # over the empty level left behind
    assert layout.read_underreplicated(9) is not None


def test_a_take_from_a_kept_listing_locks_no_mark_replicated_since(store_target: StoreTarget) -> None:
    """A kept listing names marks other workers replicated since: they are read, not locked."""
    store, other = store_target.open(), store_target.open()
    layout, levels = Layout(store), UpperLevels(ttl_s=600)
    for ledger_id in (1, 2, 3):
        layout.mark_underreplicated(ledger_id, [B3])
    (first,), _ = layout.take_underreplicated(1, "w", skip={2, 3}, levels=levels)  # listings kept
    theirs = Layout(other)
    for ledger_id in (2, 3):
        assert theirs.lock_underreplicated(ledger_id, "other") is not None
        assert theirs.mark_replicated(ledger_id)
    assert layout.take_underreplicated(2, "w", skip={first.ledger_id}, levels=levels)[0] == []
    assert layout.lock_holder(2) is None and layout.lock_holder(3) is None
    assert layout.mark_replicated(first.ledger_id, first.version, first.session_id)


def test_a_level_left_unpruned_goes_when_a_take_lists_it_empty(store: MetadataStore) -> None:
    layout = Layout(store)
    layout.mark_underreplicated(5, [B3])
    (mark,), _ = layout.take_underreplicated(1, "w")
    assert layout.mark_replicated(mark.ledger_id, mark.version, mark.session_id, prune=False)
    assert store.children("/ledgers/underreplication/ledgers/0000/0000/0000") == []  # left behind
    assert layout.take_underreplicated(1, "w") == ([], 0)
    assert store.children("/ledgers/underreplication/ledgers") == []


def test_marks_sent_together_merge_into_marks_already_there(store: MetadataStore) -> None:
    layout = Layout(store)
    layout.mark_underreplicated(2, [B1], ctime_ms=5)
    layout.mark_many_underreplicated([(1, [B3, B3]), (2, [B3]), (1 << 40, [B4])])
    assert list(layout.underreplicated_ids()) == [1, 2, 1 << 40]
    marks = {i: layout.read_underreplicated(i) for i in (1, 2, 1 << 40)}
    assert {i: m.value.replicas for i, m in marks.items() if m} == {1: (B3,), 2: (B1, B3), 1 << 40: (B4,)}
    layout.mark_many_underreplicated([])


def test_malformed_marks_are_reported_and_skipped(store: MetadataStore) -> None:
    layout = Layout(store)
    layout.mark_underreplicated(1, [B3])
    store.create(
        "/ledgers/underreplication/ledgers/0000/0000/0000/0002/urL0000000002", b"\xff", make_parents=True
    )
    store.create("/ledgers/underreplication/ledgers/0000/0000/0000/0003/urL0000000004", make_parents=True)
    store.create("/ledgers/underreplication/ledgers/zzzz")
    problems = Problems()
    assert [e.ledger_id for e in layout.underreplicated_ledgers(problems)] == [1]
    assert sorted(p.rsplit("/", 1)[1] for p, _ in problems) == ["urL0000000002", "urL0000000004", "zzzz"]
    with pytest.raises(CorruptDataError):
        layout.mark_underreplicated(2, [B1])


# --- auditor election and flags ----------------------------------------------------------------------


def test_auditor_votes_lowest_sequence_wins(store_target: StoreTarget) -> None:
    first, second = store_target.open(), store_target.open()
    layout = Layout(second)
    assert layout.current_auditor() is None
    Layout(first).add_auditor_vote("10.0.0.1:3181")
    vote = layout.add_auditor_vote("10.0.0.2:3181")
    assert vote.startswith("/ledgers/underreplication/auditorelection/V_")
    assert [bookie for _, bookie in layout.auditor_votes()] == ["10.0.0.1:3181", "10.0.0.2:3181"]
    assert layout.current_auditor() == "10.0.0.1:3181"
    first.close()
    assert layout.current_auditor() == "10.0.0.2:3181"
    layout.set_elected_auditor("10.0.0.2:3181")
    assert layout.last_elected_auditor() == "10.0.0.2:3181"


def test_flags_of_the_java_dump(dump5: LoadedDump) -> None:
    layout = Layout(dump5.store)
    assert layout.autorecovery_enabled()
    assert layout.lost_bookie_recovery_delay() == 0
    assert layout.current_auditor() is None  # the auditor's vote went with its session
    assert layout.last_elected_auditor() == "127.0.0.1:33189"
    assert Layout(dump5.store).instance_id() == "76a3f9d8-1a95-4d6d-9ea6-d348aaecafd7"


def test_flags(store: MetadataStore) -> None:
    layout = Layout(store)
    assert layout.lost_bookie_recovery_delay() is None
    layout.set_lost_bookie_recovery_delay(0)
    assert layout.lost_bookie_recovery_delay() == 0
    layout.set_lost_bookie_recovery_delay(60)
    assert store.get("/ledgers/underreplication/lostBookieRecoveryDelay")[0] == b"60"
    with pytest.raises(UsageError):
        layout.set_lost_bookie_recovery_delay(-1)
    assert layout.set_autorecovery_enabled(False) and not layout.autorecovery_enabled()
    assert not layout.set_autorecovery_enabled(False)
    assert layout.set_autorecovery_enabled(True) and layout.autorecovery_enabled()
    assert not layout.set_autorecovery_enabled(True)
    layout.set_check_ctime("checkallledgersctime", 1234)
    assert layout.check_ctime("checkallledgersctime") == 1234
    assert layout.check_ctime("replicascheckctime") is None
