"""Run acme's tests whether or not acme is installed (`pip install -e .` makes its entry point
load it; otherwise it is imported from ../src, which registers it all the same)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("tileops_acme") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
