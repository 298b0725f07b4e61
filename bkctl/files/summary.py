"""Fast per-file summaries of journal and entry log records (no per-record objects)."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from bkctl.files.digests import DigestChecker

_LEDGER_ID = struct.Struct(">q")


@dataclass
class RecordSummary:
    """Counts over the records of one file (or those of one ledger)."""

    records: int = 0
    types: dict[str, int] = field(default_factory=dict)
    ledgers: set[int] = field(default_factory=set)
    record_bytes: int = 0  # record bodies, size prefixes excluded
    first_offset: int | None = None
    last_offset: int | None = None
    digest_failures: int = 0
    digest_unverified: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "types": dict(self.types),
            "ledgers": sorted(self.ledgers),
            "record_bytes": self.record_bytes,
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
            "digest_failures": self.digest_failures,
            "digest_unverified": self.digest_unverified,
        }


def summarize(
    records: Iterable[tuple[int, Enum, memoryview]],
    kinds: type[Enum],
    checker: DigestChecker,
    ledger: int | None = None,
) -> RecordSummary:
    """Count records by kind, check DATA digests; the hot loop of `--summary` scans.

    `kinds` is the codec's RecordKind (members DATA and PADDING are used). Padding has no ledger, so
    it is left out when `ledger` filters; special records whose ledger id is negative (an entry log's
    ledgers map) are counted but not listed as ledgers.
    """
    counts: dict[Any, int] = dict.fromkeys(kinds, 0)
    ledgers: set[int] = set()
    unpack_ledger = _LEDGER_ID.unpack_from
    check = checker.check
    data = kinds["DATA"]
    padding = kinds["PADDING"]
    first = last = None
    total = failures = unverified = 0
    for offset, kind, body in records:
        if kind is not padding:
            ledger_id = unpack_ledger(body)[0]
            if ledger is not None and ledger_id != ledger:
                continue
            if ledger_id >= 0:
                ledgers.add(ledger_id)
            if kind is data:
                ok = check(ledger_id, body)[1]
                if ok is None:
                    unverified += 1
                elif not ok:
                    failures += 1
        elif ledger is not None:
            continue
        counts[kind] += 1
        total += len(body)
        if first is None:
            first = offset
        last = offset
    return RecordSummary(
        records=sum(counts.values()),
        types={kind.value: n for kind, n in counts.items()},
        ledgers=ledgers,
        record_bytes=total,
        first_offset=first,
        last_offset=last,
        digest_failures=failures,
        digest_unverified=unverified,
    )
