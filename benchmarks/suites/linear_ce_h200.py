"""Fused linear + cross-entropy training step (forward + backward) at an LLM's vocabulary.

For each token count it times, as interleaved medians of `triton.testing.do_bench`, one step
`loss = CE(hidden @ weight.T, labels); loss.backward()` in bfloat16 (10% of the labels ignored):
torch eager (`F.linear`, then `F.cross_entropy` on the float32 logits, as transformers'
ForCausalLMLoss), `torch.compile` of the same, Liger-Kernel's `LigerFusedLinearCrossEntropyLoss`
where installed, and `tileops.nn.linear_cross_entropy` (the default chunk, and each of
`--chunks`). It also records each one's peak memory above the inputs, and its loss and
gradients' relative error against eager.

    python benchmarks/suites/linear_ce_h200.py [--tokens 4096,8192] [--vocab 128256]
        [--hidden 4096] [--chunks 128,256,1024] [--out DIR]
    python benchmarks/suites/linear_ce_h200.py --tiny    # a CPU smoke run of the script

Writes `<out>/linear_ce_<device>.{md,json}` stamped with the date, device and git commit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
from _harness.provenance import result_path, results_dir, run_stamp

import tileops
import tileops.nn as tnn
from tileops.ops import LinearCrossEntropyGradOp

Step = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def eager_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(hidden, weight).float(), labels, ignore_index=-100)


def contenders(chunks: list[int]) -> dict[str, Step]:
    steps: dict[str, Step] = {"eager": eager_loss}
    steps["compile"] = torch.compile(eager_loss, dynamic=False)
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss(ignore_index=-100)
        steps["liger"] = lambda h, w, y: liger(w, h, y)
    except ImportError:
        print("Liger-Kernel is not installed: its column is left out")
    steps["tileops"] = tnn.linear_cross_entropy
    for rows in chunks:
        steps[f"tileops chunk {rows}"] = lambda h, w, y, rows=rows: tnn.linear_cross_entropy(
            h, w, y, chunk_rows=rows
        )
    return steps


def inputs(tokens: int, vocab: int, hidden: int, device: str, dtype: torch.dtype) -> tuple:
    generator = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(tokens, hidden, device=device, dtype=dtype, generator=generator)
    w = torch.randn(vocab, hidden, device=device, dtype=dtype, generator=generator) / hidden**0.5
    labels = torch.randint(0, vocab, (tokens,), device=device, generator=generator)
    labels[torch.rand(tokens, device=device, generator=generator) < 0.1] = -100
    return h.requires_grad_(), w.requires_grad_(), labels


def step_of(loss: Step, h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> Callable[[], Any]:
    def step() -> torch.Tensor:
        h.grad = w.grad = None
        out = loss(h, w, y)
        out.backward()
        return out

    return step


def peak_gib(step: Callable[[], Any], tensors: tuple, device: str) -> float:
    """GiB allocated at the peak of one step above the inputs alone (no gradients held)."""
    if device != "cuda":
        return float("nan")
    for t in tensors:
        t.grad = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**30


def timed(steps: dict[str, Callable[[], Any]], device: str, rounds: int) -> dict[str, float]:
    if device == "cuda":
        from _harness.timing import bench_all

        return bench_all(steps, rounds)
    times = {}
    for name, step in steps.items():
        step()
        samples = []
        for _ in range(3):
            start = time.perf_counter()
            step()
            samples.append((time.perf_counter() - start) * 1e3)
        times[name] = statistics.median(samples)
    return times


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def measure(tokens: int, args: argparse.Namespace, device: str) -> dict:
    h, w, y = inputs(tokens, args.vocab, args.hidden, device, torch.bfloat16)
    steps = {name: step_of(fn, h, w, y) for name, fn in contenders(args.chunks).items()}
    peaks, errors, reference = {}, {}, None
    for name, step in steps.items():
        step()  # compile, autotune, warm the caches before the measured step
        peaks[name] = peak_gib(step, (h, w), device)
        loss = step().detach()
        found = (loss.float(), h.grad.clone(), w.grad.clone())
        if reference is None:
            reference = found
        errors[name] = max(rel(f, r) for f, r in zip(found, reference, strict=True))
        del found
    times = timed(steps, device, args.rounds)
    op = LinearCrossEntropyGradOp()
    served = op.key_for("linear_cross_entropy_grad", op.call_for(h, w, None))
    return {
        "tokens": tokens,
        "vocab": args.vocab,
        "hidden": args.hidden,
        "ms": times,
        "peak_gib": peaks,
        "rel_err": errors,
        "served_by": served,
        "logits_gib": tokens * args.vocab * 2 / 2**30,
    }


def markdown(results: list[dict], stamp: dict) -> str:
    lines = [
        f"# Fused linear + cross-entropy, bfloat16 forward + backward ({stamp['device']}, "
        f"{stamp['date']}, commit {stamp['commit']}, torch {stamp['torch']})",
        "",
        "Milliseconds per step (median), GiB allocated at the step's peak above its inputs, and",
        "the largest relative error of loss, grad hidden and grad weight against eager.",
        "",
        "| tokens x vocab x hidden | contender | ms | vs eager | peak GiB | rel err |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        shape = f"{r['tokens']} x {r['vocab']} x {r['hidden']}"
        eager = r["ms"]["eager"]
        for name, ms in r["ms"].items():
            label = f"{name} ({r['served_by']})" if name == "tileops" else name
            lines.append(
                f"| {shape} | {label} | {ms:.2f} | {eager / ms:.2f}x | "
                f"{r['peak_gib'][name]:.2f} | {r['rel_err'][name]:.1e} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="4096,8192")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--chunks", default="128,256,1024", help="other chunk_rows to time")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(results_dir("linear_ce")))
    parser.add_argument("--tiny", action="store_true", help="a CPU smoke run at small sizes")
    args = parser.parse_args()
    args.chunks = [int(c) for c in args.chunks.split(",") if c]
    device = "cpu" if args.tiny else "cuda"
    if args.tiny:
        args.tokens, args.vocab, args.hidden, args.chunks = "64", 1000, 32, [16]
    stamp = run_stamp(tileops=tileops.__version__) if device == "cuda" else {
        "device": "cpu", "date": "-", "commit": "-", "torch": torch.__version__,
    }  # fmt: skip
    results = []
    for tokens in map(int, args.tokens.split(",")):
        results.append(measure(tokens, args, device))
        if device == "cuda":
            torch.cuda.empty_cache()
    text = markdown(results, stamp)
    print(text)
    if device == "cuda":
        base = str(result_path(args.out, "linear_ce", stamp["device"], ""))
        Path(base + ".md").write_text(text)
        Path(base + ".json").write_text(json.dumps({"stamp": stamp, "results": results}, indent=1))
        print(f"wrote {base}.md and .json")


if __name__ == "__main__":
    main()
