"""One ledger's audit: its segments (what the metadata gives each bookie) against what the bookies hold
of it (bitmap rows, inventory.HoldingRow), as findings grouped into entry ranges and totals.

Runs in Spark executors, once per ledger (a cogroup of segments and holdings by ledger id), with numpy
over whole entry ranges: a bookie's expected entries in a segment are arithmetic (with striping, entry e
of a segment is on `ensemble[(e + i) % E]` for i < Qw, so a bookie's share is a union of residue classes
modulo E over the segment's range), and comparing them with its holdings is a few array operations per
bookie, not a row per entry. No pyspark here: tests call it directly.

Output rows `(kind, ledger_id, bookie, first_entry_id, last_entry_id, entries, text)`:
- findings (`missing`, `lost`, `extra`, `orphan`, `corrupt`, `divergent`), one per entry range;
- totals, summed by the driver in Spark: `replicas_expected` / `replicas_found` per (ledger, bookie),
  `entries_expected`, `unknown` (replicas on bookies not audited), `digests_checked`, `ledgers` (1 for a
  ledger in the metadata) per ledger, in `entries`;
- `error` (a holding row naming a file or bookie that could not be read) and `warning` (a metadata node
  that does not decode: the ledger's copies are then neither extra nor orphan), with `text`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bkctl.pipeline import bitmaps
from bkctl.pipeline.bitmaps import Mask

RESULT_SCHEMA = (
    "kind string, ledger_id long, bookie string, first_entry_id long, last_entry_id long, entries long, "
    "text string"
)
FINDING_KINDS = ("missing", "lost", "extra", "orphan", "corrupt", "divergent")
TOTAL_KINDS = (
    "replicas_expected",
    "replicas_found",
    "entries_expected",
    "unknown",
    "digests_checked",
    "ledgers",
)
Row = tuple[str, int, str | None, int, int, int, str | None]


@dataclass(frozen=True)
class Segment:
    state: str
    last_entry_id: int  # a closed ledger's last entry (-1 when open)
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    first_entry_id: int
    segment_last: int  # -1: to the ledger's end
    ensemble: Sequence[str]


@dataclass
class Holding:
    """One bookie's copies of the ledger, merged from its rows (index files, journals)."""

    rows: list[tuple[int, bytes, bytes, bytes, bytes]] = field(default_factory=list)

    def last(self) -> int:
        return max(first + len(held) * 8 - 1 for first, held, *_ in self.rows)

    def masks(self, size: int) -> tuple[Mask, Mask]:
        """(held, failed digest) over entries 0..size-1."""
        held, bad = np.zeros(size, dtype=np.bool_), np.zeros(size, dtype=np.bool_)
        for first, packed, _, bad_bits, _ in self.rows:
            for mask, bits in ((held, packed), (bad, bad_bits)):
                if bits:
                    width = min(len(bits) * 8, size - first)
                    mask[first : first + width] |= bitmaps.unpack(bits, width)
        return held, bad

    def crc_pairs(self) -> Iterator[tuple[Any, Any]]:
        """(entry ids, payload CRCs) of the verified copies, row by row."""
        for first, _, ok_bits, _, crcs in self.rows:
            if ok_bits:
                ids = np.flatnonzero(bitmaps.unpack(ok_bits, len(ok_bits) * 8)) + first
                yield ids, np.frombuffer(crcs, dtype="<u4")


def audit_ledger(
    ledger_id: int,
    segments: list[Segment],
    problems: list[str],
    holdings: Iterable[tuple[str, int, bytes, bytes, bytes, bytes, str | None]],
    audited: frozenset[str],
) -> list[Row]:
    """Findings and totals of one ledger (or of the problem rows, under ledger id -1)."""
    out: list[Row] = [("warning", ledger_id, None, -1, -1, 0, p) for p in problems]
    by_bookie: dict[str, Holding] = {}
    for bookie, first, held, ok, bad, crcs, problem in holdings:
        if problem is not None:
            out.append(("error", ledger_id, bookie, -1, -1, 0, problem))
        elif not problems:  # an undecodable ledger is not audited: its copies are not findings
            by_bookie.setdefault(bookie, Holding()).rows.append((first, held, ok, bad, crcs))
    if problems or (not segments and not by_bookie):
        return out
    return out + _Ledger(ledger_id, segments, by_bookie, audited).rows()


class _Ledger:
    def __init__(
        self, ledger_id: int, segments: list[Segment], holdings: dict[str, Holding], audited: frozenset[str]
    ) -> None:
        self.ledger_id, self.segments, self.audited = ledger_id, segments, audited
        last_held = max((h.last() for h in holdings.values()), default=-1)
        closed_last = max((s.last_entry_id for s in segments if s.state == "CLOSED"), default=-1)
        self.size = max(last_held, closed_last) + 1
        self.held: dict[str, Mask] = {}
        self.bad: dict[str, Mask] = {}
        for bookie, holding in holdings.items():
            self.held[bookie], self.bad[bookie] = holding.masks(self.size)
        self.holding = holdings
        self.copies = sum(self.held.values(), np.zeros(self.size, dtype=np.int16))

    def end(self) -> int:
        """A closed ledger's last entry; an open one's highest entry held by >= Qa bookies (-1: none)."""
        first = self.segments[0]
        if first.state == "CLOSED":
            return first.last_entry_id
        acked = np.flatnonzero(self.copies >= first.ack_quorum)
        return int(acked[-1]) if len(acked) else -1

    def expected(self, end: int) -> tuple[Mask, dict[str, Mask]]:
        """Entries the metadata says exist (0..end), and each bookie's share of them."""
        exists = np.zeros(self.size, dtype=np.bool_)
        share: dict[str, Mask] = {}
        for s in self.segments:
            last = min(s.segment_last, end) if s.segment_last >= 0 else end
            if last < s.first_entry_id:
                continue
            exists[s.first_entry_id : last + 1] = True
            for position, bookie in enumerate(s.ensemble[: s.ensemble_size]):
                residues = [(position - i) % s.ensemble_size for i in range(s.write_quorum)]
                mask = bitmaps.striped(s.first_entry_id, last, s.ensemble_size, residues, self.size)
                share[bookie] = share[bookie] | mask if bookie in share else mask
        return exists, share

    def rows(self) -> list[Row]:
        if not self.segments:
            return self._orphan_rows()
        end = self.end()
        exists, share = self.expected(end)
        none = np.zeros(self.size, dtype=np.bool_)
        unknown = np.zeros(self.size, dtype=np.int16)
        absent: dict[str, Mask] = {}
        out: list[Row] = []
        for bookie, wanted in share.items():
            held = self.held.get(bookie, none)
            out.append(self._total("replicas_expected", bookie, int(wanted.sum())))
            out.append(self._total("replicas_found", bookie, int((wanted & held).sum())))
            if bookie in self.audited:
                absent[bookie] = wanted & ~held
            else:
                unknown += wanted & ~held
        lost = exists & (self.copies == 0) & (unknown == 0)
        in_range = np.zeros(self.size, dtype=np.bool_)  # an open ledger's copies past its end: no finding
        in_range[: end + 1] = True
        closed = self.segments[0].state == "CLOSED"
        for bookie, missing in absent.items():
            out += self._ranges("missing", bookie, missing & ~lost)
        out += self._ranges("lost", None, lost)
        for bookie, held in self.held.items():
            outside = held & ~share.get(bookie, none)
            out += self._ranges("extra", bookie, outside if closed else outside & in_range)
        for bookie, bad in self.bad.items():
            out += self._ranges("corrupt", bookie, bad)
        out += self._ranges("divergent", None, self._divergent())
        out += [
            self._total("entries_expected", None, int(exists.sum())),
            self._total("unknown", None, int(unknown.sum())),
            self._total("digests_checked", None, self._checked()),
            self._total("ledgers", None, 1),
        ]
        return out

    def _orphan_rows(self) -> list[Row]:
        """A ledger the metadata does not have: every copy is an orphan (and may be corrupt)."""
        out = [self._total("digests_checked", None, self._checked())]
        for bookie, held in self.held.items():
            out += self._ranges("orphan", bookie, held)
        for bookie, bad in self.bad.items():
            out += self._ranges("corrupt", bookie, bad)
        return out + self._ranges("divergent", None, self._divergent())

    def _checked(self) -> int:
        """Copies whose digest was checked, every row counted (a copy in the index and the journal of one
        bookie, twice)."""
        return sum(
            int(np.unpackbits(np.frombuffer(bits, dtype=np.uint8)).sum())
            for h in self.holding.values()
            for _, _, ok, bad, _ in h.rows
            for bits in (ok, bad)
            if bits
        )

    def _divergent(self) -> Mask:
        """Entries whose verified copies have more than one payload CRC."""
        pairs = [p for h in self.holding.values() for p in h.crc_pairs()]
        mask = np.zeros(self.size, dtype=np.bool_)
        if not pairs:
            return mask
        ids = np.concatenate([i for i, _ in pairs])
        crcs = np.concatenate([c for _, c in pairs])
        order = np.lexsort((crcs, ids))
        ids, crcs = ids[order], crcs[order]
        distinct = np.ones(len(ids), dtype=np.bool_)
        distinct[1:] = (ids[1:] != ids[:-1]) | (crcs[1:] != crcs[:-1])
        versions, counts = np.unique(ids[distinct], return_counts=True)
        mask[versions[counts > 1]] = True
        return mask

    def _total(self, kind: str, bookie: str | None, value: int) -> Row:
        return (kind, self.ledger_id, bookie, -1, -1, value, None)

    def _ranges(self, kind: str, bookie: str | None, mask: Mask) -> list[Row]:
        return [(kind, self.ledger_id, bookie, a, b, b - a + 1, None) for a, b in bitmaps.runs(mask)]
