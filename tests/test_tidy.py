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
    "properties": 2,
    "jaas": 2,
    "sasl": 2,
    "keystores": 2,
    "tls_channel": 2,
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
    "twisted": {"server", "client", "recovery", "commands", "metadata", "netio"},
    "numpy": {"pipeline", "server"},
}
# numpy in server/ only where the bookie process never imports it: compaction's scan process.
SERVER_NUMPY_MODULES = {"bkctl/server/live_records.py"}
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
        if top == "numpy" and part == "server" and rel not in SERVER_NUMPY_MODULES:
            yield f"{where}: numpy in server/ only in {sorted(SERVER_NUMPY_MODULES)}"
        if rel in NO_TWISTED_MODULES and top == "twisted":
            yield f"{where}: this module must not depend on twisted"


def _is_stdlib(name: str) -> bool:
    import sys

    return name in sys.stdlib_module_names or name == "__future__"


@pytest.mark.parametrize("path", list(_modules()), ids=lambda p: p.relative_to(REPO).as_posix())
def test_import_rules(path: Path) -> None:
    assert list(_violations(path)) == []


# Import cycles known and being removed; each entry is the set of modules of one cycle.
ALLOWED_CYCLES: list[set[str]] = []  # none left


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """bkctl module -> the bkctl modules it imports anywhere (TYPE_CHECKING and inside functions too).

    `from a.b import c` counts as importing the module a.b.c when there is one, else a.b.
    """
    modules = {_module_name(path): path for path in _modules()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in modules else node.module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[tuple[set[str], list[str]]]:
    """Each group of modules that import each other, with one cycle through it (a path back to its
    first module)."""
    return [(group, _path_back(graph, min(group), group)) for group in _strongly_connected(graph)]


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Groups of two or more modules each reachable from the others (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def _path_back(graph: dict[str, set[str]], start: str, group: set[str]) -> list[str]:
    """The shortest import path from `start` back to itself inside `group` (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def test_no_import_cycles() -> None:
    """No bkctl module takes part in an import cycle, counting imports under TYPE_CHECKING and inside
    functions: a shared type or a factory moves down a level instead (see docs/architecture.md)."""
    graph = _import_graph()
    found = [
        " -> ".join(cycle) + (f" (group: {', '.join(sorted(group))})" if len(group) > len(cycle) - 1 else "")
        for group, cycle in _cycles(graph)
        if group not in ALLOWED_CYCLES
    ]
    assert not found, "import cycles (each module imports the next):\n" + "\n".join(found)
    gone = [group for group in ALLOWED_CYCLES if group not in [g for g, _ in _cycles(graph)]]
    assert not gone, f"allowed cycles that no longer exist (remove them from ALLOWED_CYCLES): {gone}"


def test_the_bookie_never_imports_the_scan_processs_numpy() -> None:
    """live_records (numpy) is imported by the scan process's entry point only, inside its function."""
    graph = _import_graph()
    importers = {name for name, targets in graph.items() if "bkctl.server.live_records" in targets}
    assert importers == {"bkctl.server.gc_scan"}
    scan = ast.parse((PACKAGE / "server" / "gc_scan.py").read_text())
    top_level = [node for node in scan.body if isinstance(node, ast.ImportFrom)]
    assert all(node.module != "bkctl.server.live_records" for node in top_level)


def test_cycle_finder() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert _cycles(graph) == [({"a", "b", "c"}, ["a", "b", "c", "a"]), ({"e", "f"}, ["e", "f", "e"])]
    assert _cycles({"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}) == [({"a", "b", "c"}, ["a", "b", "a"])]
    assert _cycles({"a": {"b"}, "b": set()}) == []


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
