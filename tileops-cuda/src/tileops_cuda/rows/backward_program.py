"""The row-wise backward programs (LayerNorm, RMSNorm, softmax): one TileLang prim_func per
plan, the row held in its block's registers as float32 (backward_kernels.py declares which
rows fit). Each reads x (or y) and dy once and writes dx once.

Norms: a persistent grid of `programs` blocks, block b taking rows b, b + programs, ...; the
row statistics are recomputed from the held x (the forward keeps none: TUNING.md#backward),
and each lane adds dy * xhat (and dy) of its columns over the block's rows in registers, stored
once per block into the (programs, n) float32 partials the kernel class then sums in a fixed
order. Softmax: one block per row, dx = y * (dy - sum(y * dy)).

Each reduction of a row takes a scratch slot of its own, and the block synchronises before the
next row reuses them (tiles.reduce_group reads its slot after one barrier only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._common.arith import DTYPE_NAMES, WARP


@dataclass(frozen=True)
class BackwardPlan:
    """`lanes` threads over one row, `chunks` vectors of `vec` elements per lane; `programs`:
    the norms' persistent grid."""

    lanes: int
    vec: int
    chunks: int
    programs: int = 1

    @property
    def padded(self) -> int:
        return self.lanes * self.vec * self.chunks

    @property
    def values(self) -> int:
        """Elements of the row one lane holds."""
        return self.vec * self.chunks


@dataclass(frozen=True)
class NormBackwardShape:
    """The static facts of one norm backward program."""

    kind: str  # "layer" or "rms"
    plan: BackwardPlan
    n: int
    eps: float
    has_w: bool
    wanted: tuple  # (dx, dweight, dbias)

    @property
    def exact(self) -> bool:
        return self.plan.padded == self.n

    def column(self, lane: Any, k: int, v: int) -> Any:
        return (k * self.plan.lanes + lane) * self.plan.vec + v


def norm_backward_program(kind: str, plan: BackwardPlan, call: Any, wanted: tuple) -> Any:
    """The prim_func of LayerNorm's (kind "layer") or RMSNorm's ("rms") backward over rows of
    `call.n`; `wanted`: (dx, dweight, dbias), dweight/dbias only where the param is given.
    Tensors: X, DY, W (when a weight is given), DX (when wanted), DWP / DBP partials."""
    import tilelang.language as T

    from .._common import tiles

    s = NormBackwardShape(kind, plan, call.n, call.eps, call.dtypes[1] is not None, wanted)
    m, n = T.dynamic("m"), call.n
    shapes, dtypes = {"X": (m, n), "DY": (m, n)}, {}
    if s.has_w:
        shapes["W"], dtypes["W"] = (n,), DTYPE_NAMES[call.param_dtype]
    if wanted[0]:
        shapes["DX"] = (m, n)
    for name, need in (("DWP", wanted[1]), ("DBP", wanted[2])):
        if need:
            shapes[name], dtypes[name] = (plan.programs, n), "float32"
    body = _norm_body(s, m)

    def main(X, DY, W=None, DX=None, DWP=None, DBP=None):
        body(X, DY, W, DX, DWP, DBP)

    return tiles.prim_func(main, DTYPE_NAMES[call.dtype], dtypes, **shapes)


def _norm_body(s: NormBackwardShape, m: Any) -> Any:
    """The persistent block: each of its rows through `_norm_row`, then its partials stored."""
    import tilelang.language as T

    plan, values = s.plan, s.plan.values
    row_step, store_partials = _norm_row(s), _store_partials(s)

    @T.macro
    def body(X, DY, W, DX, DWP, DBP):
        with T.Kernel(plan.programs, threads=plan.lanes) as bx:
            lane = T.get_thread_binding()
            scratch = T.alloc_shared((4, max(plan.lanes // WARP, 1)), "float32")
            x = T.alloc_local((values,), "float32")
            g = T.alloc_local((values,), "float32")
            dw = T.alloc_local((values,), "float32")
            db = T.alloc_local((values,), "float32")
            for i in T.unroll(values):
                dw[i] = 0.0
                db[i] = 0.0
            for step in T.serial(T.ceildiv(T.max(m - bx, 0), plan.programs)):
                row_step(X, DY, W, DX, bx + step * plan.programs, lane, scratch, x, g, dw, db)
                T.sync_threads()  # the next row's reductions reuse the scratch slots
            store_partials(DWP, DBP, bx, lane, dw, db)

    return body


def _norm_row(s: NormBackwardShape) -> Any:
    """One row: x and dy into registers, the statistics, the partials, dx."""
    import tilelang.language as T

    from .._common import tiles

    plan, lanes = s.plan, _Lanes(s.plan.lanes)
    chunks, vec, values, n = plan.chunks, plan.vec, plan.values, s.n
    need_dx, need_dw, need_db = s.wanted

    def masked(col, value):
        return _masked(s.exact, n, col, value)

    @T.macro
    def row_step(X, DY, W, DX, row, lane, scratch, x, g, dw, db):
        s1 = T.alloc_var("float32", init=0.0)
        for k in T.unroll(chunks):
            for v in T.unroll(vec):
                col = s.column(lane, k, v)
                x[k * vec + v] = masked(col, X[row, col])
                g[k * vec + v] = masked(col, DY[row, col])
                s1 += x[k * vec + v]
        if s.kind == "layer":
            mean = tiles.reduce_group(s1, "sum", lanes, scratch, 0, lane) / n
            for k in T.unroll(chunks):
                for v in T.unroll(vec):
                    x[k * vec + v] = masked(s.column(lane, k, v), x[k * vec + v] - mean)
        s2 = T.alloc_var("float32", init=0.0)
        for i in T.unroll(values):
            s2 += x[i] * x[i]
        rstd = T.rsqrt(tiles.reduce_group(s2, "sum", lanes, scratch, 1, lane) / n + s.eps)
        s3 = T.alloc_var("float32", init=0.0)
        s4 = T.alloc_var("float32", init=0.0)
        for k in T.unroll(chunks):
            for v in T.unroll(vec):
                i = k * vec + v
                x[i] = x[i] * rstd  # xhat
                if need_dw:
                    dw[i] += g[i] * x[i]
                if need_db:
                    db[i] += g[i]
                if s.has_w:
                    g[i] = g[i] * masked(s.column(lane, k, v), W[s.column(lane, k, v)])
                s3 += g[i] * x[i]
                s4 += g[i]
        if need_dx:
            c1 = tiles.reduce_group(s3, "sum", lanes, scratch, 2, lane) / n
            c2 = 0.0
            if s.kind == "layer":
                c2 = tiles.reduce_group(s4, "sum", lanes, scratch, 3, lane) / n
            for k in T.unroll(chunks):
                for v in T.unroll(vec):
                    col = s.column(lane, k, v)
                    if s.exact or col < n:
                        DX[row, col] = (g[k * vec + v] - c2 - x[k * vec + v] * c1) * rstd

    return row_step


def _store_partials(s: NormBackwardShape) -> Any:
    """The block's sums of dy * xhat (and dy) over its rows, one row of DWP (DBP) per block."""
    import tilelang.language as T

    chunks, vec, n = s.plan.chunks, s.plan.vec, s.n
    _, need_dw, need_db = s.wanted

    @T.macro
    def store_partials(DWP, DBP, bx, lane, dw, db):
        for k in T.unroll(chunks):
            for v in T.unroll(vec):
                col = s.column(lane, k, v)
                if s.exact or col < n:
                    if need_dw:
                        DWP[bx, col] = dw[k * vec + v]
                    if need_db:
                        DBP[bx, col] = db[k * vec + v]

    return store_partials


def softmax_backward_program(plan: BackwardPlan, call: Any) -> Any:
    """The prim_func of softmax's backward over rows of `call.n`: Y, DY, DX."""
    import tilelang.language as T

    from .._common import tiles

    n, dtype = call.n, DTYPE_NAMES[call.dtype]
    lanes, vec, chunks, values = plan.lanes, plan.vec, plan.chunks, plan.values
    exact, nwarps = plan.padded == n, max(lanes // WARP, 1)
    m = T.dynamic("m")

    @T.macro
    def body(Y, DY, DX):
        with T.Kernel(m, threads=lanes) as row:
            lane = T.get_thread_binding()
            scratch = T.alloc_shared((1, nwarps), "float32")
            y = T.alloc_local((values,), "float32")
            g = T.alloc_local((values,), "float32")
            acc = T.alloc_var("float32", init=0.0)
            for k in T.unroll(chunks):
                for v in T.unroll(vec):
                    col = (k * lanes + lane) * vec + v
                    y[k * vec + v] = _masked(exact, n, col, Y[row, col])
                    g[k * vec + v] = _masked(exact, n, col, DY[row, col])
                    acc += y[k * vec + v] * g[k * vec + v]
            dot = tiles.reduce_group(acc, "sum", _Lanes(lanes), scratch, 0, lane)
            for k in T.unroll(chunks):
                for v in T.unroll(vec):
                    col = (k * lanes + lane) * vec + v
                    if exact or col < n:
                        DX[row, col] = y[k * vec + v] * (g[k * vec + v] - dot)

    def main(Y, DY, DX):
        body(Y, DY, DX)

    return tiles.prim_func(main, dtype, None, Y=(m, n), DY=(m, n), DX=(m, n))


def _masked(exact: bool, n: int, col: Any, value: Any) -> Any:
    """`value` as float32, 0 past the row's end (no test where the lanes cover n exactly)."""
    import tilelang.language as T

    value = T.Cast("float32", value)
    return value if exact else T.if_then_else(col < n, value, T.float32(0.0))


@dataclass(frozen=True)
class _Lanes:
    """What tiles.reduce_group reads of a plan: the lanes over one row."""

    lanes: int
