"""BatchNorm's program factories: `train_program` builds the single-kernel training layouts
(held, tiled, thread_channel), `infer_program` inference; split_channel's two kernels are in
`streamed_program`."""

from __future__ import annotations

from typing import Any

from tileops.ops import BatchNormCall

from .held_program import held_channel_body
from .plans import INFER_THREADS, INFER_VECTORS, THREAD_CHANNEL_THREADS
from .program_parts import Shape, bn_prim_func, epilogue, f32
from .streamed_program import tiled_body

HELD_LAYOUTS = ("block_channel", "smem_channel", "cluster_channel", "group_channel")


def train_program(layout: str, call: BatchNormCall, fields: tuple) -> Any:
    """The prim_func of one single-kernel training layout (all but split_channel); a cluster's
    takes its workspace S before Y, a group's S and its counters Q."""
    shape = Shape(call)
    if layout not in HELD_LAYOUTS:
        body = thread_channel_body(shape) if layout == "thread_channel" else tiled_body(shape)
        return bn_prim_func(body, shape)
    batch, plan = fields
    ticketed = layout == "group_channel"
    scratch = {}
    if ticketed or plan.cluster > 1:
        scratch["S"] = (shape.channels, plan.cluster, 2)
    if ticketed:
        scratch["Q"] = (shape.channels + 1,)
    return bn_prim_func(held_channel_body(shape, batch, plan, ticketed), shape, batch, **scratch)


def thread_channel_body(shape: Shape) -> Any:
    """thread_channel: one thread walks its channel three times (sum, squared deviations,
    output), the second and third walks from L1."""
    import tilelang.language as T

    normalized, update_stats = epilogue(shape)
    threads, spatial, batch = THREAD_CHANNEL_THREADS, shape.spatial, shape.batch

    @T.macro
    def body(X, W, Bias, RM, RV, P, S, Q, Y, M):
        with T.Kernel(T.ceildiv(shape.channels, threads), threads=threads) as bx:
            c = bx * threads + T.get_thread_binding()
            count = T.Cast("float32", batch * spatial)
            total = T.alloc_var("float32", init=0.0)
            square = T.alloc_var("float32", init=0.0)
            if c < shape.channels:
                for b in T.serial(batch):
                    for s in T.unroll(spatial):
                        total += f32(X[b, c, s])
                mean = total / count
                for b in T.serial(batch):
                    for s in T.unroll(spatial):
                        square += (f32(X[b, c, s]) - mean) * (f32(X[b, c, s]) - mean)
                var = square / count
                rstd = T.rsqrt(var + shape.eps)
                for b in T.serial(batch):
                    for r in T.unroll(shape.runs):
                        normalized(X, W, Bias, Y, b, c, r * shape.vec, mean, rstd)
                update_stats(RM, RV, M, c, mean, var, count)

    return body


def infer_program(call: BatchNormCall) -> Any:
    """Inference: thread g of the flat vector grid normalizes vectors g, g + G, ... of the
    (batch * channels) runs; the per-channel scale comes from L1-resident running stats."""
    import tilelang.language as T

    shape = Shape(call)
    threads, vec, runs, channels = INFER_THREADS, shape.vec, shape.runs, shape.channels
    vectors = shape.batch * channels * runs
    step = threads * INFER_VECTORS

    @T.macro
    def body(X, W, Bias, RM, RV, P, S, Q, Y, M):
        with T.Kernel(T.ceildiv(vectors, step), threads=threads) as bx:
            lane = T.get_thread_binding()
            for k in T.unroll(INFER_VECTORS):
                g = bx * step + k * threads + lane
                if g < vectors:
                    b, c, s = g // (channels * runs), (g // runs) % channels, (g % runs) * vec
                    rstd = T.rsqrt(f32(RV[c]) + shape.eps)
                    scale = rstd * f32(W[c]) if shape.weight else rstd
                    for v in T.vectorized(vec):
                        if shape.bias:
                            Y[b, c, s + v] = (f32(X[b, c, s + v]) - f32(RM[c])) * scale + f32(
                                Bias[c]
                            )
                        else:
                            Y[b, c, s + v] = (f32(X[b, c, s + v]) - f32(RM[c])) * scale

    return bn_prim_func(body, shape, kept=False)
