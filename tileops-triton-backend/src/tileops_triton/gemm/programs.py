"""The Triton GEMM program (imported on first build: it imports triton).

One program computes a BLOCK_M x BLOCK_N tile of C over its share of K (all of it unless
SPLIT_K > 1, when program (tile, s) takes K-slices s, s + SPLIT_K, ... and writes float32
partials to slab s of C). Tiles are visited in groups of GROUP_M rows so that programs running
together share A and B tiles in L2. Rows and columns past M and N wrap around (modulo) on load,
so only the K tail and the final store need masks. A is stored (M, K), or (K, M) with TRANS_A;
B (K, N), or (N, K) with TRANS_B: the pointers follow the storage, the tiles are the same.
HAS_BIAS adds Bias[N] to the float32 sums before the store (unsplit programs only: the
launcher adds it to split partials' sum). UPCAST multiplies in float32 (bfloat16 on pre-sm_80
GPUs, and under the interpreter, whose 16-bit dot is unreliable).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gemm(
    A, B, C, Bias, M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    TRANS_A: tl.constexpr, TRANS_B: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    split = tl.program_id(1)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP_M * tiles_n
    first_m = (pid // group_size) * GROUP_M
    rows_in_group = tl.minimum(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size) % rows_in_group
    pid_n = (pid % group_size) // rows_in_group

    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rn = tl.max_contiguous(tl.multiple_of(rn, BLOCK_N), BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    step = BLOCK_K * SPLIT_K
    if TRANS_A:
        rm = tl.max_contiguous(tl.multiple_of(rm, BLOCK_M), BLOCK_M)
        a_ptrs = A + (split * BLOCK_K + rk)[None, :].to(tl.int64) * M + rm[:, None]
        a_step = step * M
    else:
        a_ptrs = A + rm[:, None].to(tl.int64) * K + (split * BLOCK_K + rk)[None, :]
        a_step = step
    if TRANS_B:
        b_ptrs = B + rn[None, :].to(tl.int64) * K + (split * BLOCK_K + rk)[:, None]
        b_step = step
    else:
        b_ptrs = B + (split * BLOCK_K + rk)[:, None].to(tl.int64) * N + rn[None, :]
        b_step = step * N

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(split * BLOCK_K, K, step):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=rk[None, :] < K - k0, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < K - k0, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += a_step
        b_ptrs += b_step

    cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        acc += tl.load(Bias + cn, mask=cn < N, other=0.0).to(tl.float32)[None, :]
    c_ptrs = C + split.to(tl.int64) * M * N + cm[:, None].to(tl.int64) * N + cn[None, :]
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=(cm[:, None] < M) & (cn[None, :] < N))
