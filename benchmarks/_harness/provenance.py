"""The commit a benchmark result is stamped with, and where the result is written."""

from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parents[1] / "results"


def results_dir(family: str) -> Path:
    """benchmarks/results/<family>: the default place of a script's result files."""
    return RESULTS / family


def git_commit() -> str:
    """GIT_COMMIT where set (the tree may travel to the GPU machine without .git, or with a stale
    one), else the checkout's short HEAD, else "unknown"."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def run_stamp(commit: str | None = None, **versions: Any) -> dict[str, Any]:
    """What a result file is stamped with: the GPU, today's date, the commit (`commit`, else
    git_commit()), torch's version and `versions` (other packages', run settings). A CPU
    smoke run is stamped with the device "cpu"."""
    return {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "date": datetime.date.today().isoformat(),
        "commit": commit or git_commit(),
        "torch": torch.__version__,
        **versions,
    }


def result_path(out: str | Path, prefix: str, device: str, suffix: str) -> Path:
    """`<out>/<prefix>_<device><suffix>` (the device name lower-cased, spaces as _), its folder
    made."""
    path = Path(out) / f"{prefix}_{device.replace(' ', '_').lower()}{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def write_markdown(out: str | Path, prefix: str, device: str, lines: list[str]) -> Path:
    """`lines` as `<out>/<prefix>_<device>.md`, echoed to stdout."""
    path = result_path(out, prefix, device, ".md")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return path
