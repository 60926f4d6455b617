"""First-party CUDA kernels for tileops, written in TileLang.

Importing this module registers its kernels; it must not import tilelang (compile lazily).
"""

from __future__ import annotations

from importlib.metadata import version as _version

from tileops.backend import hookimpl

TILEOPS_PROTOCOL = 1


@hookimpl
def tileops_backend_info() -> dict:
    return {"name": "tileops-cuda", "version": _version("tileops-cuda"), "devices": ["cuda"]}
