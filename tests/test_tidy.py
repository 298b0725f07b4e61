"""The import rules of ARCHITECTURE.md, checked on the source (lazy imports inside functions included)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "bkctl"

# Rank of each part of the package: a module may import bkctl modules of its own rank or lower only.
# commands -> recovery/pipeline -> client/server -> metadata/files -> protocol -> errors/limits/model
RANKS = {
    "errors": 0,
    "limits": 0,
    "model": 0,
    "protocol": 1,
    "metadata": 2,
    "files": 2,
    "netio": 2,
    "tls": 2,
    "server": 3,
    "client": 3,
    "recovery": 4,
    "pipeline": 4,
    "commands": 5,
    "cli": 6,
    "__main__": 6,
    "__init__": 0,
}
# Same rank, still forbidden: the bookie never uses the client and vice versa.
FORBIDDEN_PAIRS = {("server", "client"), ("client", "server")}
# Third-party packages confined to one part of the tree.
CONFINED = {
    "pyspark": {"pipeline"},
    "typer": {"commands", "cli"},
    "rich": {"commands", "cli"},
    "click": {"commands", "cli"},
    "kazoo": {"metadata"},
    "twisted": {"server", "client", "recovery", "commands", "metadata", "netio", "tls"},
}
# Pure layers: nothing but the standard library, crc32c and lower bkctl layers.
PURE_PARTS = {"protocol", "errors", "limits", "model"}
PURE_THIRD_PARTY = {"crc32c"}
NO_TWISTED_MODULES = {"bkctl/metadata/store.py"}


def _modules() -> Iterator[Path]:
    yield from sorted(PACKAGE.rglob("*.py"))


def _part(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def _violations(path: Path) -> Iterator[str]:
    part = _part(path)
    rel = path.relative_to(REPO).as_posix()
    assert part in RANKS, f"{rel}: new top-level part {part!r}: give it a rank in tests/test_tidy.py"
    for line, name in _imports(path):
        top = name.split(".")[0]
        where = f"{rel}:{line} imports {name}"
        if top == "bkctl":
            target = name.split(".")[1] if "." in name else "__init__"
            if RANKS.get(target, 99) > RANKS[part]:
                yield f"{where}: {part} may not import upward ({target})"
            if (part, target) in FORBIDDEN_PAIRS:
                yield f"{where}: {part} may not import {target}"
        elif top in CONFINED and part not in CONFINED[top]:
            yield f"{where}: {top} belongs in {sorted(CONFINED[top])} only"
        elif part in PURE_PARTS and top not in PURE_THIRD_PARTY and not _is_stdlib(top):
            yield f"{where}: {part} must stay pure (standard library only)"
        if rel in NO_TWISTED_MODULES and top == "twisted":
            yield f"{where}: this module must not depend on twisted"


def _is_stdlib(name: str) -> bool:
    import sys

    return name in sys.stdlib_module_names or name == "__future__"


@pytest.mark.parametrize("path", list(_modules()), ids=lambda p: p.relative_to(REPO).as_posix())
def test_import_rules(path: Path) -> None:
    assert list(_violations(path)) == []


def test_only_output_writes_to_stdout() -> None:
    """Data reaches stdout through commands/output.py only; everything else writes to stderr."""
    offenders = []
    for path in _modules():
        if path.relative_to(PACKAGE).as_posix() == "commands/output.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if _writes_stdout(node):
                offenders.append(f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}")
    assert offenders == []


def _writes_stdout(node: ast.AST) -> bool:
    """A print() without file=, or a sys.stdout.write(...) call."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name) and func.id == "print":
        return not any(k.arg == "file" for k in node.keywords)
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "write"
        and isinstance(func.value, ast.Attribute)
        and func.value.attr == "stdout"
    )
