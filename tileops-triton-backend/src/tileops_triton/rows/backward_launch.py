"""Launch rule and launchers of the row-wise backward programs (`backward_programs`).

Every constant here is provisional, chosen by analogy with the forward's measured plans
(plans.py) and not yet measured for the backward: TUNING.md#backward says what to sweep.
Launchers take contiguous (rows, n) tensors; the kernel classes (backward_kernels) flatten the
caller's tensors to them and shape the gradients back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..compile import cdiv, next_pow2
from ..launching import launch

BACKWARD_FUSED_MAX = 16384  # rows held whole in registers (x and dy both): provisional
BACKWARD_TILE = 2048  # short rows packed this many elements to a fused tile: provisional
BACKWARD_CHUNK = 4096  # looped rows' slice: provisional
BACKWARD_LOOP_WARPS = 16  # provisional
PROGRAMS_PER_SM = {True: 4, False: 1}  # fused, looped norms' persistent grid: provisional
HOST_SMS = 4  # under the interpreter (no multiprocessors): a few programs, partials exercised
SUM_BLOCK_P, SUM_BLOCK_N = 32, 64  # the partials' reduction tile


@dataclass(frozen=True)
class BackwardPlan:
    """`fused`: tiles of `rows` whole rows of `block` columns; else `block`-wide slices of one
    row at a time. `programs`: the norms' persistent grid (at most this many)."""

    fused: bool
    block: int
    rows: int
    warps: int
    programs: int


def backward_plan(n: int, sm_count: int) -> BackwardPlan:
    """The launch shape of a backward over rows of length n (n >= 1)."""
    block = next_pow2(n)
    fused = block <= BACKWARD_FUSED_MAX
    programs = max(sm_count, 0) or HOST_SMS
    if not fused:
        looped_programs = programs * PROGRAMS_PER_SM[False]
        return BackwardPlan(False, BACKWARD_CHUNK, 1, BACKWARD_LOOP_WARPS, looped_programs)
    warps = min(max(block // 512, 4), 16)
    rows = max(BACKWARD_TILE // block, 1)
    return BackwardPlan(True, block, rows, warps, programs * PROGRAMS_PER_SM[True])


def norm_backward(
    plan: BackwardPlan,
    x: torch.Tensor,
    dy: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    center: bool,
    wanted: tuple[bool, bool, bool],
    param_dtype: torch.dtype,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dweight, dbias) of LayerNorm (`center`) or RMSNorm over the (rows, n) `x`, each
    computed only where `wanted` says; the parameter gradients in `param_dtype`."""
    from . import backward_programs as programs

    rows, n = x.shape
    need_dx, need_dw, need_db = wanted
    dx = torch.empty_like(x) if need_dx else None
    tiles = cdiv(rows, plan.rows)
    grid = max(min(tiles, plan.programs), 1)
    make = torch.empty if plan.fused else torch.zeros  # looped programs add into theirs
    parts = [make((grid, n), dtype=torch.float32, device=x.device) if need else None
             for need in (need_dw, need_db)]  # fmt: skip
    if rows:
        anything = x
        args = (x, dy, _or(weight, anything), _or(dx, anything), _or(parts[0], anything),
                _or(parts[1], anything), rows, n, eps)  # fmt: skip
        flags = {"CENTER": center, "HAS_W": weight is not None, "NEED_DX": need_dx,
                 "NEED_DW": need_dw, "NEED_DB": need_db}  # fmt: skip
        if plan.fused:
            launch(programs.norm_backward_fused, (grid,),
                *args, ROWS=plan.rows, BLOCK=plan.block, **flags, num_warps=plan.warps
            )  # fmt: skip
        else:
            launch(programs.norm_backward_looped, (grid,),
                *args, CHUNK=plan.block, **flags, num_warps=plan.warps
            )  # fmt: skip
    sums = [None if p is None else _column_sums(p, rows, param_dtype) for p in parts]
    return dx, sums[0], sums[1]


def _column_sums(parts: torch.Tensor, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """The partial rows added in a fixed order (zeros when there were no rows)."""
    from . import backward_programs as programs

    count, n = parts.shape
    out = torch.empty(n, dtype=dtype, device=parts.device)
    if not rows:
        return out.zero_()
    launch(programs.column_sums, (cdiv(n, SUM_BLOCK_N),),
        parts, out, count, n, BLOCK_P=SUM_BLOCK_P, BLOCK_N=SUM_BLOCK_N
    )  # fmt: skip
    return out


def softmax_backward(plan: BackwardPlan, y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx of softmax over the (rows, n) `y` (the forward's output) and `dy`."""
    from . import backward_programs as programs

    rows, n = y.shape
    dx = torch.empty_like(y)
    if not rows:
        return dx
    if plan.fused:
        launch(programs.softmax_backward_fused, (cdiv(rows, plan.rows),),
            y, dy, dx, rows, n, ROWS=plan.rows, BLOCK=plan.block, num_warps=plan.warps
        )  # fmt: skip
    else:
        launch(programs.softmax_backward_looped, (rows,), y, dy, dx, n, CHUNK=plan.block,
               num_warps=plan.warps)  # fmt: skip
    return dx


def _or(t: torch.Tensor | None, fallback: torch.Tensor) -> torch.Tensor:
    return fallback if t is None else t
