"""`bkctl completion bash|zsh|fish`: print the shell completion script (as kubectl does).

The scripts are small stubs that call `bkctl` back with `_BKCTL_COMPLETE` set, so they stay correct as
commands change; `completions/` holds the generated copies, checked current by a test.
"""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Annotated

import typer

from bkctl.commands import output

PROG_NAME = "bkctl"
COMPLETE_VAR = "_BKCTL_COMPLETE"


class Shell(StrEnum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


def completion_script(shell: Shell) -> str:
    # typer's public API only installs into ~/.bashrc; this private helper (typer is pinned) just prints.
    from typer._completion_shared import get_completion_script

    return get_completion_script(prog_name=PROG_NAME, complete_var=COMPLETE_VAR, shell=shell.value)


def completion(shell: Annotated[Shell, typer.Argument(help="bash, zsh or fish")]) -> None:
    """Print the shell completion script for bash, zsh or fish.

    Load it with `source <(bkctl completion bash)`.
    """
    output.write_text(completion_script(shell))


def register(app: typer.Typer) -> None:
    app.command("completion")(completion)
    if COMPLETE_VAR in os.environ:
        # A TAB press is calling us back: teach click typer's bash/zsh/fish completion classes.
        from typer._completion_classes import completion_init

        completion_init()
