"""A rejected design for 32K bfloat16 rows in Triton, kept measurable: each row split over
SPLIT programs, each holding its part in registers and reading the other parts only for the
statistics (their second read served by L2), so a program needs half the registers of a
held row and more programs share a multiprocessor. LayerNorm (statistics in one reduction per
part, or SPLIT = 2 in a single one) and softmax (SPLIT = 2), against the served plans
(tileops_triton.rows.plans) and a same-run copy of the op's bytes:

    python benchmarks/archive/triton_split_rows_h200.py [--n 32768]

Prints one line per configuration: % of copy and the relative error against float32 torch.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from _harness.copies import copy_moving
from _harness.ops import ELEMENTS, EPS
from _harness.timing import bench

from tileops_triton.rows.launch import layer_norm, softmax
from tileops_triton.rows.norm_programs import _add_pairs, store_shifted_layer_norm, widened
from tileops_triton.rows.plans import row_plan
from tileops_triton.rows.softmax_programs import _merged


@triton.jit
def _shifted_sums(x_row, cols, n, shift):
    mask = cols < n
    d = tl.where(mask, tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) - shift, 0.0)
    return tl.reduce((d, d * d), 0, _add_pairs)


@triton.jit
def layer_norm_split(X, W, B, Y, n, eps, BLOCK: tl.constexpr, SPLIT: tl.constexpr):
    """Program `part` of its row writes BLOCK elements; the other parts are read for the sums."""
    row = (tl.program_id(0) // SPLIT).to(tl.int64)
    part = tl.program_id(0) % SPLIT
    x_row = X + row * n
    offs = tl.arange(0, BLOCK)
    cols = part * BLOCK + offs
    mask = cols < n
    x = tl.load(x_row + cols, mask=mask, other=0.0)
    shift = tl.load(x_row).to(tl.float32)
    d = tl.where(mask, x.to(tl.float32) - shift, 0.0)
    s, s2 = tl.reduce((d, d * d), 0, _add_pairs)
    for q in tl.static_range(1, SPLIT):
        a, b = _shifted_sums(x_row, ((part + q) % SPLIT) * BLOCK + offs, n, shift)
        s += a
        s2 += b
    store_shifted_layer_norm(x, shift, s, s2, n, eps, W, B, Y + row * n, cols, mask, True, True)


@triton.jit
def _halves(X, n, BLOCK: tl.constexpr):
    """Two programs per row: the row, its start, and the columns of this program's half and of
    the other's."""
    row = (tl.program_id(0) // 2).to(tl.int64)
    part = tl.program_id(0) % 2
    offs = tl.arange(0, BLOCK)
    return row, X + row * n, part * BLOCK + offs, (1 - part) * BLOCK + offs


@triton.jit
def layer_norm_halves(X, W, B, Y, n, eps, BLOCK: tl.constexpr):
    """Two programs per row, both halves' sums in a single reduction."""
    row, x_row, cols, other = _halves(X, n, BLOCK)
    mask = cols < n
    x = tl.load(x_row + cols, mask=mask, other=0.0)
    o = tl.load(x_row + other, mask=other < n, other=0.0)
    shift = tl.load(x_row).to(tl.float32)
    d = tl.where(mask, x.to(tl.float32) - shift, 0.0)
    od = tl.where(other < n, o.to(tl.float32) - shift, 0.0)
    s, s2 = tl.reduce((d + od, d * d + od * od), 0, _add_pairs)
    store_shifted_layer_norm(x, shift, s, s2, n, eps, W, B, Y + row * n, cols, mask, True, True)


@triton.jit
def softmax_halves(X, Y, n, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """Two programs per row; each lane's (max, sum) pairs over both halves merge in one tree."""
    row, x_row, cols, other = _halves(X, n, BLOCK)
    mask = cols < n
    x = tl.load(x_row + cols, mask=mask, other=-float("inf"))
    o = tl.load(x_row + other, mask=other < n, other=-float("inf"))
    mine = tl.reshape(x.to(tl.float32), [BLOCK // VEC, VEC])
    theirs = tl.reshape(o.to(tl.float32), [BLOCK // VEC, VEC])
    local_max = tl.maximum(tl.max(mine, axis=1), tl.max(theirs, axis=1))
    base = tl.where(local_max == -float("inf"), 0.0, local_max)
    local_sum = tl.sum(tl.exp(mine - base[:, None]), axis=1)
    local_sum += tl.sum(tl.exp(theirs - base[:, None]), axis=1)
    row_max, row_sum = tl.reduce((local_max, local_sum), 0, _merged)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    y = tl.exp(widened(x) - row_max) / row_sum
    tl.store(Y + row * n + cols, y.to(Y.dtype.element_ty), mask=mask)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32768)
    n = parser.parse_args().n
    rows = ELEMENTS // n
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    w, b = (torch.randn(n, device="cuda", dtype=x.dtype) for _ in range(2))
    y = torch.empty_like(x)
    want = {
        "layer_norm": F.layer_norm(x.float(), (n,), w.float(), b.float(), EPS),
        "softmax": torch.softmax(x.float(), -1),
    }
    copy = {
        "layer_norm": bench(copy_moving((2 * x.numel() + 2 * n) * 2), 3),
        "softmax": bench(copy_moving(4 * x.numel()), 3),
    }

    def report(label: str, op: str, fn: Callable[[], object]) -> None:
        try:
            fn()
            error = ((y.float() - want[op]).norm() / want[op].norm()).item()
            print(f"{label}: {100 * copy[op] / bench(fn, 2):.1f}% copy, rel err {error:.1e}")
        except Exception as failure:  # a configuration that cannot compile is reported
            print(f"{label}: failed {str(failure).splitlines()[0][:160]}")

    served = row_plan(n, "layer_norm", x.dtype)
    report(f"LN served {served}", "layer_norm", lambda: layer_norm(served, x, w, b, EPS, y))
    served = row_plan(n, "softmax", x.dtype)
    report(f"SM served {served}", "softmax", lambda: softmax(served, x, y))
    for split, warps, cap in itertools.product((2, 4), (4, 8, 16), (None, 32, 40, 64)):
        launch = {"num_warps": warps, **({"maxnreg": cap} if cap else {})}
        block, grid = n // split, (rows * split,)
        run = partial(layer_norm_split[grid], x, w, b, y, n, EPS, block, split, **launch)
        report(f"LN split {split} {warps}w cap {cap}", "layer_norm", run)
        if split == 2:
            run = partial(layer_norm_halves[grid], x, w, b, y, n, EPS, block, **launch)
            report(f"LN halves one reduction {warps}w cap {cap}", "layer_norm", run)
            run = partial(softmax_halves[grid], x, y, n, block, 8, **launch)
            report(f"SM halves {warps}w cap {cap}", "softmax", run)


if __name__ == "__main__":
    main()
