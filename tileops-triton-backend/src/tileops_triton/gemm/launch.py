"""The launcher of the GEMM program (imported on first launch: it imports triton)."""

from __future__ import annotations

import torch

from ..compile import cdiv
from ..declare import INTERPRETING
from ..launching import launch
from .configs import GemmConfig


def gemm(
    config: GemmConfig,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    trans_a: bool = False,
    trans_b: bool = False,
    upcast: bool = False,
) -> None:
    """Write op(a) @ op(b) (+ bias) into `out`: a contiguous (m, k), or (k, m) if `trans_a`;
    b (k, n), or (n, k) if `trans_b`; bias (n,) or None; out (m, n); one dtype."""
    from . import programs

    (m, n), k = out.shape, a.shape[0 if trans_a else 1]
    if k == 0:  # an empty sum: the bias, or zeros
        if bias is None:
            out.zero_()
        else:
            out.copy_(bias.expand_as(out))
        return
    c = config
    split = min(c.split_k, cdiv(k, c.block_k))
    target = out if split == 1 else out.new_empty((split, m, n), dtype=torch.float32)
    grid = (cdiv(m, c.block_m) * cdiv(n, c.block_n), split)
    upcast = upcast or (INTERPRETING and a.dtype == torch.bfloat16)
    precision = "ieee" if upcast or a.dtype == torch.float32 else "tf32"
    launch(programs.gemm, grid,
        a, b, target, bias, m, n, k, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
        GROUP_M=c.group_m, SPLIT_K=split, EVEN_K=k % (c.block_k * split) == 0, UPCAST=upcast,
        PRECISION=precision, TRANS_A=trans_a, TRANS_B=trans_b,
        HAS_BIAS=bias is not None and split == 1, num_stages=c.stages, num_warps=c.warps,
    )  # fmt: skip
    if split > 1:
        total = target.sum(dim=0)
        out.copy_(total if bias is None else total.add_(bias))  # one rounding, as unsplit
