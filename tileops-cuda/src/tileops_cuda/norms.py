"""LayerNorm and RMSNorm forward kernels in TileLang: one class per row layout (see rows.py).

Declarations first (which rows each class serves), program factories below. Every kernel
computes in float32 and reads each element once from global memory, except stream_row, which
reads it twice (once for the statistics, once for the output).
"""

from __future__ import annotations

from typing import Any

import torch

from tileops.ops import LayerNormInterface, RMSNormInterface

from .rows import (
    DTYPE_NAMES,
    BlockRow,
    RowKernel,
    RowPlan,
    SmemRow,
    StreamRow,
    WarpRows,
)

# -- LayerNorm -------------------------------------------------------------------------------


class _LayerNorm(RowKernel, LayerNormInterface):
    @classmethod
    def build_fields(cls, call: Any) -> tuple:
        return (call.eps, call.has_weight, call.has_bias, call.param_dtype)

    @classmethod
    def program(cls, plan: RowPlan, call: Any) -> Any:
        return lambda: norm_program("layer", plan, call, call.has_weight, call.has_bias)

    def forward(
        self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None
    ) -> torch.Tensor:
        y = torch.empty_like(x)
        self.compiled(x, *[t for t in (weight, bias) if t is not None], y)
        return y


class LayerNormWarpRows(WarpRows, _LayerNorm):
    """Short rows: a group of <= 32 lanes per row, several rows per block, row in registers."""


class LayerNormBlockRow(BlockRow, _LayerNorm):
    """Medium rows: one block per row, the row in its threads' registers."""


class LayerNormSmemRow(SmemRow, _LayerNorm):
    """Long rows that fit the block's shared memory: read once, kept there for the output."""


class LayerNormStreamRow(StreamRow, _LayerNorm):
    """Any long row: statistics in one streaming pass (shifted sums), then the output pass."""


# -- RMSNorm ---------------------------------------------------------------------------------


class _RMSNorm(RowKernel, RMSNormInterface):
    @classmethod
    def build_fields(cls, call: Any) -> tuple:
        return (call.eps, call.has_weight, call.param_dtype)

    @classmethod
    def program(cls, plan: RowPlan, call: Any) -> Any:
        return lambda: norm_program("rms", plan, call, call.has_weight, False)

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        y = torch.empty_like(x)
        if weight is None:
            self.compiled(x, y)
        else:
            self.compiled(x, weight, y)
        return y


class RMSNormWarpRows(WarpRows, _RMSNorm):
    """Short rows: a group of <= 32 lanes per row, several rows per block, row in registers."""


class RMSNormBlockRow(BlockRow, _RMSNorm):
    """Medium rows: one block per row, the row in its threads' registers."""


class RMSNormSmemRow(SmemRow, _RMSNorm):
    """Long rows that fit the block's shared memory: read once, kept there for the output."""


class RMSNormStreamRow(StreamRow, _RMSNorm):
    """Any long row: sum of squares in one streaming pass, then the output pass."""


# -- TileLang programs -----------------------------------------------------------------------


def norm_program(kind: str, plan: RowPlan, call: Any, has_weight: bool, has_bias: bool) -> Any:
    """The prim_func normalizing rows of `call.n` elements (kind "layer" or "rms") with `plan`.

    The row count is symbolic: one compiled kernel serves every row count.
    """
    import tilelang.language as T

    from . import tiles

    n, eps, dtype = call.n, call.eps, DTYPE_NAMES[call.dtype]
    pdtype = DTYPE_NAMES[call.param_dtype or call.dtype]  # float32 weights under mixed precision
    lanes, vec = plan.lanes, plan.vec
    exact = plan.padded == n  # no lane's vector runs past the row's end
    # Streamed LayerNorm rows take their statistics in one shifted pass, except odd rows
    # (vec 1): for some lengths TileLang 0.1.15's StorageRewrite rejects that program, so they
    # read the row once more (mean, then variance, then output) instead.
    streaming_layer = kind == "layer" and plan.hold == "none" and plan.vec > 1
    m = T.dynamic("m")

    @T.macro
    def body(X, W, B, Y):
        with T.Kernel(T.ceildiv(m, plan.rows), threads=plan.threads) as bx:
            T.annotate_min_blocks_per_sm(plan.blocks_per_sm)
            tx = T.get_thread_binding()
            lane = tx % lanes
            row = bx * plan.rows + tx // lanes
            store = tiles.row_store(plan, dtype)
            scratch = T.alloc_shared((2, tiles.warps(plan)), "float32")
            t = T.alloc_local((vec,), "float32")
            s1 = T.alloc_var("float32", init=0.0)
            s2 = T.alloc_var("float32", init=0.0)
            # Shifted sums keep E[x^2] - E[x]^2 from cancelling; one block per streamed row.
            # The shift is the row's first element, read as the first vector (every lane the
            # same one): a scalar read of X beside vector reads of it makes TileLang 0.1.15's
            # StorageRewrite fail for some lengths (n = 32768, 49152, ... in float32).
            shift = T.alloc_var("float32", init=0.0)
            if streaming_layer and row < m:
                tiles.reload(X, store, plan, row, 0, 0, t)
                shift = t[0]
            for k in tiles.chunk_loop(plan):
                if row < m and (exact or (k * lanes + lane) * vec < n):
                    tiles.load(X, store, plan, row, lane, k, t)
                    for v in T.unroll(vec):
                        if kind == "rms":
                            s1 += t[v] * t[v]
                        else:
                            s1 += t[v] - shift
                            s2 += (t[v] - shift) * (t[v] - shift)
            mean = T.alloc_var("float32", init=0.0)
            var = T.alloc_var("float32", init=0.0)
            if kind == "rms":
                var = tiles.reduce_group(s1, "sum", plan, scratch, 0, lane) / n
            elif streaming_layer:
                a = tiles.reduce_group(s1, "sum", plan, scratch, 0, lane) / n
                b = tiles.reduce_group(s2, "sum", plan, scratch, 1, lane) / n
                mean = shift + a
                var = T.max(b - a * a, 0.0)
            else:
                mean = tiles.reduce_group(s1, "sum", plan, scratch, 0, lane) / n
                s2 = 0.0
                for k in tiles.chunk_loop(plan):
                    if row < m and (exact or (k * lanes + lane) * vec < n):
                        tiles.reload(X, store, plan, row, lane, k, t)
                        for v in T.unroll(vec):
                            s2 += (t[v] - mean) * (t[v] - mean)
                var = tiles.reduce_group(s2, "sum", plan, scratch, 1, lane) / n
            rstd = T.rsqrt(var + eps)
            for k in tiles.chunk_loop(plan):
                col = (k * lanes + lane) * vec
                if row < m and (exact or col < n):
                    tiles.reload(X, store, plan, row, lane, k, t)
                    for v in T.vectorized(vec):
                        if has_weight and has_bias:
                            Y[row, col + v] = (t[v] - mean) * rstd * W[col + v] + B[col + v]
                        elif has_weight:
                            Y[row, col + v] = (t[v] - mean) * rstd * W[col + v]
                        elif has_bias:
                            Y[row, col + v] = (t[v] - mean) * rstd + B[col + v]
                        else:
                            Y[row, col + v] = (t[v] - mean) * rstd

    rows, vector = (m, n), (n,)
    if has_weight and has_bias:

        def main(X, W, B, Y):
            body(X, W, B, Y)

        return tiles.prim_func(
            main, dtype, {"W": pdtype, "B": pdtype}, X=rows, W=vector, B=vector, Y=rows
        )
    if has_weight or has_bias:

        def main(X, P, Y):
            body(X, P, P, Y)

        return tiles.prim_func(main, dtype, {"P": pdtype}, X=rows, P=vector, Y=rows)

    def main(X, Y):
        body(X, None, None, Y)

    return tiles.prim_func(main, dtype, X=rows, Y=rows)
