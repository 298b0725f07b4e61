"""Rack sources: Pulsar's /bookies znode (format, CAS writes, the watch) and the topology script."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from bkctl.errors import UsageError
from bkctl.metadata.racks import (
    RACK_MAP_PATH,
    PulsarRackMap,
    RackEntry,
    ScriptMapping,
    decode_rack_map,
    read_rack_map,
    set_rack,
)
from bkctl.metadata.store import MetadataStore

# Pulsar's admin writes this shape (BookieRackAffinityMapping's BookiesRackConfiguration).
PULSAR = b'{"default": {"10.0.0.1:3181": {"rack": "rack1", "hostname": "bk1.example"}}}'


def test_pulsars_format() -> None:
    assert decode_rack_map(PULSAR) == [RackEntry("default", "10.0.0.1:3181", "rack1", "bk1.example")]
    assert decode_rack_map(None) == []
    for bad in (b"[1]", b"{", b'{"g": {"b": {"host": "x"}}}', b'{"g": 3}'):
        with pytest.raises(UsageError, match="rack map /bookies"):
            decode_rack_map(bad)


def test_set_list_and_the_watch(store: MetadataStore) -> None:
    seen = PulsarRackMap(store)
    try:
        assert seen(["10.0.0.1:3181"]) == {"10.0.0.1:3181": None}
        store.create(RACK_MAP_PATH, PULSAR)
        set_rack(store, RackEntry("default", "10.0.0.2:3181", "/rack2"))
        tree = json.loads(store.get(RACK_MAP_PATH)[0])
        assert tree["default"]["10.0.0.1:3181"] == {"rack": "rack1", "hostname": "bk1.example"}
        assert tree["default"]["10.0.0.2:3181"] == {"rack": "/rack2"}
        deadline = 200
        while seen(["10.0.0.2:3181"])["10.0.0.2:3181"] != "/rack2" and deadline:
            import time

            time.sleep(0.05)
            deadline -= 1
        assert seen(["10.0.0.1:3181", "10.0.0.1:4000"]) == {
            "10.0.0.1:3181": "rack1",
            "10.0.0.1:4000": "rack1",
        }
        set_rack(store, None, remove="10.0.0.1:3181")
        assert [e.bookie for e in read_rack_map(store)] == ["10.0.0.2:3181"]
    finally:
        seen.close()


def test_topology_script_batches_caches_and_fails_to_the_default(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    script = tmp_path / "topology.sh"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nfor h in "$@"; do echo "/rack-${{h##*.}}"; done\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    mapping = ScriptMapping(str(script), max_args=2)
    hosts = [f"10.0.0.{i}:3181" for i in range(3)]
    assert mapping(hosts) == {h: f"/rack-{i}" for i, h in enumerate(hosts)}
    assert mapping(hosts[:1]) == {hosts[0]: "/rack-0"}  # cached: no new call
    assert calls.read_text().split("\n")[:2] == ["10.0.0.0 10.0.0.1", "10.0.0.2"]
    assert ScriptMapping(str(tmp_path / "missing"))(hosts[:1]) == {hosts[0]: None}
