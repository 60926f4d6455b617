"""Decode over a growing cache: what a call costs at a key length seen before and at a new one.

A decode loop over transformers' DynamicCache meets a new key length every step; a kernel that
plans per shape (cuDNN's SDPA) pays its plan each time. One query token, bf16, GQA 32/8,
head_dim 128, batch 1. For each contender: the median of 200 calls at one length (300 keys),
and of 200 calls each at a length this process has not run before (every contender its own
range); each call synchronized, so these are host and GPU time together, as a loop pays them.
Then a host profile (cProfile) of AttentionFwdOp and of SDPA at one length.

    python benchmarks/sweeps/decode_lengths_h200.py [--calls 200] [--out DIR]

Writes `<out>/decode_lengths_<device>.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
from _harness.provenance import results_dir, run_stamp, write_markdown
from _harness.timing import host_profile
from torch.nn.attention import SDPBackend, sdpa_kernel

from tileops import AttentionDecodeOp, AttentionFwdOp

HEADS, KV_HEADS, DIM, DTYPE, FIRST = 32, 8, 128, torch.bfloat16, 300


def median_us(fn: Callable[[torch.Tensor, torch.Tensor], Any], lengths: Sequence[int]) -> float:
    """Median µs of synchronized calls over k and v of each length in `lengths`."""
    cache = torch.randn(1, KV_HEADS, max(lengths) + 1, DIM, device="cuda", dtype=DTYPE)
    times = []
    for n in lengths:
        k = cache[:, :, :n].contiguous()
        lens = torch.full((1,), n, dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn(k, lens)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", default=str(results_dir("attention")))
    args = parser.parse_args()
    q = torch.randn(1, HEADS, 1, DIM, device="cuda", dtype=DTYPE)
    fwd, dec = AttentionFwdOp(causal=True), AttentionDecodeOp(causal=True)
    sdpa = lambda k, lens: F.scaled_dot_product_attention(q, k, k, enable_gqa=True)  # noqa: E731
    contenders = [
        ("SDPA as torch picks", sdpa, None),
        ("SDPA cuDNN", sdpa, SDPBackend.CUDNN_ATTENTION),
        ("SDPA flash", sdpa, SDPBackend.FLASH_ATTENTION),
        ("AttentionFwdOp (dispatched)", lambda k, lens: fwd(q, k, k), None),
        ("AttentionDecodeOp (dispatched)", lambda k, lens: dec(q, k, k, lens), None),
    ]
    stamp = run_stamp()
    lines = [f"# Decode over new key lengths on {stamp['device']}\n",
             f"{stamp['date']}, commit {stamp['commit']}, torch {stamp['torch']}; bf16, GQA "
             f"{HEADS}/{KV_HEADS}, head_dim {DIM}, batch 1, one query token; median µs of "
             f"{args.calls} synchronized calls.\n",
             "| contender | one length (300 keys) | a new length each call |",
             "|---|---|---|"]  # fmt: skip
    fresh = FIRST + 1
    for name, fn, backend in contenders:
        with sdpa_kernel(backend) if backend else contextlib.nullcontext(), torch.no_grad():
            same = median_us(fn, [FIRST] * args.calls)
            new = median_us(fn, range(fresh, fresh + args.calls))
        fresh += args.calls
        lines.append(f"| {name} | {same:.0f} | {new:.0f} |")
        print(lines[-1], flush=True)
    k = torch.randn(1, KV_HEADS, FIRST, DIM, device="cuda", dtype=DTYPE)
    with torch.no_grad():
        for name, call in (("AttentionFwdOp", lambda: fwd(q, k, k)), ("SDPA", lambda: sdpa(k, 0))):
            profile = host_profile(call, args.calls, 25)
            lines += [f"\n## Host profile: {name} at one length, {args.calls} calls\n", "```",
                      profile, "```"]  # fmt: skip
    write_markdown(args.out, "decode_lengths", stamp["device"], lines)


if __name__ == "__main__":
    main()
