"""`--protocol v2|v3` of the client commands (the command's own option, the root option, the env
variable) against a real `bkctl sandbox`; a protocol that does not exist is a usage error (exit 2)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator

import pytest

from tests.commands.sandbox_proc import Sandbox, bkctl


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    sandbox = Sandbox(tmp_path_factory.mktemp("sandbox"), "--bookies", "3", "--base-port", "0")
    try:
        yield str(sandbox.wait_ready()["metadata_uri"])
    finally:
        assert sandbox.stop(signal.SIGINT) == 0, "".join(sandbox.err)


def test_write_over_v3_read_over_v2_and_v3(uri: str) -> None:
    done = bkctl("ledger", "write", "--entries", "50", "--protocol", "v3", "-o", "json", metadata=uri)
    assert done.returncode == 0, done.stderr
    ledger = str(json.loads(done.stdout)["ledger_id"])
    for args in (
        ("--protocol", "v3", "ledger", "read", ledger),
        ("ledger", "read", ledger, "--protocol", "v2"),
    ):
        done = bkctl(*args, "-o", "json", metadata=uri)
        assert done.returncode == 0, done.stderr
        assert [e["entry_id"] for e in json.loads(done.stdout)] == list(range(50))


def test_unknown_protocol_is_a_usage_error(uri: str) -> None:
    for args in (("--protocol", "v4", "ledger", "read", "0"), ("ledger", "read", "0", "--protocol", "v1")):
        done = bkctl(*args, metadata=uri)
        assert done.returncode == 2, done.stderr
        assert "v4" in done.stderr or "v1" in done.stderr


def test_the_environment_variable_picks_the_protocol(uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(os.environ, "BKCTL_PROTOCOL", "v3")
    done = bkctl("ledger", "write", "--entries", "5", "-o", "json", metadata=uri)
    assert done.returncode == 0, done.stderr
    monkeypatch.setitem(os.environ, "BKCTL_PROTOCOL", "v9")  # read: refused as a usage error
    done = bkctl("ledger", "write", "--entries", "5", metadata=uri)
    assert done.returncode == 2 and "v9" in done.stderr, done.stderr
