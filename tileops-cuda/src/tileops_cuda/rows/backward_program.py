"""The row-wise backward programs (LayerNorm, RMSNorm, softmax): one TileLang prim_func per
plan, the row held in its block's registers as float32 (backward_kernels.py declares which
rows fit). Each reads x (or y) and dy once and writes dx once.

Norms: a persistent grid of `programs` blocks, block b taking rows b, b + programs, ...; the
row statistics are recomputed from the held x (the forward keeps none: TUNING.md#backward),
and each lane adds dy * xhat (and dy) of its columns over the block's rows in registers, stored
once per block into the (programs, n) float32 partials the kernel class then sums in a fixed
order. Softmax: one block per row, dx = y * (dy - sum(y * dy)).

Each reduction of a row takes a scratch slot of its own, and the block synchronises before the
next row reuses them (tiles.reduce_group reads its slot after one barrier only). Lanes move
whole vectors of `vec` elements (vec divides n, so a vector lies wholly inside the row or past
its end): 16-byte loads and stores where n allows.
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

    def inside(lane, k):
        """Whether the lane's k-th vector lies in the row (vec divides n: wholly or not)."""
        return True if s.exact else s.column(lane, k, 0) < n

    @T.macro
    def row_step(X, DY, W, DX, row, lane, scratch, x, g, dw, db):
        for i in T.unroll(values):
            x[i] = 0.0
            g[i] = 0.0
        for k in T.unroll(chunks):
            if inside(lane, k):
                for v in T.vectorized(vec):
                    x[k * vec + v] = X[row, s.column(lane, k, v)]
                for v in T.vectorized(vec):
                    g[k * vec + v] = DY[row, s.column(lane, k, v)]
        if s.kind == "layer":
            s1 = T.alloc_var("float32", init=0.0)
            for i in T.unroll(values):
                s1 += x[i]
            mean = tiles.reduce_group(s1, "sum", lanes, scratch, 0, lane) / n
            for k in T.unroll(chunks):
                if inside(lane, k):
                    for v in T.unroll(vec):
                        x[k * vec + v] = x[k * vec + v] - mean
        s2 = T.alloc_var("float32", init=0.0)
        for i in T.unroll(values):
            s2 += x[i] * x[i]
        rstd = T.rsqrt(tiles.reduce_group(s2, "sum", lanes, scratch, 1, lane) / n + s.eps)
        for i in T.unroll(values):
            x[i] = x[i] * rstd  # xhat
            if need_dw:
                dw[i] += g[i] * x[i]
            if need_db:
                db[i] += g[i]
        if s.has_w:
            for k in T.unroll(chunks):
                if inside(lane, k):
                    for v in T.unroll(vec):
                        g[k * vec + v] = g[k * vec + v] * W[s.column(lane, k, v)]
        if need_dx:
            s3 = T.alloc_var("float32", init=0.0)
            s4 = T.alloc_var("float32", init=0.0)
            for i in T.unroll(values):
                s3 += g[i] * x[i]
                s4 += g[i]
            c1 = tiles.reduce_group(s3, "sum", lanes, scratch, 2, lane) / n
            c2 = 0.0
            if s.kind == "layer":
                c2 = tiles.reduce_group(s4, "sum", lanes, scratch, 3, lane) / n
            for k in T.unroll(chunks):
                if inside(lane, k):
                    for v in T.vectorized(vec):
                        i = k * vec + v
                        DX[row, s.column(lane, k, v)] = (g[i] - c2 - x[i] * c1) * rstd

    return row_step


def _store_partials(s: NormBackwardShape) -> Any:
    """The block's sums of dy * xhat (and dy) over its rows, one row of DWP (DBP) per block."""
    import tilelang.language as T

    chunks, vec, n = s.plan.chunks, s.plan.vec, s.n
    _, need_dw, need_db = s.wanted

    @T.macro
    def store_partials(DWP, DBP, bx, lane, dw, db):
        for k in T.unroll(chunks):
            if s.exact or s.column(lane, k, 0) < n:
                if need_dw:
                    for v in T.vectorized(vec):
                        DWP[bx, s.column(lane, k, v)] = dw[k * vec + v]
                if need_db:
                    for v in T.vectorized(vec):
                        DBP[bx, s.column(lane, k, v)] = db[k * vec + v]

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
            for i in T.unroll(values):
                y[i] = 0.0
                g[i] = 0.0
            for k in T.unroll(chunks):
                if exact or (k * lanes + lane) * vec < n:  # vec divides n: whole vectors
                    for v in T.vectorized(vec):
                        y[k * vec + v] = Y[row, (k * lanes + lane) * vec + v]
                    for v in T.vectorized(vec):
                        g[k * vec + v] = DY[row, (k * lanes + lane) * vec + v]
            acc = T.alloc_var("float32", init=0.0)
            for i in T.unroll(values):
                acc += y[i] * g[i]
            dot = tiles.reduce_group(acc, "sum", _Lanes(lanes), scratch, 0, lane)
            for k in T.unroll(chunks):
                if exact or (k * lanes + lane) * vec < n:
                    for v in T.vectorized(vec):
                        i = k * vec + v
                        DX[row, (k * lanes + lane) * vec + v] = y[i] * (g[i] - dot)

    def main(Y, DY, DX):
        body(Y, DY, DX)

    return tiles.prim_func(main, dtype, None, Y=(m, n), DY=(m, n), DX=(m, n))


@dataclass(frozen=True)
class _Lanes:
    """What tiles.reduce_group reads of a plan: the lanes over one row."""

    lanes: int
