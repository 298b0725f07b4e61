"""The offline inspect commands on a real Java bookie's files, on files we write, and on corrupt files.

Every run is guarded by hashes of its input files: inspect must never modify what it reads.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bkctl.cli import build_app
from bkctl.errors import BkctlError, CorruptDataError, ExitCode, NotFoundError, UsageError
from bkctl.model import DigestType
from bkctl.protocol import entry
from bkctl.protocol import entrylog_format as ef
from bkctl.protocol import index_format as ixf
from bkctl.protocol import journal_format as jf
from tests.commands.sandbox_proc import bkctl
from tests.conftest import JAVA_BOOKIES, JAVA_SHELL_OUTPUT
from tests.storage_builders import (
    PASSWORD,
    entry_log_bytes,
    index_bytes,
    journal_bytes,
    ledger_journal_bodies,
    packaged,
    write,
)

BOOKIES = ("bookie1", "bookie2", "bookie3")
JOURNAL_IDS = {"bookie1": "1a200fa8f95", "bookie2": "1a200fa8ff2", "bookie3": "1a200fa8e99"}
MASTER_KEY = "3b56e4145429cee1d2a84df4f6a4cb8ad7173a46"


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(autouse=True)
def golden_files_untouched() -> Iterator[None]:
    """Hash every shared golden file before and after each test."""
    before = _hashes(JAVA_BOOKIES)
    yield
    assert _hashes(JAVA_BOOKIES) == before


def invoke(*args: str) -> tuple[int, str, str, BaseException | None]:
    """Run a command in-process: (exit code as the process would exit, stdout, stderr, exception).
    The app with only this command, as `bkctl` builds it (the whole app took 90 ms per call to convert)."""
    result = CliRunner().invoke(build_app(list(args)), list(args), catch_exceptions=True)
    exc = result.exception
    if isinstance(exc, BkctlError):
        return int(exc.exit_code), result.stdout, result.stderr, exc
    if exc is not None and not isinstance(exc, SystemExit):
        raise exc
    return result.exit_code, result.stdout, result.stderr, None


def invoke_json(*args: str) -> Any:
    code, out, err, exc = invoke(*args, "-o", "json")
    assert code == 0, (err, exc)
    return json.loads(out)


def run_guarded(paths: list[Path], *args: str) -> tuple[int, str, str, BaseException | None]:
    """invoke(), checking the files under `paths` are byte-identical afterwards."""
    before = {p: _hashes(p) if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    result = invoke(*args)
    after = {p: _hashes(p) if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    assert after == before
    return result


# --- Java's BookieShell output, parsed ----------------------------------------------------------------

BLOCK = re.compile(r"--------- Lid=(-?\d+), Eid=(-?\d+), ByteOffset=(\d+), EntrySize=(\d+) ---------")


def java_records(path: Path) -> list[dict[str, Any]]:
    """The record blocks of a readjournal/readlog output: ids, offset, size, type and its detail."""
    records: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        match = BLOCK.match(line)
        if match:
            lid, eid, offset, size = map(int, match.groups())
            records.append({"ledger_id": lid, "entry_id": eid, "offset": offset, "size": size})
        elif line.startswith("Type:"):
            records[-1]["type"] = line.split()[1]
        elif line.startswith("LastConfirmed:"):
            records[-1]["lac"] = int(line.split()[1])
        elif line.startswith("MasterKey:"):
            records[-1]["master_key"] = line.split()[1]
        elif line.strip() == "Fenced":
            records[-1]["fenced"] = True
    return records


def as_java(record: dict[str, Any]) -> dict[str, Any]:
    """Our JSON record as Java's shell prints it. Documented differences: Java prints explicit-LAC
    records as DATA (with the LAC body's first long as 'LastConfirmed'-less DATA) and skips padding."""
    java: dict[str, Any] = {key: record[key] for key in ("ledger_id", "entry_id", "offset", "size")}
    kind = record["type"]
    if kind in ("MASTER_KEY", "FENCE"):
        java["type"] = "META"
        if kind == "MASTER_KEY":
            java["master_key"] = record["master_key"]
        else:
            java["fenced"] = True
    else:
        java["type"] = "DATA"
        java["lac"] = record.get("last_add_confirmed")
    return java


@pytest.mark.parametrize("bookie", BOOKIES)
def test_journal_matches_java_readjournal(bookie: str) -> None:
    journal_dir = JAVA_BOOKIES / bookie / "journal"
    doc = invoke_json("journal", "inspect", str(journal_dir))
    [journal] = doc["journals"]
    assert journal["journal_id"] == int(JOURNAL_IDS[bookie], 16) and journal["version"] == 6
    assert journal["stopped"] is None
    records = journal["records"]
    assert all(r["digest"] == "CRC32" and r["digest_ok"] is True for r in records if r["type"] == "DATA")
    assert journal["summary"]["digest_failures"] == 0
    # Padding is ours only: Java's readjournal skips it silently.
    ours = [as_java(r) for r in records if r["type"] != "PADDING"]
    assert all(r["type"] != "EXPLICIT_LAC" for r in records)  # none in this journal: nothing to remap
    if bookie == "bookie1":
        java = java_records(JAVA_SHELL_OUTPUT / f"snap1-bookie1-readjournal-{JOURNAL_IDS[bookie]}.txt")
        assert len(java) == 908
        assert ours == java
    for record in records:
        if record["type"] == "MASTER_KEY":
            assert record["master_key"] == MASTER_KEY


def test_journal_payloads_and_summary() -> None:
    journal_dir = JAVA_BOOKIES / "bookie1" / "journal" / "current"
    doc = invoke_json("journal", "inspect", str(journal_dir), "--show-data", "--ledger", "3")
    [journal] = doc["journals"]
    data = [r for r in journal["records"] if r["type"] == "DATA"]
    assert data and all(r["ledger_id"] == 3 for r in journal["records"])
    for record in data:
        payload = base64.b64decode(record["payload_base64"])
        assert payload == f"L3-E{record['entry_id']}".encode()
    summary = invoke_json("journal", "inspect", str(journal_dir), "--summary")["journals"][0]
    assert "records" not in summary
    assert summary["summary"]["types"]["DATA"] == 903
    assert summary["summary"]["types"]["PADDING"] == 904
    assert summary["summary"]["ledgers"] == [0, 1, 2, 3]
    assert summary["summary"]["first_offset"] == 512


@pytest.mark.parametrize("bookie", BOOKIES)
def test_entry_log_matches_java_readlog(bookie: str) -> None:
    log = JAVA_BOOKIES / bookie / "ledgers" / "current" / "0.log"
    doc = invoke_json("entrylog", "inspect", str(log), "--show-data")
    assert (doc["log_id"], doc["header_version"], doc["ledgers_map_offset"], doc["stopped"]) == (
        0,
        1,
        0,
        None,
    )
    for record in doc["records"]:
        assert record["digest"] == "CRC32" and record["digest_ok"] is True
        payload = base64.b64decode(record["payload_base64"])
        assert payload == f"L{record['ledger_id']}-E{record['entry_id']}".encode()
    if bookie == "bookie1":
        java = java_records(JAVA_SHELL_OUTPUT / "snap1-bookie1-readlog-0.txt")
        assert [as_java(r) for r in doc["records"]] == java


@pytest.mark.parametrize("bookie", BOOKIES)
@pytest.mark.parametrize("ledger", [0, 1, 2, 3])
def test_index_matches_java_ledger_dump(bookie: str, ledger: int) -> None:
    ledger_dir = JAVA_BOOKIES / bookie / "ledgers"
    doc = invoke_json("index", "inspect", "--ledger", str(ledger), "--ledger-dir", str(ledger_dir))
    assert (doc["ledger_id"], doc["version"], doc["master_key"]) == (ledger, 1, MASTER_KEY)
    assert doc["fenced"] is (ledger == 2) and doc["explicit_lac"] is None and doc["slot_count"] == 1024
    entries = {e["entry_id"]: (e["log_id"], e["offset"]) for e in doc["entries"]}
    holes = {e for first, last in doc["holes"] for e in range(first, last + 1)}
    assert doc["last_entry_id"] == max(entries)
    assert holes == set(range(max(entries) + 1)) - set(entries)
    # Every location points at the record of that entry in the entry log (offset after its size).
    log = (ledger_dir / "current" / "0.log").read_bytes()
    for entry_id, (_, offset) in entries.items():
        assert ef.record_key(log[offset : offset + 16]) == (ledger, entry_id)
    if bookie == "bookie1":
        text = (JAVA_SHELL_OUTPUT / f"snap1-bookie1-ledger-index-{ledger}.txt").read_text()
        java = {
            int(e): (int(lg), int(p))
            for e, lg, p in re.findall(r"entry (\d+)\t:\t\(log:(\d+), pos: (\d+)\)", text)
        }
        assert entries == java
        assert f"master key  : {MASTER_KEY}" in text
        assert f"isFenced     : {'true' if doc['fenced'] else 'false'}" in text
        assert f"entries      : {doc['slot_count']}" in text


def test_lastmark_matches_java() -> None:
    text = (JAVA_SHELL_OUTPUT / "snap1-bookie1-lastmark.txt").read_text()
    jid, name, pos = re.search(r"Journal Id - (\d+)\((\w+\.txn)\), Pos - (\d+)", text).groups()  # type: ignore[union-attr]
    for where in (JAVA_BOOKIES / "bookie1", JAVA_BOOKIES / "bookie1" / "ledgers"):
        mark = invoke_json("lastmark", str(where))["marks"][0]
        assert (mark["journal_id"], mark["journal_file"], mark["offset"]) == (int(jid), name, int(pos))


GOLDEN_COMMANDS = [
    ("journal", "inspect", "{b}/journal"),
    ("journal", "inspect", "{b}/journal", "--summary"),
    ("journal", "inspect", "{b}/journal/current/{j}.txn", "--show-data"),
    ("entrylog", "inspect", "{b}/ledgers/current/0.log", "--show-data"),
    ("entrylog", "inspect", "{b}/ledgers/current/0.log", "--summary"),
    ("entrylog", "inspect", "{b}/ledgers/current/1.log"),
    ("entrylog", "metadata", "{b}/ledgers/current/0.log"),
    ("entrylog", "metadata", "{b}/ledgers/current/1.log"),
    ("index", "inspect", "{b}/ledgers/current/0/0/0.idx"),
    ("index", "inspect", "{b}/ledgers/current/0/1/1.idx"),
    ("index", "inspect", "{b}/ledgers/current/0/2/2.idx"),
    ("index", "inspect", "{b}/ledgers/current/0/3/3.idx"),
    ("lastmark", "{b}/ledgers"),
]


@pytest.mark.parametrize("bookie", BOOKIES)
@pytest.mark.parametrize("fmt", ["table", "json", "plain"])
def test_every_golden_file_every_format(bookie: str, fmt: str) -> None:
    root = JAVA_BOOKIES / bookie
    for command in GOLDEN_COMMANDS:
        args = [a.format(b=root, j=JOURNAL_IDS[bookie]) for a in command]
        code, out, err, exc = invoke(*args, "-o", fmt)
        assert code == 0, (args, err, exc)
        assert out or (fmt == "plain" and "1.log" in args[2]), args  # plain: no rows, no output
        if fmt == "json":
            json.loads(out)


def test_entry_log_metadata_by_scan_matches_records() -> None:
    log = JAVA_BOOKIES / "bookie1" / "ledgers" / "current" / "0.log"
    meta = invoke_json("entrylog", "metadata", str(log))
    records = invoke_json("entrylog", "inspect", str(log))["records"]
    sizes: dict[int, int] = {}
    for r in records:
        sizes[r["ledger_id"]] = sizes.get(r["ledger_id"], 0) + r["size"] + 4
    assert meta["source"] == "scan"
    assert {x["ledger_id"]: x["size"] for x in meta["ledgers"]} == sizes
    assert meta["total_size"] == meta["remaining_size"] == sum(sizes.values()) == log.stat().st_size - 1024


def test_entry_filter() -> None:
    log = JAVA_BOOKIES / "bookie1" / "ledgers" / "current" / "0.log"
    doc = invoke_json("entrylog", "inspect", str(log), "-l", "2", "-e", "3", "-m")
    assert [(r["ledger_id"], r["entry_id"]) for r in doc["records"]] == [(2, 3)]
    assert doc["records"][0]["entry_offset"] == 36762  # ledger 2's index says entry 3 is at pos 36762
    code, _, _, exc = invoke("entrylog", "inspect", str(log), "-e", "3")
    assert code == ExitCode.USAGE and isinstance(exc, UsageError)


# --- files we write with our encoders -------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 4, 5, 6])
@pytest.mark.parametrize("digest", [DigestType.CRC32C, DigestType.CRC32, DigestType.MAC])
def test_our_journals(tmp_path: Path, version: int, digest: DigestType) -> None:
    bodies = ledger_journal_bodies(12, 10, digest, version) + ledger_journal_bodies(
        13, 3, DigestType.CRC32C, version
    )
    path = write(
        tmp_path / "current" / jf.journal_file_name(0x1234), journal_bytes(version, bodies, pad_every=2)
    )
    args = ["journal", "inspect", str(tmp_path), "--show-data", "--password", PASSWORD.decode(), "-o", "json"]
    code, out, err, exc = run_guarded([tmp_path], *args)
    assert code == 0, (err, exc)
    [journal] = json.loads(out)["journals"]
    assert journal["version"] == version and journal["journal_id"] == 0x1234
    records = [r for r in journal["records"] if r["type"] != "PADDING"]
    assert len(records) == len(bodies)
    data = [r for r in records if r["type"] == "DATA"]
    assert all(r["digest_ok"] is True for r in data)
    assert {r["digest"] for r in data if r["ledger_id"] == 12} == {digest.name}
    for r in data:
        assert base64.b64decode(r["payload_base64"]) == f"L{r['ledger_id']}-E{r['entry_id']}".encode()
    lacs = [r["explicit_lac"] for r in records if r["type"] == "EXPLICIT_LAC"]
    assert lacs == (
        [
            {"ledger_id": 12, "lac": 9, "raw": lacs[0]["raw"]},
            {"ledger_id": 13, "lac": 2, "raw": lacs[1]["raw"]},
        ]
        if version >= 6
        else []
    )
    fences = [r["ledger_id"] for r in records if r["type"] == "FENCE"]
    assert fences == ([12, 13] if version >= 4 else [])
    assert path.exists()


def test_mac_without_password_is_unverifiable_and_digest_option(tmp_path: Path) -> None:
    bodies = ledger_journal_bodies(5, 4, DigestType.MAC)
    write(tmp_path / "1.txn", journal_bytes(6, bodies))
    [journal] = invoke_json("journal", "inspect", str(tmp_path / "1.txn"))["journals"]
    data = [r for r in journal["records"] if r["type"] == "DATA"]
    assert {(r["digest"], r["digest_ok"]) for r in data} == {(None, None)}
    assert journal["summary"]["digest_unverified"] == 4
    [journal] = invoke_json(
        "journal", "inspect", str(tmp_path / "1.txn"), "--digest", "mac", "--password", "testpasswd", "-m"
    )["journals"]
    data = [r for r in journal["records"] if r["type"] == "DATA"]
    assert {(r["digest"], r["digest_ok"]) for r in data} == {("MAC", True)}
    assert base64.b64decode(data[0]["payload_base64"]) == b"L5-E0"  # 20-byte digest split off, not 8
    code, _, _, exc = invoke("journal", "inspect", str(tmp_path / "1.txn"), "--digest", "mac")
    assert code == ExitCode.USAGE and isinstance(exc, UsageError)
    code, _, _, _exc = invoke("journal", "inspect", str(tmp_path / "1.txn"), "--digest", "sha9")
    assert code == ExitCode.USAGE


def test_table_shows_text_or_hex_payloads(tmp_path: Path) -> None:
    bodies = [packaged(1, 0, payload=b"hello"), packaged(1, 1, payload=b"\x00\xff")]
    write(tmp_path / "1.txn", journal_bytes(6, bodies))
    code, out, _, _ = invoke("journal", "inspect", str(tmp_path / "1.txn"), "-m", "-o", "plain")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split("\t")[-1] == "hello" and lines[1].split("\t")[-1] == "00ff"


@pytest.mark.parametrize("version", [0, 1])
def test_our_entry_logs(tmp_path: Path, version: int) -> None:
    entries = [packaged(lid, e, DigestType.CRC32C) for lid in (4, 6) for e in range(30)]
    data, locations = entry_log_bytes(2, entries, version, with_map=True)
    log = write(tmp_path / "2.log", data)
    doc = invoke_json("entrylog", "inspect", str(log), "-m")
    records = [r for r in doc["records"] if r["type"] == "DATA"]
    assert len(records) == 60 and all(r["digest"] == "CRC32C" and r["digest_ok"] for r in records)
    assert [r["type"] for r in doc["records"]][-1] == "LEDGERS_MAP"
    for r in records:
        assert ef.entry_location(2, r["entry_offset"]) == locations[(r["ledger_id"], r["entry_id"])]
    meta = invoke_json("entrylog", "metadata", str(log))
    assert meta["source"] == "ledgers-map"
    expected = {lid: sum(len(e) + 4 for e in entries if ef.record_key(e)[0] == lid) for lid in (4, 6)}
    assert meta["ledgers"] == [{"ledger_id": lid, "size": size} for lid, size in expected.items()]
    assert meta["total_size"] == sum(x["size"] for x in meta["ledgers"])


def test_our_index_with_explicit_lac_and_holes(tmp_path: Path) -> None:
    lac = entry.encode_lac_body(DigestType.CRC32C, 77, 5)
    header = ixf.IndexHeader(1, entry.master_key(PASSWORD), ixf.STATE_FENCED, lac)
    locations = {e: ef.entry_location(3, 1028 + 100 * e) for e in (0, 1, 4, 5, 9, 2000)}
    index_dir = tmp_path / "ledgers"
    write(index_dir / "current" / ixf.index_path(77), index_bytes(header, locations))
    doc = invoke_json("index", "inspect", "-l", "77", "--index-dir", str(index_dir))
    assert doc["fenced"] is True and doc["master_key"] == MASTER_KEY
    assert doc["explicit_lac"]["ledger_id"] == 77 and doc["explicit_lac"]["lac"] == 5
    assert [e["entry_id"] for e in doc["entries"]] == sorted(locations)
    assert doc["holes"] == [[2, 3], [6, 8], [10, 1999]] and doc["last_entry_id"] == 2000
    assert doc["slot_count"] == 2048
    code, out, _, _ = invoke("index", "inspect", "-l", "77", "--index-dir", str(index_dir), "-o", "table")
    assert code == 0 and "2-3,6-8,10-1999" in out


def test_lastmark_numbered_files(tmp_path: Path) -> None:
    write(tmp_path / "current" / "lastMark", jf.encode_last_mark(5, 1024))
    write(tmp_path / "current" / "lastMark.1", jf.encode_last_mark(0x1B, 99))
    marks = invoke_json("lastmark", str(tmp_path))["marks"]
    assert [(m["journal_id"], m["journal_file"], m["offset"]) for m in marks] == [
        (5, "5.txn", 1024),
        (27, "1b.txn", 99),
    ]


# --- corrupt and truncated files ------------------------------------------------------------------


def _copy_journal(tmp_path: Path) -> tuple[Path, bytearray]:
    source = JAVA_BOOKIES / "bookie1" / "journal" / "current" / "1a200fa8f95.txn"
    path = tmp_path / source.name
    shutil.copyfile(source, path)
    return path, bytearray(path.read_bytes())


def _expect_corrupt(paths: list[Path], *args: str) -> tuple[Any, str, BaseException | None]:
    code, out, err, exc = run_guarded(paths, *args, "-o", "json")
    assert code == ExitCode.CORRUPT, (err, exc)
    assert isinstance(exc, CorruptDataError)
    assert "Traceback" not in err
    return json.loads(out), str(exc), exc


@pytest.mark.parametrize(
    ("offset", "patch", "reason"),
    [
        (394752, b"\xff\xff\xff\xfe", "negative length"),  # the master key record of ledger 3
        (394752, b"\x7f\x00\x00\x00", "exceeds"),
        (394752, b"\x00\x00\x00\x05", "shorter than ledger id"),
        (1028, b"\xff\xff\xff\xff", "bad padding"),  # the padding length after entry 0
    ],
)
def test_corrupt_journal(tmp_path: Path, offset: int, patch: bytes, reason: str) -> None:
    path, data = _copy_journal(tmp_path)
    if reason == "bad padding":
        offset = 605 + 4
    data[offset : offset + len(patch)] = patch
    path.write_bytes(bytes(data))
    doc, message, _ = _expect_corrupt([path], "journal", "inspect", str(path))
    journal = doc["journals"][0]
    assert journal["stopped"]["offset"] == (offset if reason != "bad padding" else 605)
    assert reason in journal["stopped"]["reason"]
    assert f"offset {journal['stopped']['offset']}" in message and path.name in message
    assert all(r["offset"] < journal["stopped"]["offset"] for r in journal["records"])
    assert len(journal["records"]) > 0


def test_flipped_payload_byte_fails_digest_not_scan(tmp_path: Path) -> None:
    path, data = _copy_journal(tmp_path)
    data[1536 + 4 + 40] ^= 0xFF  # inside the payload of ledger 0 entry 3
    path.write_bytes(bytes(data))
    [journal] = invoke_json("journal", "inspect", str(path))["journals"]
    bad = [r for r in journal["records"] if r.get("digest_ok") is False]
    assert [(r["ledger_id"], r["entry_id"], r["digest"]) for r in bad] == [(0, 3, "CRC32")]
    assert journal["summary"]["digest_failures"] == 1 and journal["stopped"] is None
    summary = invoke_json("journal", "inspect", str(path), "--summary")["journals"][0]["summary"]
    assert summary["digest_failures"] == 1


def test_truncated_journal_mid_record(tmp_path: Path) -> None:
    path, data = _copy_journal(tmp_path)
    path.write_bytes(bytes(data[: 1536 + 20]))
    doc, _message, _ = _expect_corrupt([path], "journal", "inspect", str(path), "--summary")
    journal = doc["journals"][0]
    assert journal["stopped"] == {"offset": 1536, "reason": "truncated record of 45 bytes at end of file"}
    assert journal["summary"]["types"]["DATA"] == 2


def test_journal_dir_keeps_going_after_a_corrupt_file(tmp_path: Path) -> None:
    good = journal_bytes(6, ledger_journal_bodies(1, 3, DigestType.CRC32C))
    write(tmp_path / "current" / "a.txn", good[:-5])
    write(tmp_path / "current" / "b.txn", good)
    write(tmp_path / "current" / "c.txn", b"BKLG\x00\x00\x00\x09" + bytes(600))
    doc, message, _ = _expect_corrupt([tmp_path], "journal", "inspect", str(tmp_path))
    journals = doc["journals"]
    assert [j["journal_id"] for j in journals] == [0xA, 0xB, 0xC]
    assert journals[0]["stopped"]["reason"].startswith("truncated")
    assert journals[1]["stopped"] is None and len(journals[1]["records"]) == 6
    assert "unsupported journal version 9" in journals[2]["stopped"]["reason"]
    assert "and 1 more" in message


def test_garbage_journal_is_v1_and_corrupt(tmp_path: Path) -> None:
    path = write(tmp_path / "7.txn", bytes(range(256)) * 4)
    doc, _, _ = _expect_corrupt([path], "journal", "inspect", str(path))
    assert doc["journals"][0]["version"] == 1 and doc["journals"][0]["stopped"]["offset"] == 0


def _copy_log(tmp_path: Path) -> tuple[Path, bytearray]:
    source = JAVA_BOOKIES / "bookie1" / "ledgers" / "current" / "0.log"
    path = tmp_path / "0.log"
    shutil.copyfile(source, path)
    return path, bytearray(path.read_bytes())


def test_entry_log_bad_magic_still_scanned(tmp_path: Path) -> None:
    path, data = _copy_log(tmp_path)
    data[0:4] = b"XXXX"
    path.write_bytes(bytes(data))
    doc, message, _ = _expect_corrupt([path], "entrylog", "inspect", str(path))
    assert doc["header_version"] is None and len(doc["records"]) == 903
    assert doc["stopped"]["offset"] == 0 and "magic" in doc["stopped"]["reason"]
    assert "magic" in message


def test_entry_log_huge_size_and_truncation(tmp_path: Path) -> None:
    path, data = _copy_log(tmp_path)
    data[1073:1077] = b"\x7f\xff\xff\xff"
    path.write_bytes(bytes(data))
    doc, _, _ = _expect_corrupt([path], "entrylog", "inspect", str(path))
    assert len(doc["records"]) == 1 and doc["stopped"]["offset"] == 1073
    path, data = _copy_log(tmp_path)
    path.write_bytes(bytes(data[:-10]))
    doc, _, _ = _expect_corrupt([path], "entrylog", "inspect", str(path), "--summary")
    assert doc["summary"]["types"]["DATA"] == 902 and "truncated" in doc["stopped"]["reason"]
    doc, _, _ = _expect_corrupt([path], "entrylog", "metadata", str(path))
    assert doc["source"] == "scan" and doc["stopped"]["offset"] == 46762


def test_entry_log_bad_ledgers_map(tmp_path: Path) -> None:
    data, _ = entry_log_bytes(1, [packaged(1, e) for e in range(3)], with_map=True)
    header = ef.decode_header(data)
    corrupt = bytearray(data)
    corrupt[header.ledgers_map_offset + 4 + 16 : header.ledgers_map_offset + 4 + 20] = b"\0\0\x99\x99"
    path = write(tmp_path / "1.log", bytes(corrupt))
    doc, _, _ = _expect_corrupt([path], "entrylog", "metadata", str(path))
    assert doc["source"] == "ledgers-map" and doc["stopped"]["offset"] == header.ledgers_map_offset


def test_corrupt_index(tmp_path: Path) -> None:
    source = JAVA_BOOKIES / "bookie1" / "ledgers" / "current" / "0" / "2" / "2.idx"
    path = tmp_path / "2.idx"
    path.write_bytes(source.read_bytes()[:-3])
    doc, _message, _ = _expect_corrupt([path], "index", "inspect", str(path))
    assert len(doc["entries"]) == 67 and doc["stopped"]["offset"] == 9216 - 8
    path.write_bytes(b"BKLE\0\0\0\x01\x7f\0\0\0" + bytes(1012))
    code, out, _err, exc = run_guarded([path], "index", "inspect", str(path))
    assert code == ExitCode.CORRUPT and "offset 0" in str(exc) and out == ""


def test_corrupt_lastmark_and_missing_files(tmp_path: Path) -> None:
    write(tmp_path / "current" / "lastMark", b"\0" * 15)
    code, _, _, exc = run_guarded([tmp_path], "lastmark", str(tmp_path))
    assert code == ExitCode.CORRUPT
    for args in (
        ["journal", "inspect", str(tmp_path / "nope.txn")],
        ["entrylog", "inspect", str(tmp_path / "nope.log")],
        ["index", "inspect", str(tmp_path / "nope.idx")],
        ["index", "inspect", "-l", "5", "--ledger-dir", str(tmp_path)],
        ["lastmark", str(tmp_path / "nope")],
        ["journal", "inspect", str(tmp_path)],
    ):
        code, _, _, exc = invoke(*args)
        assert code == ExitCode.NOT_FOUND and isinstance(exc, NotFoundError), args


def test_subprocess_exit_codes_and_one_line_errors(tmp_path: Path) -> None:
    path, data = _copy_journal(tmp_path)
    path.write_bytes(bytes(data[:2000]))
    digest_before = hashlib.sha256(path.read_bytes()).hexdigest()
    result = subprocess.run(
        [sys.executable, "-m", "bkctl", "journal", "inspect", str(path), "-o", "plain"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == ExitCode.CORRUPT
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("bkctl: error: ") and "offset 1585" in last and "truncated padding" in last
    assert len(result.stdout.splitlines()) == 6  # master key, entries 0, 2, 3 and two paddings
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest_before
    result = subprocess.run(
        [sys.executable, "-m", "bkctl", "lastmark", str(JAVA_BOOKIES / "bookie2"), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (
        result.returncode == 0 and json.loads(result.stdout)["marks"][0]["journal_file"] == "1a200fa8ff2.txn"
    )
    result = subprocess.run(
        [sys.executable, "-m", "bkctl", "index", "inspect", str(tmp_path / "x.idx")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == ExitCode.NOT_FOUND and result.stderr.count("\n") == 1


def test_small_chunks_give_the_same_records(tmp_path: Path) -> None:
    from bkctl.files.journal import journal_records, open_journal

    journal = open_journal(JAVA_BOOKIES / "bookie1" / "journal" / "current" / "1a200fa8f95.txn")
    whole = [(o, k, bytes(b)) for o, k, b in journal_records(journal)]
    scan = journal_records(journal, chunk_size=97)
    assert [(o, k, bytes(b)) for o, k, b in scan] == whole
    assert scan.stop is not None and scan.stop.position == 463360


def test_bad_paths_are_one_line_not_found_errors(tmp_path: Path) -> None:
    """A directory where a file is expected was `internal error: IsADirectoryError`
    (exit 1); a file where a directory is expected said "no such directory"."""
    for args in (["entrylog", "inspect"], ["entrylog", "metadata"], ["index", "inspect"]):
        code, _, _, exc = invoke(*args, str(tmp_path))
        assert code == ExitCode.NOT_FOUND and f"{tmp_path} is a directory, not a file" in str(exc), args
    not_a_dir = tmp_path / "hostname"
    not_a_dir.write_text("x\n")
    code, _, _, exc = invoke("lastmark", str(not_a_dir))
    assert code == ExitCode.NOT_FOUND and f"{not_a_dir} is not a directory" in str(exc)
    # A lastMark file itself is fine.
    mark = JAVA_BOOKIES / "bookie2" / "ledgers" / "current" / "lastMark"
    assert invoke_json("lastmark", str(mark))["marks"][0]["journal_file"] == "1a200fa8ff2.txn"


def test_journal_cut_inside_its_header_is_corrupt(tmp_path: Path) -> None:
    """A journal cut inside its 512-byte header exited 0 with no records and no
    warning, and showed `(id None, ...)`."""
    _, data = _copy_journal(tmp_path)
    cut = tmp_path / "cut.txn"
    cut.write_bytes(bytes(data[:300]))
    code, out, _, exc = run_guarded([cut], "journal", "inspect", str(cut), "-o", "json")
    assert code == ExitCode.CORRUPT and "header cut short: 300 of 512 bytes" in str(exc)
    assert json.loads(out)["journals"][0]["stopped"] == {"offset": 300, "reason": str(exc).split(": ", 2)[2]}
    code, out, _, _ = invoke("journal", "inspect", str(cut), "-o", "table")
    assert "id not in the file name" in out and "None" not in out
    empty = tmp_path / "empty.txn"
    empty.write_bytes(b"")
    assert invoke("journal", "inspect", str(empty))[0] == 0  # an empty journal is fine (Java: too)


def test_plain_summary_of_several_journals_names_each_file(tmp_path: Path) -> None:
    """`journal inspect <dir> --summary -o plain` did not say which file is which."""
    _, out, _, _ = invoke(
        "journal", "inspect", str(JAVA_BOOKIES / "bookie1" / "journal"), "--summary", "-o", "plain"
    )
    files = [line.split("\t")[1] for line in out.splitlines() if line.startswith("file\t")]
    assert files and all(f.endswith(".txn") for f in files)


def _refused_file(tmp_path: Path) -> Path:
    """A file whose open fails with EACCES even for root: a write-only sysfs attribute (the kernel
    refuses to open it for reading whoever asks); for a normal user, mode 000 does too."""
    for candidate in sorted(Path("/sys/bus").glob("*/uevent")):
        try:
            candidate.open("rb").close()
        except PermissionError:
            return candidate
        except OSError:
            continue
    assert os.geteuid() != 0, "no write-only sysfs attribute (/sys/bus/*/uevent) to deny root a read"
    refused = tmp_path / "refused"
    refused.write_bytes(b"")
    refused.chmod(0)
    return refused


def test_permission_denied_is_one_line_exit_4(tmp_path: Path) -> None:
    """Permission denied was exit 2 with usage text for inspect, exit 4 for lastmark.
    Each file is a symlink to a file nobody may read, under the name each command looks for."""
    refused = _refused_file(tmp_path)
    mark = tmp_path / "ledgers" / "current" / "lastMark"
    journals = tmp_path / "journal"
    for link in (tmp_path / "1.log", tmp_path / "1.idx", tmp_path / "1.txn", mark, journals / "2.txn"):
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(refused)
    for args, path in (
        (["entrylog", "inspect", str(tmp_path / "1.log")], tmp_path / "1.log"),
        (["entrylog", "metadata", str(tmp_path / "1.log")], tmp_path / "1.log"),
        (["index", "inspect", str(tmp_path / "1.idx")], tmp_path / "1.idx"),
        (["journal", "inspect", str(tmp_path / "1.txn")], tmp_path / "1.txn"),
        (["journal", "inspect", str(journals)], journals / "2.txn"),
        (["lastmark", str(tmp_path / "ledgers")], mark),
        (["lastmark", str(mark)], mark),
    ):
        result = bkctl(*args)
        assert result.returncode == ExitCode.NOT_FOUND, (args, result.stderr)
        assert result.stderr == f"bkctl: error: {path}: cannot open: Permission denied\n", args
        assert result.stdout == ""
