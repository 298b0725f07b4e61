"""The README's "Try it" example prints what the command prints: `ledger write` against a fresh
`bkctl sandbox`, in the table format a terminal gets (the README once lost the `closed:` line)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from tests.commands.sandbox_proc import Sandbox, bkctl
from tests.conftest import REPO

WRITE = "$ bkctl ledger write --entries 1000 --size 1024"
STDERR_MARK = "(stderr)"


def readme_example(command: str) -> tuple[list[str], list[str]]:
    """(stdout lines, stderr lines) shown under `command` in README.md, up to the next prompt or fence."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index(command) + 1
    shown = []
    for line in lines[start:]:
        if line.startswith("$ ") or line.startswith("```"):
            break
        shown.append(line)
    stderr = [line.removesuffix(STDERR_MARK).rstrip() for line in shown if line.endswith(STDERR_MARK)]
    return [line for line in shown if not line.endswith(STDERR_MARK)], stderr


def bookies_as_in_readme(text: str) -> str:
    """The sandbox's ports are free ones; the README shows 3181-3183."""
    return re.sub(r"created on \S+", "created on 127.0.0.1:3181,127.0.0.1:3182,127.0.0.1:3183", text)


def test_readme_ledger_write_example_matches_the_command(tmp_path: Path) -> None:
    sandbox = Sandbox(tmp_path / "sb", "--bookies", "3", "--base-port", "0")
    try:
        uri = str(sandbox.wait_ready()["metadata_uri"])
        written = bkctl(*WRITE.split()[2:], "-o", "table", metadata=uri)
        assert written.returncode == 0, written.stderr
        out, err = readme_example(WRITE)
        assert written.stdout.splitlines() == out
        assert bookies_as_in_readme(written.stderr).splitlines() == err
        read = bkctl("ledger", "read", "0", "--last", "4", "--as-text", "-o", "plain", metadata=uri)
        assert read.returncode == 0 and len(read.stdout.splitlines()) == 5  # "reads entries 0 to 4"
    finally:
        stopped = sandbox.stop(signal.SIGINT)
    assert stopped == 0, "".join(sandbox.err)
