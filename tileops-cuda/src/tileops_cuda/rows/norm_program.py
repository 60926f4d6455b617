"""The LayerNorm and RMSNorm programs: one TileLang prim_func per plan (kernels.py declares
which rows each layout serves). Every kernel computes in float32 and reads each element once
from global memory, except stream_row, which reads it twice (statistics, then the output).

LayerNorm's statistics are shifted sums where the row streams or is gathered in one pass: each
lane sums x - own, its own first element, so an outlier cancels against that lane's few values
only (one shift for the whole row, x[0] = 1000 among unit values, lost 0.5% of a 64K row's
variance), and the lanes' means merge relative to the row's first element, `shift`, so rows far
from zero keep their mean's low bits. The row's head is read as a vector into registers of its
own, and `own` comes from the lane's first load (a scalar read of X beside vector reads of it
made TileLang 0.1.15's StorageRewrite fail for some lengths, n = 32768, 49152, ... in float32).

The kernel's phases are macros that take the caller's variables by reference (`tiles.macro`):
an assignment to one stores into the caller's variable, which ruff's F841 cannot see.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .._common.arith import DTYPE_NAMES
from .plans import RowPlan


class NormShape:
    """The static facts of one norm program: the call's sizes and dtypes, the plan's lanes, and
    which statistics it takes (`shifted`: LayerNorm's one shifted pass)."""

    def __init__(self, kind: str, plan: RowPlan, call: Any, has_weight: bool, has_bias: bool):
        import tilelang.language as T

        self.kind, self.plan, self.has_weight, self.has_bias = kind, plan, has_weight, has_bias
        self.n, self.eps, self.dtype = call.n, call.eps, DTYPE_NAMES[call.dtype]
        # float32 weights under mixed precision
        self.pdtype = DTYPE_NAMES[call.param_dtype or call.dtype]
        self.lanes, self.vec = plan.lanes, plan.vec
        self.exact = plan.padded == call.n  # no lane's vector runs past the row's end
        self.cluster, self.size = plan.cluster, plan.slice
        # Streamed LayerNorm rows take their statistics in one shifted pass, except odd rows
        # (vec 1): for some lengths TileLang 0.1.15's StorageRewrite rejects that program, so
        # they read the row once more (mean, then variance, then output) instead.
        self.shifted = kind == "layer" and (plan.hold == "none" or plan.one_pass) and plan.vec > 1
        self.first_vector = dataclasses.replace(plan, hold="none")  # reads X, whatever the hold
        self.m = T.dynamic("m")


def norm_program(kind: str, plan: RowPlan, call: Any, has_weight: bool, has_bias: bool) -> Any:
    """The prim_func normalizing rows of `call.n` elements (kind "layer" or "rms") with `plan`.

    The row count is symbolic: one compiled kernel serves every row count. With a cluster
    (cluster_row), block `part` of a row holds elements [part * slice, (part + 1) * slice) and
    the blocks' statistics meet in S[row, part] across a cluster barrier (with RowPlan.dsmem in
    every block's shared memory instead). Its tensors: X, the parameters given (W and B, or P
    where only one is), the workspace S of global partials, Y.
    """
    shape = NormShape(kind, plan, call, has_weight, has_bias)
    rows, vector = (shape.m, shape.n), (shape.n,)
    params = [name for name, given in (("W", has_weight), ("B", has_bias)) if given]
    params = ["P"] if len(params) == 1 else params
    tensors = {"X": rows, **dict.fromkeys(params, vector)}
    dtypes = dict.fromkeys(params, shape.pdtype)
    if plan.global_partials:
        tensors["S"], dtypes["S"] = (shape.m, plan.cluster, 2), "float32"
    return row_prim_func(_norm_body(shape), shape.dtype, dtypes, **tensors, Y=rows)


def row_prim_func(body: Any, dtype: str, dtypes: dict[str, str], **tensors: tuple) -> Any:
    """The prim_func of body(X, W, B, S, Y) over the row family's tensors that `tensors` names
    (the others None): a lone parameter P fills both W and B (the program reads the one given)."""
    from .._common import tiles

    def main(X, W=None, B=None, P=None, S=None, Y=None):
        body(X, W if P is None else P, B if P is None else P, S, Y)

    return tiles.prim_func(main, dtype, dtypes, **tensors)


def _norm_body(s: NormShape) -> Any:
    """The kernel: the first walk over the row, the statistics, the output walk."""
    import tilelang.language as T

    from .._common import tiles

    plan, lanes, m, n, size, cluster = s.plan, s.lanes, s.m, s.n, s.size, s.cluster
    first_walk, statistics, output_walk = _first_walk(s), _statistics(s), _output_walk(s)

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
            store = tiles.row_store(plan, s.dtype)
            tiles.bulk_load(X, store, plan, row, base)
            scratch = T.alloc_shared((2, tiles.warps(plan)), "float32")
            t = T.alloc_local((s.vec,), "float32")
            s1 = T.alloc_var("float32", init=0.0)
            s2 = T.alloc_var("float32", init=0.0)
            shift = T.alloc_var("float32", init=0.0)  # the row's first element (module doc)
            own = T.alloc_var("float32", init=0.0)  # the lane's first element
            counted = T.alloc_var("float32", init=0.0)  # elements this lane summed
            first_walk(X, store, t, s1, s2, shift, own, counted, row, lane, base)
            mean = T.alloc_var("float32", init=0.0)
            var = T.alloc_var("float32", init=0.0)
            statistics(X, S, P, store, scratch, t, s1, s2, shift, own, counted, mean, var,
                       row, lane, part, base, held, at)  # fmt: skip
            rstd = T.rsqrt(var + s.eps)
            output_walk(X, W, B, Y, store, t, mean, rstd, row, lane, base)

    return body


def _first_walk(s: NormShape) -> Any:
    """The walk that loads the row (into its `store`) and sums it: squares (RMSNorm), or
    LayerNorm's shifted sums of x and x^2 (`s1`, `s2`, each lane's `counted` and `own`)."""
    import tilelang.language as T

    from .._common import tiles

    plan, lanes, vec, m, n, exact, shifted = s.plan, s.lanes, s.vec, s.m, s.n, s.exact, s.shifted

    @tiles.macro("s1", "s2", "shift", "own", "counted")
    def first_walk(X, store, t, s1, s2, shift, own, counted, row, lane, base):
        if shifted and row < m:
            head = T.alloc_local((vec,), "float32")
            tiles.reload(X, store, s.first_vector, row, 0, 0, head)
            shift = head[0]  # noqa: F841
        for k in tiles.chunk_loop(plan):
            if row < m and (exact or base + (k * lanes + lane) * vec < n):
                tiles.load(X, store, plan, row, lane, k, t, base)
                if shifted and k == 0:
                    own = t[0]
                counted += vec
                for v in T.unroll(vec):
                    if s.kind == "rms":
                        s1 += t[v] * t[v]
                    else:
                        s1 += t[v] - own
                        s2 += (t[v] - own) * (t[v] - own)

    return first_walk


def _statistics(s: NormShape) -> Any:
    """The row's `mean` and `var` from the first walk's sums: the block's reduction, merged
    over the cluster's slices where the row has several (RMSNorm: only `var`, the mean square)."""
    import tilelang.language as T

    from .._common import tiles

    plan, cluster, n = s.plan, s.cluster, s.n
    layer_moments = _layer_moments(s)

    def slice_values(part):
        return T.Cast("float32", T.min(T.max(n - part * s.size, 0), s.size))

    @tiles.macro("s1", "s2", "shift", "own", "counted", "mean", "var")
    def statistics(X, S, P, store, scratch, t, s1, s2, shift, own, counted, mean, var,
                   row, lane, part, base, held, at):  # fmt: skip
        if s.kind == "rms" and cluster > 1:
            squares = tiles.reduce_group(s1, "sum", plan, scratch, 0, lane)
            tiles.publish_partials(plan, S, P, row, part, squares, 0.0)
            var = tiles.merged_mean(S, at, cluster, n)  # the slices' sums of squares
        elif s.kind == "rms":
            var = tiles.reduce_group(s1, "sum", plan, scratch, 0, lane) / n
        else:  # the block's (sum, M2) of its slice
            total = T.alloc_var("float32", init=0.0)
            spread = T.alloc_var("float32", init=0.0)
            layer_moments(X, store, scratch, t, s1, s2, shift, own, counted, mean, total,
                          spread, row, lane, base, held)  # fmt: skip
            var = spread / n
            if cluster > 1:  # Chan's merge of the slices' (count, mean, M2)
                tiles.publish_partials(plan, S, P, row, part, total, spread)
                mean = tiles.merged_mean(S, at, cluster, n)
                var = tiles.merged_var(S, at, cluster, n, mean, slice_values)  # noqa: F841
            mean = shift + mean  # shifted sums' mean is relative to the row's first element

    return statistics


def _layer_moments(s: NormShape) -> Any:
    """LayerNorm: the block's `total` and `spread` (sum and M2) of its slice, and its `mean`:
    Chan's merge of the lanes' shifted sums, or the mean, then a walk of squared deviations."""
    import tilelang.language as T

    from .._common import tiles

    plan, lanes, vec, m, n, exact = s.plan, s.lanes, s.vec, s.m, s.n, s.exact

    @tiles.macro("s1", "s2", "shift", "own", "counted", "mean", "total", "spread")
    def layer_moments(X, store, scratch, t, s1, s2, shift, own, counted, mean, total, spread,
                      row, lane, base, held):  # fmt: skip
        if s.shifted:  # Chan's merge of the lanes' (count, mean - shift, M2)
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
            spread = tiles.reduce_group(s2, "sum", plan, scratch, 1, lane)  # noqa: F841

    return layer_moments


def _output_walk(s: NormShape) -> Any:
    """The walk that writes y = (x - mean) * rstd, times W and plus B where given."""
    import tilelang.language as T

    from .._common import tiles

    plan, lanes, vec, m, n, exact = s.plan, s.lanes, s.vec, s.m, s.n, s.exact
    has_weight, has_bias = s.has_weight, s.has_bias

    @tiles.macro("mean")
    def output_walk(X, W, B, Y, store, t, mean, rstd, row, lane, base):
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

    return output_walk
