"""Split-KV decode plans against torch's SDPA at decode: the GPU's time and the time as called.

One query token per sequence, bf16, GQA 32 query / 8 KV heads, head_dim 128, over a full KV
cache (issue 33's decode shapes). For each shape it times torch's SDPA (cuDNN and FlashAttention
forced, and as a plain call picks), AttentionDecodeOp and AttentionFwdOp as dispatched, and the
TileLang decode kernel (`TileLangCacheDecode`) built with each plan variant and called directly
(`decode`: its buffers allocated, both launches). Three figures each, medians of do_bench with
the L2 cleared: `graphed`, the replay of a CUDA graph of one call (the GPU's time, what a
CUDA-graphed decode loop pays); `called`, the call as made (host and GPU, whichever is
slower); KV bandwidth as % of a same-run copy, from each; and `loop`, 200 calls back to back
(the L2 warm: at 16 MB the cache stays in it).

A variant is blocks/block_n[/tN][/tmaS]: the key slices fill the SMs `blocks` deep, `block_n`
keys a step, N threads per block (the plan's own if left out), and with tmaS the K and V tiles
come through TMA, S in flight (sm_90a, warp-specialized).

    python benchmarks/sweeps/decode_plans_h200.py [--shapes 1x4096,...] [--variants 2/64,...]
        [--rounds 2] [--out DIR]

Writes `<out>/decode_plans_<device>.md`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
from _harness.builds import built, prebuild, variant_contenders
from _harness.copies import copy_gbps
from _harness.provenance import results_dir, run_stamp, write_markdown
from _harness.timing import (
    Forced,
    bench,
    checked_runs,
    graphed,
    host_profile,
    kernel_breakdown,
    loop_us,
)
from torch.nn.attention import SDPBackend, sdpa_kernel

from tileops import AttentionDecodeOp, AttentionFwdOp

HEADS, KV_HEADS, DIM, DTYPE = 32, 8, 128, torch.bfloat16
SHAPES = "1x4096,1x32768,1x131072,16x4096,64x4096,64x16384"
VARIANTS = "2/64,2/64/tma2,2/64/tma3,2/64/tma4,1/64/tma4,2/128/tma2,4/64/tma2"
SDPA = {"cuDNN": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def variant_kernel(batch: int, capacity: int, spec: str) -> Any:
    """The decode kernel for (batch, capacity) built with the plan `spec` (blocks/block_n)."""
    from tileops.ops import AttentionDecodeCall
    from tileops_cuda.attention.kernels import TileLangCacheDecode
    from tileops_cuda.attention.plans import decode_plan

    blocks, block_n, *options = spec.split("/")
    threads = [int(o[1:]) for o in options if o.startswith("t") and not o.startswith("tma")]
    tma = [int(o[3:]) for o in options if o.startswith("tma")]

    class Variant(TileLangCacheDecode):
        if tma:
            features, pass_configs = "a", None  # sm_90a: TMA, warp-specialized

        @classmethod
        def plan(cls, call: Any) -> Any:
            plan = decode_plan(call, call.batch, call.kv_heads, int(blocks), int(block_n), *tma)
            return dataclasses.replace(plan, threads=threads[0]) if threads else plan

    call = AttentionDecodeCall(
        device=torch.device("cuda:0"), batch=batch, heads=HEADS, kv_heads=KV_HEADS, q_len=1,
        capacity=capacity, head_dim=DIM, v_dim=DIM, causal=True, scale=DIM**-0.5,
        dtype=DTYPE, window=None,
    )  # fmt: skip
    return built(Variant, call)


def contenders(batch: int, capacity: int, variants: list[str]) -> tuple[dict, torch.Tensor, int]:
    """(name: call, or a Forced one, or the error that kept it from building), SDPA's output
    to check against, the K and V bytes."""
    q = torch.randn(batch, HEADS, 1, DIM, device="cuda", dtype=DTYPE)
    k, v = (torch.randn(batch, KV_HEADS, capacity, DIM, device="cuda", dtype=DTYPE) for _ in "kv")
    lens = torch.full((batch,), capacity, dtype=torch.int32, device="cuda")
    fwd, dec = AttentionFwdOp(causal=True), AttentionDecodeOp(causal=True)
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    found: dict[str, Callable[[], Any]] = {"SDPA as called": sdpa}
    for name, backend in SDPA.items():
        found[f"SDPA {name}"] = Forced(lambda backend=backend: sdpa_kernel(backend), sdpa)
    found["AttentionDecodeOp (dispatched)"] = lambda: dec(q, k, v, lens)
    found["AttentionFwdOp (dispatched)"] = lambda: fwd(q, k, v)
    build = lambda spec: variant_kernel(batch, capacity, spec)  # noqa: E731
    found.update(variant_contenders(variants, build, lambda kernel: kernel.decode(q, k, v, lens)))
    want = sdpa().float()
    return found, want, 2 * k.numel() * k.element_size()


def timed(fn: Callable[[], Any], rounds: int) -> tuple[float, float, float]:
    """(graphed, called, loop) milliseconds of a plain call (a forced one inside its context)."""
    return bench(graphed(fn), rounds), bench(fn, rounds), loop_us(fn) / 1e3


def rows_for(batch: int, capacity: int, variants: list[str], rounds: int) -> list[str]:
    found, want, kv_bytes = contenders(batch, capacity, variants)
    copy = copy_gbps(kv_bytes, rounds)
    lines = []
    for name, result in checked_runs(found, want, lambda fn: timed(fn, rounds)).items():
        label = f"| {batch} x {capacity} | {kv_bytes / 2**20:.0f} | {name} |"
        if isinstance(result, str):
            lines.append(f"{label} {result} | | | | | |")
            continue
        error, (graph_ms, call_ms, loop_ms) = result
        pct = [100 * kv_bytes / ms / 1e6 / copy for ms in (graph_ms, call_ms)]
        lines.append(f"{label} {graph_ms * 1e3:.1f} | {pct[0]:.0f} | {call_ms * 1e3:.1f} "
                     f"| {pct[1]:.0f} | {loop_ms * 1e3:.1f} | {error:.1e} |")  # fmt: skip
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--variants", default=VARIANTS)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(results_dir("attention")))
    args = parser.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    variants = args.variants.split(",") if args.variants else []
    batches = {batch: capacity for batch, capacity in shapes}  # plans depend on the batch only
    jobs = [(b, n, spec) for b, n in batches.items() for spec in variants]
    prebuild(variant_kernel, jobs)
    stamp = run_stamp()
    lines = [f"# Decode plans on {stamp['device']}\n",
             f"{stamp['date']}, commit {stamp['commit']}, torch {stamp['torch']}; bf16, GQA "
             f"{HEADS}/{KV_HEADS}, head_dim {DIM}, q_len 1, full caches; medians of do_bench "
             f"(L2 cleared), best of {args.rounds}; % of a same-run copy of the K and V bytes.\n",
             "| batch x keys | KV MB | contender | graphed us | % copy | called us | % copy "
             "| loop us | rel. error |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for batch, capacity in shapes:
        lines += rows_for(batch, capacity, variants, args.rounds)
        torch.cuda.empty_cache()
    batch, capacity = shapes[0]
    found, _, _ = contenders(batch, capacity, [])
    decode = found["AttentionDecodeOp (dispatched)"]
    lines += [
        f"\n## GPU kernels of AttentionDecodeOp, {batch} x {capacity} (median us, L2 cleared)\n"
    ] + [f"- {name[:90]}: {us:.1f}" for name, us in kernel_breakdown(decode)]
    profile = host_profile(decode, 200, 15)
    lines += [f"\n## Host profile: AttentionDecodeOp, {batch} x {capacity}, 200 calls\n",
              "```", profile, "```"]  # fmt: skip
    write_markdown(args.out, "decode_plans", stamp["device"], lines)


if __name__ == "__main__":
    main()
