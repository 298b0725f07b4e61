"""The golden files of tests/data are the Java cluster's bytes, unchanged (tests/data/README.md)."""

from __future__ import annotations

import hashlib

from tests.conftest import JAVA_TESTDATA


def test_golden_files_match_their_checksums() -> None:
    listed = {}
    for line in (JAVA_TESTDATA / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name.removeprefix("./")] = digest
    files = [path for path in JAVA_TESTDATA.rglob("*") if path.is_file() and path.name != "SHA256SUMS"]
    present = {str(path.relative_to(JAVA_TESTDATA)) for path in files}
    assert present == set(listed)
    for name, digest in listed.items():
        assert hashlib.sha256((JAVA_TESTDATA / name).read_bytes()).hexdigest() == digest, name
