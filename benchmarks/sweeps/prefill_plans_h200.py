"""TileLang prefill forward plans against torch's SDPA backends: TFLOP/s at issue 33's shapes.

bf16, GQA 32 query / 8 KV heads, head_dim 128, batch x seq = 16K tokens, causal and not; TFLOP/s
count 4 b h s^2 d, halved when causal. For each shape it times SDPA with cuDNN and with
FlashAttention forced, AttentionFwdOp as dispatched, and the sm_90a TileLang forward built with
each plan variant and called directly (its outputs allocated, one launch). Medians of do_bench
with the L2 cleared, best of `--rounds`; each row carries its error against cuDNN's output.

A variant is `auto` (fwd_program: TileLang's own pipeline and warp specialization) or `ws`
(fwd_ws_program: the hand-scheduled producer and consumers), optionally /nN (keys per step),
/sS (K and V buffers) and, with ws, /p (the consumer warpgroups issue their MMAs in turns),
/h (causal: the query blocks with the most keys launch first) and /P (one persistent block an
SM walks the query blocks, the most keys first).

    python benchmarks/sweeps/prefill_plans_h200.py [--seqs 1024,4096,16384]
        [--variants ws,ws/p,ws/P,ws/p/P] [--rounds 2] [--out DIR]

Writes `<out>/prefill_plans_<device>.md`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
from _harness.builds import built, prebuild, variant_contenders
from _harness.provenance import results_dir, run_stamp, write_markdown
from _harness.timing import Forced, bench, checked_runs
from torch.nn.attention import SDPBackend, sdpa_kernel

from tileops import AttentionFwdOp

HEADS, KV_HEADS, DIM, DTYPE, TOKENS = 32, 8, 128, torch.bfloat16, 16384
SDPA = {"cuDNN": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
FLAGS = {"p": "pingpong", "h": "heavy_first"}  # a variant's /p, /h; /P sets workers


def variant_kernel(causal: bool, spec: str, seq: int = 1024) -> Any:
    """The sm_90a forward for `causal` built with the plan `spec` (lengths are symbolic)."""
    from tileops.ops import AttentionCall
    from tileops_cuda.attention.kernels import TileLangFlashFwdSm90

    kind, *options = spec.split("/")
    changes: dict[str, Any] = {"overlap": kind == "ws"}
    for option in options:
        if option in FLAGS:
            changes[FLAGS[option]] = True
            continue
        if option == "P":
            changes["workers"] = torch.cuda.get_device_properties(0).multi_processor_count
            continue
        changes[{"n": "block_n", "s": "stages"}[option[0]]] = int(option[1:])

    class Variant(TileLangFlashFwdSm90):
        @classmethod
        def plan(cls, call: Any) -> Any:
            return dataclasses.replace(super().plan(call), **changes)

    call = AttentionCall(
        device=torch.device("cuda:0"), batch=TOKENS // seq, heads=HEADS, kv_heads=KV_HEADS,
        q_len=seq, kv_len=seq, head_dim=DIM, v_dim=DIM, causal=causal, scale=DIM**-0.5,
        dtype=DTYPE, window=None,
    )  # fmt: skip
    return built(Variant, call)


def contenders(seq: int, causal: bool, variants: list[str]) -> tuple[dict, Any]:
    """(name: call, a Forced one, or the error that kept it from building), the inputs."""
    batch = TOKENS // seq
    q = torch.randn(batch, HEADS, seq, DIM, device="cuda", dtype=DTYPE)
    k, v = (torch.randn(batch, KV_HEADS, seq, DIM, device="cuda", dtype=DTYPE) for _ in "kv")
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)  # noqa: E731
    found: dict[str, Any] = {
        f"SDPA {name}": Forced(lambda backend=backend: sdpa_kernel(backend), sdpa)
        for name, backend in SDPA.items()
    }
    fwd = AttentionFwdOp(causal=causal)
    found["AttentionFwdOp (dispatched)"] = lambda: fwd(q, k, v)
    build = lambda spec: variant_kernel(causal, spec, seq)  # noqa: E731
    found.update(variant_contenders(variants, build, lambda kernel: kernel.forward(q, k, v)))
    return found, sdpa


def rows_for(seq: int, causal: bool, variants: list[str], rounds: int) -> list[str]:
    found, sdpa = contenders(seq, causal, variants)
    with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        want = sdpa().float()
    flops = 4 * (TOKENS // seq) * HEADS * seq * seq * DIM / (2 if causal else 1)
    lines = []
    for name, result in checked_runs(found, want, lambda fn: bench(fn, rounds)).items():
        label = f"| {'causal' if causal else 'full'} | {seq} | {name} |"
        if isinstance(result, str):
            lines.append(f"{label} {result} | | |")
            continue
        error, ms = result
        lines.append(f"{label} {flops / ms / 1e9:.0f} | {ms:.3f} | {error:.1e} |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", default="1024,4096,16384")
    parser.add_argument("--variants", default="ws,ws/p,ws/P,ws/p/P")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(results_dir("attention")))
    args = parser.parse_args()
    seqs = [int(s) for s in args.seqs.split(",")]
    variants = args.variants.split(",") if args.variants else []
    jobs = [(causal, spec) for causal in (True, False) for spec in variants]
    prebuild(variant_kernel, jobs)
    stamp = run_stamp()
    lines = [f"# Prefill plans on {stamp['device']}\n",
             f"{stamp['date']}, commit {stamp['commit']}, torch {stamp['torch']}; bf16, GQA "
             f"{HEADS}/{KV_HEADS}, head_dim {DIM}, {TOKENS} tokens a call; medians of do_bench "
             f"(L2 cleared), best of {args.rounds}; error against cuDNN's output.\n",
             "| mask | seq | contender | TFLOP/s | ms | rel. error |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for causal in (True, False):
        for seq in seqs:
            lines += rows_for(seq, causal, variants, args.rounds)
            torch.cuda.empty_cache()
    write_markdown(args.out, "prefill_plans", stamp["device"], lines)


if __name__ == "__main__":
    main()
