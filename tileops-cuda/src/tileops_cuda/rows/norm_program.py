"""The LayerNorm and RMSNorm programs: one TileLang prim_func per plan (kernels.py declares
which rows each layout serves). Every kernel computes in float32 and reads each element once
from global memory, except stream_row, which reads it twice (statistics, then the output).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._common.arith import DTYPE_NAMES
from .plans import RowPlan


def norm_program(kind: str, plan: RowPlan, call: Any, has_weight: bool, has_bias: bool) -> Any:
    """The prim_func normalizing rows of `call.n` elements (kind "layer" or "rms") with `plan`.

    The row count is symbolic: one compiled kernel serves every row count. With a cluster
    (cluster_row), block `part` of a row holds elements [part * slice, (part + 1) * slice) and
    the blocks' statistics meet in S[row, part] across a cluster barrier (with RowPlan.dsmem in
    every block's shared memory instead).
    """
    import tilelang.language as T

    from .._common import tiles

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
    from .._common import tiles

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
