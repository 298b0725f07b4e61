"""The audit's inputs as PySpark Python data sources (`pyspark.sql.datasource`), producing Arrow record
batches: ledger metadata partitioned by ledger id ranges, bookie contents partitioned by file (offline)
or by bookie and ledger id range (online). The readers run in executors: everything they need travels
in the options (JSON) and partition values.

Spark asks each data source for its schema and partitions in Python processes of their own, started
afresh by every audit (a cold start each), so this module imports only what that takes; pyarrow and the
readers' modules (inventory, online: numpy, the bookie's file readers) load when a partition is read."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from bkctl.model import DigestType
from bkctl.pipeline.bookie_dirs import BookieDirs, db_dirs, index_files

if TYPE_CHECKING:
    from bkctl.pipeline.inventory import HoldingRow, Verify
    from bkctl.pipeline.online import OnlineBookie

BATCH_ROWS = 65536
BATCH_BYTES = 16 << 20  # local bound: a batch of bitmap rows ends past this many bytes of bitmaps
# Index files per partition at most (few big tasks beat many small ones: a task costs ~10 ms).
FILES_PER_PARTITION_MAX = 256  # local bound

# inventory.HoldingRow and inventory.segment_rows, as Spark schemas.
HOLDING_SCHEMA = (
    "bookie string, ledger_id long, first_entry_id long, held binary, ok binary, bad binary, "
    "crcs binary, problem string"
)
SEGMENT_SCHEMA = (
    "ledger_id long, state string, last_entry_id long, ensemble_size int, write_quorum int, "
    "ack_quorum int, first_entry_id long, segment_last long, ensemble array<string>, problem string"
)
_HOLDING_NAMES = ("bookie", "ledger_id", "first_entry_id", "held", "ok", "bad", "crcs", "problem")
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


def _holding_types() -> tuple[Any, ...]:
    import pyarrow as pa

    return (pa.string(), pa.int64(), pa.int64(), *[pa.binary()] * 4, pa.string())


def _segment_types() -> tuple[Any, ...]:
    import pyarrow as pa

    ints = (pa.int64(), pa.int32(), pa.int32(), pa.int32(), pa.int64(), pa.int64())
    return (pa.int64(), pa.string(), *ints, pa.list_(pa.string()), pa.string())


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
    import pyarrow as pa

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
    from bkctl.pipeline.inventory import Verify

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
        return HOLDING_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return BookieFilesReader(self.options)


class BookieFilesReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.bookies = _decode_bookies(options)
        self.options = dict(options)

    def partitions(self) -> list[InputPartition]:
        from bkctl.pipeline import inventory

        parts: list[InputPartition] = []
        for i, bookie in enumerate(self.bookies):
            files = [str(p) for p in index_files(bookie)]
            for start in range(0, len(files), FILES_PER_PARTITION_MAX):
                parts.append(
                    InputPartition(("index", i, files[start : start + FILES_PER_PARTITION_MAX], None))
                )
            # A locations db in key ranges of as many ledgers as a partition has index files.
            for directory in db_dirs(bookie):
                for key_range in inventory.db_ranges(directory, FILES_PER_PARTITION_MAX):
                    parts.append(InputPartition(("db", i, [str(directory)], key_range)))
            parts += [InputPartition(("journal", i, [str(d)], None)) for d in sorted(bookie.journal_dirs)]
        return parts or [InputPartition(("none", 0, [], None))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        kind, i, paths, key_range = partition.value
        if kind == "none":
            return
        rows = self._rows(kind, self.bookies[i], paths, key_range)
        yield from batches(rows, _HOLDING_NAMES, _holding_types())

    def _rows(
        self, kind: str, bookie: BookieDirs, paths: list[str], key_range: tuple[bytes, bytes | None] | None
    ) -> Iterator[HoldingRow]:
        from bkctl.pipeline import inventory

        verify = _decode_verify(self.options)
        logs = inventory.entry_log_ids(bookie) if kind == "index" else set()
        for path in map(Path, paths):
            if kind == "index":
                yield from inventory.index_holdings(bookie, path, verify, logs)
            elif kind == "db":
                yield from inventory.db_holdings(bookie, path, verify, *(key_range or (b"", None)))
            else:
                yield from inventory.journal_holdings(bookie, path, verify)


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
        return HOLDING_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return BookiesOnlineReader(self.options)


class BookiesOnlineReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.bookies: list[list[Any]] = json.loads(options["bookies"])  # [id, host, port]
        self.ids: list[int] = json.loads(options["ids"])
        self.options = dict(options)

    def partitions(self) -> list[InputPartition]:
        parts = [
            InputPartition((i, self.ids[start : start + LEDGERS_PER_PARTITION]))
            for i in range(len(self.bookies))
            for start in range(0, len(self.ids), LEDGERS_PER_PARTITION)
        ]
        return parts or [InputPartition((0, []))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from bkctl.pipeline import online

        i, ledger_ids = partition.value
        if ledger_ids:
            bookie = online.OnlineBookie(*self.bookies[i])
            rows = online.holdings(bookie, ledger_ids, _decode_verify(self.options))
            yield from batches(rows, _HOLDING_NAMES, _holding_types())


# --- ledger metadata ---------------------------------------------------------------------------------


class LedgerSegments(DataSource):
    """`spark.read.format("bkctl_ledger_segments").options(uri=..., ids=JSON, partitions=N).load()`."""

    @classmethod
    def name(cls) -> str:
        return "bkctl_ledger_segments"

    def schema(self) -> str:
        return SEGMENT_SCHEMA

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
        from bkctl.pipeline import inventory

        if partition.value:
            yield from batches(
                inventory.segment_rows(self.uri, partition.value), _SEGMENT_NAMES, _segment_types()
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
