"""Each class short enough to hold in one's head, each module readable in one sitting: no class
over :data:`CLASS_LINES` lines and no module over :data:`MODULE_LINES` in the package
(CPython's ``concurrent/futures/process.py`` has a largest class of 297 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(__file__).resolve().parent.parent / "precompile_executor"

CLASS_LINES = 400
MODULE_LINES = 600


def too_long(root: Path = PACKAGE) -> set[str]:
    """``module`` or ``module:Class`` for each module or class over its limit."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        source = path.read_text()
        if len(source.splitlines()) > MODULE_LINES:
            found.add(name)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                if node.end_lineno - node.lineno + 1 > CLASS_LINES:
                    found.add(f"{name}:{node.name}")
    return found


def test_no_class_or_module_over_its_limit() -> None:
    assert too_long() == set()


def test_the_measure_sees_a_long_class_and_a_long_module(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(CLASS_LINES))
    (tmp_path / "big.py").write_text(f"class Big:\n{body}\n" + "\n" * MODULE_LINES)
    (tmp_path / "small.py").write_text("class Small:\n    pass\n")
    assert too_long(tmp_path) == {"big.py", "big.py:Big"}
