"""Where bookies are: the sources of network locations (`/rack`, `/region/rack`, `/zone/upgradedomain`).

- Apache Pulsar's rack map, the znode `/bookies` at the top of the same ZooKeeper as `/ledgers`, as
  `BookieRackAffinityMapping` reads it: JSON `{group: {bookie id: {"rack": ..., "hostname": ...}}}`.
  Read once, then kept current by a watch. `bkctl bookie rack set|list` write and read it.
- A topology script (`networkTopologyScriptFileName`), as Java's `ScriptBasedMapping`: called with up to
  `networkTopologyScriptNumberArgs` host names (a bookie id's host, as Java passes it), one location
  per argument on its output; answers are cached; a failing script leaves the bookies unknown (the
  policy's default rack).

`reppDnsResolverClass` names the source by Java's or Pulsar's class name (`source_from_properties`).
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bkctl.errors import BadVersionError, NodeExistsError, UsageError
from bkctl.metadata.store import MetadataStore

log = logging.getLogger(__name__)

RACK_MAP_PATH = "/bookies"  # Pulsar's BookieRackAffinityMapping.BOOKIE_INFO_ROOT_PATH
DEFAULT_GROUP = "default"
RACK_MAP_SIZE_MAX = 4 * 1024 * 1024  # local bound: a rack map larger than this is refused, not parsed
SCRIPT_TIMEOUT_S = 30.0  # local bound: a topology script that hangs is given up on
SCRIPT_ARGS_DEFAULT = 100  # Java's NET_TOPOLOGY_SCRIPT_NUMBER_ARGS_DEFAULT
SET_RETRIES = 8  # local bound: compare-and-set attempts of `bookie rack set`

SCRIPT_MAPPING = "org.apache.bookkeeper.net.ScriptBasedMapping"
PULSAR_MAPPINGS = (
    "org.apache.pulsar.bookie.rackawareness.BookieRackAffinityMapping",
    "org.apache.pulsar.zookeeper.ZkBookieRackAffinityMapping",
    "bkctl.rackmap",
)


@dataclass(frozen=True)
class RackEntry:
    group: str
    bookie: str
    rack: str
    hostname: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"group": self.group, "bookie": self.bookie, "rack": self.rack, "hostname": self.hostname}


# --- Pulsar's znode ------------------------------------------------------------------------------


def decode_rack_map(data: bytes | None) -> list[RackEntry]:
    """The znode's JSON -> entries; UsageError (one line) when it is not Pulsar's shape."""
    if not data:
        return []
    try:
        tree = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"rack map {RACK_MAP_PATH} is not JSON: {exc}") from None
    if not isinstance(tree, dict):
        raise UsageError(f"rack map {RACK_MAP_PATH} is not a JSON object of groups")
    entries = []
    for group, bookies in tree.items():
        if not isinstance(bookies, dict):
            raise UsageError(f"rack map {RACK_MAP_PATH}: group {group!r} is not an object of bookies")
        for bookie, info in bookies.items():
            if not isinstance(info, dict) or not isinstance(info.get("rack"), str):
                raise UsageError(f'rack map {RACK_MAP_PATH}: bookie {bookie!r} has no "rack" string')
            host = info.get("hostname")
            entries.append(RackEntry(group, bookie, info["rack"], host if isinstance(host, str) else None))
    return entries


def encode_rack_map(entries: Sequence[RackEntry]) -> bytes:
    tree: dict[str, dict[str, dict[str, str]]] = {}
    for entry in entries:
        info = {"rack": entry.rack}
        if entry.hostname:
            info["hostname"] = entry.hostname
        tree.setdefault(entry.group, {})[entry.bookie] = info
    return json.dumps(tree, indent=2, sort_keys=True).encode("utf-8")


def read_rack_map(store: MetadataStore) -> list[RackEntry]:
    data = store.get(RACK_MAP_PATH)[0] if store.exists(RACK_MAP_PATH) is not None else None
    return decode_rack_map(data)


def set_rack(store: MetadataStore, entry: RackEntry | None, *, remove: str | None = None) -> list[RackEntry]:
    """Put `entry` in the map (replacing the bookie's entry in any group), or remove bookie `remove`;
    compare-and-set on the znode's version, so a concurrent writer (Pulsar's admin) is not overwritten."""
    if entry is not None and not entry.rack.strip():
        raise UsageError("a rack must not be empty")
    for _ in range(SET_RETRIES):
        stat = store.exists(RACK_MAP_PATH)
        current = decode_rack_map(store.get(RACK_MAP_PATH)[0]) if stat is not None else []
        gone = {remove, entry.bookie if entry else None} - {None}
        updated = [e for e in current if e.bookie not in gone] + ([entry] if entry else [])
        data = encode_rack_map(updated)
        try:
            if stat is None:
                store.create(RACK_MAP_PATH, data)
            else:
                store.set(RACK_MAP_PATH, data, stat.version)
            return updated
        except (BadVersionError, NodeExistsError):
            continue  # someone else changed it: read again
    raise UsageError(f"rack map {RACK_MAP_PATH} kept changing under {SET_RETRIES} attempts")


def locations_in(entries: Sequence[RackEntry], bookies: Sequence[str]) -> dict[str, str | None]:
    """Each bookie's rack: by bookie id, else by its host among the map's ids and hostnames."""
    by_id = {e.bookie: e.rack for e in entries}
    by_host: dict[str, str] = {}
    for e in entries:
        by_host.setdefault(_host(e.bookie), e.rack)
        if e.hostname:
            by_host.setdefault(e.hostname, e.rack)
    return {b: by_id.get(b) or by_host.get(_host(b)) for b in bookies}


class PulsarRackMap:
    """Pulsar's znode as a location source, kept current by a watch (a change applies to the next
    choice)."""

    def __init__(self, store: MetadataStore) -> None:
        self._entries: list[RackEntry] = []
        self._lock = threading.Lock()
        self._subscription = store.watch_data(RACK_MAP_PATH, self._changed)

    def _changed(self, data: bytes | None, _stat: object) -> None:
        try:
            entries = decode_rack_map(data)
        except UsageError as exc:
            log.warning("%s; keeping the previous rack map", exc)
            return
        with self._lock:
            self._entries = entries

    def __call__(self, bookies: Sequence[str]) -> dict[str, str | None]:
        with self._lock:
            entries = self._entries
        return locations_in(entries, bookies)

    def close(self) -> None:
        self._subscription.cancel()


class ScriptMapping:
    """Java's ScriptBasedMapping: the script maps host names to locations, in batches; cached."""

    def __init__(self, script: str, max_args: int = SCRIPT_ARGS_DEFAULT) -> None:
        self.command = shlex.split(script)
        if not self.command:
            raise UsageError("networkTopologyScriptFileName is empty")
        self.max_args = max(1, max_args)
        self._cache: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def __call__(self, bookies: Sequence[str]) -> dict[str, str | None]:
        hosts = sorted({_host(b) for b in bookies})
        with self._lock:
            unknown = [h for h in hosts if h not in self._cache]
            for start in range(0, len(unknown), self.max_args):
                batch = unknown[start : start + self.max_args]
                for host, location in zip(batch, self._run(batch), strict=True):
                    if location is not None:  # Java caches answers only
                        self._cache[host] = location
            return {b: self._cache.get(_host(b)) for b in bookies}

    def _run(self, hosts: list[str]) -> list[str | None]:
        try:
            done = subprocess.run(
                [*self.command, *hosts], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S, check=True
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("topology script %s failed: %s; bookies in the default rack", self.command[0], exc)
            return [None] * len(hosts)
        answers = done.stdout.split()
        if len(answers) != len(hosts):
            log.warning(
                "topology script %s gave %d locations for %d hosts; bookies in the default rack",
                self.command[0],
                len(answers),
                len(hosts),
            )
            return [None] * len(hosts)
        return list(answers)


def source_from_properties(props: Mapping[str, str], store: MetadataStore | None) -> object | None:
    """The location source `reppDnsResolverClass` names (with its keys); None: none configured.
    A topology script alone (Java's default resolver class is the script mapping) is used too."""
    name = props.get("reppDnsResolverClass", "").strip()
    script = props.get("networkTopologyScriptFileName", "").strip()
    if name in PULSAR_MAPPINGS:
        if store is None:
            raise UsageError(f"reppDnsResolverClass {name} needs the metadata store (--metadata)")
        return PulsarRackMap(store)
    if name in ("", SCRIPT_MAPPING):
        if not script:
            # Without a script, bkctl reads Pulsar's rack map when it exists: `bookie rack set` writes it.
            return PulsarRackMap(store) if store is not None else None
        args = props.get("networkTopologyScriptNumberArgs", str(SCRIPT_ARGS_DEFAULT)).strip()
        if not args.isdigit():
            raise UsageError(f"networkTopologyScriptNumberArgs={args!r} is not a positive integer")
        return ScriptMapping(script, int(args))
    raise UsageError(
        f"reppDnsResolverClass {name!r} is not supported: use {SCRIPT_MAPPING} or {PULSAR_MAPPINGS[0]}"
    )


def _host(bookie: str) -> str:
    return bookie.rsplit(":", 1)[0] if ":" in bookie else bookie
