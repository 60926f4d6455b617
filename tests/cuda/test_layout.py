"""The package's shape: no module of tileops_cuda over 500 lines, no function over 80 (nested
functions count toward the function that holds them), so that a family reads in a sitting."""

from __future__ import annotations

import ast
from pathlib import Path

import tileops_cuda

MODULE_LINES = 500
FUNCTION_LINES = 80
PACKAGE = Path(tileops_cuda.__file__).parent


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def function_lengths(path: Path) -> list[tuple[str, int]]:
    """(name:line, lines from the first decorator to the last line) of every function."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            found.append((f"{node.name}:{node.lineno}", node.end_lineno - start + 1))
    return found


def test_the_package_has_its_families():
    assert {p.parent.name for p in modules()} >= {"_common", "rows", "batch_norm", "gemm"}


def test_no_module_over_500_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MODULE_LINES
    }
    assert long == {}


def test_no_function_over_80_lines():
    long = {
        f"{p.relative_to(PACKAGE)}:{name}": n
        for p in modules()
        for name, n in function_lengths(p)
        if n > FUNCTION_LINES
    }
    assert long == {}
