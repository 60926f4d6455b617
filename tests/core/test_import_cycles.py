"""No import cycle among the modules of tileops and its backends, a package and its own modules
included (the import contracts' acyclic check compares siblings only); imports inside
functions count, imports under TYPE_CHECKING do not."""

from __future__ import annotations

from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")  # comes with import-linter (nox's TEST_TOOLS)

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    ROOT / "tileops-core" / "src",
    ROOT / "tileops-cuda" / "src",
    ROOT / "tileops-triton-backend" / "src",
    ROOT / "examples" / "acme-backend" / "src",
]
PACKAGES = ("tileops", "tileops_cuda", "tileops_triton", "tileops_acme")


def cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for start in sorted(imports):
        if start in index:
            continue
        work = [(start, iter(sorted(imports[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            module, rest = work[-1]
            child = next(rest, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(imports[child]))))
                elif child in stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = stack[stack.index(module) :]
                del stack[stack.index(module) :]
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_package():
    imports = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p"}, "q": {"p"}}
    assert cycles(imports) == [["p", "p.a", "p.b"]]


def test_no_module_imports_itself_back(monkeypatch):
    for source in SOURCES:  # where grimp finds the packages it reads (it imports none)
        monkeypatch.syspath_prepend(str(source))
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert cycles(imports) == []
