"""Ensemble placement: the one place every chooser asks (new ledgers, a writer's ensemble change,
manual recovery, replication workers, decommission, the placement check).

Java's policies by their class names (`ensemblePlacementPolicy`), with their keys and semantics:

- Default: distinct read-write bookies at random.
- Rack-aware: every write set spans at least min(writeQuorum, `minNumRacksPerWriteQuorum`) racks
  (network locations, e.g. `/rack1`); `enforceMinNumRacksPerWriteQuorum` makes that a hard rule and
  keeps bookies of the default rack (`/default-rack`, a bookie no source knows) out of ensembles.
- Region-aware: the same on the first part of `/region/rack` (`reppMinimumRegionsForDurability`).
- Zone-aware: the same on the zone of `/zone/upgradedomain`, at least `minNumZonesPerWriteQuorum`
  zones, `desiredNumZonesPerWriteQuorum` preferred; `enforceStrictZoneawarePlacement` (default on).

When the policy cannot be met (a rack is down) and it is not enforced, the choice falls back to any
bookie, as Java's does, and says so (`Choice.adheres` False, with the reason); enforced, it fails.
Callers pass only read-write bookies: read-only and draining ones are never chosen. Locations come from
a `Locate` callable (metadata/racks.py); unknown bookies are in the policy's default location.
A seeded `random.Random` makes the choice reproducible in tests.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bkctl.errors import UnavailableError, UsageError

log = logging.getLogger(__name__)

DEFAULT_POLICY = "org.apache.bookkeeper.client.DefaultEnsemblePlacementPolicy"
RACKAWARE = "org.apache.bookkeeper.client.RackawareEnsemblePlacementPolicy"
REGIONAWARE = "org.apache.bookkeeper.client.RegionAwareEnsemblePlacementPolicy"
ZONEAWARE = "org.apache.bookkeeper.client.ZoneawareEnsemblePlacementPolicy"
KINDS = {DEFAULT_POLICY: "default", RACKAWARE: "rack", REGIONAWARE: "region", ZONEAWARE: "zone"}
# Java's NetworkTopology defaults: where a bookie no source knows is.
DEFAULT_LOCATIONS = {
    "default": "/default-rack",
    "rack": "/default-rack",
    "region": "/default-region/default-rack",
    "zone": "/default-zone/default-upgradedomain",
}
DOMAIN_WORDS = {"default": "rack", "rack": "rack", "region": "region", "zone": "zone"}
NEW_ENSEMBLE_TRIES = 16  # random greedy rounds before settling for the best ensemble found

# bookies -> {bookie: network location or None (unknown)}; may block (a script, a znode read)
Locate = Callable[[Sequence[str]], Mapping[str, str | None]]


@dataclass(frozen=True)
class PolicySettings:
    kind: str = "default"  # default | rack | region | zone
    min_domains: int = 2  # minNumRacksPerWriteQuorum, reppMinimumRegionsForDurability, minNumZones...
    desired_domains: int = 2  # desiredNumZonesPerWriteQuorum (zone-aware); else min_domains
    enforce: bool = False  # enforceMinNumRacksPerWriteQuorum, enforceStrictZoneawarePlacement
    enforce_durability: bool = False  # enforceDurability: an ack quorum spans the racks too
    default_location: str = "/default-rack"

    @property
    def word(self) -> str:
        return DOMAIN_WORDS[self.kind]

    def describe(self) -> str:
        if self.kind == "default":
            return "default (random)"
        strict = ", enforced" if self.enforce else ""
        return f"{self.kind}-aware, at least {self.min_domains} {self.word}s per write quorum{strict}"


def settings_from_properties(props: Mapping[str, str]) -> PolicySettings:
    """Java's keys (bk_client.conf / bk_server.conf) -> settings; UsageError on a bad value."""
    name = props.get("ensemblePlacementPolicy", DEFAULT_POLICY).strip()
    kind = KINDS.get(name)
    if kind is None:
        raise UsageError(f"ensemblePlacementPolicy {name!r} is not one of {', '.join(KINDS)}")
    if kind == "zone":
        low = _int(props, "minNumZonesPerWriteQuorum", 2)
        desired = _int(props, "desiredNumZonesPerWriteQuorum", 3)
        enforce = _bool(props, "enforceStrictZoneawarePlacement", True)
    elif kind == "region":
        low = desired = _int(props, "reppMinimumRegionsForDurability", 2)
        enforce = _bool(props, "enforceMinNumRacksPerWriteQuorum", False)
    else:
        low = desired = _int(props, "minNumRacksPerWriteQuorum", 2)
        enforce = _bool(props, "enforceMinNumRacksPerWriteQuorum", False)
    return PolicySettings(
        kind,
        low,
        max(low, desired),
        enforce,
        _bool(props, "enforceDurability", False),
        DEFAULT_LOCATIONS[kind],
    )


def _int(props: Mapping[str, str], key: str, default: int) -> int:
    text = props.get(key)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(f"{key}={text!r} is not an integer") from None
    if not 1 <= value <= 64:
        raise UsageError(f"{key}={value} is out of range [1, 64]")
    return value


def _bool(props: Mapping[str, str], key: str, default: bool) -> bool:
    text = props.get(key)
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise UsageError(f"{key}={text!r} is not true or false")
    return text.strip().lower() == "true"


@dataclass(frozen=True)
class Violation:
    """A write set (ensemble positions `first`.. wrapping) spanning too few racks (or zones...)."""

    first: int
    positions: tuple[int, ...]
    bookies: tuple[str, ...]
    domains: tuple[str, ...]
    needed: int
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {
            "write_set": self.first,
            "bookies": list(self.bookies),
            "domains": list(self.domains),
            "needed": self.needed,
            "reason": self.reason,
        }


@dataclass
class Choice:
    bookies: list[str]  # the new ensemble
    adheres: bool = True
    reason: str = ""  # why it does not adhere (a fallback)
    violations: list[Violation] = field(default_factory=list)


def write_sets(ensemble_size: int, write_quorum: int) -> list[list[int]]:
    """Java's round-robin write sets: entry e goes to positions e, e+1, ... mod ensemble size."""
    if write_quorum >= ensemble_size:
        return [list(range(ensemble_size))]
    return [[(first + j) % ensemble_size for j in range(write_quorum)] for first in range(ensemble_size)]


class Placement:
    """A policy over a source of locations. `locate` may block: call the methods off the reactor."""

    def __init__(
        self,
        settings: PolicySettings | None = None,
        locate: Locate | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings or PolicySettings()
        self._locate = locate
        self.rng = rng or random.Random()

    @property
    def aware(self) -> bool:
        return self.settings.kind != "default"

    # --- where ----------------------------------------------------------------------------------

    def locations(self, bookies: Iterable[str]) -> dict[str, str]:
        wanted = sorted(set(bookies))
        found = self._locate(wanted) if (self._locate and self.aware) else {}
        default = self.settings.default_location
        return {b: _normal(found.get(b)) or default for b in wanted}

    def domain(self, location: str) -> str:
        """The failure domain a policy counts: the whole location for racks, the first part for
        regions and zones."""
        if self.settings.kind in ("region", "zone"):
            return "/" + location.strip("/").split("/")[0]
        return location

    def _domains(self, bookies: Iterable[str]) -> dict[str, str]:
        return {b: self.domain(loc) for b, loc in self.locations(bookies).items()}

    def _needed(self, write_quorum: int) -> int:
        return min(write_quorum, self.settings.min_domains)

    # --- judging --------------------------------------------------------------------------------

    def violations(
        self, ensemble: Sequence[str], write_quorum: int, domains: Mapping[str, str] | None = None
    ) -> list[Violation]:
        """Java's isEnsembleAdheringToPlacementPolicy, every failing write set with its reason."""
        if not self.aware or not ensemble:
            return []
        domains = domains or self._domains(ensemble)
        default = self.domain(self.settings.default_location)
        needed = self._needed(write_quorum)
        found = []
        for positions in write_sets(len(ensemble), write_quorum):
            members = tuple(ensemble[p] for p in positions)
            spanned = tuple(sorted({domains[b] for b in members}))
            reason = ""
            if len(spanned) < needed:
                reason = f"spans {len(spanned)} {self.settings.word}(s), needs {needed}"
            elif self.settings.enforce and default in spanned:
                reason = f"has a bookie in the default {self.settings.word} {default} (enforced)"
            if reason:
                found.append(Violation(positions[0], tuple(positions), members, spanned, needed, reason))
        return found

    def _pick(
        self,
        ensemble: Sequence[str | None],
        index: int,
        quorum: int,
        pool: Sequence[str],
        domains: Mapping[str, str],
        home: str | None = None,
    ) -> str:
        """A bookie for `index`: from a domain giving the write sets through it the most domains (the
        fewest in a complete set first, capped at the desired count; then the most over all the sets
        with chosen members), the `home` domain among equals (Java prefers the replaced bookie's rack),
        at random within it. Scored per domain, not per bookie: a few racks, however many bookies."""
        sets = [
            [ensemble[p] for p in positions if p != index]
            for positions in write_sets(len(ensemble), quorum)
            if index in positions
        ]
        others = [{domains[m] for m in members if m is not None} for members in sets]
        complete = [found for found, members in zip(others, sets, strict=True) if None not in members]
        cap = self.settings.desired_domains
        by_domain: dict[str, list[str]] = {}
        for bookie in pool:
            by_domain.setdefault(domains[bookie], []).append(bookie)

        def score(domain: str) -> tuple[int, int, bool]:
            fewest = min([cap, *(len(found | {domain}) for found in complete)])
            return fewest, sum(len(found | {domain}) for found in others), domain == home

        best = max(score(d) for d in by_domain)
        chosen = sorted(b for d, members in by_domain.items() if score(d) == best for b in members)
        return self.rng.choice(chosen)

    def _candidates(self, available: Iterable[str], exclude: Collection[str]) -> list[str]:
        candidates = sorted(set(available) - set(exclude))  # sorted: the seed alone decides the choice
        if self.aware and self.settings.enforce:  # Java leaves the default rack out when enforced
            where = self.locations(candidates)
            candidates = [b for b in candidates if where[b] != self.settings.default_location]
        return candidates

    # --- choosing -------------------------------------------------------------------------------

    def new_ensemble(
        self,
        available: Iterable[str],
        size: int,
        write_quorum: int | None = None,
        exclude: Collection[str] = (),
    ) -> Choice:
        candidates = self._candidates(available, exclude)
        _enough(candidates, size, exclude)
        if not self.aware:
            return Choice(self.rng.sample(candidates, size))
        quorum = write_quorum or size
        domains = self._domains(candidates)
        best: Choice | None = None
        for _ in range(NEW_ENSEMBLE_TRIES):
            ensemble = self._greedy(candidates, size, quorum, domains)
            broken = self.violations(ensemble, quorum, domains)
            if not broken:
                return Choice(ensemble)
            if best is None or len(broken) < len(best.violations):
                best = Choice(ensemble, False, broken[0].reason, broken)
        assert best is not None
        return self._fallback(best, f"no ensemble of {size} meets the policy ({self.settings.describe()})")

    def _greedy(self, candidates: list[str], size: int, quorum: int, domains: Mapping[str, str]) -> list[str]:
        pool = list(candidates)
        ensemble: list[str | None] = [None] * size
        for index in range(size):
            pick = self._pick(ensemble, index, quorum, pool, domains)
            ensemble[index] = pick
            pool.remove(pick)
        return [b for b in ensemble if b is not None]

    def replace(
        self,
        ensemble: Sequence[str],
        indexes: Collection[int],
        available: Iterable[str],
        write_quorum: int | None = None,
        exclude: Collection[str] = (),
        keep: Mapping[int, str] | None = None,
    ) -> Choice:
        """A copy of `ensemble` with the bookies at `indexes` replaced by distinct new ones, neither in
        the ensemble nor in `exclude`. `keep`: positions whose replacement is already decided (a
        recovery's target). A replacement in the replaced bookie's rack is preferred (as Java's), then
        any that keeps the write sets through it within the policy."""
        keep = dict(keep or {})
        todo = sorted(set(indexes) - set(keep))
        candidates = self._candidates(available, {*ensemble, *exclude, *keep.values()})
        _enough(candidates, len(todo), exclude)
        new = list(ensemble)
        for index, bookie in keep.items():
            new[index] = bookie
        if not self.aware:
            for index, bookie in zip(todo, self.rng.sample(candidates, len(todo)), strict=True):
                new[index] = bookie
            return Choice(new)
        quorum = write_quorum or len(ensemble)
        domains = self._domains([*candidates, *ensemble, *keep.values()])
        for index in todo:
            home = domains.get(ensemble[index])
            pick = self._pick(
                [b if i != index else None for i, b in enumerate(new)],
                index,
                quorum,
                candidates,
                domains,
                home,
            )
            new[index] = pick
            candidates.remove(pick)
        touched = set(indexes)
        broken = [v for v in self.violations(new, quorum, domains) if touched & set(v.positions)]
        if not broken:
            return Choice(new)
        moved = ", ".join(new[i] for i in todo)
        return self._fallback(
            Choice(new, False, broken[0].reason, broken), f"no replacement ({moved}) meets the policy"
        )

    def _fallback(self, choice: Choice, what: str) -> Choice:
        if self.settings.enforce or self.settings.enforce_durability:
            raise UnavailableError(f"{what}: {choice.reason} ({self.settings.describe()})")
        log.warning("placement fallback: %s: %s; chose %s anyway", what, choice.reason, choice.bookies)
        choice.reason = f"{what}: {choice.reason}"
        return choice


def _normal(location: str | None) -> str | None:
    if not location or not location.strip():
        return None
    text = location.strip()
    return text if text.startswith("/") else "/" + text


def _enough(candidates: Sequence[str], size: int, exclude: Collection[str]) -> None:
    if len(candidates) < size:
        # Say what the count is of: "0 available (excluding 3)" read as if the 3 were the problem.
        left_out = (
            f" once the {len(set(exclude))} already in the ensemble or failed are left out" if exclude else ""
        )
        raise UnavailableError(
            f"not enough bookies: {size} more needed, {len(candidates)} read-write bookie(s) to choose "
            f"from{left_out}"
        )


# The random policy, kept for callers that need no racks.
def place_ensemble(
    available: Iterable[str], size: int, exclude: Collection[str] = (), rng: random.Random | None = None
) -> list[str]:
    """`size` distinct bookies from `available` minus `exclude`; UnavailableError when too few remain."""
    return Placement(rng=rng).new_ensemble(available, size, exclude=exclude).bookies


def replace_bookies(
    ensemble: Sequence[str],
    indexes: Collection[int],
    available: Iterable[str],
    exclude: Collection[str] = (),
    rng: random.Random | None = None,
) -> list[str]:
    """A copy of `ensemble` with the bookies at `indexes` replaced by new distinct random bookies."""
    return Placement(rng=rng).replace(ensemble, indexes, available, exclude=exclude).bookies
