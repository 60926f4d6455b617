"""The softmax program: one TileLang prim_func per plan (kernels.py declares which rows each
layout serves). All compute in float32 with the row maximum subtracted. Rows of -inf behave as
torch.softmax's: a row holding only -inf gives NaN (exp(-inf - (-inf))); -inf entries of other
rows give 0; a +inf or NaN entry makes its row NaN.
"""

from __future__ import annotations

from typing import Any

import torch

from .._common.arith import DTYPE_NAMES
from .norm_program import row_prim_func
from .plans import RowPlan


class SoftmaxShape:
    """The static facts of one softmax program: the call's sizes, the plan's lanes, and how the
    exponentials are taken (`online`, `scaled`, `fold`)."""

    def __init__(self, plan: RowPlan, call: Any) -> None:
        import tilelang.language as T

        self.plan, self.n, self.dtype = plan, call.n, DTYPE_NAMES[call.dtype]
        self.lanes, self.vec = plan.lanes, plan.vec
        self.exact = plan.padded == call.n
        self.cluster, self.size = plan.cluster, plan.slice
        # Streamed rows take max and sum in one pass, rescaling the sum as the max grows (a
        # second read of X costs more than the rescales); held rows take the max, then the sum.
        self.online = plan.hold == "none"
        # RowPlan.scaled_exp: exponents in log2 units from one rounded max, so the rounding
        # cancels in y = e / sum; a 16-bit output also folds the sum into its exponent (a
        # multiply less; that rounding, under 2^-17 of the value for logits within 1000, is far
        # below its ulp).
        self.scaled = plan.scaled_exp and not self.online
        self.fold = self.scaled and call.dtype != torch.float32
        self.m = T.dynamic("m")


def softmax_program(plan: RowPlan, call: Any) -> Any:
    """The prim_func of softmax over rows of `call.n` elements with `plan`; rows symbolic.
    With a cluster, each block's (max, sum of exp(x - max)) over its slice meets the others'
    in S[row, part] across a cluster barrier (with RowPlan.dsmem in every block's shared
    memory instead). Its tensors: X, the workspace S of global partials, Y."""
    shape = SoftmaxShape(plan, call)
    rows = (shape.m, shape.n)
    tensors, dtypes = {"X": rows}, {}
    if plan.global_partials:
        tensors["S"], dtypes["S"] = (shape.m, plan.cluster, 2), "float32"
    return row_prim_func(_softmax_body(shape), shape.dtype, dtypes, **tensors, Y=rows)


def _softmax_body(s: SoftmaxShape) -> Any:
    """The kernel (W and B: the row family's parameters, absent here): the row's max and sum
    of exponentials, merged over the cluster's slices, then the output walk. Its phases take
    the caller's variables by reference (`tiles.macro`)."""
    import tilelang.language as T

    from .._common import tiles

    plan, lanes, m, size, cluster = s.plan, s.lanes, s.m, s.size, s.cluster
    first_walk, sum_walk = _first_walk(s), _sum_walk(s)
    merge_slices, output_walk = _merge_slices(s), _output_walk(s)

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
            store = tiles.row_store(plan, s.dtype)
            tiles.bulk_load(X, store, plan, row, base)
            scratch = T.alloc_shared((2, tiles.warps(plan)), "float32")
            t = T.alloc_local((s.vec,), "float32")
            top = T.alloc_var("float32", init=tiles.NEG_INF)
            total = T.alloc_var("float32", init=0.0)
            first_walk(X, store, t, top, total, row, lane, base)
            row_max = tiles.reduce_group(top, "max", plan, scratch, 0, lane)
            sum_walk(X, store, t, top, total, row_max, row, lane, base)
            peak = T.alloc_var("float32", init=tiles.NEG_INF)  # the max the output subtracts
            scale = T.alloc_var("float32", init=0.0)
            peak = row_max
            scale = tiles.reduce_group(total, "sum", plan, scratch, 1, lane)
            merge_slices(S, P, peak, scale, row, part, at)
            output_walk(X, Y, store, t, peak, scale, row, lane, base)

    return body


def _first_walk(s: SoftmaxShape) -> Any:
    """The walk that loads the row: this lane's max `top`, and (online) its `total` of
    exponentials, rescaled as the max grows."""
    import tilelang.language as T

    from .._common import tiles

    plan, lanes, vec, m, n, exact, online = s.plan, s.lanes, s.vec, s.m, s.n, s.exact, s.online

    @tiles.macro("top", "total")
    def first_walk(X, store, t, top, total, row, lane, base):
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

    return first_walk


def _sum_walk(s: SoftmaxShape) -> Any:
    """This lane's `total` of exponentials from the row's max: the online sum rescaled once,
    or a walk over the held row."""
    import tilelang.language as T

    from .._common import tiles

    plan, lanes, vec, m, n, exact, scaled = s.plan, s.lanes, s.vec, s.m, s.n, s.exact, s.scaled

    @tiles.macro("top", "total")
    def sum_walk(X, store, t, top, total, row_max, row, lane, base):
        if s.online:
            total = total * tiles.exp_gap(top, row_max)  # noqa: F841
        else:
            # A slice of only -inf adds 0 to its cluster's sum (exp2(-inf - 0)), not NaN;
            # a whole row of them still gives NaN without a cluster, as torch.
            top = row_max
            if s.cluster > 1 and row_max == tiles.NEG_INF:
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

    return sum_walk


def _merge_slices(s: SoftmaxShape) -> Any:
    """With a cluster: the row's `peak` and `scale` from the slices' (max, sum), each sum
    rescaled to the row's max (by the rounded maxima the sums subtracted, when scaled)."""
    import tilelang.language as T

    from .._common import tiles

    plan, cluster, scaled, ninf = s.plan, s.cluster, s.scaled, tiles.NEG_INF

    @tiles.macro("peak", "scale")
    def merge_slices(S, P, peak, scale, row, part, at):
        if cluster > 1:
            tiles.publish_partials(plan, S, P, row, part, peak, scale)
            peak = S[at, 0, 0]
            for p in T.unroll(1, cluster):
                peak = T.max(peak, S[at, p, 0])
            scale = 0.0
            for p in T.unroll(cluster):
                if not scaled:
                    scale += S[at, p, 1] * tiles.exp_gap(S[at, p, 0], peak)
                elif S[at, p, 0] != ninf:
                    gap = tiles.in_log2_units(S[at, p, 0]) - tiles.in_log2_units(peak)
                    scale += S[at, p, 1] * T.exp2(gap)

    return merge_slices


def _output_walk(s: SoftmaxShape) -> Any:
    """The walk that writes y = exp(x - peak) / scale (scaled: from the max in log2 units, a
    16-bit output with the sum folded into the exponent)."""
    import tilelang.language as T

    from .._common import tiles

    plan, lanes, vec, m, n, exact = s.plan, s.lanes, s.vec, s.m, s.n, s.exact
    scaled, fold = s.scaled, s.fold

    @tiles.macro("peak", "scale")
    def output_walk(X, Y, store, t, peak, scale, row, lane, base):
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

    return output_walk
