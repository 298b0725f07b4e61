"""Metadata URI parsing (pure) and the default location of the embedded store."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkctl.errors import UsageError
from bkctl.metadata.store import (
    MetadataLocation,
    default_metadata_uri,
    default_sqlite_path,
    parse_metadata_uri,
    resolve_metadata_uri,
)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("zk://zk1:2181/ledgers", MetadataLocation("zookeeper", root="/ledgers", hosts="zk1:2181")),
        ("zk://a:1,b:2/bk/ledgers", MetadataLocation("zookeeper", root="/bk/ledgers", hosts="a:1,b:2")),
        ("zk://zk1:2181", MetadataLocation("zookeeper", root="/ledgers", hosts="zk1:2181")),
        ("zk://zk1:2181/", MetadataLocation("zookeeper", root="/ledgers", hosts="zk1:2181")),
        ("zk://zk1/ledgers", MetadataLocation("zookeeper", root="/ledgers", hosts="zk1")),
        (
            "zk+hierarchical://h1:2181;h2:2181/ledgers",
            MetadataLocation("zookeeper", root="/ledgers", hosts="h1:2181,h2:2181", layout="hierarchical"),
        ),
        (
            "zk+longhierarchical://h:2181/x",
            MetadataLocation("zookeeper", root="/x", hosts="h:2181", layout="longhierarchical"),
        ),
        ("zk+null://h:2181/ledgers", MetadataLocation("zookeeper", root="/ledgers", hosts="h:2181")),
        ("ZK://h:2181/ledgers", MetadataLocation("zookeeper", root="/ledgers", hosts="h:2181")),
        ("127.0.0.1:2181", MetadataLocation("zookeeper", hosts="127.0.0.1:2181")),
        ("a:1,b:2/chroot", MetadataLocation("zookeeper", hosts="a:1,b:2/chroot")),
        (
            "sqlite:///var/lib/bk/metadata.db",
            MetadataLocation("sqlite", path=Path("/var/lib/bk/metadata.db")),
        ),
        ("sqlite://rel/meta.db", MetadataLocation("sqlite", path=Path("rel/meta.db"))),
        ("sqlite:///m.db?root=/bk", MetadataLocation("sqlite", root="/bk", path=Path("/m.db"))),
        ("sqlite:///with%20space.db", MetadataLocation("sqlite", path=Path("/with space.db"))),
    ],
)
def test_parse(uri: str, expected: MetadataLocation) -> None:
    assert parse_metadata_uri(uri) == expected


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "   ",
        "http://h:2181/ledgers",
        "zk:///ledgers",
        "zk://h:notaport/ledgers",
        "zk://h:0/ledgers",
        "zk://h:70000/ledgers",
        "zk://h:2181/bad//root",
        "zk://h:2181/ledgers?x=1",
        ":2181",
        "h:2181/bad//chroot",
        "sqlite:///m.db?mode=ro",
        "sqlite:///m.db?root=relative",
    ],
)
def test_parse_rejects(uri: str) -> None:
    with pytest.raises(UsageError):
        parse_metadata_uri(uri)


def test_sqlite_without_path_is_the_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BKCTL_HOME", str(tmp_path))
    assert parse_metadata_uri("sqlite://").path == tmp_path / "metadata.db"


def test_default_paths() -> None:
    assert default_sqlite_path({"BKCTL_HOME": "/srv/bk"}) == Path("/srv/bk/metadata.db")
    assert default_sqlite_path({"XDG_DATA_HOME": "/xdg"}) == Path("/xdg/bkctl/metadata.db")
    assert default_sqlite_path({}) == Path.home() / ".local/share/bkctl/metadata.db"
    assert default_metadata_uri({"BKCTL_HOME": "/srv/bk"}) == "sqlite:///srv/bk/metadata.db"
    assert parse_metadata_uri(default_metadata_uri({"BKCTL_HOME": "/srv/bk"})).path == Path(
        "/srv/bk/metadata.db"
    )


def test_resolve_order() -> None:
    env = {"BKCTL_METADATA": "zk://env:2181/ledgers", "BKCTL_HOME": "/h"}
    assert resolve_metadata_uri("zk://opt:2181/ledgers", env) == "zk://opt:2181/ledgers"
    assert resolve_metadata_uri(None, env) == "zk://env:2181/ledgers"
    assert resolve_metadata_uri(None, {"BKCTL_HOME": "/h"}) == "sqlite:///h/metadata.db"
