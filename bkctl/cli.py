"""The root `bkctl` command: global options, command groups, and errors turned into exit codes.

Command modules are imported here but import their heavy dependencies (twisted, kazoo, pyspark)
inside the commands, so `bkctl --help` and TAB completion stay fast. A command line naming a command
imports and builds that command's modules alone (`COMMANDS`): a script calling `bkctl ledger read` in a
loop pays about half the start-up of building every command; help at the root, and a name bkctl does
not know, build them all (the error then suggests the right one).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Annotated, NoReturn

# Plain click-style help: typer's rich help costs ~120 ms of imports per `--help` and TAB press.
os.environ.setdefault("TYPER_USE_RICH", "0")

import typer  # after TYPER_USE_RICH is set

# typer 0.29 vendors click; typer is pinned in pyproject.toml, so this private path is stable for us.
from typer._click import core as click_core
from typer._click import exceptions as click_exceptions

from bkctl import __version__, tls
from bkctl.commands.output import OutputClosed, OutputOption
from bkctl.errors import BkctlError, ExitCode

# Each module has `register(app)`, which adds its commands or group to the root app.
COMMAND_MODULES = (
    "bkctl.commands.completion",
    "bkctl.commands.inspect",
    "bkctl.commands.bookie",
    "bkctl.commands.bookie_server",
    "bkctl.commands.bookie_gc",
    "bkctl.commands.bookie_state",
    "bkctl.commands.bookie_rack",
    "bkctl.commands.bookie_convert",
    "bkctl.commands.bookie_check",
    "bkctl.commands.cluster",
    "bkctl.commands.ledger",
    "bkctl.commands.ledger_data",
    "bkctl.commands.ledger_write",
    "bkctl.commands.recover",
    "bkctl.commands.smoke",
    "bkctl.commands.sandbox",
    "bkctl.commands.bench",
    "bkctl.commands.underreplicated",
    "bkctl.commands.autorecovery",
    "bkctl.commands.audit",
    "bkctl.commands.doctor",
)

# The top-level commands and the modules that add to each (a group's commands live in several).
_BOTH = ("bkctl.commands.recover", "bkctl.commands.smoke")  # `bookie decommission`, `ledger recover`, ...
COMMANDS: dict[str, tuple[str, ...]] = {
    "completion": ("bkctl.commands.completion",),
    **dict.fromkeys(("journal", "entrylog", "index", "lastmark"), ("bkctl.commands.inspect",)),
    "bookie": (*(m for m in COMMAND_MODULES if m.startswith("bkctl.commands.bookie")), *_BOTH),
    "ledger": ("bkctl.commands.ledger", "bkctl.commands.ledger_data", "bkctl.commands.ledger_write", *_BOTH),
    **{name: (f"bkctl.commands.{name}",) for name in ("cluster", "recover", "sandbox", "bench")},
    **{name: (f"bkctl.commands.{name}",) for name in ("underreplicated", "autorecovery", "audit", "doctor")},
}

HELP = """Run, inspect and repair an Apache BookKeeper-compatible replicated log.

Data goes to stdout (-o table|json|plain), messages to stderr; exit codes are listed in docs/cli.md."""


def _version(value: bool) -> None:
    if value:
        from bkctl.commands.output import write_text

        write_text(f"bkctl {__version__}")
        raise typer.Exit()


def _root(
    verbose: Annotated[
        int, typer.Option("--verbose", "-v", count=True, help="More log output on stderr (-vv for debug).")
    ] = 0,
    metadata: Annotated[
        str | None,
        typer.Option(
            "--metadata",
            help="Metadata store URI for every command below (same as the command's own --metadata).",
            show_default=False,
        ),
    ] = None,
    output: OutputOption = None,
    metadata_timeout_ms: Annotated[
        int | None,
        typer.Option(
            "--metadata-timeout",
            min=0,
            max=3_600_000,
            help="How long (ms) a metadata operation rides through a lost ZooKeeper connection or session "
            "before it fails (default 120000; env BKCTL_METADATA_TIMEOUT_MS).",
            show_default=False,
        ),
    ] = None,
    tls_on: Annotated[
        bool, typer.Option("--tls", help="Talk to bookies over TLS (START_TLS; env BKCTL_TLS=1).")
    ] = False,
    tls_trust_store: Annotated[
        Path | None,
        typer.Option("--tls-trust-store", help="PEM CA bundle the bookies' certificates must chain to."),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option("--tls-cert", help="PEM client certificate, for bookies that require one.")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", help="PEM private key of --tls-cert.")] = None,
    tls_hostname_verification: Annotated[
        bool,
        typer.Option("--tls-hostname-verification", help="The bookie's certificate must name its host."),
    ] = False,
    conf: Annotated[
        Path | None,
        typer.Option(
            "--conf",
            help="Java's configuration (a bk_server.conf or client conf): its security keys "
            "(zkEnableSecurity, ...) for every command below (env BKCTL_CONF).",
            show_default=False,
        ),
    ] = None,
    jaas: Annotated[
        Path | None,
        typer.Option(
            "--jaas",
            help="JAAS file with the credentials, as Java's java.security.auth.login.config: "
            "section Client for ZooKeeper (env BKCTL_JAAS).",
            show_default=False,
        ),
    ] = None,
    protocol: Annotated[
        str | None,
        typer.Option(
            "--protocol",
            help="Bookie wire protocol of every client command below: v2 (default) or v3 "
            "(same as the command's own --protocol; env BKCTL_PROTOCOL).",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    # Commands read their --metadata and -o defaults from these variables: the root options reach them all.
    if metadata is not None:
        os.environ["BKCTL_METADATA"] = metadata
    if output is not None:
        os.environ["BKCTL_OUTPUT"] = output.value
    if metadata_timeout_ms is not None:
        os.environ["BKCTL_METADATA_TIMEOUT_MS"] = str(metadata_timeout_ms)
    # The client reads these in bkctl/tls.py (client_settings_from_env), wherever it is made.
    tls_env = {
        tls.ENV_TLS: "1" if tls_on else None,
        tls.ENV_TRUST_STORE: tls_trust_store,
        tls.ENV_CERTIFICATE: tls_cert,
        tls.ENV_KEY: tls_key,
        tls.ENV_HOSTNAME_VERIFICATION: "1" if tls_hostname_verification else None,
    }
    os.environ.update({name: str(value) for name, value in tls_env.items() if value is not None})
    # The metadata store reads these (bkctl/metadata/zk_auth.py) wherever it is opened.
    os.environ.update(
        {name: str(value) for name, value in (("BKCTL_CONF", conf), ("BKCTL_JAAS", jaas)) if value}
    )
    if protocol is not None:
        if protocol.lower() not in ("v2", "v3"):
            raise typer.BadParameter(f"{protocol!r} is not v2 or v3", param_hint="'--protocol'")
        os.environ["BKCTL_PROTOCOL"] = protocol.lower()
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if verbose >= 2:
        os.environ.setdefault("BKCTL_TRACEBACK", "1")


TYPE_NAMES = {
    "str": "TEXT",
    "int": "INTEGER",
    "float": "NUMBER",
    "Path": "PATH",
    "path": "PATH",
    "file": "FILE",
}


def _help_type(label: str, is_argument: bool) -> str:
    """What to type, for help: `PATH`, `INTEGER`, `<a|b>` choices; never a Python annotation."""
    inner = label[1:-1] if label.startswith("<") and label.endswith(">") else label
    if "|" in inner and "[" not in inner:
        return label  # choices are worth showing as they are
    if is_argument:
        return ""  # the argument's own name says it (`PATHS...`)
    inner = inner.removeprefix("list[").removesuffix("]").removesuffix(" range")
    return TYPE_NAMES.get(inner, inner.upper())


def _human_help_types() -> None:
    """typer 0.29 (pinned) prints annotations such as `<list[Path]>` in help: show plain names instead."""
    from typer import core

    original = core._TyperParameter.display_type

    def display_type(self: core._TyperParameter, ctx: click_core.Context) -> str:
        return _help_type(original(self, ctx), isinstance(self, core.TyperArgument))

    core._TyperParameter.display_type = display_type  # type: ignore[method-assign]


def build_app(argv: list[str] | None = None) -> typer.Typer:
    """The root app with the modules of the command `argv` names (None, or no known command: all)."""
    app = typer.Typer(
        name="bkctl",
        help=HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    _human_help_types()
    app.callback()(_root)
    wanted = COMMANDS.get(_command_named(argv) or "", COMMAND_MODULES)
    for name in COMMAND_MODULES:
        if name in wanted:
            importlib.import_module(name).register(app)
    return app


def _command_named(argv: list[str] | None) -> str | None:
    """The first word of `argv` that is not a root option or an option's value: the command."""
    words = iter(sys.argv[1:] if argv is None else argv)
    for word in words:
        if word == "--":
            return next(words, None)
        if not word.startswith("-"):
            return word
        if "=" not in word and word in _root_value_options():
            next(words, None)
    return None


@functools.cache
def _root_value_options() -> frozenset[str]:
    """The root's options that take a value (`--metadata X`), as click parses them."""
    root = typer.Typer()
    root.callback()(_root)
    group = typer.main.get_command(root)
    return frozenset(
        name
        for param in group.params
        if param.param_type_name == "option"
        and not getattr(param, "is_flag", True)
        and not getattr(param, "count", 0)
        for name in param.opts
    )


CHOICE_ERROR = re.compile(r"^(?:Value error, )?'(.*)' is not one of (.*?)\.?$")


NEGATIVE_NUMBER = re.compile(r"^-\d+$")


def _bad_parameter(exc: click_exceptions.BadParameter) -> str:
    """One line: which option, what was given, what is allowed (no validator jargon, no env var noise)."""
    param = exc.param
    if isinstance(exc, click_exceptions.MissingParameter) and param is not None:
        # click's own text is empty for a missing argument: name it and say what it is
        what = getattr(param, "help", None) or ""
        label = "/".join(param.opts) if param.param_type_name == "option" else (param.name or "").upper()
        return f"missing {param.param_type_name} {label}" + (f": {what}" if what else "")
    name = "/".join(param.opts) if param is not None and param.opts else (exc.param_hint or "a value")
    text = str(exc.message).removeprefix("Value error, ")
    choice = CHOICE_ERROR.match(text)
    if choice:
        allowed = choice.group(2).replace("'", "")
        return f"invalid value '{choice.group(1)}' for {name}: choose one of {allowed}"
    return f"invalid value for {name}: {text}"


def _no_such_option(exc: click_exceptions.NoSuchOption) -> str:
    """One line; a negative number (`ledger check -5`) is a value the parser took for an option."""
    if NEGATIVE_NUMBER.match(exc.option_name):
        return f"invalid value {exc.option_name}: ids, counts and sizes are 0 or more"
    hint = f" (did you mean {', '.join(sorted(exc.possibilities))}?)" if exc.possibilities else ""
    return f"no such option: {exc.option_name}{hint}"


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point of the `bkctl` console script."""
    try:
        result = build_app(argv)(args=argv, prog_name="bkctl", standalone_mode=False)
    except click_exceptions.BadParameter as exc:
        print(f"bkctl: error: {_bad_parameter(exc)}", file=sys.stderr)
        if exc.ctx is not None:
            print(f"Try '{exc.ctx.command_path} -h' for help.", file=sys.stderr)
        sys.exit(ExitCode.USAGE)
    except click_exceptions.NoSuchOption as exc:
        print(f"bkctl: error: {_no_such_option(exc)}", file=sys.stderr)
        if exc.ctx is not None:
            print(f"Try '{exc.ctx.command_path} -h' for help.", file=sys.stderr)
        sys.exit(ExitCode.USAGE)
    except click_exceptions.ClickException as exc:
        exc.show()
        sys.exit(ExitCode.USAGE if isinstance(exc, click_exceptions.UsageError) else ExitCode.ERROR)
    except (typer.Abort, KeyboardInterrupt):
        print("bkctl: interrupted", file=sys.stderr)
        sys.exit(ExitCode.INTERRUPTED)
    except BkctlError as exc:
        print(f"bkctl: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except (BrokenPipeError, OutputClosed):
        # `bkctl ... | head` closed our stdout: stop quietly, like cat does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(ExitCode.OK)
    except Exception as exc:  # last resort: one line, never a traceback unless asked for
        if os.environ.get("BKCTL_TRACEBACK"):
            raise
        print(
            f"bkctl: internal error: {type(exc).__name__}: {exc} (rerun with -vv for a traceback)",
            file=sys.stderr,
        )
        sys.exit(ExitCode.ERROR)
    sys.exit(result if isinstance(result, int) else ExitCode.OK)
