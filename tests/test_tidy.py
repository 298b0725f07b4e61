"""The rules of docs/architecture.md, checked on the source's AST (lazy imports inside functions included).

Every rule has a probe test below that runs the checker on a small source string breaking it: a rule
that cannot fail is not checked.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from collections.abc import Iterator, Set
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "bkctl"
ARCHITECTURE = REPO / "docs" / "architecture.md"

# Which layer each top-level part of the package belongs to.
LAYER_OF = {
    "errors": "base",
    "limits": "base",
    "model": "base",
    "__init__": "base",
    "protocol": "protocol",
    "metadata": "metadata",
    "files": "files",
    "netio": "netio",
    "tls": "tls",
    "tls_channel": "tls_channel",
    "properties": "conf",
    "jaas": "conf",
    "sasl": "conf",
    "kerberos": "conf",
    "keystores": "conf",
    "admin": "admin",
    "server": "server",
    "client": "client",
    "recovery": "recovery",
    "pipeline": "pipeline",
    "commands": "commands",
    "cli": "cli",
    "__main__": "cli",
}
# The layer diagram of docs/architecture.md (its mermaid block must state exactly these arrows): a
# layer imports its own modules and the layers it reaches by following the arrows, nothing else. So
# server and client never import each other and recovery never imports server.
DIAGRAM = {
    "cli": {"commands"},
    "commands": {"recovery", "pipeline", "server", "client"},
    "recovery": {"client", "admin"},
    "pipeline": {"server", "client"},
    "server": {"admin", "metadata", "files", "netio", "tls"},
    "admin": {"metadata"},
    "client": {"metadata", "netio", "tls"},
    "metadata": {"protocol", "conf"},
    "files": {"protocol"},
    "tls": {"tls_channel", "conf"},
    "conf": {"base"},
    "netio": {"base"},
    "tls_channel": {"base"},
    "protocol": {"base"},
    "base": set(),
}
# Third-party packages confined to some parts of the tree.
CONFINED = {
    "pyspark": {"pipeline"},
    "typer": {"commands", "cli"},
    "rich": {"commands", "cli"},
    "tabulate": {"commands", "cli"},
    "click": {"commands", "cli"},
    "kazoo": {"metadata"},
    "twisted": {"admin", "server", "client", "recovery", "commands", "netio"},
    "numpy": {"pipeline", "server"},
}
# Single modules allowed a confined package outside its parts, each for a reason the doc states.
CONFINED_EXCEPTIONS = {
    # Stopping waits on a Deferred for at most a bound; the rest of metadata/ is blocking.
    ("twisted", "bkctl/metadata/at_stop.py"),
}
# numpy in server/ only where the bookie process never imports it: compaction's scan process.
SERVER_NUMPY_MODULES = {"bkctl/server/live_records.py", "bkctl/server/db_slots.py"}
# Pure layers: nothing but the standard library, crc32c and lower bkctl layers.
PURE_PARTS = {"protocol", "errors", "limits", "model"}
PURE_THIRD_PARTY = {"crc32c"}
NO_TWISTED_MODULES = {"bkctl/metadata/store.py"}


def _reach(layer: str) -> set[str]:
    """The layers `layer` may import: itself and every layer the arrows lead to."""
    seen, todo = {layer}, [layer]
    while todo:
        for below in DIAGRAM[todo.pop()]:
            if below not in seen:
                seen.add(below)
                todo.append(below)
    return seen


def _modules() -> Iterator[Path]:
    yield from sorted(PACKAGE.rglob("*.py"))


@functools.cache
def _module_names() -> frozenset[str]:
    return frozenset(_module_name(path) for path in _modules())


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _part(module: str) -> str:
    """bkctl.server.gc -> server; bkctl.limits -> limits; bkctl -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(tree: ast.AST, module: str, is_package: bool, known: Set[str]) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of `tree`, however written: `import a.b`, `from a import b`
    (a.b when it is a module, else a), relative imports resolved against `module`, and
    importlib.import_module with a literal (with anything else: every bkctl module the file names in
    a string, since one of them is what it imports)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, is_package)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield node.lineno, sub if sub in known or not base else base
        elif isinstance(node, ast.Call) and _is_import_module(node.func):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield node.lineno, arg.value
            else:
                for text in ast.walk(tree):
                    if isinstance(text, ast.Constant) and text.value in known:
                        yield node.lineno, str(text.value)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")
    parts = parts if is_package else parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in {"import_module", "__import__"}
    )


def import_violations(rel: str, source: str, known: Set[str] | None = None) -> Iterator[str]:
    """What is wrong with the imports of the module at `rel` (e.g. bkctl/server/gc.py) holding `source`."""
    known = _module_names() if known is None else known
    path = Path(rel)
    is_package = path.name == "__init__.py"
    module = ".".join(path.with_suffix("").parts[:-1] if is_package else path.with_suffix("").parts)
    part = _part(module)
    assert part in LAYER_OF, f"{rel}: new top-level part {part!r}: give it a layer in tests/test_tidy.py"
    allowed = _reach(LAYER_OF[part])
    for line, name in _imports(ast.parse(source, filename=rel), module, is_package, known):
        top = name.split(".")[0]
        where = f"{rel}:{line} imports {name}"
        if top == "bkctl":
            target = _part(name)
            if LAYER_OF.get(target, "?") not in allowed:
                yield f"{where}: {part} may import only {sorted(allowed)} (docs/architecture.md)"
        elif top in CONFINED and part not in CONFINED[top] and (top, rel) not in CONFINED_EXCEPTIONS:
            yield f"{where}: {top} belongs in {sorted(CONFINED[top])} only"
        elif part in PURE_PARTS and top not in PURE_THIRD_PARTY and not _is_stdlib(top):
            yield f"{where}: {part} must stay pure (standard library only)"
        if top == "numpy" and part == "server" and rel not in SERVER_NUMPY_MODULES:
            yield f"{where}: numpy in server/ only in {sorted(SERVER_NUMPY_MODULES)}"
        if rel in NO_TWISTED_MODULES and top == "twisted":
            yield f"{where}: this module must not depend on twisted"


def _is_stdlib(name: str) -> bool:
    return name in sys.stdlib_module_names or name == "__future__"


@pytest.mark.parametrize("path", list(_modules()), ids=lambda p: p.relative_to(REPO).as_posix())
def test_import_rules(path: Path) -> None:
    assert list(import_violations(path.relative_to(REPO).as_posix(), path.read_text())) == []


KNOWN = {"bkctl", "bkctl.limits", "bkctl.server", "bkctl.server.gc", "bkctl.client", "bkctl.client.ledger"}


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("bkctl/protocol/probe.py", "from bkctl import server\n"),
        ("bkctl/protocol/probe.py", "from bkctl.server import gc\n"),
        ("bkctl/protocol/probe.py", "import bkctl.server.gc\n"),
        ("bkctl/protocol/probe.py", "from ..server import gc\n"),
        ("bkctl/protocol/probe.py", "from .. import server\n"),
        ("bkctl/protocol/probe.py", "import importlib\nimportlib.import_module('bkctl.server.gc')\n"),
        ("bkctl/protocol/probe.py", "import importlib\nM = 'bkctl.server'\nimportlib.import_module(M)\n"),
        ("bkctl/server/probe.py", "def f():\n    from bkctl.client import ledger\n"),
        ("bkctl/client/probe.py", "from . import ledger\nfrom ..server import gc\n"),
        ("bkctl/recovery/probe.py", "from bkctl.server import gc\n"),
        ("bkctl/metadata/probe.py", "import twisted\n"),
        ("bkctl/metadata/store.py", "from twisted.internet import defer\n"),
        ("bkctl/server/probe.py", "import numpy\n"),
        ("bkctl/protocol/probe.py", "import yaml\n"),
        ("bkctl/client/probe.py", "import pyspark\n"),
    ],
)
def test_import_rules_catch_each_form(rel: str, source: str) -> None:
    assert list(import_violations(rel, source, KNOWN)), source


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("bkctl/protocol/probe.py", "from bkctl import limits\nfrom . import wire\n"),
        ("bkctl/client/probe.py", "from . import ledger\nfrom .. import limits\n"),
        ("bkctl/commands/probe.py", "from bkctl.server import gc\nfrom bkctl.client import ledger\n"),
        ("bkctl/metadata/at_stop.py", "from twisted.internet import defer\n"),
    ],
)
def test_import_rules_let_allowed_imports_pass(rel: str, source: str) -> None:
    assert list(import_violations(rel, source, KNOWN)) == []


def diagram_errors(text: str) -> list[str]:
    """How the mermaid block of an architecture page differs from DIAGRAM and LAYER_OF."""
    block = text.split("```mermaid", 1)[1].split("```", 1)[0]
    arrows = set()
    for left, right in re.findall(r"^\s*(\w+)\s*-->\s*(.+?)\s*$", block, re.M):
        arrows.update((left, target.strip()) for target in right.split("&"))
    checked = {(upper, lower) for upper, lowers in DIAGRAM.items() for lower in lowers}
    errors = [f"arrow {a} --> {b} is not checked" for a, b in sorted(arrows - checked)]
    errors += [f"arrow {a} --> {b} is not drawn" for a, b in sorted(checked - arrows)]
    nodes = dict(re.findall(r'^\s*(\w+)\["([^"]*)"\]', block, re.M))
    errors += [f"layer {layer} is not drawn" for layer in sorted(set(DIAGRAM) - set(nodes))]
    errors += [f"node {node} is not a layer" for node in sorted(set(nodes) - set(DIAGRAM))]
    for part, layer in LAYER_OF.items():
        shown = part if part != "__init__" else "__init__.py"
        if layer in nodes and not re.search(rf"\b{re.escape(shown)}\b", nodes[layer]):
            errors.append(f"{part} is missing from node {layer}")
    return errors


def unnamed_modules(text: str, paths: list[Path]) -> list[str]:
    """The modules (paths under bkctl/) that the module table of an architecture page does not name in
    their part's row (a top-level module: in any row)."""
    rows: dict[str, str] = {}
    for first, rest in re.findall(r"^\| `?([\w/ ]+?)`? \| (.*)\|$", text, re.M):
        rows[first] = rows.get(first, "") + rest
    missing = []
    for path in paths:
        rel = path.relative_to(PACKAGE)
        where = rows.get(f"{rel.parts[0]}/", "") if len(rel.parts) > 1 else " ".join(rows.values())
        named = (path.name == "__init__.py" and len(rel.parts) > 1) or f"`{path.name}`" in where
        if not named:
            missing.append(rel.as_posix())
    return missing


def test_the_documented_diagram_is_the_checked_one() -> None:
    assert diagram_errors(ARCHITECTURE.read_text()) == []


def test_every_module_is_named_in_the_architecture() -> None:
    assert unnamed_modules(ARCHITECTURE.read_text(), [*_modules(), *PACKAGE.rglob("*.c")]) == []


def test_the_doc_rules_catch_a_drift() -> None:
    text = ARCHITECTURE.read_text()
    extra = text.replace("    recovery --> client & admin\n", "    recovery --> client & admin & server\n")
    assert diagram_errors(extra) == ["arrow recovery --> server is not checked"]
    missing = text.replace("    tls --> tls_channel & conf\n", "    tls --> conf\n")
    assert diagram_errors(missing) == ["arrow tls --> tls_channel is not drawn"]
    unnamed = text.replace("errors.py limits.py", "errors.py")
    assert diagram_errors(unnamed) == ["limits is missing from node base"]
    probe = [PACKAGE / "server" / "probe_module.py", PACKAGE / "client" / "ledger.py"]
    assert unnamed_modules(text, probe) == ["server/probe_module.py"]
    # reads.py is named, but in client's row
    assert unnamed_modules(text, [PACKAGE / "server" / "reads.py"]) == ["server/reads.py"]


# Import cycles known and being removed; each entry is the set of modules of one cycle.
ALLOWED_CYCLES: list[set[str]] = []  # none left


def _import_graph() -> dict[str, set[str]]:
    """bkctl module -> the bkctl modules it imports anywhere (TYPE_CHECKING and inside functions too).

    Every import form counts (see _imports): `from a.b import c` is the module a.b.c when there is one.
    """
    modules = {_module_name(path): path for path in _modules()}
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        targets = {target for _, target in _imports(tree, name, path.name == "__init__.py", known)}
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
    """live_records and db_slots (numpy) are imported by the scan process's entry point only, inside its
    functions."""
    graph = _import_graph()
    scan = ast.parse((PACKAGE / "server" / "gc_scan.py").read_text())
    top_level = [node for node in scan.body if isinstance(node, ast.ImportFrom)]
    for module in ("bkctl.server.live_records", "bkctl.server.db_slots"):
        importers = {name for name, targets in graph.items() if module in targets}
        assert importers == {"bkctl.server.gc_scan"}, module
        assert all(node.module != module for node in top_level)


def test_cycle_finder() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert _cycles(graph) == [({"a", "b", "c"}, ["a", "b", "c", "a"]), ({"e", "f"}, ["e", "f", "e"])]
    assert _cycles({"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}) == [({"a", "b", "c"}, ["a", "b", "a"])]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# Modules allowed to write to stdout: the printer, and the scan child whose stdout is a pipe of frames
# to the bookie that started it.
STDOUT_MODULES = {"bkctl/commands/output.py", "bkctl/server/gc_scan.py"}
# Calls that only look at stdout (is it a terminal?).
STDOUT_READ_ONLY_CALLS = {"on_terminal"}


def stdout_writes(source: str) -> list[int]:
    """Lines that write to stdout however it is spelled: print() without file= or with file=sys.stdout,
    sys.stdout.write/writelines (also through .buffer, sys.__stdout__ or `from sys import stdout`),
    stdout or its buffer bound to a name or handed to another function, os.write(1, ...)."""
    tree = ast.parse(source)
    names = {"stdout"} if re.search(r"^\s*from sys import .*\bstdout\b", source, re.M) else set()
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_stdout(node.value, names):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        writes = isinstance(node, ast.Call) and _call_writes_stdout(node, names)
        if writes or (isinstance(node, ast.Assign) and _is_stdout(node.value, names)):
            lines.append(node.lineno)
    return sorted(set(lines))


def _is_stdout(node: ast.expr, names: set[str]) -> bool:
    """sys.stdout, sys.__stdout__, an alias of them, or their .buffer."""
    if isinstance(node, ast.Attribute) and node.attr == "buffer":
        node = node.value
    if isinstance(node, ast.Name):
        return node.id in names
    return (
        isinstance(node, ast.Attribute)
        and node.attr in {"stdout", "__stdout__"}
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _call_writes_stdout(node: ast.Call, names: set[str]) -> bool:
    func = node.func
    if isinstance(func, ast.Name) and func.id == "print":
        files = [k.value for k in node.keywords if k.arg == "file"]
        return not files or _is_stdout(files[0], names)
    if isinstance(func, ast.Attribute) and func.attr in {"write", "writelines"}:
        if _is_stdout(func.value, names):
            return True
        first = node.args[0] if node.args else None
        if isinstance(func.value, ast.Name) and func.value.id == "os" and isinstance(first, ast.Constant):
            return first.value == 1
    callee = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    handed = [*node.args, *(k.value for k in node.keywords)]
    return callee not in STDOUT_READ_ONLY_CALLS and any(_is_stdout(arg, names) for arg in handed)


def test_only_the_printer_writes_to_stdout() -> None:
    """Data reaches stdout through commands/output.py only; everything else writes to stderr."""
    offenders = []
    for path in _modules():
        rel = path.relative_to(REPO).as_posix()
        if rel not in STDOUT_MODULES:
            offenders += [f"{rel}:{line}" for line in stdout_writes(path.read_text())]
    assert offenders == []


@pytest.mark.parametrize(
    "source",
    [
        "print('x')\n",
        "import sys\nprint('x', file=sys.stdout)\n",
        "import sys\nsys.stdout.write('x')\n",
        "import sys\nsys.stdout.buffer.write(b'x')\n",
        "import sys\nsys.stdout.writelines(['x'])\n",
        "import sys\nsys.__stdout__.write('x')\n",
        "from sys import stdout\nstdout.write('x')\n",
        "import sys\nout = sys.stdout.buffer\nout.write(b'x')\n",
        "import sys, json\njson.dump({}, sys.stdout)\n",
        "import os\nos.write(1, b'x')\n",
    ],
)
def test_the_stdout_rule_catches_each_form(source: str) -> None:
    assert stdout_writes(source), source


def test_the_stdout_rule_lets_stderr_and_terminal_checks_pass() -> None:
    source = (
        "import sys, os\nprint('x', file=sys.stderr)\nsys.stderr.write('x')\n"
        "on_terminal(sys.stdout)\nos.dup2(2, sys.stdout.fileno())\nos.write(2, b'x')\n"
    )
    assert stdout_writes(source) == []


# Module-level numeric constants whose name says they bound something (a time, a size, a count of
# tries) live in limits.py. One that belongs where it is carries the marker comment on its line or
# the line above: "# local bound" (a bound of this module's own logic, no operator would tune it) or
# "# format fact" (a fact of a file or wire format, such as Java's int range).
BOUND_NAME = re.compile(
    r"_(S|MS|US|BYTES|MAX|LIMIT|TIMEOUT|DEADLINE|ATTEMPTS|RETRIES|INTERVAL)$|(^|_)(LIMIT|TIMEOUT)(_|$)"
)
BOUND_MARKER = re.compile(r"#\s*(local bound|format fact)\b")


def unmarked_bounds(source: str) -> list[str]:
    """Names of the module-level bound constants of `source` without the marker."""
    lines = source.splitlines()
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not (isinstance(target, ast.Name) and re.fullmatch(r"_?[A-Z][A-Z0-9_]*", target.id)):
            continue
        alias = isinstance(value, ast.Name | ast.Attribute) or "limits." in ast.unparse(value)
        if not BOUND_NAME.search(target.id) or not _numeric(value) or alias:
            continue  # not a bound, or another name for one defined elsewhere
        near = lines[max(node.lineno - 2, 0) : (node.end_lineno or node.lineno)]
        if not any(BOUND_MARKER.search(line) for line in near):
            found.append(target.id)
    return found


def _numeric(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _numeric(node.left) and _numeric(node.right)
    if isinstance(node, ast.UnaryOp):
        return _numeric(node.operand)
    return isinstance(node, ast.Name | ast.Attribute) and (getattr(node, "id", None) or node.attr).isupper()


def test_bounds_live_in_limits() -> None:
    offenders = []
    for path in _modules():
        if path != PACKAGE / "limits.py":
            offenders += [f"{path.relative_to(REPO)}: {name}" for name in unmarked_bounds(path.read_text())]
    assert offenders == [], "move these to bkctl/limits.py, or mark them (see BOUND_MARKER)"


def test_the_bounds_rule_catches_and_lets_pass() -> None:
    assert unmarked_bounds("RETRY_S = 0.5\nX_MAX: Final = 1 << 20\nREAD_TIMEOUT = 3\nB_BYTES = 4 * K\n") == [
        "RETRY_S",
        "X_MAX",
        "READ_TIMEOUT",
        "B_BYTES",
    ]
    marked = "RETRY_S = 0.5  # local bound\n# format fact: Java's int\nINT_MAX = 2**31 - 1\n"
    others = "A_MAX = limits.B_MAX\nC_MAX = wire.C_MAX\nNAME_S = 's'\nHEADER_SIZE = 8\n"
    assert unmarked_bounds(marked + others) == []


# The pre-commit hook refuses a file over 1 MiB (Java's journal samples are exactly 1 MiB).
TRACKED_FILE_SIZE_MAX = 1024 * 1024  # local bound


def test_no_tracked_file_exceeds_1_mib() -> None:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    sizes = {name: (REPO / name).stat().st_size for name in listed.decode().split("\0") if name}
    big = {name: size for name, size in sizes.items() if size > TRACKED_FILE_SIZE_MAX}
    assert big == {}


# Comments, docs and benchmarks/RESULTS.md speak of code by date and commit. A numbered working session,
# a numbered helper or a tracker's issue or item means nothing to a reader of the repository. The
# patterns are exact so that ZooKeeper's sessions ("session timeout 10 s", "sessions of 2-20 s") and
# code words ("helpers.py", "issue the next add") stay fine.
_UNITS = r"(?:\s*(?:-\s*\d+\s*)?(?:s|ms|sec|seconds?|min|minutes?)\b)"
UNFOLLOWABLE = re.compile(
    r"\bsessions?\s+\d+\b(?!" + _UNITS + r")(?![.,]\d)"
    r"|\bhelpers?[-_ ]?\d+\b"
    r"|\bagents?[-_ ]\d+\b"
    r"|\bissues?\s+#?\d+\b"
    r"|\bworking sessions?\b",
    re.I,
)


def unfollowable_references(text: str) -> list[str]:
    return [match.group() for match in UNFOLLOWABLE.finditer(text)]


def test_no_reference_to_sessions_helpers_or_tracker_items() -> None:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    found = []
    for name in sorted(listed.decode().split("\0")):
        path = REPO / name
        if not name or name == "tests/test_tidy.py" or not path.is_file() or path.stat().st_size > 2**20:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary: a golden file
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{name}:{number}: {ref}" for ref in unfollowable_references(line)]
    assert found == [], "say the date and the commit instead:\n" + "\n".join(found)


def test_the_reference_rule_catches_and_lets_pass() -> None:
    caught = ["session 13", "Session 12's", "helper-8", "helper 3", "Issue 19 item 3", "issue #15", "agent-2"]
    for text in caught:
        assert unfollowable_references(f"as {text} measured"), text
    fine = [
        "a ZooKeeper session 10 s long",
        "ZooKeeper (session 10 s)",
        "sessions of 2-20 s",
        "session timeout 4000 ms",
        "tests/server/helpers.py",
        "each acknowledged add issues the next one",
        "2026-11-27, 0f6e285",
    ]
    for text in fine:
        assert unfollowable_references(text) == [], text
