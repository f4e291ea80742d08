"""Imports go one way: down the module table of docs/design.md, with no cycle anywhere.

Every import counts, also one inside a function (a lazy import is still a dependency) and one
under ``TYPE_CHECKING``. Each row of the table is a layer, top first; a module may import its own
row (inside a subpackage: ``triton/``, ``dask/``, ``helion/``) or a row below, never one above.
A module missing from the table, or a row naming nothing, fails too: the table stays complete.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "precompile_executor"
DESIGN = ROOT / "docs" / "design.md"


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name → file, for every module of the package."""
    modules: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, source: str, known: Iterable[str]) -> set[str]:
    """The package modules that module ``name`` (whose code is ``source``) imports."""
    known = set(known)
    is_package = name not in known or any(k.startswith(name + ".") for k in known)
    here = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    found.discard(name)
    return found


def declared_layers(text: str) -> list[list[str]]:
    """The first cell of each row of the "## Modules" table: the names of one layer, top first
    (``_scheduling.py``, ``triton/``, ``__init__.py``)."""
    section = text.split("\n## Modules", 1)[1].split("\n## ", 1)[0]
    layers = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        layers.append(re.findall(r"`([^`]+)`", first))
    return layers


def layer_index(modules: Iterable[str], layers: list[list[str]]) -> dict[str, int]:
    """Each module's row; raises AssertionError for a module in no row or in two, or a row
    entry that names no module."""
    index: dict[str, int] = {}
    used: set[str] = set()
    for module in modules:
        rel = module.removeprefix(PACKAGE).lstrip(".").split(".")
        rows = []
        for i, names in enumerate(layers):
            for entry in names:
                if entry.endswith("/"):
                    hit = rel[0] == entry.rstrip("/")
                elif entry == "__init__.py":
                    hit = rel == [""]
                else:
                    hit = len(rel) == 1 and rel[0] == entry.removesuffix(".py")
                if hit:
                    rows.append(i)
                    used.add(entry)
        assert rows, f"{module} is missing from the module table of docs/design.md"
        assert len(rows) == 1, f"{module} is in more than one row of docs/design.md's table"
        index[module] = rows[0]
    unused = [e for names in layers for e in names if e not in used]
    assert not unused, f"docs/design.md's module table names modules that do not exist: {unused}"
    return index


def upward_imports(graph: Mapping[str, set[str]], index: Mapping[str, int]) -> list[str]:
    """Imports of a row above the importer's (or of its own row across packages)."""
    bad = []
    for module, targets in graph.items():
        for target in targets:
            if index[target] < index[module]:
                bad.append(f"{module} imports {target}, listed above it")
    return sorted(bad)


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import cycle (``[a, b, a]``), or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def _graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {m: imported_modules(m, p.read_text(), modules) for m, p in modules.items()}


def test_no_import_cycle_in_the_package() -> None:
    assert find_cycle(_graph()) is None


def test_imports_go_down_the_module_table_of_the_design_doc() -> None:
    graph = _graph()
    index = layer_index(graph, declared_layers(DESIGN.read_text()))
    assert upward_imports(graph, index) == []


SHARED_LAYER = ("_base", "_batch", "_cluster_executor", "_cluster_state")
LOCAL_BACKEND = ("_executor", "_scheduling", "_processes")


def test_the_layer_every_backend_shares_imports_nothing_of_the_local_backend() -> None:
    # A cluster backend's caller never loads the local scheduler or the hub; the public layer
    # depends on contracts (Backend), not on one backend (docs/design.md, "A backend").
    graph = _graph()
    reached: set[str] = set()
    todo = [f"{PACKAGE}.{m}" for m in SHARED_LAYER]
    while todo:
        module = todo.pop()
        for target in graph.get(module, ()):
            if target not in reached and target != PACKAGE:  # the surface re-exports all
                reached.add(target)
                todo.append(target)
    local = {f"{PACKAGE}.{m}" for m in LOCAL_BACKEND}
    assert reached & local == set()


@pytest.mark.parametrize(
    ("package", "needs"),
    [("precompile_executor.dask", "distributed"), ("precompile_executor.ray", "ray")],
)
def test_a_cluster_backend_imports_neither_torch_nor_triton(package: str, needs: str) -> None:
    # What each package's docstring promises: a dask scheduler or a Ray node that imports the
    # backend loads no GPU stack (seconds and memory in processes that never compile).
    pytest.importorskip(needs)
    code = f"import sys, {package}; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_the_checks_catch_a_cycle_an_upward_import_and_a_missing_row() -> None:
    known = {f"{PACKAGE}._a", f"{PACKAGE}._b", f"{PACKAGE}.sub", f"{PACKAGE}.sub._c"}
    # Relative imports resolve as Python does: a module's level 1 is its package.
    lazy = "def f():\n    from ._b import x\n"
    assert imported_modules(f"{PACKAGE}._a", lazy, known) == {f"{PACKAGE}._b"}
    from_package = "from .. import _a\nfrom . import name_in_init\n"
    assert imported_modules(f"{PACKAGE}.sub._c", from_package, known) == {
        f"{PACKAGE}._a",
        f"{PACKAGE}.sub",
    }
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    table = "\n## Modules\n\n| module | job |\n|---|---|\n| `_a.py` | top |\n| `_b.py` | below |\n"
    layers = declared_layers(table)
    assert layers == [["_a.py"], ["_b.py"]]
    index = layer_index([f"{PACKAGE}._a", f"{PACKAGE}._b"], layers)
    up = {f"{PACKAGE}._b": {f"{PACKAGE}._a"}, f"{PACKAGE}._a": set()}
    assert upward_imports(up, index) == [f"{PACKAGE}._b imports {PACKAGE}._a, listed above it"]
    with pytest.raises(AssertionError, match="missing from the module table"):
        layer_index([f"{PACKAGE}._a", f"{PACKAGE}._new"], layers)
