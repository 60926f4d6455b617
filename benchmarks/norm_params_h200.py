"""What LayerNorm's and RMSNorm's parameters cost on one GPU: the dispatched op at M*N = 2^26,
bfloat16, with weight and bias, weight only, and none, as % of a same-run copy of x's bytes
(read and write; the parameters' own bytes are not counted, so their cost shows).

    python benchmarks/norm_params_h200.py [--sizes 65536,131072]

Prints one line per row length.
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from tileops.ops import LayerNormFwdOp, RMSNormFwdOp

ELEMENTS = 1 << 26


def percent_of_copy(fn, moved: int, copy_gbps: float) -> float:
    ms = min(do_bench(fn, return_mode="median") for _ in range(3))
    return 100 * moved / ms / 1e6 / copy_gbps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="65536,131072")
    args = parser.parse_args()
    src = torch.empty(1 << 28, dtype=torch.int8, device="cuda")
    dst = torch.empty_like(src)
    copy_gbps = 2 * src.numel() / do_bench(lambda: dst.copy_(src), return_mode="median") / 1e6
    for n in (int(s) for s in args.sizes.split(",")):
        x = torch.randn(ELEMENTS // n, n, device="cuda", dtype=torch.bfloat16)
        w, b = (
            torch.randn(n, device="cuda", dtype=x.dtype),
            torch.randn(n, device="cuda", dtype=x.dtype),
        )
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
            share = percent_of_copy(lambda op=op, a=call_args: op(*a), 4 * x.numel(), copy_gbps)
            scores.append(f"{name} {share:.1f}")
        print(n, "; ".join(scores), flush=True)


if __name__ == "__main__":
    main()
