"""Shared fixtures. The golden files from a real Java BookKeeper live in ../shared beside the repo."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
JAVA_TESTDATA = SHARED / "testdata" / "bookkeeper-java"
JAVA_BOOKIES = JAVA_TESTDATA / "bookies-snapshot1"
JAVA_SHELL_OUTPUT = JAVA_TESTDATA / "shell-output"
JAVA_ZK_DUMPS = JAVA_TESTDATA / "zk"
JAVA_WIRE = JAVA_TESTDATA / "wire"
