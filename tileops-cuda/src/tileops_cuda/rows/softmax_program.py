"""The softmax program: one TileLang prim_func per plan (kernels.py declares which rows each
layout serves). All compute in float32 with the row maximum subtracted. Rows of -inf behave as
torch.softmax's: a row holding only -inf gives NaN (exp(-inf - (-inf))); -inf entries of other
rows give 0; a +inf or NaN entry makes its row NaN.
"""

from __future__ import annotations

from typing import Any

import torch

from .._common.arith import DTYPE_NAMES
from .plans import RowPlan


def softmax_program(plan: RowPlan, call: Any) -> Any:
    """The prim_func of softmax over rows of `call.n` elements with `plan`; rows symbolic.
    With a cluster, each block's (max, sum of exp(x - max)) over its slice meets the others'
    in S[row, part] across a cluster barrier (with RowPlan.dsmem in every block's shared
    memory instead)."""
    import tilelang.language as T

    from .._common import tiles

    n, dtype = call.n, DTYPE_NAMES[call.dtype]
    lanes, vec = plan.lanes, plan.vec
    exact = plan.padded == n
    cluster, size = plan.cluster, plan.slice
    # Streamed rows take max and sum in one pass, rescaling the sum as the max grows (a
    # second read of X costs more than the rescales); held rows take the max, then the sum.
    online = plan.hold == "none"
    # RowPlan.scaled_exp: exponents in log2 units from one rounded max, so the rounding cancels
    # in y = e / sum; a 16-bit output also folds the sum into its exponent (a multiply less;
    # that rounding, under 2^-17 of the value for logits within 1000, is far below its ulp).
    scaled = plan.scaled_exp and not online
    fold = scaled and call.dtype != torch.float32
    ninf = tiles.NEG_INF
    m = T.dynamic("m")

    @T.macro
    def body(X, S, Y):
        with tiles.launch(plan, m) as bx:
            T.annotate_min_blocks_per_sm(plan.blocks_per_sm)
            P = tiles.cluster_partials(cluster) if plan.dsmem else None
            tx = T.get_thread_binding()
            lane = tx % lanes
            row = (bx // cluster) * plan.rows + tx // lanes
            part = bx % cluster
            S, at = tiles.partials_at(plan, S, P, row)  # S[at]: the cluster's partials
            base = part * size  # where this block's slice starts (0 without a cluster)
            store = tiles.row_store(plan, dtype)
            tiles.bulk_load(X, store, plan, row, base)
            scratch = T.alloc_shared((2, tiles.warps(plan)), "float32")
            t = T.alloc_local((vec,), "float32")
            top = T.alloc_var("float32", init=ninf)
            total = T.alloc_var("float32", init=0.0)
            for k in tiles.chunk_loop(plan):
                if row < m and (exact or base + (k * lanes + lane) * vec < n):
                    tiles.load(X, store, plan, row, lane, k, t, base)
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
                # A slice of only -inf adds 0 to its cluster's sum (exp2(-inf - 0)), not NaN;
                # a whole row of them still gives NaN without a cluster, as torch.
                top = row_max
                if cluster > 1 and row_max == ninf:
                    top = 0.0
                scaled_top = tiles.in_log2_units(top) if scaled else None
                for k in tiles.chunk_loop(plan):
                    if row < m and (exact or base + (k * lanes + lane) * vec < n):
                        tiles.reload(X, store, plan, row, lane, k, t, base)
                        for v in T.unroll(vec):
                            if scaled:
                                total += tiles.exp_below(t[v], scaled_top)
                            else:
                                total += tiles.exp_from(t[v], top)
            peak = T.alloc_var("float32", init=ninf)  # the max the output subtracts
            scale = T.alloc_var("float32", init=0.0)
            peak = row_max
            scale = tiles.reduce_group(total, "sum", plan, scratch, 1, lane)
            if cluster > 1:  # the slices' sums, each rescaled to the row's max
                tiles.publish_partials(plan, S, P, row, part, peak, scale)
                peak = S[at, 0, 0]
                for p in T.unroll(1, cluster):
                    peak = T.max(peak, S[at, p, 0])
                scale = 0.0
                for p in T.unroll(cluster):
                    if not scaled:
                        scale += S[at, p, 1] * tiles.exp_gap(S[at, p, 0], peak)
                    elif S[at, p, 0] != ninf:  # by the rounded maxima the sums subtracted
                        gap = tiles.in_log2_units(S[at, p, 0]) - tiles.in_log2_units(peak)
                        scale += S[at, p, 1] * T.exp2(gap)
            scaled_peak = tiles.in_log2_units(peak) if scaled else None
            if fold:
                scaled_peak = scaled_peak + T.log2(scale)
            scale = 1.0 / scale
            for k in tiles.chunk_loop(plan):
                col = base + (k * lanes + lane) * vec
                if row < m and (exact or col < n):
                    tiles.reload(X, store, plan, row, lane, k, t, base)
                    if scaled:  # in place first: an extern call keeps a loop from vectorizing
                        for v in T.unroll(vec):
                            t[v] = tiles.exp_below(t[v], scaled_peak)
                            if not fold:
                                t[v] = t[v] * scale
                        for v in T.vectorized(vec):
                            Y[row, col + v] = t[v]
                    else:
                        for v in T.vectorized(vec):
                            Y[row, col + v] = tiles.exp_from(t[v], peak) * scale

    rows = (m, n)
    if plan.global_partials:

        def main(X, S, Y):
            body(X, S, Y)

        return tiles.prim_func(main, dtype, {"S": "float32"}, X=rows, S=(m, cluster, 2), Y=rows)

    def main(X, Y):
        body(X, None, Y)

    return tiles.prim_func(main, dtype, X=rows, Y=rows)
