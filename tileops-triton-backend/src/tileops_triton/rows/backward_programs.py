"""Triton programs of the row-wise backward passes (imported on first launch: it imports triton).

Norms (LayerNorm with CENTER, RMSNorm without): a persistent grid of programs, each walking its
share of the rows. The row statistics (mean, rstd) are recomputed from x, which the program
reads for dx anyway: no extra traffic, and the forward saves nothing. Each program sums
dy * xhat (and dy) over its rows in float32 and writes one partial row per program into a
(programs, n) buffer; `column_sums` then adds the partials in a fixed order: deterministic,
no atomics.
- fused: a tile of ROWS whole rows in registers, one read of x and dy, one write of dx;
- looped: one row at a time in CHUNK-wide slices, for rows too long for registers: a pass of
  sums (shifted by the row's first element, as the forward's looped LayerNorm), then a pass
  that writes dx and adds into the program's own partial row.
Softmax: dx = y * (dy - sum(y * dy)), from the forward's y; fused tiles or looped rows alike.
Offsets are int64: rows * n may exceed 2**31.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def norm_backward_fused(
    X, DY, W, DX, DW_PART, DB_PART, rows, n, eps,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, CENTER: tl.constexpr, HAS_W: tl.constexpr,
    NEED_DX: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)  # so is the loop's tile: int64 offsets
    cols = tl.arange(0, BLOCK)
    in_row = cols < n
    if HAS_W:
        w = tl.load(W + cols, mask=in_row, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], tl.float32)
    db = tl.zeros([BLOCK], tl.float32)
    for tile in range(pid, tl.cdiv(rows, ROWS), tl.num_programs(0)):
        r = tile * ROWS + tl.arange(0, ROWS)
        mask = (r[:, None] < rows) & in_row[None, :]
        offs = r[:, None] * n + cols[None, :]
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        if CENTER:
            x = tl.where(mask, x - (tl.sum(x, axis=1) / n)[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n + eps)
        xhat = x * rstd[:, None]
        if NEED_DW:
            dw += tl.sum(dy * xhat, axis=0)
        if NEED_DB:
            db += tl.sum(dy, axis=0)
        if NEED_DX:
            g = dy * w[None, :] if HAS_W else dy
            dx = g - xhat * (tl.sum(g * xhat, axis=1) / n)[:, None]
            if CENTER:
                dx -= (tl.sum(g, axis=1) / n)[:, None]
            tl.store(DX + offs, (dx * rstd[:, None]).to(DX.dtype.element_ty), mask=mask)
    if NEED_DW:
        tl.store(DW_PART + pid * n + cols, dw, mask=in_row)
    if NEED_DB:
        tl.store(DB_PART + pid * n + cols, db, mask=in_row)


@triton.jit
def norm_backward_looped(
    X, DY, W, DX, DW_PART, DB_PART, rows, n, eps,
    CHUNK: tl.constexpr, CENTER: tl.constexpr, HAS_W: tl.constexpr,
    NEED_DX: tl.constexpr, NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)  # so is the loop's row: int64 offsets
    cols = tl.arange(0, CHUNK)
    dw_row, db_row = DW_PART + pid * n, DB_PART + pid * n
    for row in range(pid, rows, tl.num_programs(0)):
        offset = row * n
        x_row, dy_row, dx_row = X + offset, DY + offset, DX + offset
        shift = tl.load(x_row).to(tl.float32) if CENTER else 0.0
        s_d = tl.zeros([CHUNK], tl.float32)
        s_dd = tl.zeros([CHUNK], tl.float32)
        s_gd = tl.zeros([CHUNK], tl.float32)
        s_g = tl.zeros([CHUNK], tl.float32)
        for start in range(0, n, CHUNK):
            mask = start + cols < n
            d = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            d = tl.where(mask, d - shift, 0.0)
            g = tl.load(dy_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_W:
                g *= tl.load(W + start + cols, mask=mask, other=0.0).to(tl.float32)
            s_d += d
            s_dd += d * d
            s_gd += g * d
            s_g += g
        mean_d = tl.sum(s_d, axis=0) / n if CENTER else 0.0
        rstd = tl.rsqrt(tl.maximum(tl.sum(s_dd, axis=0) / n - mean_d * mean_d, 0.0) + eps)
        sum_g = tl.sum(s_g, axis=0)
        c1 = rstd * (tl.sum(s_gd, axis=0) - mean_d * sum_g) / n  # mean of g * xhat
        c2 = sum_g / n if CENTER else 0.0
        for start in range(0, n, CHUNK):
            mask = start + cols < n
            x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            xhat = (x - shift - mean_d) * rstd
            dy = tl.load(dy_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            if NEED_DX:
                g = dy
                if HAS_W:
                    g *= tl.load(W + start + cols, mask=mask, other=0.0).to(tl.float32)
                dx = (g - c2 - xhat * c1) * rstd
                tl.store(dx_row + start + cols, dx.to(DX.dtype.element_ty), mask=mask)
            if NEED_DW:  # the program's own partial row: no other program writes it
                part = tl.load(dw_row + start + cols, mask=mask, other=0.0)
                tl.store(dw_row + start + cols, part + dy * xhat, mask=mask)
            if NEED_DB:
                part = tl.load(db_row + start + cols, mask=mask, other=0.0)
                tl.store(db_row + start + cols, part + dy, mask=mask)


@triton.jit
def column_sums(PART, OUT, parts, n, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """OUT[j] = sum over p of PART[p, j], in a fixed order, rounded once to OUT's dtype."""
    cols = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_P, BLOCK_N], tl.float32)
    for start in range(0, parts, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)
        mask = (p[:, None] < parts) & (cols[None, :] < n)
        acc += tl.load(PART + p[:, None].to(tl.int64) * n + cols[None, :], mask=mask, other=0.0)
    tl.store(OUT + cols, tl.sum(acc, axis=0).to(OUT.dtype.element_ty), mask=cols < n)


@triton.jit
def softmax_backward_fused(Y, DY, DX, rows, n, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (r[:, None] < rows) & (cols[None, :] < n)
    offs = r[:, None] * n + cols[None, :]
    y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    dx = y * (dy - tl.sum(y * dy, axis=1)[:, None])
    tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def softmax_backward_looped(Y, DY, DX, n, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    y_row, dy_row, dx_row = Y + row * n, DY + row * n, DX + row * n
    cols = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], tl.float32)
    for start in range(0, n, CHUNK):
        mask = start + cols < n
        y = tl.load(y_row + start + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        dy = tl.load(dy_row + start + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        acc += y.to(tl.float32) * dy.to(tl.float32)
    dot = tl.sum(acc, axis=0)
    slices = tl.cdiv(n, CHUNK)
    for i in range(0, slices):  # backwards: the slices read last are still in L2
        start = (slices - 1 - i) * CHUNK
        mask = start + cols < n
        y = tl.load(y_row + start + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        dy = tl.load(dy_row + start + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        dx = y.to(tl.float32) * (dy.to(tl.float32) - dot)
        tl.store(dx_row + start + cols, dx.to(DX.dtype.element_ty), mask=mask)
