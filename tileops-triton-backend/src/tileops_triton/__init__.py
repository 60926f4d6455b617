"""Triton kernels for tileops, and a triton target.

Importing this module registers its kernels; it must not import triton (compile lazily).
"""

from __future__ import annotations

from importlib.metadata import version as _version

from tileops.backend import hookimpl

TILEOPS_PROTOCOL = 1


@hookimpl
def tileops_backend_info() -> dict:
    return {
        "name": "tileops-triton-backend",
        "version": _version("tileops-triton-backend"),
        "devices": ["cuda"],
    }
