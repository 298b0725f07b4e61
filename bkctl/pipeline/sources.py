"""The audit's inputs as PySpark Python data sources (`pyspark.sql.datasource`), producing Arrow record
batches: ledger metadata partitioned by ledger id ranges, bookie contents partitioned by file (offline)
or by bookie and ledger id range (online). The readers run in executors: everything they need travels
in the options (JSON) and partition values."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from bkctl.model import DigestType
from bkctl.pipeline import inventory, online
from bkctl.pipeline.inventory import BookieDirs, Verify
from bkctl.pipeline.online import OnlineBookie

BATCH_ROWS = 65536
BATCH_BYTES = 16 << 20  # a batch of bitmap rows ends past this many bytes of bitmaps
# Index files per partition at most (few big tasks beat many small ones: a task costs ~10 ms).
FILES_PER_PARTITION_MAX = 256

_HOLDING_TYPES = (pa.string(), pa.int64(), pa.int64(), *[pa.binary()] * 4, pa.string())
_HOLDING_NAMES = ("bookie", "ledger_id", "first_entry_id", "held", "ok", "bad", "crcs", "problem")
_SEGMENT_TYPES = (
    pa.int64(),
    pa.string(),
    pa.int64(),
    pa.int32(),
    pa.int32(),
    pa.int32(),
    pa.int64(),
    pa.int64(),
    pa.list_(pa.string()),
    pa.string(),
)
_SEGMENT_NAMES = (
    "ledger_id",
    "state",
    "last_entry_id",
    "ensemble_size",
    "write_quorum",
    "ack_quorum",
    "first_entry_id",
    "segment_last",
    "ensemble",
    "problem",
)


def batches(rows: Iterator[tuple[Any, ...]], names: tuple[str, ...], types: tuple[Any, ...]) -> Iterator[Any]:
    """Arrow record batches of at most BATCH_ROWS rows or about BATCH_BYTES bytes (of bytes values)."""
    chunk: list[tuple[Any, ...]] = []
    size = 0
    for row in rows:
        chunk.append(row)
        size += sum(len(v) for v in row if isinstance(v, bytes))
        if len(chunk) >= BATCH_ROWS or size >= BATCH_BYTES:
            yield _batch(chunk, names, types)
            chunk, size = [], 0
    if chunk:
        yield _batch(chunk, names, types)


def _batch(rows: list[tuple[Any, ...]], names: tuple[str, ...], types: tuple[Any, ...]) -> Any:
    columns = [
        pa.array(list(values), type=t) for values, t in zip(zip(*rows, strict=True), types, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, names=list(names))


# --- bookie files ------------------------------------------------------------------------------------


def bookie_options(bookies: list[BookieDirs], verify: Verify | None) -> dict[str, str]:
    """Data source options for `bookie_files`: the bookies' directories and the digest keys."""
    encoded = [
        {
            "bookie_id": b.bookie_id,
            "ledger_dirs": list(map(str, b.ledger_dirs)),
            "journal_dirs": list(map(str, b.journal_dirs)),
        }
        for b in bookies
    ]
    options = {"bookies": json.dumps(encoded)}
    if verify is not None:
        keys = {str(k): [d.name, None if mac is None else mac.hex()] for k, (d, mac) in verify.keys.items()}
        options["verify"] = json.dumps({"keys": keys, "sample": verify.sample})
    return options


def _decode_bookies(options: Mapping[str, str]) -> list[BookieDirs]:
    return [
        BookieDirs(b["bookie_id"], [Path(d) for d in b["ledger_dirs"]], [Path(d) for d in b["journal_dirs"]])
        for b in json.loads(options["bookies"])
    ]


def _decode_verify(options: Mapping[str, str]) -> Verify | None:
    if "verify" not in options:
        return None
    raw = json.loads(options["verify"])
    keys = {
        int(k): (DigestType[name], None if mac is None else bytes.fromhex(mac))
        for k, (name, mac) in raw["keys"].items()
    }
    return Verify(keys, float(raw["sample"]))


class BookieFiles(DataSource):
    """`spark.read.format("bkctl_bookie_files").options(**bookie_options(...)).load()`."""

    @classmethod
    def name(cls) -> str:
        return "bkctl_bookie_files"

    def schema(self) -> str:
        return inventory.HOLDING_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return BookieFilesReader(self.options)


class BookieFilesReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.bookies = _decode_bookies(options)
        self.verify = _decode_verify(options)

    def partitions(self) -> list[InputPartition]:
        parts: list[InputPartition] = []
        for i, bookie in enumerate(self.bookies):
            files = [str(p) for p in inventory.index_files(bookie)]
            for start in range(0, len(files), FILES_PER_PARTITION_MAX):
                parts.append(InputPartition(("index", i, files[start : start + FILES_PER_PARTITION_MAX])))
            parts += [InputPartition(("journal", i, [str(d)])) for d in sorted(bookie.journal_dirs)]
        return parts or [InputPartition(("none", 0, []))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        kind, i, paths = partition.value
        if kind == "none":
            return
        yield from batches(self._rows(kind, self.bookies[i], paths), _HOLDING_NAMES, _HOLDING_TYPES)

    def _rows(self, kind: str, bookie: BookieDirs, paths: list[str]) -> Iterator[inventory.HoldingRow]:
        logs = inventory.entry_log_ids(bookie) if kind == "index" else set()
        for path in map(Path, paths):
            if kind == "index":
                yield from inventory.index_holdings(bookie, path, self.verify, logs)
            else:
                yield from inventory.journal_holdings(bookie, path, self.verify)


# --- bookies online ----------------------------------------------------------------------------------

# Ledgers asked of one bookie per task (a task is one connection; several tasks per bookie overlap).
LEDGERS_PER_PARTITION = 500


def online_options(bookies: list[OnlineBookie], ids: list[int], verify: Verify | None) -> dict[str, str]:
    """Data source options for `bookies_online`: the bookies' addresses, the ledgers and digest keys."""
    options = bookie_options([], verify)
    options["bookies"] = json.dumps([[b.bookie_id, b.host, b.port] for b in bookies])
    options["ids"] = json.dumps(ids)
    return options


class BookiesOnline(DataSource):
    """`spark.read.format("bkctl_bookies_online").options(**online_options(...)).load()`."""

    @classmethod
    def name(cls) -> str:
        return "bkctl_bookies_online"

    def schema(self) -> str:
        return inventory.HOLDING_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return BookiesOnlineReader(self.options)


class BookiesOnlineReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.bookies = [OnlineBookie(*b) for b in json.loads(options["bookies"])]
        self.ids: list[int] = json.loads(options["ids"])
        self.verify = _decode_verify(options)

    def partitions(self) -> list[InputPartition]:
        parts = [
            InputPartition((i, self.ids[start : start + LEDGERS_PER_PARTITION]))
            for i in range(len(self.bookies))
            for start in range(0, len(self.ids), LEDGERS_PER_PARTITION)
        ]
        return parts or [InputPartition((0, []))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        i, ledger_ids = partition.value
        if ledger_ids:
            rows = online.holdings(self.bookies[i], ledger_ids, self.verify)
            yield from batches(rows, _HOLDING_NAMES, _HOLDING_TYPES)


# --- ledger metadata ---------------------------------------------------------------------------------


class LedgerSegments(DataSource):
    """`spark.read.format("bkctl_ledger_segments").options(uri=..., ids=JSON, partitions=N).load()`."""

    @classmethod
    def name(cls) -> str:
        return "bkctl_ledger_segments"

    def schema(self) -> str:
        return inventory.SEGMENT_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return LedgerSegmentsReader(self.options)


class LedgerSegmentsReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.uri = options["uri"]
        self.ids: list[int] = json.loads(options["ids"])
        self.count = max(1, int(options.get("partitions", "2")))

    def partitions(self) -> list[InputPartition]:
        size = max(1, -(-len(self.ids) // self.count))
        return [InputPartition(self.ids[i : i + size]) for i in range(0, len(self.ids), size)] or [
            InputPartition([])
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if partition.value:
            yield from batches(
                inventory.segment_rows(self.uri, partition.value), _SEGMENT_NAMES, _SEGMENT_TYPES
            )


def register(spark: Any) -> None:
    spark.dataSource.register(BookieFiles)
    spark.dataSource.register(BookiesOnline)
    spark.dataSource.register(LedgerSegments)


def verify_keys(
    segments_md: list[tuple[int, DigestType | None, bytes | None]],
) -> dict[int, tuple[DigestType, bytes | None]]:
    """Digest type and MAC key per ledger (ledgers whose digest type is unknown are not checked)."""
    from bkctl.protocol.entry import mac_key

    return {
        lid: (digest, mac_key(password or b"") if digest is DigestType.MAC else None)
        for lid, digest, password in segments_md
        if digest is not None
    }
