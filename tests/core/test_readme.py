"""The Python examples of the README and of docs/extending.md run as written."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
EXTENDING = ROOT / "docs" / "extending.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
EXTENDING_BLOCKS = re.findall(r"```python\n(.*?)```", EXTENDING.read_text(), flags=re.S)


def run_example(source: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("readme_example")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(source, str(path), "exec"), module.__dict__)


@pytest.mark.parametrize("source", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(source, tileops_registry, monkeypatch):
    run_example(source, README, monkeypatch)


@pytest.mark.parametrize(
    "source", EXTENDING_BLOCKS, ids=[f"block{i}" for i in range(len(EXTENDING_BLOCKS))]
)
def test_extending_example_runs(source, tileops_registry, monkeypatch):
    run_example(source, EXTENDING, monkeypatch)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2
