"""Softmax forward kernels in TileLang: one class per row layout (see rows.py).

Declarations first, program factories below. All compute in float32 with the row maximum
subtracted. Rows of -inf behave as torch.softmax's: a row holding only -inf gives NaN
(exp(-inf - (-inf))); -inf entries of other rows give 0; a +inf or NaN entry makes its row NaN.
"""

from __future__ import annotations

from typing import Any

import torch

from tileops.ops import SoftmaxInterface

from .rows import (
    DTYPE_NAMES,
    BlockRow,
    RowKernel,
    RowPlan,
    SmemRow,
    StreamRow,
    WarpRows,
)


class _Softmax(RowKernel, SoftmaxInterface):
    @classmethod
    def program(cls, plan: RowPlan, call: Any) -> Any:
        return lambda: softmax_program(plan, call)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        self.compiled(x, y)
        return y


class SoftmaxWarpRows(WarpRows, _Softmax):
    """Short rows: a group of <= 32 lanes per row, several rows per block, row in registers."""


class SoftmaxBlockRow(BlockRow, _Softmax):
    """Medium rows: one block per row, the row (then its exponentials) in registers."""


class SoftmaxSmemRow(SmemRow, _Softmax):
    """Long rows that fit the block's shared memory: read once, kept there for the output."""


class SoftmaxStreamRow(StreamRow, _Softmax):
    """Any long row: running max and rescaled sum in one streaming pass, then the output."""


# -- TileLang programs -----------------------------------------------------------------------


def softmax_program(plan: RowPlan, call: Any) -> Any:
    """The prim_func of softmax over rows of `call.n` elements with `plan`; rows symbolic."""
    import tilelang.language as T

    from . import tiles

    n, dtype = call.n, DTYPE_NAMES[call.dtype]
    lanes, vec = plan.lanes, plan.vec
    exact = plan.padded == n
    online = plan.hold == "none"  # one pass for max and sum: rescale the sum as the max grows
    ninf = tiles.NEG_INF
    m = T.dynamic("m")

    @T.macro
    def body(X, Y):
        with T.Kernel(T.ceildiv(m, plan.rows), threads=plan.threads) as bx:
            T.annotate_min_blocks_per_sm(plan.blocks_per_sm)
            tx = T.get_thread_binding()
            lane = tx % lanes
            row = bx * plan.rows + tx // lanes
            store = tiles.row_store(plan, dtype)
            scratch = T.alloc_shared((2, tiles.warps(plan)), "float32")
            t = T.alloc_local((vec,), "float32")
            top = T.alloc_var("float32", init=ninf)
            total = T.alloc_var("float32", init=0.0)
            for k in tiles.chunk_loop(plan):
                if row < m and (exact or (k * lanes + lane) * vec < n):
                    tiles.load(X, store, plan, row, lane, k, t)
                    for v in T.unroll(vec):
                        if online:
                            grown = T.max(top, t[v])
                            total = total * tiles.exp_gap(top, grown) + tiles.exp_gap(t[v], grown)
                            top = grown
                        else:
                            top = T.max(top, t[v])
            row_max = tiles.reduce_group(top, "max", plan, scratch, 0, lane)
            if online:
                total = total * tiles.exp_gap(top, row_max)
            else:
                for k in tiles.chunk_loop(plan):
                    if row < m and (exact or (k * lanes + lane) * vec < n):
                        tiles.reload(X, store, plan, row, lane, k, t)
                        for v in T.unroll(vec):
                            total += tiles.exp_from(t[v], row_max)
            scale = 1.0 / tiles.reduce_group(total, "sum", plan, scratch, 1, lane)
            for k in tiles.chunk_loop(plan):
                col = (k * lanes + lane) * vec
                if row < m and (exact or col < n):
                    tiles.reload(X, store, plan, row, lane, k, t)
                    for v in T.vectorized(vec):
                        Y[row, col + v] = tiles.exp_from(t[v], row_max) * scale

    rows = (m, n)

    def main(X, Y):
        body(X, Y)

    return tiles.prim_func(main, dtype, X=rows, Y=rows)
