"""The commit a benchmark result is stamped with."""

from __future__ import annotations

import os
import subprocess


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
