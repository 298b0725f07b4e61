"""CLI conventions every command relies on: exit codes, errors as one line, completion, lazy imports."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bkctl import __version__, cli, errors
from bkctl.commands.completion import Shell, completion_script
from tests.conftest import REPO


def run_bkctl(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `python -m bkctl ARGS` as a user would, capturing stdout and stderr separately."""
    return subprocess.run(
        [sys.executable, "-m", "bkctl", *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )


def test_version() -> None:
    result = run_bkctl("--version")
    assert (result.returncode, result.stdout) == (0, f"bkctl {__version__}\n")


@pytest.mark.parametrize("args", [["no-such-command"], ["completion", "tcsh"], ["--no-such-option"]])
def test_usage_errors_exit_2_on_stderr(args: list[str]) -> None:
    result = run_bkctl(*args)
    assert result.returncode == errors.ExitCode.USAGE
    assert result.stdout == ""
    assert "Usage" in result.stderr or "-h' for help." in result.stderr


def test_no_arguments_shows_help_and_exits_2() -> None:
    result = run_bkctl()
    assert result.returncode == errors.ExitCode.USAGE
    assert "Commands" in result.stderr and result.stdout == ""


def test_every_error_class_has_a_documented_exit_code() -> None:
    documented = (REPO / "docs" / "cli.md").read_text()
    for code, name, _meaning in errors.exit_code_table():
        assert re.search(rf"^\|\s*{code}\s*\|\s*`?{name}`?\s*\|", documented, re.M), (
            f"{code} {name} not in cli.md"
        )
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.BkctlError)]
    assert all(isinstance(c.exit_code, errors.ExitCode) for c in classes)


@pytest.mark.parametrize("shell", list(Shell))
def test_completion_scripts_are_current(shell: Shell) -> None:
    shipped = (REPO / "completions" / f"bkctl.{shell.value}").read_text()
    assert shipped == completion_script(shell) + "\n", "run scripts/gen-completions"


def test_tab_completion_answers() -> None:
    env = {**os.environ, "_BKCTL_COMPLETE": "complete_bash", "COMP_WORDS": "bkctl comp", "COMP_CWORD": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "bkctl"], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert result.stdout.split() == ["completion"]


def test_heavy_libraries_are_imported_lazily() -> None:
    code = (
        "import sys; from bkctl.cli import build_app; build_app(); "
        "print(sorted(m for m in ('twisted', 'kazoo', 'pyspark', 'sqlite_utils') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_closed_pipe_ends_quietly_with_success() -> None:
    """`bkctl ... | head` must not fail a `set -o pipefail` script or print a traceback."""
    journal = REPO / "examples" / "java-bookie1" / "journal"
    args = [sys.executable, "-m", "bkctl", "journal", "inspect", str(journal), "-o", "table"]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.read(100)
        proc.stdout.close()
        assert proc.wait(timeout=60) == errors.ExitCode.OK
        assert proc.stderr.read() == b""


def test_metadata_option_works_before_the_command(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'metadata.db'}"
    assert run_bkctl("--metadata", uri, "cluster", "init").returncode == 0
    before = run_bkctl("--metadata", uri, "cluster", "info", "-o", "json")
    after = run_bkctl("cluster", "info", "--metadata", uri, "-o", "json")
    assert before.returncode == after.returncode == 0
    assert before.stdout == after.stdout and '"ledger_count": 0' in before.stdout


def test_help_shows_no_python_types_and_whole_summaries() -> None:
    """Help showed `<list[Path]>` / `<str>` and cut "Print the shell completion
    script, e.g." at the abbreviation."""
    for args in (
        ["--help"],
        ["lastmark", "--help"],
        ["bookie", "start", "--help"],
        ["ledger", "read", "--help"],
    ):
        text = run_bkctl(*args).stdout
        assert not re.search(r"<(list\[|str>|int>|Path>|float>)", text), (args, text)
    assert "Print the shell completion script for bash, zsh or fish." in run_bkctl("--help").stdout


def test_choice_errors_are_one_plain_line() -> None:
    result = run_bkctl("ledger", "list", "-o", "xml")
    assert result.returncode == errors.ExitCode.USAGE
    assert result.stderr.splitlines()[0] == (
        "bkctl: error: invalid value 'xml' for --output/-o/-w: "
        "choose one of table, json, plain, markdown, rst, grid"
    )
    assert "Value error" not in result.stderr


def test_output_option_works_before_the_command(tmp_path: Path) -> None:
    db = tmp_path / "metadata.db"
    assert run_bkctl("cluster", "init", "--metadata", f"sqlite://{db}").returncode == 0
    result = run_bkctl("-o", "json", "--metadata", f"sqlite://{db}", "ledger", "list")
    assert (result.returncode, result.stdout) == (0, "[]\n")


def test_read_only_commands_create_no_metadata_store(tmp_path: Path) -> None:
    """`ledger list --metadata sqlite:///x.db` created x.db; the default store was
    created too, and the message did not name the store or the fix; --metadata "" fell back."""
    missing = tmp_path / "x.db"
    result = run_bkctl("ledger", "list", "--metadata", f"sqlite://{missing}")
    assert result.returncode == errors.ExitCode.NOT_FOUND and not missing.exists()
    assert f"no metadata store at sqlite://{missing}" in result.stderr and "bkctl sandbox" in result.stderr
    env = {k: v for k, v in os.environ.items() if k != "BKCTL_METADATA"} | {"HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "bkctl", "ledger", "list"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == errors.ExitCode.NOT_FOUND and "the default store" in done.stderr
    assert not (tmp_path / "home").exists()
    result = run_bkctl("ledger", "list", "--metadata", "")
    assert result.returncode == errors.ExitCode.USAGE and "is empty" in result.stderr


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (("ledger", "delete", "3"), b"ledger 3 not deleted"),
        (("cluster", "init", "--force"), b"nothing deleted"),
    ],
)
def test_declining_a_prompt_is_exit_14_and_no_terminal_needs_yes(
    tmp_path: Path, command: tuple[str, ...], said: bytes
) -> None:
    """Answering `n` to `ledger delete` (and to `cluster init --force`) exited 130, the
    Ctrl-C code."""
    db = tmp_path / "metadata.db"
    assert run_bkctl("cluster", "init", "--metadata", f"sqlite://{db}").returncode == 0
    result = run_bkctl(*command, "--metadata", f"sqlite://{db}")
    assert result.returncode == errors.ExitCode.USAGE and "--yes" in result.stderr  # no terminal
    status, output = answer_on_a_terminal([*command, "--metadata", f"sqlite://{db}"], b"n\n")
    assert status == errors.ExitCode.DECLINED, output
    assert said in output


def answer_on_a_terminal(args: list[str], answer: bytes) -> tuple[int, bytes]:
    """Run bkctl ARGS on a pseudo-terminal, type `answer`, return its exit code and what it showed."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: bkctl on a terminal
        os.execv(sys.executable, [sys.executable, "-m", "bkctl", *args])
    os.write(fd, answer)
    output = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 1024):
            output += chunk
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), output


def test_bookie_gc_refuses_an_endpoint_that_is_not_host_port() -> None:
    """Refused before any connection (no name lookup of whatever was typed)."""
    result = run_bkctl("bookie", "gc", "--http", "nonsense")
    assert result.returncode == errors.ExitCode.USAGE and "HOST:PORT" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_command_line_builds_its_own_commands_alone_and_the_same_ones() -> None:
    """`COMMANDS` names every module adding to each top-level command: the app built for one command
    line (in a fresh interpreter: a group's modules add to it when imported) has that command, with the
    subcommands of the app built whole, and few others."""
    show = (
        "import sys, json, typer.main; from bkctl import cli; "
        "g = typer.main.get_command(cli.build_app(sys.argv[1:] or None)); "
        "print(json.dumps({n: sorted(getattr(c, 'commands', {})) for n, c in g.commands.items()}))"
    )

    def built(*argv: str) -> dict[str, list[str]]:
        done = subprocess.run([sys.executable, "-c", show, *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    whole = built()
    assert set(whole) == set(cli.COMMANDS)
    for name in cli.COMMANDS:
        one = built("-o", "json", name, "--help")  # a module adding several (inspect's) brings them all
        assert one[name] == whole[name] and len(one) <= len(cli.COMMANDS) - 10, name
