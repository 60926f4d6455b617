"""LayerNorm and RMSNorm forward kernels in TileLang: one class per row layout (see rows.py).

Declarations first (which rows each class serves), program factories below. Every kernel
computes in float32 and reads each element once from global memory, except stream_row, which
reads it twice (once for the statistics, once for the output).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from tileops.ops import LayerNormInterface, RMSNormInterface

from .operands import aligned
from .rows import (
    CLUSTER_THREADS,
    DTYPE_NAMES,
    ITEMSIZE,
    BlockRow,
    ClusterRow,
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
        x, params = aligned(x), [aligned(t) for t in (weight, bias) if t is not None]
        y = torch.empty_like(x)
        self.compiled(x, *params, *self.workspace(x), y)
        return y


class LayerNormWarpRows(WarpRows, _LayerNorm):
    """Short rows: a group of <= 32 lanes per row, several rows per block, row in registers."""


class LayerNormBlockRow(BlockRow, _LayerNorm):
    """Medium rows: one block per row, the row in its threads' registers."""


class LayerNormSmemRow(SmemRow, _LayerNorm):
    """Long rows that fit the block's shared memory: read once, kept there for the output."""


class LayerNormStreamRow(StreamRow, _LayerNorm):
    """Any long row: statistics in one streaming pass (shifted sums), then the output pass."""


class LayerNormClusterRow(ClusterRow, _LayerNorm):
    """Long rows on sm_90: a slice per block of a cluster, (sum, M2) of the slices merged."""

    # Statistics while the slice loads: 2-4 points of copy over a second pass through shared
    # memory at 64K-256K elements, bf16 and float32 (row_plans_cluster_row, 2026-11-29).
    cluster_one_pass = True
    cluster_bulk = True  # rows.BULK_ROW_BYTES

    @classmethod
    def cluster_threads(cls, dtype: torch.dtype) -> int:
        # 16-bit rows: 256 threads beat 512 by about 8 points of copy bandwidth at 64K-256K
        # elements on the H200 (results/norms/row_plans_cluster_row_nvidia_h200.md); float32: even.
        return 256 if ITEMSIZE[dtype] == 2 else CLUSTER_THREADS


# -- RMSNorm ---------------------------------------------------------------------------------


class _RMSNorm(RowKernel, RMSNormInterface):
    @classmethod
    def build_fields(cls, call: Any) -> tuple:
        return (call.eps, call.has_weight, call.param_dtype)

    @classmethod
    def program(cls, plan: RowPlan, call: Any) -> Any:
        return lambda: norm_program("rms", plan, call, call.has_weight, False)

    def forward(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        x, params = aligned(x), [] if weight is None else [aligned(weight)]
        y = torch.empty_like(x)
        self.compiled(x, *params, *self.workspace(x), y)
        return y


class RMSNormWarpRows(WarpRows, _RMSNorm):
    """Short rows: a group of <= 32 lanes per row, several rows per block, row in registers."""


class RMSNormBlockRow(BlockRow, _RMSNorm):
    """Medium rows: one block per row, the row in its threads' registers."""

    # float32 rows of 8K and 16K: 1024 threads reached 97.6 / 98.2 and 96.6 / 96.4% of copy
    # against 95.8 / 95.9 (256 threads) and 96.1 / 96.1 (512) in two sweeps (2026-11-29 and -30,
    # row_plans_block_row_float32 and row_plans_stream_row_block_row_triton); LayerNorm's and
    # softmax's rows did not gain.
    full_block_32bit = (4096, 16384)


class RMSNormSmemRow(SmemRow, _RMSNorm):
    """Long rows that fit the block's shared memory: read once, kept there for the output."""

    smem_bulk = True  # rows.SMALL_SMEM_ROW_BYTES


class RMSNormStreamRow(StreamRow, _RMSNorm):
    """Any long row: sum of squares in one streaming pass, then the output pass."""


class RMSNormClusterRow(ClusterRow, _RMSNorm):
    """Long rows on sm_90: a slice per block of a cluster, the slices' sums of squares added."""

    # smem_row's lone block per SM still reached 91-93% of copy at 64K bfloat16 (128 KB)
    # against 88% here (norms_nvidia_h200.md and row_plans_smem_row_triton, 2026-11-29).
    smem_row_over_cluster_bytes = 128 * 1024
    cluster_bulk = True  # rows.BULK_ROW_BYTES


# -- TileLang programs -----------------------------------------------------------------------


def norm_program(kind: str, plan: RowPlan, call: Any, has_weight: bool, has_bias: bool) -> Any:
    """The prim_func normalizing rows of `call.n` elements (kind "layer" or "rms") with `plan`.

    The row count is symbolic: one compiled kernel serves every row count. With a cluster
    (cluster_row), block `part` of a row holds elements [part * slice, (part + 1) * slice) and
    the blocks' statistics meet in S[row, part] across a cluster barrier (with RowPlan.dsmem in
    every block's shared memory instead).
    """
    import tilelang.language as T

    from . import tiles

    n, eps, dtype = call.n, call.eps, DTYPE_NAMES[call.dtype]
    pdtype = DTYPE_NAMES[call.param_dtype or call.dtype]  # float32 weights under mixed precision
    lanes, vec = plan.lanes, plan.vec
    exact = plan.padded == n  # no lane's vector runs past the row's end
    cluster, size = plan.cluster, plan.slice
    # Streamed LayerNorm rows take their statistics in one shifted pass, except odd rows
    # (vec 1): for some lengths TileLang 0.1.15's StorageRewrite rejects that program, so they
    # read the row once more (mean, then variance, then output) instead.
    shifted = kind == "layer" and (plan.hold == "none" or plan.one_pass) and plan.vec > 1
    first_vector = dataclasses.replace(plan, hold="none")  # reads X itself, whatever the hold
    m = T.dynamic("m")

    def slice_values(part):
        return T.Cast("float32", T.min(T.max(n - part * size, 0), size))

    @T.macro
    def body(X, W, B, S, Y):
        with tiles.launch(plan, m) as bx:
            T.annotate_min_blocks_per_sm(plan.blocks_per_sm)
            P = tiles.cluster_partials(cluster) if plan.dsmem else None
            tx = T.get_thread_binding()
            lane = tx % lanes
            row = (bx // cluster) * plan.rows + tx // lanes
            part = bx % cluster
            S, at = tiles.partials_at(plan, S, P, row)  # S[at]: the cluster's partials
            base = part * size  # where this block's slice starts (0 without a cluster)
            held = T.min(T.max(n - base, 0), size)  # elements of the row in this block
            store = tiles.row_store(plan, dtype)
            tiles.bulk_load(X, store, plan, row, base)
            scratch = T.alloc_shared((2, tiles.warps(plan)), "float32")
            t = T.alloc_local((vec,), "float32")
            s1 = T.alloc_var("float32", init=0.0)
            s2 = T.alloc_var("float32", init=0.0)
            # Shifted sums keep E[x^2] - E[x]^2 from cancelling: each lane sums x - own, its
            # own first element, so an outlier cancels against that lane's few values only (one
            # shift for the whole row, x[0] = 1000 among unit values lost 0.5% of a 64K row's
            # variance); the lanes' means merge relative to the row's first element, `shift`,
            # so rows far from zero keep their mean's low bits. The row's head is read as a
            # vector into its own registers (a scalar read of X beside vector reads of it makes
            # TileLang 0.1.15's StorageRewrite fail for some lengths, n = 32768, 49152, ... in
            # float32), and `own` comes from the lane's first load: no extra read ahead of the
            # loop's loads.
            shift = T.alloc_var("float32", init=0.0)
            own = T.alloc_var("float32", init=0.0)
            counted = T.alloc_var("float32", init=0.0)  # elements this lane summed
            if shifted and row < m:
                head = T.alloc_local((vec,), "float32")
                tiles.reload(X, store, first_vector, row, 0, 0, head)
                shift = head[0]
            for k in tiles.chunk_loop(plan):
                if row < m and (exact or base + (k * lanes + lane) * vec < n):
                    tiles.load(X, store, plan, row, lane, k, t, base)
                    if shifted and k == 0:
                        own = t[0]
                    counted += vec
                    for v in T.unroll(vec):
                        if kind == "rms":
                            s1 += t[v] * t[v]
                        else:
                            s1 += t[v] - own
                            s2 += (t[v] - own) * (t[v] - own)
            mean = T.alloc_var("float32", init=0.0)
            var = T.alloc_var("float32", init=0.0)
            if kind == "rms" and cluster > 1:
                squares = tiles.reduce_group(s1, "sum", plan, scratch, 0, lane)
                tiles.publish_partials(plan, S, P, row, part, squares, 0.0)
                var = tiles.merged_mean(S, at, cluster, n)  # the slices' sums of squares
            elif kind == "rms":
                var = tiles.reduce_group(s1, "sum", plan, scratch, 0, lane) / n
            else:  # the block's (sum, M2) of its slice
                total = T.alloc_var("float32", init=0.0)
                spread = T.alloc_var("float32", init=0.0)
                if shifted:  # Chan's merge of the lanes' (count, mean - shift, M2)
                    lane_count = T.max(counted, 1.0)
                    offset = own - shift
                    total = tiles.reduce_group(counted * offset + s1, "sum", plan, scratch, 0, lane)
                    mean = total / T.Cast("float32", T.max(held, 1))
                    lane_gap = offset + s1 / lane_count - mean
                    lane_m2 = s2 - s1 * s1 / lane_count + counted * lane_gap * lane_gap
                    spread = tiles.reduce_group(lane_m2, "sum", plan, scratch, 1, lane)
                else:  # the mean, then squared deviations from it
                    total = tiles.reduce_group(s1, "sum", plan, scratch, 0, lane)
                    mean = total / T.Cast("float32", T.max(held, 1))
                    s2 = 0.0
                    for k in tiles.chunk_loop(plan):
                        if row < m and (exact or base + (k * lanes + lane) * vec < n):
                            tiles.reload(X, store, plan, row, lane, k, t, base)
                            for v in T.unroll(vec):
                                s2 += (t[v] - mean) * (t[v] - mean)
                    spread = tiles.reduce_group(s2, "sum", plan, scratch, 1, lane)
                var = spread / n
                if cluster > 1:  # Chan's merge of the slices' (count, mean, M2)
                    tiles.publish_partials(plan, S, P, row, part, total, spread)
                    mean = tiles.merged_mean(S, at, cluster, n)
                    var = tiles.merged_var(S, at, cluster, n, mean, slice_values)
                mean = shift + mean  # shifted sums' mean is relative to the row's first element
            rstd = T.rsqrt(var + eps)
            for k in tiles.chunk_loop(plan):
                col = base + (k * lanes + lane) * vec
                if row < m and (exact or col < n):
                    tiles.reload(X, store, plan, row, lane, k, t, base)
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
    if plan.global_partials:
        return _cluster_norm_func(body, dtype, pdtype, rows, vector, (m, cluster, 2), has_weight,
                                  has_bias)  # fmt: skip
    if has_weight and has_bias:

        def main(X, W, B, Y):
            body(X, W, B, None, Y)

        return tiles.prim_func(
            main, dtype, {"W": pdtype, "B": pdtype}, X=rows, W=vector, B=vector, Y=rows
        )
    if has_weight or has_bias:

        def main(X, P, Y):
            body(X, P, P, None, Y)

        return tiles.prim_func(main, dtype, {"P": pdtype}, X=rows, P=vector, Y=rows)

    def main(X, Y):
        body(X, None, None, None, Y)

    return tiles.prim_func(main, dtype, X=rows, Y=rows)


def _cluster_norm_func(body, dtype, pdtype, rows, vector, work, has_weight, has_bias) -> Any:
    """norm_program's prim_func with the cluster's workspace S before Y."""
    from . import tiles

    f32 = {"S": "float32"}
    if has_weight and has_bias:

        def main(X, W, B, S, Y):
            body(X, W, B, S, Y)

        dtypes = {"W": pdtype, "B": pdtype, **f32}
        return tiles.prim_func(main, dtype, dtypes, X=rows, W=vector, B=vector, S=work, Y=rows)
    if has_weight or has_bias:

        def main(X, P, S, Y):
            body(X, P, P, S, Y)

        return tiles.prim_func(main, dtype, {"P": pdtype, **f32}, X=rows, P=vector, S=work, Y=rows)

    def main(X, S, Y):
        body(X, None, None, S, Y)

    return tiles.prim_func(main, dtype, f32, X=rows, S=work, Y=rows)
