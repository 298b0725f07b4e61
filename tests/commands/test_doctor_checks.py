"""The pure parts of `bkctl doctor`'s checks: reading a bookie's info answer (bkctl's and Java's)."""

from __future__ import annotations

from bkctl.commands.doctor_checks import BookieHealth, take_disk


def disk_of(answer: dict[str, object] | str) -> BookieHealth:
    bookie = BookieHealth("127.0.0.1:3181", "rw", True, "127.0.0.1:8000")
    take_disk(bookie, answer)
    return bookie


def test_bkctl_info_counts_the_fullest_directory() -> None:
    usage = {"/j": {"used_fraction": 0.5}, "/l": {"used_fraction": 0.93, "free_bytes": 7}}
    bookie = disk_of({"id": "127.0.0.1:3181", "disk_usage": usage})
    assert bookie.disk_used_fraction == 0.93
    assert bookie.disk_detail == "93% used (fullest of 2 directories)"


def test_java_info_gives_the_total_of_its_ledger_directories() -> None:
    bookie = disk_of({"freeSpace": 250, "totalSpace": 1000})  # Java's BookieInfoService
    assert bookie.disk_used_fraction == 0.75
    assert bookie.disk_detail == "75% used (all ledger directories together)"


def test_what_cannot_be_read_is_unknown() -> None:
    for answer in ({}, {"freeSpace": 5, "totalSpace": 0}, {"disk_usage": {"/l": "full"}}, {"freeSpace": "1"}):
        bookie = disk_of(answer)
        assert bookie.disk_used_fraction is None and bookie.disk_detail.startswith("unknown")
    assert disk_of("unknown (http://x: refused)").disk_detail == "unknown (http://x: refused)"
