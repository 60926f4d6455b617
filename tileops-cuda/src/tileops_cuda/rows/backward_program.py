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


def norm_backward_program(kind: str, plan: BackwardPlan, call: Any, wanted: tuple) -> Any:
    """The prim_func of LayerNorm's (kind "layer") or RMSNorm's ("rms") backward over rows of
    `call.n`; `wanted`: (dx, dweight, dbias), dweight/dbias only where the param is given.
    Tensors: X, DY, W (when a weight is given), DX (when wanted), DWP / DBP partials."""
    import tilelang.language as T

    from .._common import tiles

    n, eps, dtype = call.n, call.eps, DTYPE_NAMES[call.dtype]
    has_w = call.dtypes[1] is not None
    need_dx, need_dw, need_db = wanted
    lanes, vec, chunks, programs = plan.lanes, plan.vec, plan.chunks, plan.programs
    values, exact, nwarps = plan.values, plan.padded == n, max(lanes // WARP, 1)
    m = T.dynamic("m")
    shapes = {"X": (m, n), "DY": (m, n)}
    dtypes = {}
    if has_w:
        shapes["W"], dtypes["W"] = (n,), DTYPE_NAMES[call.param_dtype]
    if need_dx:
        shapes["DX"] = (m, n)
    for name, need in (("DWP", need_dw), ("DBP", need_db)):
        if need:
            shapes[name], dtypes[name] = (programs, n), "float32"

    def column(lane, k, v):
        return (k * lanes + lane) * vec + v

    def masked(col, value):
        return _masked(exact, n, col, value)

    def read(A, row, col):
        return _masked(exact, n, col, A[row, col])

    @T.macro
    def body(X, DY, W, DX, DWP, DBP):
        with T.Kernel(programs, threads=lanes) as bx:
            lane = T.get_thread_binding()
            scratch = T.alloc_shared((4, nwarps), "float32")
            x = T.alloc_local((values,), "float32")
            g = T.alloc_local((values,), "float32")
            dw = T.alloc_local((values,), "float32")
            db = T.alloc_local((values,), "float32")
            for i in T.unroll(values):
                dw[i] = 0.0
                db[i] = 0.0
            for step in T.serial(T.ceildiv(T.max(m - bx, 0), programs)):
                row = bx + step * programs
                s1 = T.alloc_var("float32", init=0.0)
                for k in T.unroll(chunks):
                    for v in T.unroll(vec):
                        col = column(lane, k, v)
                        x[k * vec + v] = read(X, row, col)
                        g[k * vec + v] = read(DY, row, col)
                        s1 += x[k * vec + v]
                if kind == "layer":
                    mean = tiles.reduce_group(s1, "sum", _Lanes(lanes), scratch, 0, lane) / n
                    for k in T.unroll(chunks):
                        for v in T.unroll(vec):
                            col = column(lane, k, v)
                            x[k * vec + v] = masked(col, x[k * vec + v] - mean)
                s2 = T.alloc_var("float32", init=0.0)
                for i in T.unroll(values):
                    s2 += x[i] * x[i]
                rstd = T.rsqrt(
                    tiles.reduce_group(s2, "sum", _Lanes(lanes), scratch, 1, lane) / n + eps
                )
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
                        if has_w:
                            col = column(lane, k, v)
                            g[i] = g[i] * masked(col, W[col])
                        s3 += g[i] * x[i]
                        s4 += g[i]
                if need_dx:
                    c1 = tiles.reduce_group(s3, "sum", _Lanes(lanes), scratch, 2, lane) / n
                    c2 = 0.0
                    if kind == "layer":
                        c2 = tiles.reduce_group(s4, "sum", _Lanes(lanes), scratch, 3, lane) / n
                    for k in T.unroll(chunks):
                        for v in T.unroll(vec):
                            col = column(lane, k, v)
                            i = k * vec + v
                            if exact or col < n:
                                DX[row, col] = (g[i] - c2 - x[i] * c1) * rstd
                T.sync_threads()  # the next row's reductions reuse the scratch slots
            for k in T.unroll(chunks):
                for v in T.unroll(vec):
                    col = column(lane, k, v)
                    if exact or col < n:
                        if need_dw:
                            DWP[bx, col] = dw[k * vec + v]
                        if need_db:
                            DBP[bx, col] = db[k * vec + v]

    def main(X, DY, W=None, DX=None, DWP=None, DBP=None):
        body(X, DY, W, DX, DWP, DBP)

    return tiles.prim_func(main, dtype, dtypes, **shapes)


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
