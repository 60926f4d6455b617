"""Triton program of the fused linear + cross-entropy row step (imported on first launch: it
imports triton).

One program per row of a (rows, vocab) logits block: an online pass keeps a running max and
a rescaled sum of exponentials per lane (and the row's sum, for label smoothing), then the
loss is written in float32 and, with WRITE_GRAD, a second pass overwrites the row in place
with `scale * (softmax - (1 - eps) onehot - eps / vocab)`. The label's logit is read before
the row is overwritten. An ignored row gets loss 0 and zeros (its scale is 0); a label out of
[0, vocab) that is not ignored gets NaN for both.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def ce_rows(
    Z, stride, LABELS, SCALES, LOSS, vocab, ignore_index, smoothing, smooth_share,
    WRITE_GRAD: tl.constexpr, SMOOTH: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    z_row = Z + row * stride
    label = tl.load(LABELS + row).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    t = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        mask = start + cols < vocab
        x = tl.load(z_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        base = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp(m - base) + tl.exp(x - base)
        m = m_new
        if SMOOTH:
            t += tl.where(mask, x, 0.0)
    row_max = tl.max(m, axis=0)
    lse = row_max + tl.log(tl.sum(s * tl.exp(m - row_max), axis=0))
    counted = label != ignore_index
    valid = (label >= 0) & (label < vocab)
    z_label = tl.load(z_row + label, mask=counted & valid, other=0.0).to(tl.float32)
    loss = lse - (1.0 - smoothing) * z_label
    if SMOOTH:
        loss -= smoothing * (tl.sum(t, axis=0) / vocab)
    loss = tl.where(valid, loss, float("nan"))
    tl.store(LOSS + row, tl.where(counted, loss, 0.0))
    if WRITE_GRAD:
        scale = tl.load(SCALES + row).to(tl.float32)
        scale = tl.where(valid | (label == ignore_index), scale, float("nan"))
        for start in range(0, vocab, BLOCK):
            mask = start + cols < vocab
            x = tl.load(z_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            g = tl.exp(x - lse) - smooth_share
            g = tl.where(start + cols == label, g - (1.0 - smoothing), g)
            tl.store(z_row + start + cols, (g * scale).to(Z.dtype.element_ty), mask=mask)
