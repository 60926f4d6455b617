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
        # elements on the H200 (results/row_plans_cluster_row_nvidia_h200.md); float32: even.
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

    stacked = list(range(plan.stack))  # the block's rows, first + r (RowPlan.stack)

    def affine(value, weight, bias, i):
        """The normalized value through the op's weight and bias (their element i)."""
        if has_weight:
            value = value * weight[i]
        if has_bias:
            value = value + bias[i]
        return value

    @T.macro
    def body(X, W, B, S, Y):
        with tiles.launch(plan, m) as bx:
            T.annotate_min_blocks_per_sm(plan.blocks_per_sm)
            P = tiles.cluster_partials(cluster, plan.stack) if plan.dsmem else None
            tx = T.get_thread_binding()
            lane = tx % lanes
            first = ((bx // cluster) * plan.rows + tx // lanes) * plan.stack  # block's first row
            part = bx % cluster
            base = part * size  # where this block's slice starts (0 without a cluster)
            held = T.min(T.max(n - base, 0), size)  # elements of a row in this block
            store = tiles.row_store(plan, dtype)
            tiles.bulk_load(X, store, plan, first, base)
            scratch = T.alloc_shared((2 * plan.stack, tiles.warps(plan)), "float32")
            t = T.alloc_local((vec,), "float32")
            s1 = T.alloc_local((plan.stack,), "float32")
            s2 = T.alloc_local((plan.stack,), "float32")
            # Shifted sums keep E[x^2] - E[x]^2 from cancelling: each lane sums x - own, its
            # own first element, so an outlier cancels against that lane's few values only (one
            # shift for the whole row, x[0] = 1000 among unit values lost 0.5% of a 64K row's
            # variance); the lanes' means merge relative to the row's first element, `shift`,
            # so rows far from zero keep their mean's low bits. The row's head is read as a
            # vector into its own registers (a scalar read of X beside vector reads of it makes
            # TileLang 0.1.15's StorageRewrite fail for some lengths, n = 32768, 49152, ... in
            # float32), and `own` comes from the lane's first load: no extra read ahead of the
            # loop's loads.
            shift = T.alloc_local((plan.stack,), "float32")
            own = T.alloc_local((plan.stack,), "float32")
            for r in stacked:
                s1[r] = 0.0
                s2[r] = 0.0
                shift[r] = 0.0
                own[r] = 0.0
            counted = T.alloc_var("float32", init=0.0)  # elements this lane summed, per row
            if shifted:
                head = T.alloc_local((vec,), "float32")
                for r in stacked:
                    if first + r < m:
                        tiles.reload(X, store, first_vector, first + r, 0, 0, head)
                        shift[r] = head[0]
            for k in tiles.chunk_loop(plan):
                if exact or base + (k * lanes + lane) * vec < n:
                    counted += vec
                    for r in stacked:
                        if first + r < m:
                            tiles.load(X, store, plan, first + r, lane, k, t, base, r)
                            if shifted and k == 0:
                                own[r] = t[0]
                            for v in T.unroll(vec):
                                if kind == "rms":
                                    s1[r] += t[v] * t[v]
                                else:
                                    s1[r] += t[v] - own[r]
                                    s2[r] += (t[v] - own[r]) * (t[v] - own[r])
            # Per row: the block's sum of squares (rms), or its (sum, M2) of its slice.
            total = T.alloc_local((plan.stack,), "float32")
            spread = T.alloc_local((plan.stack,), "float32")
            mean = T.alloc_local((plan.stack,), "float32")
            rstd = T.alloc_local((plan.stack,), "float32")
            for r in stacked:
                total[r] = 0.0
                spread[r] = 0.0
                mean[r] = 0.0
                if kind == "rms":
                    total[r] = tiles.reduce_group(s1[r], "sum", plan, scratch, 2 * r, lane)
                elif shifted:  # Chan's merge of the lanes' (count, mean - shift, M2)
                    lane_count = T.max(counted, 1.0)
                    offset = own[r] - shift[r]
                    local_sum = counted * offset + s1[r]
                    total[r] = tiles.reduce_group(local_sum, "sum", plan, scratch, 2 * r, lane)
                    mean[r] = total[r] / T.Cast("float32", T.max(held, 1))
                    lane_gap = offset + s1[r] / lane_count - mean[r]
                    lane_m2 = s2[r] - s1[r] * s1[r] / lane_count + counted * lane_gap * lane_gap
                    spread[r] = tiles.reduce_group(lane_m2, "sum", plan, scratch, 2 * r + 1, lane)
                else:  # the mean, then squared deviations from it
                    total[r] = tiles.reduce_group(s1[r], "sum", plan, scratch, 2 * r, lane)
                    mean[r] = total[r] / T.Cast("float32", T.max(held, 1))
                    s2[r] = 0.0
                    for k in tiles.chunk_loop(plan):
                        if first + r < m and (exact or base + (k * lanes + lane) * vec < n):
                            tiles.reload(X, store, plan, first + r, lane, k, t, base, r)
                            for v in T.unroll(vec):
                                s2[r] += (t[v] - mean[r]) * (t[v] - mean[r])
                    spread[r] = tiles.reduce_group(s2[r], "sum", plan, scratch, 2 * r + 1, lane)
            if cluster > 1:
                pairs = [(total[r], spread[r]) for r in stacked]
                tiles.publish_partials(plan, S, P, first, part, pairs, m)
            for r in stacked:
                var = T.alloc_var("float32", init=0.0)
                if cluster > 1:
                    S, at = tiles.partials_at(plan, S, P, first, r)  # S[at]: row r's partials
                    if kind == "rms":
                        var = tiles.merged_mean(S, at, cluster, n)  # slices' sums of squares
                    else:  # Chan's merge of the slices' (count, mean, M2)
                        mean[r] = tiles.merged_mean(S, at, cluster, n)
                        var = tiles.merged_var(S, at, cluster, n, mean[r], slice_values)
                elif kind == "rms":
                    var = total[r] / n
                else:
                    var = spread[r] / n
                mean[r] = shift[r] + mean[r]  # shifted sums' mean is relative to the row's head
                rstd[r] = T.rsqrt(var + eps)
            # Stacked rows read each weight and bias vector once, into registers (a store to Y
            # could alias W, so the compiler would read it again for every row).
            kept = plan.stack > 1
            Wk = T.alloc_local((vec,), pdtype) if kept and has_weight else None
            Bk = T.alloc_local((vec,), pdtype) if kept and has_bias else None
            for k in tiles.chunk_loop(plan):
                col = base + (k * lanes + lane) * vec
                if exact or col < n:
                    if kept and has_weight:
                        for v in T.vectorized(vec):
                            Wk[v] = W[col + v]
                    if kept and has_bias:
                        for v in T.vectorized(vec):
                            Bk[v] = B[col + v]
                    for r in stacked:
                        if first + r < m:
                            tiles.reload(X, store, plan, first + r, lane, k, t, base, r)
                            for v in T.vectorized(vec):
                                centered = (t[v] - mean[r]) * rstd[r]
                                if kept:
                                    Y[first + r, col + v] = affine(centered, Wk, Bk, v)
                                else:
                                    Y[first + r, col + v] = affine(centered, W, B, col + v)

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
