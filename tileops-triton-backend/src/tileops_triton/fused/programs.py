"""Triton programs of the fused training ops (imported on first launch: it imports triton).

All compute in float32 and round once. Offsets are int64: rows * n may exceed 2**31.
- add + RMSNorm: one row per program, held whole (rows up to `launch.MAX_ROW`); the backward
  walks a contiguous block of rows per program, writing dx and the program's partial sums of
  dweight to its own row of a (programs, n) float32 buffer, which the launcher sums in a fixed
  order (deterministic, no atomics);
- GLU: 2-D tiles over (row, column block), rows of any row stride;
- rotary: one program per (batch, position) token, all heads of q and k in one tile each, the
  cos/sin row loaded once for both.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Constants appear as literals in the programs (compiled Triton takes module globals only as
# constexprs, which its interpreter cannot multiply by a tensor): 1/sqrt(2) = 0.7071067811865476,
# sqrt(2/pi) = 0.7978845608028654, 1/sqrt(2*pi) = 0.3989422804014327.


@triton.jit
def add_rms_norm_fwd(X, R, W, Y, H, n, eps, BLOCK: tl.constexpr, HAS_W: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(X + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(R + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(H.dtype.element_ty)  # the new residual, rounded as `x + residual` is
    tl.store(H + row * n + cols, h, mask=mask)
    hf = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(hf * hf, axis=0) / n + eps)
    y = hf * rstd
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * n + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def add_rms_norm_bwd(
    X, R, W, DY, DH, DX, DW, rows, n, eps, per_program,
    BLOCK: tl.constexpr, HAS_W: tl.constexpr, HAS_DH: tl.constexpr,
):  # fmt: skip
    part = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    if HAS_W:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    else:
        w = tl.full([BLOCK], 1.0, tl.float32)
    dw = tl.zeros([BLOCK], tl.float32)
    first = part * per_program
    for row in range(first, tl.minimum(first + per_program, rows)):
        offs = row * n + cols
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(R + offs, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(X.dtype.element_ty).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(h * h, axis=0) / n + eps)
        hn = h * rstd
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        g = dy * w
        dh = rstd * (g - hn * (tl.sum(g * hn, axis=0) / n))
        if HAS_DH:
            dh += tl.load(DH + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + offs, dh.to(DX.dtype.element_ty), mask=mask)
        dw += dy * hn
    if HAS_W:
        tl.store(DW + part * n + cols, dw, mask=mask)


@triton.jit
def _sigmoid(g):
    return 1.0 / (1.0 + tl.exp(-g))


@triton.jit
def _tanh(z):
    return 2.0 * _sigmoid(2.0 * z) - 1.0


@triton.jit
def _act(g, ACT: tl.constexpr):
    """The activation of float32 `g`: 0 silu, 1 gelu (erf), 2 gelu (tanh)."""
    if ACT == 0:
        a = g * _sigmoid(g)
    elif ACT == 1:
        a = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
    else:
        a = 0.5 * g * (1.0 + _tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)))
    return a


@triton.jit
def _act_and_slope(g, ACT: tl.constexpr):
    """The activation of float32 `g` and its derivative."""
    if ACT == 0:
        s = _sigmoid(g)
        a = g * s
        slope = s * (1.0 + g * (1.0 - s))
    elif ACT == 1:
        cdf = 0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476))
        a = g * cdf
        slope = cdf + g * 0.3989422804014327 * tl.exp(-0.5 * g * g)
    else:
        t = _tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))
        a = 0.5 * g * (1.0 + t)
        inner = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * g * g)
        slope = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * inner
    return a, slope


@triton.jit
def glu_fwd(G, U, Y, n, g_stride, u_stride, ACT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(G + row * g_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + row * u_stride + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * n + cols, (_act(g, ACT) * u).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def glu_bwd(
    G, U, DY, DG, DU, n, g_stride, u_stride, dy_stride,
    ACT: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(G + row * g_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + row * u_stride + cols, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * dy_stride + cols, mask=mask, other=0.0).to(tl.float32)
    a, slope = _act_and_slope(g, ACT)
    tl.store(DG + row * n + cols, (dy * u * slope).to(DG.dtype.element_ty), mask=mask)
    tl.store(DU + row * n + cols, (dy * a).to(DU.dtype.element_ty), mask=mask)


@triton.jit
def _rotate_heads(
    X, XO, x_off, o_off, heads, sh, oh, c1, c2, s1, s2, half, rot, head_dim,
    HEADS: tl.constexpr, HALF: tl.constexpr, PASS: tl.constexpr, BACKWARD: tl.constexpr,
):  # fmt: skip
    """Rotate the first `rot` dims of `heads` heads at X + x_off (head stride sh) into XO +
    o_off (head stride oh), copying the rest; the transpose of the rotation when BACKWARD."""
    h = tl.arange(0, HEADS)[:, None]
    j = tl.arange(0, HALF)[None, :]
    m = (h < heads) & (j < half)
    src = X + x_off + h * sh
    dst = XO + o_off + h * oh
    x1 = tl.load(src + j, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(src + half + j, mask=m, other=0.0).to(tl.float32)
    if BACKWARD:
        y1 = x1 * c1 + x2 * s2
        y2 = x2 * c2 - x1 * s1
    else:
        y1 = x1 * c1 - x2 * s1
        y2 = x2 * c2 + x1 * s2
    tl.store(dst + j, y1.to(XO.dtype.element_ty), mask=m)
    tl.store(dst + half + j, y2.to(XO.dtype.element_ty), mask=m)
    if PASS > 0:
        p = tl.arange(0, PASS)[None, :]
        pm = (h < heads) & (p < head_dim - rot)
        kept = tl.load(src + rot + p, mask=pm, other=0.0)
        tl.store(dst + rot + p, kept.to(XO.dtype.element_ty), mask=pm)


@triton.jit
def rotary(
    Q, K, C, S, QO, KO, seq, q_heads, k_heads, rot, head_dim,
    qb, qh, qs, kb, kh, ks, qob, qoh, qos, kob, koh, kos, cb, cs,
    Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, HALF: tl.constexpr, PASS: tl.constexpr,
    BACKWARD: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    b = token // seq
    s = token % seq
    half = rot // 2
    j = tl.arange(0, HALF)[None, :]
    jm = j < half
    table = b * cb + s * cs
    c1 = tl.load(C + table + j, mask=jm, other=0.0).to(tl.float32)
    c2 = tl.load(C + table + half + j, mask=jm, other=0.0).to(tl.float32)
    s1 = tl.load(S + table + j, mask=jm, other=0.0).to(tl.float32)
    s2 = tl.load(S + table + half + j, mask=jm, other=0.0).to(tl.float32)
    _rotate_heads(Q, QO, b * qb + s * qs, b * qob + s * qos, q_heads, qh, qoh,
                  c1, c2, s1, s2, half, rot, head_dim, Q_HEADS, HALF, PASS, BACKWARD)  # fmt: skip
    _rotate_heads(K, KO, b * kb + s * ks, b * kob + s * kos, k_heads, kh, koh,
                  c1, c2, s1, s2, half, rot, head_dim, K_HEADS, HALF, PASS, BACKWARD)  # fmt: skip
