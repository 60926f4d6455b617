"""The row-wise backward programs (LayerNorm, RMSNorm, softmax): one TileLang prim_func per
plan (backward_kernels.py declares which rows fit). Each reads x (or y) and dy once and writes
dx once.

Norms: a persistent grid of `programs` blocks, block b taking rows b, b + programs, ...; x and
dy of the next row copy into shared memory while the block works on this one, and wait there
or in float32 registers (the plan's `hold`). The row statistics are recomputed from x (the
forward keeps none: TUNING.md#backward), and each lane adds dy * xhat (and dy) of its columns
over the block's rows in registers, stored once per block into the (programs, n) float32
partials the kernel class then sums in a fixed order. Softmax: one block per row, y and dy in
registers, dx = y * (dy - sum(y * dy)).

Each reduction of a row takes a scratch slot of its own, and the block synchronises before the
next row reuses them (tiles.reduce_group reads its slot after one barrier only). Lanes move
whole vectors of `vec` elements (vec divides n, so a vector lies wholly inside the row or past
its end): 16-byte loads and stores where n allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._common.arith import DTYPE_NAMES, ITEMSIZE, WARP

ITEMSIZE_BY_NAME = {name: ITEMSIZE[dtype] for dtype, name in DTYPE_NAMES.items()}


@dataclass(frozen=True)
class BackwardPlan:
    """`lanes` threads over one row, `chunks` vectors of `vec` elements per lane; `programs`:
    the norms' persistent grid, `blocks_per_sm` of them resident per multiprocessor (the
    launch bounds the compiler fits its registers to), `stages` rows of x and dy staged in
    shared memory per block (2: the next row's copy overlaps this row's work); `hold`, where
    a lane keeps its x and dy while it works: float32 registers, or the staged copy only."""

    lanes: int
    vec: int
    chunks: int
    programs: int = 1
    blocks_per_sm: int = 1
    stages: int = 0
    hold: str = "registers"
    cluster: int = 1

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
    dtype: str  # x's and dy's, as stored
    plan: BackwardPlan
    n: int
    eps: float
    has_w: bool
    wanted: tuple  # (dx, dweight, dbias)

    @property
    def exact(self) -> bool:
        return self.plan.padded * self.plan.cluster == self.n

    def local(self, lane: Any, k: int, v: int) -> Any:
        """The lane's k-th vector's element v in the block's slice (its staged column)."""
        return (k * self.plan.lanes + lane) * self.plan.vec + v

    def column(self, base: Any, lane: Any, k: int, v: int) -> Any:
        """The same element's column in the row; `base`, where the block's slice starts."""
        return base + self.local(lane, k, v)

    def inside(self, base: Any, lane: Any, k: int) -> Any:
        """Whether the lane's k-th vector lies in the row (vec divides n: wholly or not)."""
        return True if self.exact else self.column(base, lane, k, 0) < self.n


def norm_backward_program(kind: str, plan: BackwardPlan, call: Any, wanted: tuple) -> Any:
    """The prim_func of LayerNorm's (kind "layer") or RMSNorm's ("rms") backward over rows of
    `call.n`; `wanted`: (dx, dweight, dbias), dweight/dbias only where the param is given.
    Tensors: X, DY, W (when a weight is given), DX (when wanted), DWP / DBP partials."""
    import tilelang.language as T

    from .._common import tiles

    dtype = DTYPE_NAMES[call.dtype]
    s = NormBackwardShape(kind, dtype, plan, call.n, call.eps, call.dtypes[1] is not None, wanted)
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

    return tiles.prim_func(main, dtype, dtypes, **shapes)


def _norm_body(s: NormBackwardShape, m: Any) -> Any:
    """The persistent block: each of its rows through `_norm_row`, then its partials stored.
    The next row's x and dy copy into shared memory (cp.async) while this row computes, so a
    block keeps its loads in flight through its reductions (TUNING.md#backward). A cluster's
    blocks take the same rows, a slice each."""
    import tilelang.language as T

    plan, values, cluster = s.plan, s.plan.values, s.plan.cluster
    stage_row, read_row, row_step = _stage_row(s), _read_row(s), _norm_row(s)
    store_partials = _store_partials(s)
    grid = plan.programs * cluster

    @T.macro
    def body(X, DY, W, DX, DWP, DBP):
        with _launch(grid, plan.lanes, cluster) as bx:
            T.annotate_min_blocks_per_sm(plan.blocks_per_sm)
            if cluster > 1:
                T.cluster_arrive_relaxed()  # this block runs: its shared memory may be written
            lane = T.get_thread_binding()
            first, part = bx, 0
            if cluster > 1:
                first, part = bx // cluster, bx % cluster
            base = part * plan.padded  # where this block's slice starts
            scratch = T.alloc_shared((4, max(plan.lanes // WARP, 1)), "float32")
            sums = T.alloc_shared((2 * EXCHANGES, cluster, 2), "float32")  # row parity, slot
            stages = plan.stages
            staged = T.alloc_shared((stages, 2, plan.padded), s.dtype)  # x or dy, column
            held = values if plan.hold == "registers" else 1
            x = T.alloc_local((held,), "float32")
            g = T.alloc_local((held,), "float32")
            dw = T.alloc_local((values,), "float32")
            db = T.alloc_local((values,), "float32")
            for i in T.unroll(values):
                dw[i] = 0.0
                db[i] = 0.0
            for ahead in T.unroll(stages - 1):  # the rows in flight before the first is read
                row = first + ahead * plan.programs
                stage_row(X, DY, staged, ahead, row, row < m, base, lane)
            if cluster > 1:
                T.cluster_wait()  # every block of the cluster runs
            for step in T.serial(T.ceildiv(T.max(m - first, 0), plan.programs)):
                row = first + step * plan.programs
                ahead = row + (stages - 1) * plan.programs
                stage = (step + stages - 1) % stages
                stage_row(X, DY, staged, stage, ahead, ahead < m, base, lane)
                T.ptx_wait_group(stages - 1)  # this row's copies landed, later ones may not
                if plan.hold == "registers":
                    read_row(staged, step % stages, base, lane, x, g)
                at = (step % 2) * EXCHANGES
                row_step(W, DX, staged, step % stages, row, base, part, lane, scratch, sums, at,
                         x, g, dw, db)  # fmt: skip
                T.sync_threads()  # the next row's reductions reuse the scratch slots
            store_partials(DWP, DBP, first, base, lane, dw, db)

    return body


EXCHANGES = 3  # a cluster's sums per row: (x), (x - mean)^2, (g * xhat, g)


def _launch(grid: int, lanes: int, cluster: int) -> Any:
    import tilelang.language as T

    if cluster == 1:
        return T.Kernel(grid, threads=lanes)
    return T.Kernel(grid, threads=lanes, cluster_dims=cluster)


def _stage_row(s: NormBackwardShape) -> Any:
    """Row `row`'s x and dy (the block's slice) into shared stage `stage`, each lane copying
    the vectors it will read (so no barrier is needed): one cp.async group, committed even
    when `wanted` is false so the groups keep counting rows. Vectors narrower than cp.async's
    4 bytes are copied through registers instead."""
    import tilelang.language as T

    chunks, vec = s.plan.chunks, s.plan.vec
    asynchronous = vec * ITEMSIZE_BY_NAME[s.dtype] >= 4

    @T.macro
    def stage_row(X, DY, staged, stage, row, wanted, base, lane):
        for k in T.unroll(chunks):
            if s.inside(base, lane, k) and wanted:
                at, col = s.local(lane, k, 0), s.column(base, lane, k, 0)
                if asynchronous:
                    T.ptx_cp_async(T.access_ptr(staged[stage, 0, at], "w"),
                                   T.access_ptr(X[row, col], "r"), vec)  # fmt: skip
                    T.ptx_cp_async(T.access_ptr(staged[stage, 1, at], "w"),
                                   T.access_ptr(DY[row, col], "r"), vec)  # fmt: skip
                else:
                    for v in T.unroll(vec):
                        staged[stage, 0, at + v] = X[row, col + v]
                        staged[stage, 1, at + v] = DY[row, col + v]
        T.ptx_commit_group()

    return stage_row


def _read_row(s: NormBackwardShape) -> Any:
    """A lane's vectors of the staged row into float32 registers (the vectors in the row)."""
    import tilelang.language as T

    chunks, vec = s.plan.chunks, s.plan.vec

    @T.macro
    def read_row(staged, stage, base, lane, x, g):
        for k in T.unroll(chunks):
            if s.inside(base, lane, k):
                for v in T.vectorized(vec):
                    x[k * vec + v] = staged[stage, 0, s.local(lane, k, v)]
                for v in T.vectorized(vec):
                    g[k * vec + v] = staged[stage, 1, s.local(lane, k, v)]

    return read_row


def _row_sums(s: NormBackwardShape) -> Any:
    """The row's totals of one or two lane values: the block's (tiles.reduce_group, scratch
    slots `slot` and `slot + 1`), then, in a cluster, every block's added after each block
    has written its own into every block's `sums[at]` (distributed shared memory) and the
    cluster barrier has passed. Rows alternate between two sets of `sums` slots, so a block
    a row ahead never overwrites sums another block still reads."""
    import tilelang.language as T

    from .._common import tiles

    lanes, cluster = _Lanes(s.plan.lanes), s.plan.cluster

    @T.macro
    def row_sums(first, second, pair, slot, scratch, sums, at, part, lane):
        total = T.alloc_var("float32", init=0.0)
        other = T.alloc_var("float32", init=0.0)
        total = tiles.reduce_group(first, "sum", lanes, scratch, slot, lane)
        if pair:
            other = tiles.reduce_group(second, "sum", lanes, scratch, slot + 1, lane)
        if cluster > 1:
            mine = T.alloc_shared((2,), "float32")
            if lane == 0:
                mine[0] = total
                mine[1] = other
            T.sync_threads()
            for r in T.serial(cluster):
                T.copy_cluster(mine, sums[at, part, :], dst_block=r)
            T.cluster_sync()
            total = sums[at, 0, 0]
            other = sums[at, 0, 1]
            for p in T.unroll(1, cluster):
                total = total + sums[at, p, 0]
                other = other + sums[at, p, 1]
        return total, other

    return row_sums


def _norm_row(s: NormBackwardShape) -> Any:
    """One row, x and dy read where the plan holds them: the statistics, the partials, dx. Each
    pass reads only the lane's vectors inside the row."""
    import tilelang.language as T

    plan = s.plan
    chunks, vec, n, eps = plan.chunks, plan.vec, s.n, s.eps
    need_dx, need_dw, need_db = s.wanted
    inside, local, column, layer = s.inside, s.local, s.column, s.kind == "layer"
    row_sums = _row_sums(s)

    def held(values, staged, stage, which, lane, k, v):
        """x (which 0) or dy (1) at the lane's k-th vector, element v, in float32."""
        if plan.hold == "registers":
            return values[k * vec + v]
        return T.cast(staged[stage, which, local(lane, k, v)], "float32")

    def scaled(g, W, base, lane, k, v):
        return g * W[column(base, lane, k, v)] if s.has_w else g

    @T.macro
    def row_step(W, DX, staged, stage, row, base, part, lane, scratch, sums, at, x, g, dw, db):
        mean = 0.0
        if layer:
            s1 = T.alloc_var("float32", init=0.0)
            for k in T.unroll(chunks):
                if inside(base, lane, k):
                    for v in T.unroll(vec):
                        s1 += held(x, staged, stage, 0, lane, k, v)
            total, _ = row_sums(s1, 0.0, False, 0, scratch, sums, at, part, lane)
            mean = total / n
        s2 = T.alloc_var("float32", init=0.0)
        for k in T.unroll(chunks):
            if inside(base, lane, k):
                for v in T.unroll(vec):
                    centred = held(x, staged, stage, 0, lane, k, v) - mean
                    s2 += centred * centred
        squares, _ = row_sums(s2, 0.0, False, 1, scratch, sums, at + 1, part, lane)
        rstd = T.rsqrt(squares / n + eps)
        s3 = T.alloc_var("float32", init=0.0)  # sum of g * xhat, g = dy * w
        s4 = T.alloc_var("float32", init=0.0)  # sum of g
        for k in T.unroll(chunks):
            if inside(base, lane, k):
                for v in T.unroll(vec):
                    xhat = (held(x, staged, stage, 0, lane, k, v) - mean) * rstd
                    dy = held(g, staged, stage, 1, lane, k, v)
                    if need_dw:
                        dw[k * vec + v] += dy * xhat
                    if need_db:
                        db[k * vec + v] += dy
                    if need_dx:
                        s3 += scaled(dy, W, base, lane, k, v) * xhat
                        s4 += scaled(dy, W, base, lane, k, v)
        if need_dx:
            dots, gs = row_sums(s3, s4, layer, 2, scratch, sums, at + 2, part, lane)
            c1 = dots / n
            c2 = 0.0
            if layer:
                c2 = gs / n
            for k in T.unroll(chunks):
                if inside(base, lane, k):
                    for v in T.vectorized(vec):
                        xhat = (held(x, staged, stage, 0, lane, k, v) - mean) * rstd
                        gw = scaled(held(g, staged, stage, 1, lane, k, v), W, base, lane, k, v)
                        DX[row, column(base, lane, k, v)] = (gw - c2 - xhat * c1) * rstd

    return row_step


def _store_partials(s: NormBackwardShape) -> Any:
    """The block's sums of dy * xhat (and dy) over its rows, one row of DWP (DBP) per block (a
    cluster's blocks fill one row, their slices each)."""
    import tilelang.language as T

    chunks, vec = s.plan.chunks, s.plan.vec
    _, need_dw, need_db = s.wanted

    @T.macro
    def store_partials(DWP, DBP, first, base, lane, dw, db):
        for k in T.unroll(chunks):
            if s.inside(base, lane, k):
                if need_dw:
                    for v in T.vectorized(vec):
                        DWP[first, s.column(base, lane, k, v)] = dw[k * vec + v]
                if need_db:
                    for v in T.vectorized(vec):
                        DBP[first, s.column(base, lane, k, v)] = db[k * vec + v]

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
