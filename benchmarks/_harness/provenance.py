"""The commit a benchmark result is stamped with, and where the result is written."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


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


def write_markdown(out: str | Path, prefix: str, device: str, lines: list[str]) -> Path:
    """`lines` as `<out>/<prefix>_<device>.md` (the device name lower-cased, spaces as _),
    echoed to stdout."""
    path = Path(out) / f"{prefix}_{device.replace(' ', '_').lower()}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return path
