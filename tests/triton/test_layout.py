"""The backend's shape: modules and functions short enough to read whole, and every measurement
the code and its TUNING.md files cite present in the repository (a moved result file or a
renamed heading fails here, not in a reader's search)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tileops-triton-backend" / "src" / "tileops_triton"
RESULTS = ROOT / "benchmarks" / "results"
MODULE_LINES, FUNCTION_LINES = 500, 80
MODULES = sorted(PACKAGE.rglob("*.py"))
TUNING = sorted(PACKAGE.rglob("TUNING.md"))
RESULT_FILE = re.compile(r"[\w-]+_(?:nvidia_h200|cpu|cpu_dev|h200|h200_host)\.(?:md|txt|json|png)")
BENCHMARK_PATH = re.compile(r"benchmarks/[\w/.-]+\.(?:py|cu|md|txt|json|png)")


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


def long_functions(source: str, limit: int) -> list[str]:
    """`name (lines)` for every function or method of `source` longer than `limit` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append(f"{node.name} ({length})")
    return found


def test_the_checker_finds_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    assert long_functions(f"def f():\n{body}\n", FUNCTION_LINES) == ["f (81)"]
    assert long_functions("def g():\n    return 1\n", FUNCTION_LINES) == []


@pytest.mark.parametrize("module", MODULES, ids=_name)
def test_modules_and_functions_stay_short(module: Path) -> None:
    source = module.read_text()
    assert len(source.splitlines()) <= MODULE_LINES
    assert long_functions(source, FUNCTION_LINES) == []


def _anchor(heading: str) -> str:
    """The anchor a Markdown renderer gives `heading` (lower case, spaces as -, no punctuation)."""
    return re.sub(r"[^\w -]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(tuning: Path) -> set[str]:
    headings = [line for line in tuning.read_text().splitlines() if line.startswith("#")]
    return {_anchor(heading.lstrip("#")) for heading in headings}


@pytest.mark.parametrize("document", [*TUNING, *MODULES], ids=_name)
def test_tuning_anchors_cited_exist(document: Path) -> None:
    """Code cites `TUNING.md#anchor` of the TUNING.md beside it; a TUNING.md links its own."""
    text = document.read_text()
    cited = set(re.findall(r"TUNING\.md#([\w-]+)", text) + re.findall(r"\]\(#([\w-]+)\)", text))
    if cited:
        assert cited <= _anchors(document.parent / "TUNING.md")


def _existing_result_names() -> set[str]:
    return {path.name for path in RESULTS.rglob("*") if path.is_file()}


@pytest.mark.parametrize("document", [*TUNING, *MODULES], ids=_name)
def test_result_files_and_scripts_cited_exist(document: Path) -> None:
    text = document.read_text()
    missing = [name for name in RESULT_FILE.findall(text) if name not in _existing_result_names()]
    missing += [path for path in BENCHMARK_PATH.findall(text) if not (ROOT / path).exists()]
    assert missing == []
