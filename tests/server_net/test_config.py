"""bk_server.conf parsing and validation (pure)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bkctl import limits
from bkctl.errors import UsageError
from bkctl.properties import parse_properties, read_properties_file
from bkctl.server.config import BookieConfig, load_config

SAMPLE = r"""
# A Java bookie's conf, trimmed.
bookiePort=3181
! bang comment
journalDirectories=/var/lib/bk/journal1,/var/lib/bk/journal2
ledgerDirectories = /var/lib/bk/ledgers
metadataServiceUri: zk+hierarchical://zk1:2181;zk2:2181/ledgers
journalMaxGroupWaitMSec 1
journalFlushWhenQueueEmpty=true
logSizeLimit=1073741824
flushInterval=60000
readOnlyModeEnabled=true
diskUsageThreshold=0.9
nettyMaxFrameSizeBytes=5253120
advertisedAddress=bk1.example.com
someJavaOnlyKey=org.apache.Foo
"""


def test_parse_properties_forms() -> None:
    text = "a=1\n  b : 2\nc 3\n# d=4\n!e=5\nf=x\\\n   y\ng=tab\\there\nh\\=k=v\ni=\\u0041\nempty=\n"
    assert parse_properties(text) == {
        "a": "1",
        "b": "2",
        "c": "3",
        "f": "xy",
        "g": "tab\there",
        "h=k": "v",
        "i": "A",
        "empty": "",
    }


def test_parse_properties_later_key_wins_and_even_backslashes() -> None:
    assert parse_properties("a=1\na=2\nb=c:\\\\\nd=e") == {"a": "2", "b": "c:\\", "d": "e"}


@given(st.text(max_size=200))
def test_parse_properties_never_fails(text: str) -> None:
    assert isinstance(parse_properties(text), dict)


def test_sample_conf(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="bkctl.bookie"):
        config = load_config(parse_properties(SAMPLE))
    assert config.port == 3181
    assert config.journal_dirs == (Path("/var/lib/bk/journal1"), Path("/var/lib/bk/journal2"))
    assert config.ledger_dirs == (Path("/var/lib/bk/ledgers"),)
    assert config.effective_index_dirs == config.ledger_dirs
    assert config.metadata_uri == "zk+hierarchical://zk1:2181;zk2:2181/ledgers"
    assert config.journal_max_group_wait_ms == 1.0
    assert config.journal_flush_when_queue_empty is True
    assert config.flush_interval_ms == 60_000
    assert config.disk_usage_threshold == 0.9
    assert config.disk_usage_lwm_threshold == 0.9  # clamped to the threshold when not given
    assert config.frame_size_max == limits.FRAME_SIZE_MAX  # Java's 5 MiB + 10 KiB, lowered to our bound
    assert config.resolved_bookie_id() == "bk1.example.com:3181"
    assert config.listen_host == "0.0.0.0"
    assert config.unused_keys == ("someJavaOnlyKey",)


@pytest.mark.parametrize(
    ("key", "value", "refused"),
    [
        ("bookieAuthProviderFactoryClass", "org.example.Sasl", True),
        ("bookieAuthProviderFactoryClass", "", False),
        ("ensemblePlacementPolicy", "org.example.client.CustomEnsemblePlacementPolicy", True),
        ("ensemblePlacementPolicy", "org.apache.bookkeeper.client.ZoneawareEnsemblePlacementPolicy", False),
        ("ensemblePlacementPolicy", "org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy", False),
    ],
)
def test_keys_bkctl_cannot_honour_refuse(key: str, value: str, refused: bool) -> None:
    if refused:
        with pytest.raises(UsageError, match=f"config key {key}={value}: not implemented by bkctl"):
            load_config({key: value})
    else:
        assert load_config({key: value}).unused_keys == ()


def test_defaults() -> None:
    config = load_config()
    assert config == BookieConfig()
    assert config.resolved_bookie_id() == "127.0.0.1:3181"
    assert config.resolved_bookie_id(port=4000) == "127.0.0.1:4000"
    assert config.listen_host == "127.0.0.1"
    assert config.http_port is None


def test_overrides_win() -> None:
    config = load_config(
        {"bookiePort": "3181", "ledgerDirectories": "/a", "bookieId": "x:1"},
        {"bookiePort": "0", "ledgerDirectories": "/b,/c", "indexDirectories": "/i"},
    )
    assert (config.port, config.ledger_dirs, config.index_dirs) == (
        0,
        (Path("/b"), Path("/c")),
        (Path("/i"),),
    )
    assert config.resolved_bookie_id() == "x:1"


def test_zk_servers_and_http() -> None:
    config = load_config(
        {"zkServers": "z1:2181, z2:2181", "zkLedgersRootPath": "/bk", "httpServerEnabled": "true"}
    )
    assert config.metadata_uri == "zk://z1:2181,z2:2181/bk"
    assert config.http_port == 8080
    assert load_config({"httpServerEnabled": "false", "httpServerPort": "9"}).http_port is None
    assert (
        load_config({"metadataServiceUri": "sqlite:///m.db", "zkServers": "z:1"}).metadata_uri
        == "sqlite:///m.db"
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("bookiePort", "70000"),
        ("bookiePort", "x"),
        ("journalDirectories", "/a,,/b"),
        ("ledgerDirectories", "/a,/a"),
        ("journalFlushWhenQueueEmpty", "maybe"),
        ("diskUsageThreshold", "1.5"),
        ("journalAlignmentSize", "1000"),
        ("nettyMaxFrameSizeBytes", "100"),
        ("bookieId", "has space"),
        ("bookieId", "readonly"),
        ("bookieId", "a/b"),
        ("advertisedAddress", "  "),
        ("dbStorage_rocksDB_blockCacheSize", "1000"),
        ("dbStorage_rocksDB_writeBufferSizeMB", "0"),
        ("dbStorage_rocksDB_bloomFilterBitsPerKey", "-1"),
        ("dbStorage_rocksDB_numLevels", "1"),
        ("dbStorage_rocksDB_lz4CompressionEnabled", "lz4"),
    ],
)
def test_bad_values_name_the_key(key: str, value: str) -> None:
    with pytest.raises(UsageError, match=key):
        load_config({key: value})


def test_cross_checks() -> None:
    with pytest.raises(UsageError, match="diskUsageLwmThreshold"):
        load_config({"diskUsageThreshold": "0.8", "diskUsageLwmThreshold": "0.85"})
    with pytest.raises(UsageError, match="entryLocationCompactionInterval: 60 s is shorter than gcWaitTime"):
        load_config({"entryLocationCompactionInterval": "60"})  # gcWaitTime 600000 ms
    assert load_config({"entryLocationCompactionInterval": "60", "gcWaitTime": "0"})
    with pytest.raises(UsageError, match="share a directory"):
        load_config({"journalDirectories": "/x", "ledgerDirectories": "/x"})


def test_read_properties_file(tmp_path: Path) -> None:
    conf = tmp_path / "bk_server.conf"
    conf.write_text(SAMPLE)
    assert read_properties_file(conf)["bookiePort"] == "3181"
    with pytest.raises(UsageError, match="cannot read"):
        read_properties_file(tmp_path / "missing.conf")


def test_metadata_outage_keys() -> None:
    """The bookie's ride through metadata outages, with Java's key names where they exist."""
    from bkctl.server.service import retry_policy

    config = load_config(
        {
            "zkTimeout": "4000",
            "zkRetryBackoffStartMs": "50",
            "zkRetryBackoffMaxMs": "800",
            "metadataRetryDeadlineMs": "9000",
        }
    )
    assert config.zk_timeout_ms == 4000
    policy = retry_policy(config)
    assert (policy.deadline_ms, policy.backoff_start_ms, policy.backoff_max_ms) == (9000, 50, 800)
    with pytest.raises(UsageError, match="zkTimeout"):
        load_config({"zkTimeout": "5"})


def test_ledger_storage_class_selects_the_engine_and_its_write_cache_key() -> None:
    from bkctl.server.service import storage_config

    db_class = "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage"
    keys = {
        "ledgerStorageClass": db_class,
        "dbStorage_writeCacheMaxSizeMb": "16",
        "skipListSizeLimit": "8388608",
    }
    db = storage_config(load_config(keys))
    assert db.engine == "db" and db.write_cache_max_bytes == 16 * 1024 * 1024
    assert (db.read_cache_max_bytes, db.read_ahead_batch) == (64 * 1024 * 1024, 100)  # the defaults
    read_keys = {"dbStorage_readAheadCacheMaxSizeMb": "0", "dbStorage_readAheadCacheBatchSize": "7"}
    no_cache = storage_config(load_config({**keys, **read_keys}))
    assert (no_cache.read_cache_max_bytes, no_cache.read_ahead_batch) == (0, 7)
    with pytest.raises(UsageError, match="dbStorage_readAheadCacheBatchSize"):
        load_config({"dbStorage_readAheadCacheBatchSize": "-1"})
    keys["ledgerStorageClass"] = "org.apache.bookkeeper.bookie.SortedLedgerStorage"
    sorted_ = storage_config(load_config(keys))
    assert sorted_.engine == "interleaved" and sorted_.write_cache_max_bytes == 8 * 1024 * 1024
    with pytest.raises(
        UsageError, match=r"ledgerStorageClass=com\.example\.Mine: a storage bkctl does not know"
    ):
        load_config({"ledgerStorageClass": "com.example.Mine"})


def test_rocksdb_keys_tune_the_db_engine_as_javas_do(tmp_path: Path) -> None:
    """Java's dbStorage_rocksDB_* keys reach every RocksDB open of a db bookie; their defaults are
    Java's (the block cache excepted: docs/bookie.md); logLevel is ignored and listed as such."""
    from bkctl.server.rocksdb_settings import DEFAULT
    from bkctl.server.rocksdb_store import KeyValueDb
    from bkctl.server.service import storage_config

    assert load_config({}).rocksdb == DEFAULT and storage_config(load_config({})).rocksdb == DEFAULT
    keys = {
        "dbStorage_rocksDB_blockCacheSize": str(16 * 1024 * 1024),
        "dbStorage_rocksDB_writeBufferSizeMB": "8",
        "dbStorage_rocksDB_sstSizeInMB": "32",
        "dbStorage_rocksDB_blockSize": "4096",
        "dbStorage_rocksDB_bloomFilterBitsPerKey": "0",
        "dbStorage_rocksDB_numLevels": "5",
        "dbStorage_rocksDB_numFilesInLevel0": "8",
        "dbStorage_rocksDB_maxSizeInLevel1MB": "128",
        "dbStorage_rocksDB_lz4CompressionEnabled": "false",
        "dbStorage_rocksDB_logPath": str(tmp_path / "rocksdb-logs"),
        "dbStorage_rocksDB_logLevel": "warn",
    }
    config = load_config(keys)
    settings = storage_config(config).rocksdb
    assert config.unused_keys == ("dbStorage_rocksDB_logLevel",)
    assert (settings.block_cache_size, settings.write_buffer_size, settings.sst_size) == (
        16 * 1024 * 1024,
        8 * 1024 * 1024,
        32 * 1024 * 1024,
    )
    assert (settings.block_size, settings.bloom_bits_per_key, settings.num_levels) == (4096, 0, 5)
    assert (settings.level0_files, settings.level1_max_size, settings.lz4) == (8, 128 * 1024 * 1024, False)
    db = KeyValueDb(tmp_path / "current" / "locations", huge=True, settings=settings)
    try:
        assert db.property_int("rocksdb.block-cache-capacity") == 16 * 1024 * 1024
        options = next((tmp_path / "current" / "locations").glob("OPTIONS-*")).read_text()
        for line in (
            "write_buffer_size=8388608",
            "target_file_size_base=33554432",
            "num_levels=5",
            "level0_file_num_compaction_trigger=8",
            "max_bytes_for_level_base=134217728",
            "compression=kNoCompression",
            "block_size=4096",
            "filter_policy=nullptr",
        ):
            assert line in options
    finally:
        db.close()
    with pytest.raises(UsageError, match=r"dbStorage_rocksDB_logPath: cannot create /proc/nope/locations"):
        KeyValueDb(
            tmp_path / "x" / "locations", huge=True, settings=replace(settings, log_path=Path("/proc/nope"))
        )
    logs = list((tmp_path / "rocksdb-logs" / "locations").iterdir())
    assert logs and all(path.name.endswith("LOG") for path in logs)
    assert not (tmp_path / "current" / "locations" / "LOG").exists()
