"""The streamed layouts' programs: tiled (one block streams a channel twice) and split_channel's
two kernels (each split's Welford partials, then the merge and the output)."""

from __future__ import annotations

from typing import Any

from tileops.ops import BatchNormCall

from .._common.arith import WARP
from .plans import PARTIAL_FIELDS, SPLIT_THREADS, SUM_FIELDS, TILED_THREADS
from .program_parts import Shape, bn_prim_func, epilogue, f32


def welford(shape: Shape, threads: int):
    """Macros of the streamed layouts: a thread's shifted sums of its vectors (start, fold),
    turned into (count, mean, M2) (welford_of) and merged across the block (Chan et al.),
    every thread getting the result."""
    import tilelang.language as T

    vec, runs = shape.vec, shape.runs
    vectors = shape.batch * runs
    nwarps = threads // WARP
    offsets = [WARP >> i for i in range(1, WARP.bit_length())]  # 16, 8, 4, 2, 1

    @T.macro
    def merge(st, count, mean, m2):
        total = st[0] + count
        delta = mean - st[1]
        weight = T.if_then_else(total > 0.0, count / T.max(total, 1.0), 0.0)
        st[2] = st[2] + m2 + delta * delta * st[0] * weight
        st[1] = st[1] + delta * weight
        st[0] = total

    @T.macro
    def start(X, c, j, acc):
        """A thread's sums begin at its first value (the shift): sums of (x - shift) and of
        its squares then stay near the spread of the values, so M2 = S2 - S1^2 / n keeps its
        digits, and each vector costs adds and multiplies only (no division per vector)."""
        for f in T.unroll(SUM_FIELDS):
            acc[f] = 0.0
        if j < vectors:
            acc[1] = f32(X[j // runs, c, (j % runs) * vec])

    @T.macro
    def fold(X, c, j, acc, t):
        for v in T.vectorized(vec):
            t[v] = f32(X[j // runs, c, (j % runs) * vec + v])
        for v in T.unroll(vec):
            acc[2] += t[v] - acc[1]
            acc[3] += (t[v] - acc[1]) * (t[v] - acc[1])
        acc[0] += float(vec)

    @T.macro
    def welford_of(acc, st):
        """(count, shift, S1, S2) as (count, mean, M2), for the merges."""
        n = T.max(acc[0], 1.0)
        st[0] = acc[0]
        st[1] = acc[1] + acc[2] / n
        st[2] = T.max(acc[3] - acc[2] * acc[2] / n, 0.0)

    @T.macro
    def block_merge(st, scratch, lane):
        for offset in offsets:
            count = T.shfl_xor(st[0], offset)
            mean = T.shfl_xor(st[1], offset)
            m2 = T.shfl_xor(st[2], offset)
            merge(st, count, mean, m2)
        if nwarps > 1:
            if lane % WARP == 0:
                for f in T.unroll(PARTIAL_FIELDS):
                    scratch[f, lane // WARP] = st[f]
            T.sync_threads()
            for f in T.unroll(PARTIAL_FIELDS):
                st[f] = scratch[f, 0]
            for w in T.unroll(1, nwarps):
                merge(st, scratch[0, w], scratch[1, w], scratch[2, w])

    return start, fold, welford_of, merge, block_merge


def tiled_body(shape: Shape) -> Any:
    """tiled: one block per channel, Welford over the channel's vectors, then the output."""
    import tilelang.language as T

    normalized, update_stats = epilogue(shape)
    start, fold, welford_of, _, block_merge = welford(shape, TILED_THREADS)
    threads, vec, runs = TILED_THREADS, shape.vec, shape.runs
    vectors = shape.batch * runs

    @T.macro
    def body(X, W, Bias, RM, RV, P, S, Q, Y, M):
        with T.Kernel(shape.channels, threads=threads) as c:
            lane = T.get_thread_binding()
            acc = T.alloc_local((SUM_FIELDS,), "float32")
            st = T.alloc_local((PARTIAL_FIELDS,), "float32")
            t = T.alloc_local((vec,), "float32")
            scratch = T.alloc_shared((PARTIAL_FIELDS, threads // WARP), "float32")
            start(X, c, lane, acc)
            for k in T.serial(T.ceildiv(vectors, threads)):
                if k * threads + lane < vectors:
                    fold(X, c, k * threads + lane, acc, t)
            welford_of(acc, st)
            block_merge(st, scratch, lane)
            var = st[2] / st[0]
            rstd = T.rsqrt(var + shape.eps)
            for k in T.serial(T.ceildiv(vectors, threads)):
                j = k * threads + lane
                if j < vectors:
                    normalized(X, W, Bias, Y, j // runs, c, (j % runs) * vec, st[1], rstd)
            if lane == 0:
                update_stats(RM, RV, M, c, st[1], var, st[0])

    return body


def partials_program(call: BatchNormCall, chunk: int) -> Any:
    """Split layout, kernel 1: block (split, c) writes the (count, mean, M2) of its `chunk`
    vectors of channel c to P[c, split]."""
    import tilelang.language as T

    shape = Shape(call)
    start, fold, welford_of, _, block_merge = welford(shape, SPLIT_THREADS)
    threads, vec = SPLIT_THREADS, shape.vec
    vectors = shape.batch * shape.runs
    splits = T.dynamic("splits")

    @T.macro
    def body(X, W, Bias, RM, RV, P, S, Q, Y, M):
        with T.Kernel(splits, shape.channels, threads=threads) as (split, c):
            lane = T.get_thread_binding()
            acc = T.alloc_local((SUM_FIELDS,), "float32")
            st = T.alloc_local((PARTIAL_FIELDS,), "float32")
            t = T.alloc_local((vec,), "float32")
            scratch = T.alloc_shared((PARTIAL_FIELDS, threads // WARP), "float32")
            start(X, c, split * chunk + lane, acc)
            for k in T.unroll(chunk // threads, annotations={"pragma_unroll_factor": 4}):
                j = split * chunk + k * threads + lane
                if j < vectors:
                    fold(X, c, j, acc, t)
            welford_of(acc, st)
            block_merge(st, scratch, lane)
            if lane == 0:
                for f in T.unroll(PARTIAL_FIELDS):
                    P[c, split, f] = st[f]

    partials = (shape.channels, splits, PARTIAL_FIELDS)
    return bn_prim_func(body, shape, channel_tensors=(), output=False, P=partials)


def finish_program(call: BatchNormCall, chunk: int) -> Any:
    """Split layout, kernel 2: block (split, c) merges channel c's partials, normalizes its
    chunk; block (0, c) updates the running stats. Blocks run in the reverse of kernel 1's
    order, so the first ones re-read what kernel 1 read last, while it is still in L2."""
    import tilelang.language as T

    shape = Shape(call)
    normalized, update_stats = epilogue(shape)
    *_, merge, block_merge = welford(shape, SPLIT_THREADS)
    threads, vec, runs = SPLIT_THREADS, shape.vec, shape.runs
    vectors = shape.batch * runs
    splits = T.dynamic("splits")

    @T.macro
    def body(X, W, Bias, RM, RV, P, S, Q, Y, M):
        with T.Kernel(splits, shape.channels, threads=threads) as (bx, by):
            split, c = splits - 1 - bx, shape.channels - 1 - by
            lane = T.get_thread_binding()
            st = T.alloc_local((PARTIAL_FIELDS,), "float32")
            scratch = T.alloc_shared((PARTIAL_FIELDS, threads // WARP), "float32")
            for f in T.unroll(PARTIAL_FIELDS):
                st[f] = 0.0
            for k in T.serial(T.ceildiv(splits, threads)):
                if k * threads + lane < splits:
                    i = k * threads + lane
                    merge(st, P[c, i, 0], P[c, i, 1], P[c, i, 2])
            block_merge(st, scratch, lane)
            var = st[2] / st[0]
            rstd = T.rsqrt(var + shape.eps)
            for k in T.unroll(chunk // threads, annotations={"pragma_unroll_factor": 4}):
                j = split * chunk + k * threads + lane
                if j < vectors:
                    normalized(X, W, Bias, Y, j // runs, c, (j % runs) * vec, st[1], rstd)
            if split == 0 and lane == 0:
                update_stats(RM, RV, M, c, st[1], var, st[0])

    return bn_prim_func(body, shape, P=(shape.channels, splits, PARTIAL_FIELDS))
