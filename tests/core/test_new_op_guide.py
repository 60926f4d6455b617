"""docs/new-op.md is a walkthrough: its Python blocks run as written, in order, in one module."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "new-op.md"
BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)


def test_the_new_op_guide_runs_end_to_end(tileops_registry, monkeypatch, capsys):
    assert len(BLOCKS) >= 6
    module = types.ModuleType("new_op_guide")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for index, block in enumerate(BLOCKS):
        exec(compile(block, f"{GUIDE}:block{index}", "exec"), module.__dict__)
    out = capsys.readouterr().out
    assert "guide::ScaledAddFwdOp.scaled_add" in out  # what explain printed
    assert "calls not served by it" in out and "[float16]" not in out.split("\n")[-2]
