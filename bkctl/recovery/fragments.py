"""Fragments: a ledger's segments split per bookie, with the entries each bookie must hold.

Entry e of a segment is stored on the write set `ensemble[(e + i) % E]`, i < Qw, so the bookie at
ensemble index k holds the entries e of the segment's range with (k - e) mod E < Qw. A closed ledger's
last segment ends at its last entry; an open one's at the last entry the caller knows is confirmed. An
open ledger's earlier segments are whole up to the next one's first entry, as Java's LedgerChecker
takes them: a writer starts a segment at its last add confirmed + 1, so everything before was
acknowledged, even when the entries that bookies hold still piggyback an older confirmed id.
Pure: metadata in, fragments out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from bkctl.model import LedgerMetadata, LedgerState


@dataclass(frozen=True)
class Fragment:
    """What one bookie (at `index` of one segment's ensemble) must hold of a ledger."""

    ledger_id: int
    segment: int  # index in the metadata's segments
    first_entry_id: int  # the segment's range, inclusive; last < first when the segment is empty
    last_entry_id: int
    index: int
    bookie: str
    ensemble_size: int
    write_quorum: int

    def holds(self, entry_id: int) -> bool:
        return (self.index - entry_id) % self.ensemble_size < self.write_quorum

    def entries(self) -> Iterator[int]:
        """The entry ids this bookie stores, ascending."""
        for entry_id in range(self.first_entry_id, self.last_entry_id + 1):
            if self.holds(entry_id):
                yield entry_id

    def first_and_last(self) -> list[int]:
        """The first and last entries it stores (BookKeeper's default check), none if it stores none."""
        first = next(self.entries(), None)
        if first is None:
            return []
        last = next(e for e in range(self.last_entry_id, first - 1, -1) if self.holds(e))
        return [first] if last == first else [first, last]

    def entry_count(self) -> int:
        return sum(1 for _ in self.entries())


def fragments(ledger_id: int, metadata: LedgerMetadata, last_entry_id: int) -> list[Fragment]:
    """Every fragment of the ledger up to `last_entry_id` (the closed ledger's last entry, or what is
    confirmed of an open one: its last segment's end), one per segment and ensemble position."""
    found = []
    count = len(metadata.segments)
    closed = metadata.state is LedgerState.CLOSED
    for number, segment in enumerate(metadata.segments):
        sealed = number + 1 < count
        end = metadata.segments[number + 1].first_entry_id - 1 if sealed else last_entry_id
        if closed or not sealed:
            end = min(end, last_entry_id)
        for index, bookie in enumerate(segment.ensemble):
            found.append(
                Fragment(
                    ledger_id,
                    number,
                    segment.first_entry_id,
                    end,
                    index,
                    bookie,
                    metadata.ensemble_size,
                    metadata.write_quorum,
                )
            )
    return found


def on_bookies(found: list[Fragment], bookies: set[str] | frozenset[str]) -> list[Fragment]:
    return [f for f in found if f.bookie in bookies]
