"""Launchers of the row programs: each takes a plan, contiguous (rows, n) tensors and an output
buffer, so the kernel classes (which return a new tensor), the triton target (which writes the
op's output) and the plan sweeps share them. The programs are imported on first launch (they
import triton).
"""

from __future__ import annotations

import torch

from ..launching import launch
from .plans import RowPlan


def layer_norm(
    plan: RowPlan,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    out: torch.Tensor,
) -> None:
    """Write LayerNorm of the contiguous (rows, n) `x` into `out` of the same layout."""
    from . import norm_programs as programs

    rows, n = x.shape
    flags = {"HAS_W": weight is not None, "HAS_B": bias is not None}
    w, b = _or(weight, x), _or(bias, x)  # absent vectors: any pointer, never read
    if plan.held:
        launch(programs.layer_norm_held, (rows,),
            x, w, b, out, n, eps, BLOCK=plan.block, **flags, num_warps=plan.warps,
            maxnreg=plan.maxnreg,
        )  # fmt: skip
    elif plan.fused:
        launch(programs.layer_norm_fused, plan.grid(rows),
            x, w, b, out, rows, n, eps, ROWS=plan.rows, BLOCK=plan.block, **flags,
            num_warps=plan.warps,
        )  # fmt: skip
    else:
        launch(programs.layer_norm_looped, (rows,),
            x, w, b, out, n, eps, CHUNK=plan.block, **flags, num_warps=plan.warps
        )  # fmt: skip


def rms_norm(
    plan: RowPlan, x: torch.Tensor, weight: torch.Tensor | None, eps: float, out: torch.Tensor
) -> None:
    """Write RMSNorm of the contiguous (rows, n) `x` into `out` of the same layout."""
    from . import norm_programs as programs

    rows, n = x.shape
    w, has_w = _or(weight, x), weight is not None
    if plan.held:
        launch(programs.rms_norm_held, (rows,),
            x, w, out, n, eps, BLOCK=plan.block, HAS_W=has_w, num_warps=plan.warps,
            maxnreg=plan.maxnreg,
        )  # fmt: skip
    elif plan.fused:
        launch(programs.rms_norm_fused, plan.grid(rows),
            x, w, out, rows, n, eps, ROWS=plan.rows, BLOCK=plan.block, HAS_W=has_w,
            CACHED=plan.cached, num_warps=plan.warps,
        )  # fmt: skip
    else:
        launch(programs.rms_norm_looped, (rows,),
            x, w, out, n, eps, CHUNK=plan.block, HAS_W=has_w, num_warps=plan.warps
        )  # fmt: skip


def softmax(plan: RowPlan, x: torch.Tensor, out: torch.Tensor) -> None:
    """Write the softmax of each row of the contiguous (rows, n) `x` into `out`."""
    from . import softmax_programs as programs

    rows, n = x.shape
    if plan.held:
        vec = min(16 // x.element_size(), plan.block)  # a lane's 16-byte vector
        launch(programs.softmax_held, (rows,),
            x, out, n, BLOCK=plan.block, VEC=vec, num_warps=plan.warps, maxnreg=plan.maxnreg
        )  # fmt: skip
    elif plan.fused:
        launch(programs.softmax_fused, plan.grid(rows),
            x, out, rows, n, ROWS=plan.rows, BLOCK=plan.block, num_warps=plan.warps
        )  # fmt: skip
    else:
        launch(programs.softmax_looped, (rows,), x, out, n, CHUNK=plan.block, num_warps=plan.warps)


def _or(t: torch.Tensor | None, fallback: torch.Tensor) -> torch.Tensor:
    return fallback if t is None else t
