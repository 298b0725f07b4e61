"""The outcome of a resumable record scan, shared by the journal and entry log codecs."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class StopStatus(StrEnum):
    END = "end"  # a zero length or the clean end of the file: nothing after it is record data
    NEED_MORE = "need-more"  # the next record straddles the buffer end: read more, scan again from there
    ERROR = "error"  # corrupt bytes at `position`


@dataclass(frozen=True)
class ScanStop:
    """Where and why a scan stopped; `position` is an absolute file offset."""

    status: StopStatus
    position: int
    reason: str | None = None
    # A record cut short by the end of the file: corrupt for inspect, "end of valid data" for replay.
    truncated: bool = False

    @property
    def is_error(self) -> bool:
        return self.status is StopStatus.ERROR

    @property
    def read_all_valid(self) -> bool:
        """The scan read all the valid data: it ended cleanly, or at a record cut by the end of the file
        (a kill during a write past the last fsync, which nothing acknowledged names)."""
        return not self.is_error or self.truncated
