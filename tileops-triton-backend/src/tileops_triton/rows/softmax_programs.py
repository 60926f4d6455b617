"""Triton programs of softmax (imported on first build: it imports triton).

fused: a tile of ROWS whole rows in registers, read with `.ca` as the norms' (norm_programs).
held: one row per program kept as loaded (as the norms' held rows) and one reduction instead of
two: each lane's VEC-wide vector gives its own (max, sum of exponentials) without leaving the
lane, and the row's pairs merge in one tree (the online rescaling), so the block synchronises
twice instead of five times.
looped: one row per program in CHUNK-wide slices: an online pass keeps a running max and a
rescaled sum per lane, then a writing pass walks the row backwards (the slices read last are
still in L2). Masked lanes hold -inf and contribute 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .norm_programs import widened


@triton.jit
def softmax_fused(X, Y, rows, n, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (r[:, None] < rows) & (cols[None, :] < n)
    offs = r[:, None] * n + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=-float("inf"), cache_modifier=".ca")
    x = x.to(tl.float32)
    row_max = tl.max(x, axis=1)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)  # all -inf: NaN as in torch
    e = tl.exp(x - row_max[:, None])
    y = e * (1.0 / tl.sum(e, axis=1))[:, None]
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _merged(m1, s1, m2, s2):
    """Two (max, sum of exp(x - max)) pairs as one; both maxima -inf: the sum stays 0."""
    m = tl.maximum(m1, m2)
    base = tl.where(m == -float("inf"), 0.0, m)
    return m, s1 * tl.exp(m1 - base) + s2 * tl.exp(m2 - base)


@triton.jit
def softmax_held(X, Y, n, BLOCK: tl.constexpr, VEC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(X + row * n + cols, mask=mask, other=-float("inf"))
    vectors = tl.reshape(x.to(tl.float32), [BLOCK // VEC, VEC])  # a lane's vector per row
    local_max = tl.max(vectors, axis=1)
    base = tl.where(local_max == -float("inf"), 0.0, local_max)
    local_sum = tl.sum(tl.exp(vectors - base[:, None]), axis=1)
    row_max, row_sum = tl.reduce((local_max, local_sum), 0, _merged)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)  # all -inf: NaN as in torch
    y = tl.exp(widened(x) - row_max) / row_sum
    tl.store(Y + row * n + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def softmax_looped(X, Y, n, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row, y_row = X + row * n, Y + row * n
    cols = tl.arange(0, CHUNK)
    m = tl.full([CHUNK], -float("inf"), tl.float32)
    s = tl.zeros([CHUNK], tl.float32)
    for start in range(0, n, CHUNK):
        mask = start + cols < n
        x = tl.load(
            x_row + start + cols, mask=mask, other=-float("inf"), eviction_policy="evict_last"
        ).to(tl.float32)
        m_new = tl.maximum(m, x)
        base = tl.where(m_new == -float("inf"), 0.0, m_new)  # all -inf so far: keep s at 0
        s = s * tl.exp(m - base) + tl.exp(x - base)
        m = m_new
    row_max = tl.max(m, axis=0)
    inv = 1.0 / tl.sum(s * tl.exp(m - row_max), axis=0)
    slices = tl.cdiv(n, CHUNK)
    for i in range(0, slices):
        start = (slices - 1 - i) * CHUNK
        mask = start + cols < n
        x = tl.load(x_row + start + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        y = tl.exp(x.to(tl.float32) - row_max) * inv
        tl.store(y_row + start + cols, y.to(Y.dtype.element_ty), mask=mask)
