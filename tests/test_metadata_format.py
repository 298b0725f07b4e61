"""metadata_format.py: every metadata value of a real Java 4.14.8 cluster, hand-written v1/v2 vectors,
round trips and "arbitrary bytes raise only ProtocolError".

Where the facts of the hand-written vectors come from: apache/bookkeeper release-4.14.8,
`LedgerMetadataSerDe.java` (serializeVersion1/serializeVersion2 and the v1 reader: quorum, ensemble size
and length lines, one `first\\tbookie...` line per segment, `last\\tCLOSED` or `-102\\tCLOSED`),
`DataFormats.proto` (field names and numbers), protobuf-java's `TextFormat` printer (two-space indent,
`TextFormatEscaper` escapes) and the layout of docs/layout.md.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bkctl import limits
from bkctl.errors import ProtocolError
from bkctl.model import DigestType, LedgerMetadata, LedgerState, Segment
from bkctl.protocol import metadata_format as mf
from bkctl.protocol import text_format as tf
from bkctl.protocol.metadata_format import (
    BookieEndpoint,
    BookieServiceInfo,
    Cookie,
    LedgerLayout,
    UnderreplicatedLedger,
    UnderreplicationLayout,
)
from tests.conftest import JAVA_BOOKIES, JAVA_ZK_DUMPS

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
Codec = tuple[Callable[[bytes], Any], Callable[[Any], bytes]]


# ======================================================================================= golden data


def _dump_nodes() -> list[tuple[str, str, dict[str, object]]]:
    nodes = []
    for dump in sorted(JAVA_ZK_DUMPS.glob("*.json")):
        for path, node in json.loads(dump.read_text()).items():
            nodes.append((dump.name, path, node))
    return nodes


DUMP_NODES = _dump_nodes()


def _data(node: dict[str, object]) -> bytes:
    encoded = node.get("data_b64") or ""
    assert isinstance(encoded, str)
    return base64.b64decode(encoded)


def _ledger_nodes() -> list[tuple[str, str, dict[str, object]]]:
    return [n for n in DUMP_NODES if "decoded_ledger_metadata" in n[2]]


def _codec_for(path: str) -> Codec | None:
    """Which codec the value at `path` uses (BookKeeper's ZooKeeper layout, reference section c)."""
    rules: list[tuple[str, Codec]] = [
        (
            r"/ledgers/(\d{2,4}/)+L\d{4}|/ledgers/L\d{10}",
            (mf.decode_ledger_metadata, mf.encode_ledger_metadata),
        ),
        (r"/ledgers/cookies/[^/]+", (mf.decode_cookie, mf.encode_cookie)),
        (
            r"/ledgers/available/(readonly/)?(?!readonly$)[^/]+",
            (mf.decode_bookie_service_info, mf.encode_bookie_service_info),
        ),
        (r"/ledgers/LAYOUT", (mf.decode_ledger_layout, mf.encode_ledger_layout)),
        (r"/ledgers/INSTANCEID", (mf.decode_instance_id, mf.encode_instance_id)),
        (
            r"/ledgers/underreplication/LAYOUT",
            (mf.decode_underreplication_layout, mf.encode_underreplication_layout),
        ),
        (
            r"/ledgers/underreplication/auditorelection(/V_\d+)?",
            (mf.decode_auditor_vote, mf.encode_auditor_vote),
        ),
        (r"/ledgers/underreplication/locks/urL\d+", (mf.decode_lock_data, mf.encode_lock_data)),
        (
            r"/ledgers/underreplication/ledgers/.*/urL\d+",
            (mf.decode_underreplicated_ledger, mf.encode_underreplicated_ledger),
        ),
        (
            r"/ledgers/underreplication/lostBookieRecoveryDelay",
            (mf.decode_lost_bookie_recovery_delay, mf.encode_lost_bookie_recovery_delay),
        ),
        (
            r"/ledgers/underreplication/(checkallledgers|placementpolicycheck|replicascheck)ctime",
            (mf.decode_check_ctime, mf.encode_check_ctime),
        ),
    ]
    for pattern, codec in rules:
        if re.fullmatch(pattern, path):
            return codec
    return None


def test_the_dumps_are_there() -> None:
    dumps = {dump for dump, _, _ in DUMP_NODES}
    assert len(dumps) >= 2
    assert all(any(d == dump for d, _, _ in _ledger_nodes()) for dump in dumps)


@pytest.mark.parametrize(("dump", "path", "node"), DUMP_NODES, ids=[f"{d[:9]}{p}" for d, p, _ in DUMP_NODES])
def test_every_znode_decodes_and_reencodes_byte_for_byte(
    dump: str, path: str, node: dict[str, object]
) -> None:
    data = _data(node)
    codec = _codec_for(path)
    if codec is None:
        # Containers only: a BookKeeper znode with data nobody decodes would be a gap in this module.
        assert data == b"" or path.startswith("/zookeeper"), f"{dump}: no codec for {path}"
        return
    decode, encode = codec
    if decode is mf.decode_ledger_metadata:
        # Old ledgers keep their format: re-encode in the version they were read in.
        version = mf.ledger_metadata_format_version(data)
        assert mf.encode_ledger_metadata(mf.decode_ledger_metadata(data), version) == data
        return
    assert encode(decode(data)) == data


@pytest.mark.parametrize(("dump", "path", "node"), _ledger_nodes(), ids=[p for _, p, _ in _ledger_nodes()])
def test_ledger_metadata_matches_java_to_string(dump: str, path: str, node: dict[str, object]) -> None:
    data = _data(node)
    md = mf.decode_ledger_metadata(data)
    version = mf.ledger_metadata_format_version(data)
    assert mf.format_ledger_metadata_java(md, version) == node["decoded_ledger_metadata"]


def _java_fields(text: str) -> dict[str, str]:
    """Java's toString split into its fields (ensembles and customMetadata contain ', ')."""
    body = text.removeprefix("LedgerMetadata{").removesuffix("}")
    fields = dict(re.findall(r"(\w+)=(\{.*?\}|[^,]*)(?:, |$)", body))
    return fields


@pytest.mark.parametrize(("dump", "path", "node"), _ledger_nodes(), ids=[p for _, p, _ in _ledger_nodes()])
def test_ledger_metadata_fields_match_java(dump: str, path: str, node: dict[str, object]) -> None:
    java = _java_fields(str(node["decoded_ledger_metadata"]))
    md = mf.decode_ledger_metadata(_data(node))
    assert int(java["ensembleSize"]) == md.ensemble_size
    assert int(java["writeQuorumSize"]) == md.write_quorum
    assert int(java["ackQuorumSize"]) == md.ack_quorum
    assert java["state"] == md.state.name
    if md.is_closed:
        assert int(java["length"]) == md.length
        assert int(java["lastEntryId"]) == md.last_entry_id
    if "password" in java:
        assert md.password is not None and md.password == base64.b64decode(java["password"][len("base64:") :])
        assert java["digestType"] == (md.digest or DigestType.CRC32).name
    else:
        assert md.password is None
    ensembles = re.findall(r"(\d+)=\[([^\]]*)\]", java["ensembles"])
    assert {s.first_entry_id: s.ensemble for s in md.segments} == {
        int(first): tuple(members.split(", ")) for first, members in ensembles
    }
    custom = re.findall(r"([^={}, ]+)=base64:([A-Za-z0-9+/=]*)", java["customMetadata"])
    assert dict(md.custom_metadata) == {key: base64.b64decode(value) for key, value in custom}


def test_open_ledger_in_dump_1_keeps_its_ctoken_and_no_ctime() -> None:
    node = next(n for d, p, n in DUMP_NODES if d.startswith("zk-dump-1") and p.endswith("/L0001"))
    md = mf.decode_ledger_metadata(_data(node))
    assert md.state is LedgerState.OPEN and md.last_entry_id == -1 and md.length == 0
    assert md.ctime is None and md.c_token is not None and md.c_token > 0
    assert md.ack_quorum_stored


def _version_files() -> list[Path]:
    return sorted(JAVA_BOOKIES.glob("*/*/current/VERSION"))


@pytest.mark.parametrize("path", _version_files(), ids=lambda p: str(p.relative_to(JAVA_BOOKIES)))
def test_version_files_reencode_and_equal_the_stored_cookie(path: Path) -> None:
    data = path.read_bytes()
    cookie = mf.decode_cookie(data)
    assert mf.encode_cookie(cookie) == data
    for _, node_path, node in DUMP_NODES:
        if node_path == f"/ledgers/cookies/{cookie.bookie_id}":
            stored = mf.decode_cookie(_data(node))
            assert stored == cookie
            assert mf.cookie_mismatch(cookie, stored) == []


def test_reference_version_file_is_a_layout_4_cookie() -> None:
    cookie = mf.decode_cookie((JAVA_BOOKIES / "bookie1/journal/current/VERSION").read_bytes())
    assert cookie == Cookie(
        4,
        "127.0.0.1:33181",
        ("/var/lib/bookkeeper/b1/journal",),
        ("/var/lib/bookkeeper/b1/ledgers",),
        "76a3f9d8-1a95-4d6d-9ea6-d348aaecafd7",
        None,
    )


def test_golden_values_decode_to_what_the_readme_says() -> None:
    nodes = {p: _data(n) for d, p, n in DUMP_NODES if d.startswith("zk-dump-5")}
    assert mf.decode_ledger_layout(nodes["/ledgers/LAYOUT"]) == LedgerLayout()
    assert mf.decode_instance_id(nodes["/ledgers/INSTANCEID"]) == "76a3f9d8-1a95-4d6d-9ea6-d348aaecafd7"
    info = mf.decode_bookie_service_info(nodes["/ledgers/available/127.0.0.1:33184"])
    assert info == BookieServiceInfo((BookieEndpoint("bookie", 33184, "127.0.0.1", "bookie-rpc"),))
    layout = mf.decode_underreplication_layout(nodes["/ledgers/underreplication/LAYOUT"])
    assert layout == UnderreplicationLayout("BASIC", 1)
    assert mf.decode_auditor_vote(nodes["/ledgers/underreplication/auditorelection"]) == "127.0.0.1:33189"
    assert (
        mf.decode_lost_bookie_recovery_delay(nodes["/ledgers/underreplication/lostBookieRecoveryDelay"]) == 0
    )
    digests = {p[-5:]: mf.decode_ledger_metadata(v).digest for p, v in nodes.items() if "/00/0000/L" in p}
    assert digests["L0004"] is DigestType.CRC32C and digests["L0005"] is DigestType.MAC


# ============================================================================ hand-written v1 / v2

V2_CLOSED = (
    b"BookieMetadataFormatVersion\t2\n"
    b"quorumSize: 2\n"
    b"ensembleSize: 3\n"
    b"length: 1290\n"
    b"lastEntryId: 199\n"
    b"state: CLOSED\n"
    b"segment {\n"
    b'  ensembleMember: "10.0.0.1:3181"\n'
    b'  ensembleMember: "10.0.0.2:3181"\n'
    b'  ensembleMember: "10.0.0.3:3181"\n'
    b"  firstEntryId: 0\n"
    b"}\n"
    b"segment {\n"
    b'  ensembleMember: "10.0.0.1:3181"\n'
    b'  ensembleMember: "10.0.0.4:3181"\n'
    b'  ensembleMember: "10.0.0.3:3181"\n'
    b"  firstEntryId: 100\n"
    b"}\n"
    b"digestType: HMAC\n"
    b'password: "pass\\tw\\"o\\\\rd\\001\\377"\n'
    b"ackQuorumSize: 2\n"
    b"ctime: 1700000000000\n"
    b"customMetadata {\n"
    b'  key: "application"\n'
    b'  value: "bkctl"\n'
    b"}\n"
    b"customMetadata {\n"
    b'  key: "caf\\303\\251"\n'
    b'  value: "\\000\\n"\n'
    b"}\n"
)
V2_EXPECTED = LedgerMetadata(
    ensemble_size=3,
    write_quorum=2,
    ack_quorum=2,
    segments=(
        Segment(0, ("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181")),
        Segment(100, ("10.0.0.1:3181", "10.0.0.4:3181", "10.0.0.3:3181")),
    ),
    state=LedgerState.CLOSED,
    last_entry_id=199,
    length=1290,
    digest=DigestType.MAC,
    password=b'pass\tw"o\\rd\x01\xff',
    ctime=1700000000000,
    custom_metadata=(("application", b"bkctl"), ("café", b"\x00\n")),
)


def test_v2_vector_decodes_and_reencodes_as_java_prints_it() -> None:
    md = mf.decode_ledger_metadata(V2_CLOSED)
    assert md == V2_EXPECTED
    assert mf.ledger_metadata_format_version(V2_CLOSED) == 2
    assert mf.encode_ledger_metadata(md, 2) == V2_CLOSED
    assert mf.decode_ledger_metadata(mf.encode_ledger_metadata(md)) == md


def test_v2_to_string_as_java() -> None:
    md = mf.decode_ledger_metadata(V2_CLOSED)
    assert mf.format_ledger_metadata_java(md, 2) == (
        "LedgerMetadata{formatVersion=2, ensembleSize=3, writeQuorumSize=2, ackQuorumSize=2, state=CLOSED, "
        "length=1290, lastEntryId=199, digestType=MAC, password=base64:cGFzcwl3Im9ccmQB/w=="
        + ", ensembles={0=[10.0.0.1:3181, 10.0.0.2:3181, 10.0.0.3:3181], "
        "100=[10.0.0.1:3181, 10.0.0.4:3181, 10.0.0.3:3181]}, "
        "customMetadata={application=base64:YmtjdGw=, café=base64:AAo=}}"
    )


def test_v2_reader_accepts_the_rest_of_the_text_format() -> None:
    """Comments, `<>` and `: {`, single quotes, adjacent strings, hex/octal numbers, enum numbers, `;`."""
    text = (
        b"BookieMetadataFormatVersion\t2\n"
        b"# written by hand\n"
        b"quorumSize: 0x2 ensembleSize: 03; length: 1290, lastEntryId: 199\n"
        b"state: 3\n"
        b"segment: < ensembleMember: '10.0.0.1:3181' ensembleMember: \"10.0.0.2:\" '3181'\n"
        b'  ensembleMember: "\\x31\\60.0.0.3:3181" firstEntryId: 0 >\n'
        b"segment { ensembleMember: '10.0.0.1:3181' ensembleMember: '10.0.0.4:3181' "
        b"ensembleMember: '10.0.0.3:3181' firstEntryId: 100 }\n"
        b"digestType: HMAC password: 'pass\\tw\"o\\\\rd\\1\\xff' ackQuorumSize: 2 ctime: 1700000000000\n"
        b"customMetadata { key: 'application' value: 'bkctl' }\n"
        b"customMetadata { key: 'caf\\u00e9' value: '\\0\\n' }"
    )
    assert mf.decode_ledger_metadata(text) == V2_EXPECTED


def test_v2_without_ack_quorum_uses_write_quorum_and_reencodes_without_it() -> None:
    text = (
        b"BookieMetadataFormatVersion\t2\nquorumSize: 2\nensembleSize: 2\nlength: 0\nlastEntryId: -1\n"
        b'state: OPEN\nsegment {\n  ensembleMember: "a:1"\n  ensembleMember: "b:1"\n  firstEntryId: 0\n}\n'
    )
    md = mf.decode_ledger_metadata(text)
    assert md.ack_quorum == 2 and not md.ack_quorum_stored
    assert md.digest is None and md.password is None
    assert mf.encode_ledger_metadata(md, 2) == text
    assert mf.format_ledger_metadata_java(md, 2) == (
        "LedgerMetadata{formatVersion=2, ensembleSize=2, writeQuorumSize=2, ackQuorumSize=2, state=OPEN, "
        "ensembles={0=[a:1, b:1]}, customMetadata={}}"
    )


V1_CLOSED = (
    b"BookieMetadataFormatVersion\t1\n2\n3\n1290\n"
    b"0\t10.0.0.1:3181\t10.0.0.2:3181\t10.0.0.3:3181\n"
    b"100\t10.0.0.1:3181\t10.0.0.4:3181\t10.0.0.3:3181\n"
    b"199\tCLOSED"
)


def test_v1_closed_vector() -> None:
    md = mf.decode_ledger_metadata(V1_CLOSED)
    assert md == dataclasses.replace(
        V2_EXPECTED, digest=None, password=None, ctime=None, custom_metadata=(), ack_quorum=2
    )
    assert mf.encode_ledger_metadata(md, 1) == V1_CLOSED
    assert mf.format_ledger_metadata_java(md, 1) == (
        "LedgerMetadata{formatVersion=1, ensembleSize=3, writeQuorumSize=2, ackQuorumSize=2, state=CLOSED, "
        "length=1290, lastEntryId=199, ensembles={0=[10.0.0.1:3181, 10.0.0.2:3181, 10.0.0.3:3181], "
        "100=[10.0.0.1:3181, 10.0.0.4:3181, 10.0.0.3:3181]}, customMetadata={}}"
    )


def test_v1_in_recovery_and_open_vectors() -> None:
    recovering = b"BookieMetadataFormatVersion\t1\n3\n3\n0\n0\ta:1\tb:1\tc:1\n-102\tCLOSED"
    md = mf.decode_ledger_metadata(recovering)
    assert md.state is LedgerState.IN_RECOVERY and md.last_entry_id == -1 and md.length == 0
    assert mf.encode_ledger_metadata(md, 1) == recovering
    # Body lines may end in \r\n (Java reads them with readLine); the header line may not.
    opened = b"BookieMetadataFormatVersion\t1\n2\r\n2\n0\r\n0\ta:1\tb:1\n"
    md = mf.decode_ledger_metadata(opened)
    assert md.state is LedgerState.OPEN and md.segments == (Segment(0, ("a:1", "b:1")),)
    assert mf.encode_ledger_metadata(md, 1) == opened.replace(b"\r", b"")


def test_ledger_metadata_rejects_what_java_rejects() -> None:
    v3 = mf.encode_ledger_metadata(V2_EXPECTED)
    bad = [
        b"",
        b"BookieMetadataFormatVersion\t4\n",
        b"BookieMetadataFormatVersion\t3",
        b"BookieMetadataFormatVersion\t12345678901\n",
        b"BookieMetadataFormatVersion 3\n",
        v3 + b"\x00",  # bytes after the delimited message
        v3[:-1],
        b"BookieMetadataFormatVersion\t2\nensembleSize: 3\n",  # required quorumSize missing
        b"BookieMetadataFormatVersion\t2\nquorumSize: 2\nensembleSize: 3\nlength: 0\nstate: LIMBO\n",
        b"BookieMetadataFormatVersion\t2\nquorumSize: 2\nensembleSize: 3\nlength: 0\nstate: OPEN\nbogus: 1\n",
        b"BookieMetadataFormatVersion\t2\nquorumSize: 4\nensembleSize: 3\nlength: 0\nstate: OPEN\n",
        b"BookieMetadataFormatVersion\t2\nquorumSize: 9999999999\nensembleSize: 3\nlength: 0\nstate: OPEN\n",
        b"BookieMetadataFormatVersion\t1\n2\n3\n0\n",  # no segment: Java refuses it too
        b"BookieMetadataFormatVersion\t1\r\n2\n2\n0\n0\ta:1\tb:1\n",  # Java parses "1\r" as the version
        b"BookieMetadataFormatVersion\t1\n2\nthree\n0\n",
        b"BookieMetadataFormatVersion\t1\n2\n2\n0\n0\n",
    ]
    for data in bad:
        with pytest.raises(ProtocolError):
            mf.decode_ledger_metadata(data)


def test_custom_metadata_prints_in_java_hash_map_order() -> None:
    # "q" (113) and "a" (97) share bucket 1 of a 16-bucket HashMap, "b" (98) is in bucket 2: buckets in
    # index order, insertion order inside a bucket.
    md = dataclasses.replace(V2_EXPECTED, custom_metadata=(("b", b"2"), ("q", b"1"), ("a", b"0")))
    assert mf.format_ledger_metadata_java(md).endswith(
        "customMetadata={q=base64:MQ==, a=base64:MA==, b=base64:Mg==}}"
    )
    # 13 keys grow the table to 32 buckets: "a" (97 -> 1) now sorts before "q" (113 -> 17).
    many = tuple((chr(ord("a") + i), b"") for i in range(13))
    md = dataclasses.replace(V2_EXPECTED, custom_metadata=(("q", b""), *many[1:], ("a", b"")))
    shown = mf.format_ledger_metadata_java(md).split("customMetadata={")[1]
    assert shown.index("a=") < shown.index("q=")


def test_repeated_custom_metadata_key_is_rejected_like_java() -> None:
    md = dataclasses.replace(V2_EXPECTED, custom_metadata=(("k", b"1"), ("k", b"2")))
    with pytest.raises(ProtocolError):
        mf.decode_ledger_metadata(mf.encode_ledger_metadata(md))


# ================================================================================= round trips


def _bookie() -> st.SearchStrategy[str]:
    host = st.from_regex(r"[a-z0-9][a-z0-9.-]{0,20}", fullmatch=True)
    return st.builds(lambda h, p: f"{h}:{p}", host, st.integers(0, 65535))


@st.composite
def ledger_metadata(draw: st.DrawFn, member: st.SearchStrategy[str] | None = None) -> LedgerMetadata:
    member = _bookie() if member is None else member
    ensemble_size = draw(st.integers(1, 8))
    write_quorum = draw(st.integers(1, ensemble_size))
    ack_quorum = draw(st.integers(1, write_quorum))
    ack_stored = draw(st.booleans())
    firsts = sorted(draw(st.sets(st.integers(1, 1 << 40), max_size=4)))
    ensemble = st.lists(member, min_size=ensemble_size, max_size=ensemble_size).map(tuple)
    keys = draw(st.lists(st.text(max_size=12), unique=True, max_size=4))
    return LedgerMetadata(
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum if ack_stored else write_quorum,
        segments=tuple(Segment(first, draw(ensemble)) for first in [0, *firsts]),
        state=draw(st.sampled_from(LedgerState)),
        last_entry_id=draw(INT64),
        length=draw(INT64),
        digest=draw(st.none() | st.sampled_from(DigestType)),
        password=draw(st.none() | st.binary(max_size=40)),
        ctime=draw(st.none() | INT64),
        custom_metadata=tuple((key, draw(st.binary(max_size=20))) for key in keys),
        c_token=draw(st.none() | INT64),
        ack_quorum_stored=ack_stored,
    )


@given(ledger_metadata(st.text(max_size=30)))
def test_v3_round_trip(md: LedgerMetadata) -> None:
    data = mf.encode_ledger_metadata(md)
    decoded = mf.decode_ledger_metadata(data)
    assert decoded == md and decoded.ack_quorum_stored == md.ack_quorum_stored
    assert mf.encode_ledger_metadata(decoded) == data
    assert mf.format_ledger_metadata_java(decoded).startswith("LedgerMetadata{formatVersion=3, ")


@given(ledger_metadata(st.text(max_size=30)))
def test_v2_round_trip(md: LedgerMetadata) -> None:
    data = mf.encode_ledger_metadata(md, 2)
    # v2 never carried cToken (Java's serializeVersion2 leaves it out).
    assert mf.decode_ledger_metadata(data) == dataclasses.replace(md, c_token=None)
    assert mf.encode_ledger_metadata(mf.decode_ledger_metadata(data), 2) == data


@given(ledger_metadata())
def test_v1_round_trip_keeps_what_v1_has(md: LedgerMetadata) -> None:
    closed = md.state is LedgerState.CLOSED
    if closed and md.last_entry_id == -102:
        md = dataclasses.replace(md, last_entry_id=0)
    expected = dataclasses.replace(
        md,
        ack_quorum=md.write_quorum,
        digest=None,
        password=None,
        ctime=None,
        custom_metadata=(),
        c_token=None,
        last_entry_id=md.last_entry_id if closed else -1,
        length=md.length if closed else 0,
    )
    assert mf.decode_ledger_metadata(mf.encode_ledger_metadata(md, 1)) == expected


def _dir() -> st.SearchStrategy[str]:
    return st.text(st.characters(blacklist_characters=",\t\r\n", blacklist_categories=["Cs"]), min_size=1)


@st.composite
def cookies(draw: st.DrawFn) -> Cookie:
    dirs = st.lists(_dir(), max_size=4).map(tuple)
    return Cookie(
        layout_version=draw(st.integers(4, 9)),
        bookie_id=draw(st.text()),
        journal_dirs=draw(dirs),
        ledger_dirs=draw(dirs),
        instance_id=draw(st.none() | st.text(min_size=1)),
        index_dirs=draw(st.none() | st.lists(_dir(), min_size=1, max_size=3).map(tuple)),
    )


@given(cookies())
def test_cookie_round_trip(cookie: Cookie) -> None:
    data = mf.encode_cookie(cookie)
    assert mf.decode_cookie(data) == cookie
    assert mf.encode_cookie(mf.decode_cookie(data)) == data


@given(st.lists(st.text(), max_size=5).map(tuple), st.none() | INT64)
def test_underreplicated_ledger_round_trip(replicas: tuple[str, ...], ctime: int | None) -> None:
    mark = UnderreplicatedLedger(replicas, ctime)
    data = mf.encode_underreplicated_ledger(mark)
    assert mf.decode_underreplicated_ledger(data) == mark


@given(st.none() | st.text())
def test_lock_and_vote_round_trip(bookie_id: str | None) -> None:
    assert mf.decode_lock_data(mf.encode_lock_data(bookie_id)) == bookie_id
    assert mf.decode_auditor_vote(mf.encode_auditor_vote(bookie_id)) == bookie_id


@given(st.none() | INT64)
def test_check_ctime_round_trip(ctime: int | None) -> None:
    assert mf.decode_check_ctime(mf.encode_check_ctime(ctime)) == ctime


@given(st.integers(-(1 << 31), (1 << 31) - 1))
def test_lost_bookie_recovery_delay_round_trip(delay_s: int) -> None:
    assert mf.decode_lost_bookie_recovery_delay(mf.encode_lost_bookie_recovery_delay(delay_s)) == delay_s


endpoints = st.builds(
    BookieEndpoint,
    st.text(),
    st.integers(-(1 << 31), (1 << 31) - 1),
    st.text(),
    st.text(),
    st.lists(st.text(), max_size=3).map(tuple),
    st.lists(st.text(), max_size=3).map(tuple),
)


@given(
    st.builds(
        BookieServiceInfo,
        st.lists(endpoints, max_size=3).map(tuple),
        st.lists(st.tuples(st.text(), st.text()), max_size=3).map(tuple),
    )
)
def test_bookie_service_info_round_trip(info: BookieServiceInfo) -> None:
    data = mf.encode_bookie_service_info(info)
    assert mf.decode_bookie_service_info(data) == info
    assert mf.encode_bookie_service_info(mf.decode_bookie_service_info(data)) == data


@given(
    st.builds(
        LedgerLayout,
        st.text(st.characters(blacklist_characters=":\n", blacklist_categories=["Cs"])),
        st.integers(-(1 << 31), (1 << 31) - 1),
        st.integers(1, 2),
    ),
    st.builds(UnderreplicationLayout, st.text(), st.integers(-(1 << 31), (1 << 31) - 1)),
    st.text(),
)
def test_layouts_and_instance_id_round_trip(
    layout: LedgerLayout, ur: UnderreplicationLayout, iid: str
) -> None:
    assert mf.decode_ledger_layout(mf.encode_ledger_layout(layout)) == layout
    assert mf.decode_underreplication_layout(mf.encode_underreplication_layout(ur)) == ur
    assert mf.decode_instance_id(mf.encode_instance_id(iid)) == iid


# ========================================================================= underreplication texts


def test_underreplicated_ledger_text_is_what_java_prints() -> None:
    mark = UnderreplicatedLedger(("127.0.0.1:33183", "127.0.0.1:33184"), 1700000000123)
    assert mf.encode_underreplicated_ledger(mark) == (
        b'replica: "127.0.0.1:33183"\nreplica: "127.0.0.1:33184"\nctime: 1700000000123\n'
    )
    assert mf.encode_underreplicated_ledger(UnderreplicatedLedger(("h:1",))) == b'replica: "h:1"\n'
    assert mf.encode_lock_data("worker-host") == b'bookieId: "worker-host"\n'
    assert mf.encode_lock_data(None) == b""
    assert mf.encode_underreplication_layout() == b'type: "BASIC"\nversion: 1\n'
    assert mf.encode_check_ctime(1700000000000) == b"\x08\x80\xd0\x95\xff\xbc1"
    assert mf.encode_check_ctime(None) == b""
    assert mf.decode_check_ctime(b"\x08\x80\xd0\x95\xff\xbc1\x10\x05") == 1700000000000  # unknown field 2


def test_text_strings_escape_as_java_text_format() -> None:
    # Non-ASCII goes out as octal UTF-8 bytes, as TextFormatEscaper.escapeText does.
    vote = mf.encode_auditor_vote("t\ta\"b'c\\dé\x7f")
    assert vote == b'bookieId: "t\\ta\\"b\\\'c\\\\d\\303\\251\\177"\n'
    assert mf.decode_auditor_vote(vote) == "t\ta\"b'c\\dé\x7f"


# ==================================================================================== cookies


def test_cookie_layout_5_with_index_dirs() -> None:
    cookie = Cookie.create("10.0.0.1:3181", ["/j1", "/j2"], ["/d1", "/d2"], "uuid-1", ["/i1"])
    data = mf.encode_cookie(cookie)
    assert data == (
        b'5\nbookieHost: "10.0.0.1:3181"\njournalDir: "/j1,/j2"\nledgerDirs: "2\\t/d1\\t/d2"\n'
        b'instanceId: "uuid-1"\nindexDirs: "1\\t/i1"\n'
    )
    assert mf.decode_cookie(data) == cookie


def test_cookie_layout_3_is_read_only() -> None:
    data = b"3\n10.0.0.1:3181\n/j1,/j2\n2\t/d1\t/d2\n"
    cookie = mf.decode_cookie(data)
    assert cookie == Cookie(3, "10.0.0.1:3181", ("/j1", "/j2"), ("/d1", "/d2"))
    with pytest.raises(ProtocolError, match="read-only"):
        mf.encode_cookie(cookie)
    assert mf.decode_cookie(b"2\n") == Cookie(2, "", (), ())


def test_cookie_decoder_treats_empty_optional_fields_as_absent_like_java() -> None:
    data = b'4\nbookieHost: "h:1"\njournalDir: "/j"\nledgerDirs: "1\\t/d"\ninstanceId: ""\nindexDirs: ""\n'
    assert mf.decode_cookie(data) == Cookie(4, "h:1", ("/j",), ("/d",), None, None)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"x\n",
        b"0\n",
        b'4\njournalDir: "/j"\nledgerDirs: "1\\t/d"\n',  # bookieHost is required
        b'4\nbookieHost: "h:1"\njournalDir: "/j"\nledgerDirs: "2\\t/d"\n',  # count does not match
        b'4\nbookieHost: "h:1"\njournalDir: "/j"\nledgerDirs: "/d"\n',
        b"3\nh:1\n/j\n",
    ],
)
def test_bad_cookies_raise_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        mf.decode_cookie(data)


def test_cookie_encoder_refuses_directories_it_cannot_write() -> None:
    for cookie in (
        Cookie.create("h:1", ["/a,b"], ["/d"]),
        Cookie.create("h:1", ["/j"], ["/d\t2"]),
        Cookie.create("h:1", ["/j"], [""]),
    ):
        with pytest.raises(ProtocolError):
            mf.encode_cookie(cookie)


def test_cookie_mismatch_names_every_differing_field() -> None:
    mine = Cookie.create("10.0.0.1:3181", ["/j"], ["/d1", "/d2"], "uuid-1")
    assert mf.cookie_mismatch(mine, dataclasses.replace(mine, layout_version=4)) == []
    # No index dirs means "the ledger dirs", on either side.
    assert mf.cookie_mismatch(mine, dataclasses.replace(mine, index_dirs=("/d1", "/d2"))) == []
    other = Cookie(4, "10.0.0.2:3181", ("/j2",), ("/d1",), None, ("/i",))
    problems = mf.cookie_mismatch(mine, other)
    assert problems == [
        "bookie ids differ: this bookie has 10.0.0.1:3181, the stored cookie has 10.0.0.2:3181",
        "journal directories differ: this bookie has /j, the stored cookie has /j2",
        "ledger directories differ: this bookie has /d1, /d2, the stored cookie has /d1",
        "index directories differ: this bookie has /d1, /d2, the stored cookie has /i",
        "cluster instance ids differ: this bookie has uuid-1, the stored cookie has none",
    ]
    assert mf.cookie_mismatch(mine, Cookie(2, "", (), ())) == [
        "the stored cookie has layout version 2, too old to compare"
    ]


# ======================================================================== LAYOUT, service info


def test_ledger_layout_rejects_other_shapes() -> None:
    for data in (b"3\nX:1", b"2\n", b"2\nX", b"2\nX:1:2", b"2\nX:one", b"2\nX:1\n", b"\xff"):
        with pytest.raises(ProtocolError):
            mf.decode_ledger_layout(data)
    assert mf.decode_ledger_layout(b"1\nflat:1") == LedgerLayout("flat", 1, 1)


def test_service_info_with_properties_and_two_endpoints() -> None:
    info = BookieServiceInfo(
        (
            BookieEndpoint("bookie", 3181, "10.0.0.1", "bookie-rpc", ("tls",), ("x",)),
            BookieEndpoint("http-server", 8000, "10.0.0.1", "http"),
        ),
        (("autorecovery.enabled", "true"),),
    )
    data = mf.encode_bookie_service_info(info)
    # Field 6 (endpoint, 41 bytes): id, port 3181 = varint ed 18, host, protocol, auth (5), extensions (6).
    assert data.startswith(b'2)\n\x06bookie\x10\xed\x18\x1a\x0810.0.0.1"\nbookie-rpc*\x03tls2\x01x2 ')
    # Then field 7, one map entry {1: key, 2: value}.
    assert data.endswith(b":\x1c\n\x14autorecovery.enabled\x12\x04true")
    assert mf.decode_bookie_service_info(data) == info
    assert mf.decode_bookie_service_info(b"") == BookieServiceInfo()
    with pytest.raises(ProtocolError):
        mf.decode_bookie_service_info(b"2\x02\x08\x01")  # endpoint without its required fields


# ============================================================================ text format bounds


def test_text_format_is_bounded() -> None:
    deep = b"segment {" * (limits.PROTOBUF_DEPTH_MAX + 1)
    with pytest.raises(ProtocolError):
        tf.parse_message(deep, mf.LEDGER_METADATA_SPEC)
    with pytest.raises(ProtocolError):
        mf.decode_underreplicated_ledger(b'replica: "x"\n' * (limits.METADATA_VALUE_SIZE_MAX // 10))
    big = b"BookieMetadataFormatVersion\t2\n" + b" " * limits.LEDGER_METADATA_SIZE_MAX
    with pytest.raises(ProtocolError):
        mf.decode_ledger_metadata(big)


@pytest.mark.parametrize(
    "text",
    [
        b'replica: "unterminated\n',
        b'replica "no colon"\n',
        b"replica: 12\n",
        b'ctime: "12"\n',
        b"ctime: 99999999999999999999\n",
        b"ctime: 1.5\n",
        b'replica: "bad \\q escape"\n',
        b'replica: "\\x"\n',
        b'replica: "\\ud800"\n',
        b"replica {\n}\n",
        b"[ext]: 1\n",
        b'replica: "x" }\n',
        b"\xff",
    ],
)
def test_text_format_errors(text: bytes) -> None:
    with pytest.raises(ProtocolError):
        mf.decode_underreplicated_ledger(text)


# =================================================================== arbitrary input, only ProtocolError

DECODERS: list[Callable[[bytes], object]] = [
    mf.decode_ledger_metadata,
    mf.ledger_metadata_format_version,
    mf.decode_underreplicated_ledger,
    mf.decode_lock_data,
    mf.decode_auditor_vote,
    mf.decode_underreplication_layout,
    mf.decode_check_ctime,
    mf.decode_lost_bookie_recovery_delay,
    mf.decode_cookie,
    mf.decode_bookie_service_info,
    mf.decode_ledger_layout,
    mf.decode_instance_id,
]
PREFIXES = [
    b"",
    b"BookieMetadataFormatVersion\t3\n",
    b"BookieMetadataFormatVersion\t2\n",
    b"BookieMetadataFormatVersion\t1\n",
    b"4\n",
    b"3\n",
    b"2\n",
]
TEXT_TOKENS = [
    *("quorumSize", "ensembleSize", "length", "lastEntryId", "state", "segment", "ensembleMember"),
    *("firstEntryId", "digestType", "password", "customMetadata", "key", "value", "replica", "ctime"),
    *("bookieId", "bookieHost", "journalDir", "ledgerDirs", "indexDirs", "type", "version", "CLOSED"),
    *(":", "{", "}", "<", ">", ";", ",", "#", "\n", " ", "\t", '"', "'", "\\", "-", "0", "7", "0x1f", "-1"),
    *('"a:1"', '"\\t"', '"\\377"', '"1\\t/d"', "HMAC", "OPEN", "3", "2"),
]


def _only_protocol_errors(decode: Callable[[bytes], object], data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(DECODERS), st.sampled_from(PREFIXES), st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_protocol_error(
    decode: Callable[[bytes], object], prefix: bytes, data: bytes
) -> None:
    _only_protocol_errors(decode, prefix + data)


@settings(max_examples=300)
@given(
    st.sampled_from(DECODERS),
    st.sampled_from(PREFIXES),
    st.lists(st.sampled_from(TEXT_TOKENS), max_size=40).map("".join),
)
def test_arbitrary_text_raises_only_protocol_error(
    decode: Callable[[bytes], object], prefix: bytes, text: str
) -> None:
    _only_protocol_errors(decode, prefix + text.encode())


GOLDEN_VALUES = sorted({_data(n) for _, _, n in DUMP_NODES if _data(n)} | {V2_CLOSED, V1_CLOSED})


@settings(max_examples=300)
@given(
    st.sampled_from(DECODERS),
    st.sampled_from(GOLDEN_VALUES),
    st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, 1 << 16),
)
def test_damaged_golden_values_raise_only_protocol_error(
    decode: Callable[[bytes], object], value: bytes, changes: list[tuple[int, int]], cut: int
) -> None:
    damaged = bytearray(value)
    for position, byte in changes:
        damaged[position % len(damaged)] = byte
    _only_protocol_errors(decode, bytes(damaged[: max(1, cut % (len(damaged) + 1))]))
