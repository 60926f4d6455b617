"""GEMM: `GemmOp` (with an optional bias, NN by default) and upstream TileOPs' `GemmFwdOp`
(no bias, NT by default), importable from here as before and from `tileops.ops.gemm.gemm`,
upstream's module."""

from __future__ import annotations

from .gemm import (
    LAYOUTS,
    GemmBackward,
    GemmCall,
    GemmFwdOp,
    GemmInterface,
    GemmOp,
    GemmReference,
    gemm_gradient_calls,
)

__all__ = [
    "LAYOUTS",
    "GemmBackward",
    "GemmCall",
    "GemmFwdOp",
    "GemmInterface",
    "GemmOp",
    "GemmReference",
    "gemm_gradient_calls",
]
