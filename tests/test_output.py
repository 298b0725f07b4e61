"""output.py: streaming JSON, tables and plain lines."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest

from bkctl.commands import output
from bkctl.commands.output import Column, OutputFormat

COLUMNS = [Column("offset", "OFFSET", numeric=True), Column("type", "TYPE"), Column("ok", "OK")]


def rows() -> Iterator[dict[str, object]]:
    yield {"offset": 512, "type": "DATA", "ok": True}
    yield {"offset": 1024, "type": "FENCE", "ok": None}


def test_json_streams_iterators_and_calls_callables_when_reached() -> None:
    seen: list[int] = []

    def records() -> Iterator[dict[str, int]]:
        for i in range(3):
            seen.append(i)
            yield {"i": i}

    out = io.StringIO()
    output.write_json({"records": records(), "summary": lambda: {"count": len(seen)}, "raw": b"\x01"}, out)
    document = json.loads(out.getvalue())
    assert document == {"records": [{"i": 0}, {"i": 1}, {"i": 2}], "summary": {"count": 3}, "raw": "AQ=="}


def test_table_aligns_columns_and_marks_absent_values() -> None:
    out = io.StringIO()
    assert output.write_rows(rows(), COLUMNS, OutputFormat.table, out) == 2
    assert out.getvalue().splitlines() == ["OFFSET  TYPE   OK", "   512  DATA   true", "  1024  FENCE  -"]


def test_tables_to_paste_in_markdown_rst_and_grid() -> None:
    """tabulate draws them: numbers right-aligned, absent values as `-`, the same cells as the table."""
    out = io.StringIO()
    assert output.write_rows(rows(), COLUMNS, OutputFormat.markdown, out) == 2
    assert out.getvalue().splitlines() == [
        "|   OFFSET | TYPE   | OK   |",
        "|---------:|:-------|:-----|",
        "|      512 | DATA   | true |",
        "|     1024 | FENCE  | -    |",
    ]
    out = io.StringIO()
    output.write_rows(rows(), COLUMNS, OutputFormat.rst, out)
    assert out.getvalue().splitlines()[1] == "  OFFSET  TYPE    OK"
    out = io.StringIO()
    output.write_mapping({"ledger_id": 7, "fenced": False}, OutputFormat.grid, out)
    assert "| ledger_id | 7       |" in out.getvalue() and out.getvalue().startswith("+---")


def test_plain_is_tab_separated_without_header() -> None:
    out = io.StringIO()
    output.write_rows(rows(), COLUMNS, OutputFormat.plain, out)
    assert out.getvalue() == "512\tDATA\ttrue\n1024\tFENCE\t-\n"


def test_mapping_in_every_format() -> None:
    values = {"journal_id": 7, "fenced": False}
    for fmt, expected in [
        (OutputFormat.plain, "journal_id\t7\nfenced\tfalse\n"),
        (OutputFormat.table, "journal_id:  7\nfenced:      false\n"),
        (OutputFormat.json, '{"journal_id": 7, "fenced": false}\n'),
    ]:
        out = io.StringIO()
        output.write_mapping(values, fmt, out)
        assert out.getvalue() == expected


def test_default_format_follows_the_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert output.resolve(None, Tty()) is OutputFormat.table
    assert output.resolve(None, io.StringIO()) is OutputFormat.plain
    assert output.resolve(OutputFormat.json, Tty()) is OutputFormat.json


def test_json_stays_valid_when_a_stream_fails_midway() -> None:
    """A read that failed midway left a bare `[` on stdout (invalid JSON)."""
    from bkctl.errors import NotFoundError

    def rows() -> Iterator[dict[str, int]]:
        yield {"entry_id": 0}
        yield {"entry_id": 1}
        raise NotFoundError("entry 2: no bookie has it")

    out = io.StringIO()
    with pytest.raises(NotFoundError):
        output.write_json({"ledger_id": 3, "entries": rows()}, out)
    assert json.loads(out.getvalue()) == {"ledger_id": 3, "entries": [{"entry_id": 0}, {"entry_id": 1}]}
