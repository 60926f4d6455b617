"""Triton programs of LayerNorm and RMSNorm (imported on first build: it imports triton).

Two shapes of program per norm, both computing in float32:
- fused: a tile of ROWS whole rows in registers, one read and one write of each element, the
  read cached in L1 (`.ca`, TUNING.md#cached-reads);
- held: one row per program kept as loaded (16-bit values packed two to a register) between
  its uses, each use converting to float32 anew; half the registers of a float32 row, so a
  4K-32K bfloat16 row leaves room for more programs on the multiprocessor (plans.HELD);
- looped: one row per program in CHUNK-wide slices, for rows too long for registers: a
  statistics pass, then a normalizing pass that walks the row backwards, so it starts on the
  slices the first pass read last, which are still in L2.
Offsets are int64: rows * n may exceed 2**31.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _affine(y, W, B, cols, mask, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if HAS_B:
        y = y + tl.load(B + cols, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    return y


@triton.jit
def widened(x):
    """x as float32, through an integer shift for bfloat16: the compiler would merge a second
    `x.to(tl.float32)` with the first and keep the float32 row alive between the uses."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def _add_pairs(a1, b1, a2, b2):
    return a1 + a2, b1 + b2


@triton.jit
def layer_norm_fused(
    X, W, B, Y, rows, n, eps,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (r[:, None] < rows) & (cols[None, :] < n)
    offs = r[:, None] * n + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0, cache_modifier=".ca").to(tl.float32)
    mean = tl.sum(x, axis=1) / n
    d = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(d * d, axis=1) / n + eps)
    y = _affine(d * rstd[:, None], W, B, cols[None, :], cols[None, :] < n, HAS_W, HAS_B)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def layer_norm_held(
    X, W, B, Y, n, eps, BLOCK: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(X + row * n + cols, mask=mask, other=0.0)
    # One pass of sums shifted by the row's first element (no cancellation far from 0), both
    # sums in one reduction: two block barriers instead of five, and in Triton 3.9 20 bytes of
    # spills instead of 352 under the 32-register cap (tests/triton/test_compile.py).
    shift = tl.load(X + row * n).to(tl.float32)
    d = tl.where(mask, x.to(tl.float32) - shift, 0.0)
    sum_d, sum_d2 = tl.reduce((d, d * d), 0, _add_pairs)
    store_shifted_layer_norm(x, shift, sum_d, sum_d2, n, eps, W, B, Y + row * n, cols, mask,
                             HAS_W, HAS_B)  # fmt: skip


@triton.jit
def store_shifted_layer_norm(
    x, shift, sum_d, sum_d2, n, eps, W, B, y_row, cols, mask,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr,
):  # fmt: skip
    """LayerNorm of the held values x at `cols`, from the row's sums of d = x - shift and d^2,
    stored at y_row + cols."""
    mean_d = sum_d / n
    var = tl.maximum(sum_d2 / n - mean_d * mean_d, 0.0)
    rstd = tl.rsqrt(var + eps)
    y = _affine((widened(x) - (shift + mean_d)) * rstd, W, B, cols, mask, HAS_W, HAS_B)
    tl.store(y_row + cols, y.to(y_row.dtype.element_ty), mask=mask)


@triton.jit
def layer_norm_looped(
    X, W, B, Y, n, eps, CHUNK: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    x_row, y_row = X + row * n, Y + row * n
    cols = tl.arange(0, CHUNK)
    # Sums of x - shift, shift the first slice's mean: no cancellation for rows far from 0.
    first = tl.load(x_row + cols, mask=cols < n, other=0.0).to(tl.float32)
    shift = tl.sum(first, axis=0) / tl.minimum(n, CHUNK)
    s1 = tl.zeros([CHUNK], tl.float32)
    s2 = tl.zeros([CHUNK], tl.float32)
    for start in range(0, n, CHUNK):
        mask = start + cols < n
        x = tl.load(x_row + start + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        d = tl.where(mask, x.to(tl.float32) - shift, 0.0)
        s1 += d
        s2 += d * d
    mean_d = tl.sum(s1, axis=0) / n
    var = tl.maximum(tl.sum(s2, axis=0) / n - mean_d * mean_d, 0.0)
    mean = shift + mean_d
    rstd = tl.rsqrt(var + eps)
    slices = tl.cdiv(n, CHUNK)
    for i in range(0, slices):
        start = (slices - 1 - i) * CHUNK
        mask = start + cols < n
        x = tl.load(x_row + start + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        y = (x.to(tl.float32) - mean) * rstd
        y = _affine(y, W + start, B + start, cols, mask, HAS_W, HAS_B)
        tl.store(y_row + start + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_fused(
    X, W, Y, rows, n, eps,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, HAS_W: tl.constexpr, CACHED: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (r[:, None] < rows) & (cols[None, :] < n)
    offs = r[:, None] * n + cols[None, :]
    if CACHED:
        x = tl.load(X + offs, mask=mask, other=0.0, cache_modifier=".ca").to(tl.float32)
    else:
        x = tl.load(X + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n + eps)
    y = _affine(x * rstd[:, None], W, W, cols[None, :], cols[None, :] < n, HAS_W, False)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_held(X, W, Y, n, eps, BLOCK: tl.constexpr, HAS_W: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(X + row * n + cols, mask=mask, other=0.0)
    square = x.to(tl.float32) * x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(square, axis=0) / n + eps)
    y = _affine(widened(x) * rstd, W, W, cols, mask, HAS_W, False)
    tl.store(Y + row * n + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_looped(X, W, Y, n, eps, CHUNK: tl.constexpr, HAS_W: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row, y_row = X + row * n, Y + row * n
    cols = tl.arange(0, CHUNK)
    s2 = tl.zeros([CHUNK], tl.float32)
    for start in range(0, n, CHUNK):
        mask = start + cols < n
        x = tl.load(x_row + start + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        x = x.to(tl.float32)
        s2 += x * x
    rstd = tl.rsqrt(tl.sum(s2, axis=0) / n + eps)
    slices = tl.cdiv(n, CHUNK)
    for i in range(0, slices):
        start = (slices - 1 - i) * CHUNK
        mask = start + cols < n
        x = tl.load(x_row + start + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        y = _affine(x.to(tl.float32) * rstd, W + start, W, cols, mask, HAS_W, False)
        tl.store(y_row + start + cols, y.to(Y.dtype.element_ty), mask=mask)
