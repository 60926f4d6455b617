"""`import tileops` on a plain install prints nothing: no warning, NumPy's included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).parents[2] / "tileops-core" / "pyproject.toml"


def test_import_prints_nothing_and_warns_nothing():
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", "import tileops"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""


@pytest.mark.skipif(not PYPROJECT.exists(), reason="runs from a source checkout")
def test_numpy_is_a_dependency_of_tileops_core():
    """torch warns on import when NumPy is missing: a plain install must bring it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() == "numpy" for d in dependencies)
