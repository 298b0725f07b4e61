"""The only writer to stdout: tables for people, JSON for scripts, plain lines for grep.

Data goes to stdout, messages to stderr. Tables and key/value records sent to a terminal are drawn with
rich, states and findings coloured by their value (STYLES; none when NO_COLOR is set); sent anywhere
else they keep their plain aligned layout, byte for byte, so a script or a file never sees an escape.
rich is imported only when a terminal is there to draw on (it costs tens of ms at start).

Large outputs (an inspect of a 1 GiB journal) are streamed: rows are written as they are produced,
and JSON documents may hold iterators (written as arrays, element by element) and zero-argument
callables (called when reached, e.g. a summary that is only known once the records before it were
consumed).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from itertools import islice
from typing import Annotated, Any, Final, ParamSpec, TextIO, TypeVar

import typer

P = ParamSpec("P")
R = TypeVar("R")


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    plain = "plain"
    markdown = "markdown"
    rst = "rst"
    grid = "grid"


# Tables to paste into a ticket, a wiki or a runbook, drawn by tabulate (its format names). Unlike
# table and plain, these hold every row in memory to size the columns: meant for listings, not for the
# inspection of a whole journal.
TABULATE_FORMATS: Final[Mapping[OutputFormat, str]] = {
    OutputFormat.markdown: "pipe",
    OutputFormat.rst: "rst",
    OutputFormat.grid: "grid",
}


OutputOption = Annotated[
    OutputFormat | None,
    typer.Option(
        "--output",
        "-o",
        "-w",
        envvar="BKCTL_OUTPUT",
        case_sensitive=False,
        help="table (default on a terminal), json (stable schema for scripts), "
        "plain (tab-separated, default when piped), or markdown, rst, grid (tables to paste).",
        show_default=False,
    ),
]


def resolve(fmt: OutputFormat | None, stream: TextIO | None = None) -> OutputFormat:
    """The format to use: the one asked for, else table on a terminal and plain when piped."""
    if fmt is not None:
        return fmt
    return OutputFormat.table if (stream or sys.stdout).isatty() else OutputFormat.plain


# Colours of values people look for, by the key of the field that holds them (a column's key or a
# record's key): ledger states, bookie states, fragment states (`ledger check`), audit findings by kind.
_BAD: Final = "bold red"
STYLES: Final[Mapping[str, Mapping[str, str]]] = {
    "state": {
        "CLOSED": "green",
        "OPEN": "yellow",
        "IN_RECOVERY": "magenta",
        "rw": "green",
        "ro": "yellow",
        "down": _BAD,
        "ok": "green",
        "missing": _BAD,
        "bookie_down": _BAD,
        "digest_mismatch": _BAD,
    },
    "kind": {
        "missing": _BAD,
        "lost": _BAD,
        "corrupt": _BAD,
        "divergent": "magenta",
        "extra": "yellow",
        "orphan": "cyan",
    },
    "digest_ok": {"true": "green", "false": _BAD},
    "ok": {"true": "green", "false": _BAD},
}


def colour_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """False when NO_COLOR is set to anything but the empty string (no-color.org)."""
    return (environ if environ is not None else os.environ).get("NO_COLOR", "") == ""


def on_terminal(stream: TextIO) -> bool:
    """Whether people read `stream` (a closed or odd stream is no terminal)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# Rows that set a table's column widths: a table of a million rows starts printing at once, in bounded
# memory; a wider cell later just pushes its row out of line.
TABLE_WIDTH_ROWS: Final = 200


@dataclass(frozen=True)
class Column:
    """A column of a table: `key` in the row dict, `header` shown on top, right-aligned numbers."""

    key: str
    header: str
    numeric: bool = False


class OutputClosed(Exception):
    """The reader of stdout went away (`bkctl ... | head`): stop producing, quietly, with success."""


def _pipe_safe(write: Callable[P, R]) -> Callable[P, R]:
    """Turn a broken pipe into OutputClosed, which click would otherwise turn into exit code 1."""

    @functools.wraps(write)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return write(*args, **kwargs)
        except BrokenPipeError:
            raise OutputClosed from None

    return guarded


def message(text: str) -> None:
    """A message for the person at the terminal (stderr, never stdout)."""
    print(text, file=sys.stderr, flush=True)


# --- JSON ---------------------------------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, Enum):
        return value.name
    return str(value)


@_pipe_safe
def write_json(document: Any, out: TextIO | None = None) -> None:
    """Write `document` as one JSON value followed by a newline, streaming iterators and callables.

    If producing a value fails midway (a read error, a corrupt file), every array and object opened so
    far is closed before the error goes on: stdout stays valid JSON holding what was produced, and the
    exit code and the stderr line say it is incomplete.
    """
    out = out or sys.stdout
    try:
        _write_value(document, out)
    finally:
        _write_quietly(out, "\n")
        with contextlib.suppress(OSError, ValueError, OutputClosed):
            out.flush()


def _write_quietly(out: TextIO, text: str) -> None:
    """Closing brackets after a failure: a closed stdout must not hide the failure that got us here."""
    with contextlib.suppress(OSError, ValueError, OutputClosed):
        out.write(text)


def _write_value(value: Any, out: TextIO) -> None:
    if callable(value) and not isinstance(value, type):
        value = value()
    if isinstance(value, Mapping):
        out.write("{")
        try:
            for i, (key, item) in enumerate(value.items()):
                out.write(", " if i else "")
                out.write(json.dumps(str(key)) + ": ")
                _write_value(item, out)
        finally:
            _write_quietly(out, "}")
    elif isinstance(value, (Iterator, list, tuple)):
        out.write("[")
        try:
            for i, item in enumerate(value):
                # One record per line keeps long streams greppable; short scalar lists stay on one line.
                out.write(("," + ("\n" if isinstance(item, Mapping) else " ")) if i else "")
                _write_value(item, out)
        finally:
            _write_quietly(out, "]")
    else:
        out.write(json.dumps(value, default=_json_default, separators=(", ", ": ")))


# --- tables and plain lines ----------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return ",".join(_cell(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value, default=_json_default)
    return str(value)


@_pipe_safe
def write_rows(
    rows: Iterable[Mapping[str, Any]],
    columns: Sequence[Column],
    fmt: OutputFormat,
    out: TextIO | None = None,
) -> int:
    """Stream rows as a table (header, aligned) or plain tab-separated lines; return the row count.

    Column widths come from the header and the first TABLE_WIDTH_ROWS rows (see there).
    """
    out = out or sys.stdout
    iterator = iter(rows)
    if fmt in TABULATE_FORMATS:
        cells = [[_cell(row.get(c.key)) for c in columns] for row in iterator]
        _write_tabulated(cells, [c.header for c in columns], fmt, out, [c.numeric for c in columns])
        return len(cells)
    if fmt is OutputFormat.table and on_terminal(out):
        return _rich_rows(iterator, columns, out)
    if fmt is OutputFormat.plain:
        count = 0
        for row in iterator:
            out.write("\t".join(_cell(row.get(c.key)) for c in columns) + "\n")
            count += 1
        out.flush()
        return count
    return _aligned_rows(iterator, columns, out, lambda _, cell: cell, lambda header, _: out.write(header))


def _aligned_rows(
    rows: Iterator[Mapping[str, Any]],
    columns: Sequence[Column],
    out: TextIO,
    paint: Callable[[str, str], str],
    write_header: Callable[[str, Sequence[int]], object],
) -> int:
    """The table layout, for a file and for a terminal: widths from the header and the first
    TABLE_WIDTH_ROWS rows, numbers right-aligned, two spaces between columns. `paint(key, cell)` dresses
    a shown value (colours on a terminal); `write_header(line, widths)` writes the header line."""
    head = [[_cell(row.get(c.key)) for c in columns] for row in islice(rows, TABLE_WIDTH_ROWS)]
    widths = [max([len(c.header)] + [len(r[i]) for r in head]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        parts = []
        for cell, width, column in zip(cells, widths, columns, strict=True):
            pad = " " * (width - len(cell))
            shown = paint(column.key, cell)
            parts.append(pad + shown if column.numeric else shown + pad)
        return "  ".join(parts).rstrip() + "\n"

    write_header(line([c.header for c in columns]), widths)
    for cells in head:
        out.write(line(cells))
    count = len(head)
    for row in rows:
        out.write(line([_cell(row.get(c.key)) for c in columns]))
        count += 1
    out.flush()
    return count


@_pipe_safe
def write_mapping(values: Mapping[str, Any], fmt: OutputFormat, out: TextIO | None = None) -> None:
    """A record of named values: `key: value` lines in a table, `key<TAB>value` when plain, JSON object."""
    out = out or sys.stdout
    if fmt is OutputFormat.json:
        write_json(values, out)
        return
    if fmt in TABULATE_FORMATS:
        _write_tabulated([[key, _cell(value)] for key, value in values.items()], ["KEY", "VALUE"], fmt, out)
        return
    if fmt is OutputFormat.table and on_terminal(out):
        _rich_mapping(values, out)
        return
    width = max((len(k) for k in values), default=0)
    for key, value in values.items():
        if fmt is OutputFormat.plain:
            out.write(f"{key}\t{_cell(value)}\n")
        else:
            out.write(f"{key + ':':<{width + 1}}  {_cell(value)}\n")
    out.flush()


def _write_tabulated(
    cells: list[list[str]],
    headers: list[str],
    fmt: OutputFormat,
    out: TextIO,
    numeric: list[bool] | None = None,
) -> None:
    """Rows already shown as text (`_cell`, so `-` for none), laid out by tabulate; numbers right."""
    from tabulate import tabulate

    align = ["right" if n else "left" for n in numeric] if numeric else None
    table = tabulate(cells, headers, tablefmt=TABULATE_FORMATS[fmt], colalign=align, disable_numparse=True)
    out.write(table + "\n")
    out.flush()


@_pipe_safe
def write_text(text: str, out: TextIO | None = None) -> None:
    """Verbatim text on stdout (a completion script, a version line), newline-terminated."""
    out = out or sys.stdout
    out.write(text if text.endswith("\n") else text + "\n")
    out.flush()


@_pipe_safe
def write_title(text: str, fmt: OutputFormat, out: TextIO | None = None) -> None:
    """A heading above a table; nothing in plain or JSON output, which stay machine-readable."""
    if fmt in TABULATE_FORMATS:
        (out or sys.stdout).write(f"{text}\n")
        return
    if fmt is OutputFormat.table:
        out = out or sys.stdout
        if on_terminal(out):
            from rich.text import Text

            _console(out).print(Text(text, style="bold"))
            return
        out.write(f"{text}\n")


# --- on a terminal: rich ---------------------------------------------------------------------------------

RULE_CHAR: Final = "\u2500"


def _console(out: TextIO) -> Any:
    from rich.console import Console

    # No markup, no highlighting: a payload holding "[red]" or a number is shown as it is, uncoloured.
    # soft_wrap: a line longer than the terminal wraps there, as plain text does, never re-flowed.
    return Console(
        file=out,
        color_system="auto" if colour_wanted() else None,
        markup=False,
        highlight=False,
        emoji=False,
        soft_wrap=True,
    )


def _style(key: str, cell: str) -> str | None:
    """The colour of a shown value of field `key` (STYLES), if it has one."""
    return STYLES.get(key, {}).get(cell)


def _rich_rows(rows: Iterator[Mapping[str, Any]], columns: Sequence[Column], out: TextIO) -> int:
    """The table layout with its header in bold over a rule (printed by rich) and states in their
    colours (rich's escape codes around the cell). Not rich's Table: it lays out every cell of every
    row, over 100x slower (a 1 GiB journal's records would crawl on a terminal; benchmarks/RESULTS.md)."""
    from rich.text import Text

    console = _console(out)

    def header(line: str, widths: Sequence[int]) -> None:
        console.print(Text(line.rstrip("\n"), style="bold"))
        console.print(Text(RULE_CHAR * (sum(widths) + 2 * (len(widths) - 1)), style="dim"))

    return _aligned_rows(rows, columns, out, _painter(console), header)


def _painter(console: Any) -> Callable[[str, str], str]:
    """(field key, shown value) -> the value wrapped in the escape codes rich writes for its STYLES
    colour on this console (none under NO_COLOR or on a terminal without colours)."""
    from rich.console import COLOR_SYSTEMS
    from rich.style import Style

    system = COLOR_SYSTEMS.get(console.color_system or "")
    codes = {
        (key, value): tuple(Style.parse(style).render("\0", color_system=system).split("\0"))
        for key, styles in STYLES.items()
        for value, style in styles.items()
    }

    def paint(key: str, cell: str) -> str:
        found = codes.get((key, cell))
        return cell if found is None else f"{found[0]}{cell}{found[1]}"

    return paint


def _rich_mapping(values: Mapping[str, Any], out: TextIO) -> None:
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in values.items():
        cell = _cell(value)
        grid.add_row(key + ":", Text(cell, style=_style(key, cell) or ""))
    _console(out).print(grid)
