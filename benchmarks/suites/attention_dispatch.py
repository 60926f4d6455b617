"""Attention's host path at decode, on the CPU: AttentionFwdOp and AttentionDecodeOp through
kernels that do no work but allocate their outputs, at a key length seen before and at a new
length every call (a cache growing by a token a step), against that kernel called directly.

float32 tensors, batch 1, GQA 32/8, head_dim 128, one query token; the best of `--rounds`
medians of `--calls` single calls each (one torch thread). A decode loop's later layers repeat
the first layer's layout; only its first layer meets a new length. AttentionDecodeOp's lengths
are CPU tensors here, so its calls also check their values (on a GPU they are the caller's
promise).

    python benchmarks/suites/attention_dispatch.py [--calls 300] [--rounds 3] [--out DIR]

Writes `<out>/attention_dispatch_cpu.txt`.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
from _harness.provenance import git_commit, results_dir

from tileops import AttentionDecodeOp, AttentionFwdOp, Kernel
from tileops.backend import register_kernel_type
from tileops.ops import AttentionDecodeInterface, AttentionInterface
from tileops.testing import isolated_registry

HEADS, KV_HEADS, DIM, FIRST = 32, 8, 128, 300


def no_work(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What a kernel entry must do at least: allocate out and lse."""
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


class NoWorkAttention(Kernel, AttentionInterface):
    devices = {"cpu"}

    def forward(self, q, k, v):
        return no_work(q)


class NoWorkDecode(Kernel, AttentionDecodeInterface):
    devices = {"cpu"}

    def forward(self, q, k_cache, v_cache, cache_seqlens):
        return no_work(q)


def median_us(call: Callable[[torch.Tensor], Any], caches: list[torch.Tensor]) -> float:
    """Median µs of single calls, one per cache in `caches`."""
    times = []
    for cache in caches:
        start = time.perf_counter()
        call(cache)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def rows(calls: int, rounds: int) -> list[tuple[str, float, float]]:
    """(contender, µs at one length, µs at a new length each call): the best of `rounds`
    medians, the contenders interleaved round by round (the first timing after a large
    allocation runs slow, whichever contender it is)."""
    q = torch.randn(1, HEADS, 1, DIM)
    store = torch.randn(1, KV_HEADS, FIRST + rounds * 3 * calls + 1, DIM)
    same = [store[:, :, :FIRST].contiguous()] * calls
    lens = torch.tensor([FIRST], dtype=torch.int32)
    fwd, dec = AttentionFwdOp(causal=True), AttentionDecodeOp(causal=True)
    contenders = {
        "no-op kernel called directly": lambda k: no_work(q),
        "AttentionFwdOp": lambda k: fwd(q, k, k),
        "AttentionDecodeOp": lambda k: dec(q, k, k, lens),
    }
    for call in contenders.values():
        for _ in range(2):  # settled, its lane made
            call(same[0])
    best = {name: [float("inf"), float("inf")] for name in contenders}
    fresh = FIRST + 1
    for _ in range(rounds):
        for name, call in contenders.items():
            new = [store[:, :, :n].contiguous() for n in range(fresh, fresh + calls)]
            fresh += calls
            timed = median_us(call, same), median_us(call, new)
            best[name] = [min(b, t) for b, t in zip(best[name], timed, strict=True)]
    return [(name, *times) for name, times in best.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(results_dir("dispatch")))
    args = parser.parse_args()
    torch.set_num_threads(1)
    with isolated_registry():
        register_kernel_type(AttentionFwdOp, "no_work", NoWorkAttention)
        register_kernel_type(AttentionDecodeOp, "no_work", NoWorkDecode)
        found = rows(args.calls, args.rounds)
    lines = [
        f"attention dispatch at decode, commit {git_commit()}, python "
        f"{platform.python_version()}, torch {torch.__version__}, {platform.machine()}; best of "
        f"{args.rounds} medians of {args.calls} single calls, µs",
        "",
        f"{'contender':<32} {'one length':>12} {'a new length each call':>24}",
    ]
    lines += [f"{name:<32} {same:>12.1f} {new:>24.1f}" for name, same, new in found]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out) / "attention_dispatch_cpu.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
