"""What LayerNorm's and RMSNorm's parameters cost on one GPU: the dispatched op at M*N = 2^26
(or the powers of two `--elements` gives: a larger problem shows how much the last wave of
blocks costs at 2^26), bfloat16, with weight and bias, weight only, and none, as % of a
same-run copy of x's bytes (read and write; the parameters' own bytes are not counted, so
their cost shows).

    python benchmarks/sweeps/norm_params_h200.py [--sizes 65536,131072] [--elements 26,28]

Prints one line per problem size and row length.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
from _harness.copies import copy_gbps
from _harness.timing import bench

from tileops.ops import LayerNormFwdOp, RMSNormFwdOp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="65536,131072")
    parser.add_argument("--elements", default="26", help="log2 of M*N, comma-separated")
    args = parser.parse_args()
    for log2 in (int(e) for e in args.elements.split(",")):
        for n in (int(s) for s in args.sizes.split(",")):
            measure(1 << log2, n)


def measure(elements: int, n: int) -> None:
    """One line: every parameter case of rows of n at M*N = elements."""
    moved = 2 * elements * 2  # x read and y written, bfloat16
    copy = copy_gbps(moved, 3)
    x = torch.randn(elements // n, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=x.dtype)
    b = torch.randn_like(w)
    cases = {
        "layer_norm w+b": (LayerNormFwdOp(n), (x, w, b)),
        "layer_norm w": (LayerNormFwdOp(n), (x, w, None)),
        "layer_norm none": (LayerNormFwdOp(n), (x, None, None)),
        "rms_norm w": (RMSNormFwdOp(n), (x, w)),
        "rms_norm none": (RMSNormFwdOp(n), (x, None)),
    }
    scores = []
    for name, (op, call_args) in cases.items():
        op(*call_args)  # build outside the timing
        ms = bench(lambda op=op, a=call_args: op(*a), 3)
        scores.append(f"{name} {100 * moved / ms / 1e6 / copy:.1f}")
    print(f"2^{elements.bit_length() - 1}", n, "; ".join(scores), flush=True)


if __name__ == "__main__":
    main()
