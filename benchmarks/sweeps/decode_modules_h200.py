"""Where kernelized Llama decode pays its host time: each module of one decode step, eager
against kernelized, at batch 1.

The models suite's Llama (d=4096, 4 layers, GQA 32/8), eager and kernelized from the same
seed. After a 256-token prefill, one decode forward records each module's inputs; then, per
module, the host's time for `--calls` back-to-back calls (the clock read before the device is
synchronized, so only the launch path counts while the GPU keeps up) and the time of the
same loop with the GPU waited for. Attention modules run without the cache (its update costs
both alike). Then the whole decode forward over the cache, cropped back after each call, the
prompt's prefill forward (what `generate` runs first), and the models suite's whole step
(`generate`), eager and kernelized taking turns.

    python benchmarks/sweeps/decode_modules_h200.py [--calls 50] [--steps 7] [--out DIR] [--tiny]

Writes `<out>/decode_modules_<device>.md`.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suites"))

import torch
from _harness.provenance import results_dir, run_stamp, write_markdown
from _harness.timing import host_profile
from models_h200 import contender, time_in_turns, works

MODULES = (
    "model.layers.0.input_layernorm",
    "model.layers.0.self_attn.q_proj",
    "model.layers.0.self_attn.k_proj",
    "model.layers.0.mlp.gate_proj",
    "model.layers.0.mlp.down_proj",
    "model.layers.0.mlp",
    "model.layers.0.self_attn",
    "model.layers.0",
    "model.norm",
    "lm_head",
)
CACHE_KEYWORDS = ("past_key_values", "cache")  # transformers renamed it after 5.17


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def recorded_inputs(model: torch.nn.Module, ids: torch.Tensor) -> tuple[dict, Any]:
    """Each of MODULES' (args, kwargs) in one decode forward after a prefill of `ids`, and the
    cache as the prefill left it."""
    from transformers import DynamicCache

    found: dict[str, tuple] = {}

    def keep(name: str) -> Callable:
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            kwargs = {k: (None if k in CACHE_KEYWORDS else v) for k, v in kwargs.items()}
            found.setdefault(name, (args, kwargs))

        return hook

    cache = DynamicCache(config=model.config)
    model(input_ids=ids, past_key_values=cache, use_cache=True)
    handles = [
        model.get_submodule(name).register_forward_pre_hook(keep(name), with_kwargs=True)
        for name in MODULES
    ]
    model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True)
    for handle in handles:
        handle.remove()
    cache.crop(-1)  # a negative length removes tokens, in every transformers version
    return found, cache


def host_and_loop_us(fn: Callable[[], Any], calls: int, repeats: int = 7) -> tuple[float, float]:
    """Median µs per call of `calls` back-to-back calls: the host's alone (clock read before the
    synchronize) and with the GPU (after it)."""
    fn()
    _sync()
    host, loop = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        issued = time.perf_counter()
        _sync()
        done = time.perf_counter()
        host.append((issued - start) / calls * 1e6)
        loop.append((done - start) / calls * 1e6)
    return statistics.median(host), statistics.median(loop)


def decode_forward(model: torch.nn.Module, ids: torch.Tensor, cache: Any) -> Callable[[], Any]:
    token = ids[:, -1:]

    def run() -> None:
        model(input_ids=token, past_key_values=cache, use_cache=True)
        cache.crop(-1)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--steps", type=int, default=7, help="generate steps of each, in turns")
    parser.add_argument("--tiny", action="store_true", help="a CPU smoke run")
    parser.add_argument("--out", default=str(results_dir("models")))
    args = parser.parse_args()
    device = "cpu" if args.tiny else "cuda"
    work = next(w for w in works(device, args.tiny) if w.work.startswith("decode b1"))
    rows: dict[str, dict[str, tuple[float, float]]] = {}
    forwards = {}
    with torch.inference_mode():
        for name, kernelized in (("eager", False), ("kernelized", True)):
            model, _ = contender(work, kernelized, compiled=False)
            ids = work.batch(0)
            inputs, cache = recorded_inputs(model, ids)
            for module in MODULES:
                given, kwargs = inputs[module]
                call = functools.partial(model.get_submodule(module), *given, **kwargs)
                rows.setdefault(module, {})[name] = host_and_loop_us(call, args.calls)
            forward = decode_forward(model, ids, cache)
            rows.setdefault("decode forward (cache 256)", {})[name] = host_and_loop_us(forward, 5)
            prefill = functools.partial(model, input_ids=ids, use_cache=False, logits_to_keep=1)
            rows.setdefault("prefill forward (256 tokens)", {})[name] = host_and_loop_us(prefill, 3)
            forwards[name] = (model, forward)
        profiles = {n: host_profile(f, 20, args.top) for n, (_, f) in forwards.items()}
    models = {name: model for name, (model, _) in forwards.items()}
    steps = time_in_turns(work, models, device, args.steps)
    failed = {name: ms for name, ms in steps.items() if isinstance(ms, str)}
    if failed:
        raise RuntimeError(f"the generate step failed: {failed}")
    profiles |= {
        f"{name} generate step": host_profile(
            functools.partial(work.step, model, work.batch(0)), 1, args.top
        )
        for name, model in models.items()
    }
    lines = ["# Kernelized Llama decode b1, module by module", ""]
    lines += ["  ".join(f"{k}: {v}" for k, v in run_stamp().items()), ""]
    lines += [
        f"µs per call, median of 7 loops of {args.calls} calls (decode forward: 5, prefill: 3). "
        "host: the "
        "clock read before the device is synchronized; loop: after.",
        "",
        "| module | eager host | kernelized host | ratio | eager loop | kernelized loop | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for module, got in rows.items():
        (eh, el), (kh, kl) = got["eager"], got["kernelized"]
        lines.append(
            f"| {module} | {eh:.1f} | {kh:.1f} | {kh / eh:.2f} | {el:.1f} | {kl:.1f} | "
            f"{kl / el:.2f} |"
        )
    eager, ours = steps["eager"], steps["kernelized"]
    lines += [
        "",
        f"The suite's whole step (`generate`, 256 + 32 tokens), eager and kernelized in turns, "
        f"median of {args.steps} each: eager {eager:.2f} ms, kernelized {ours:.2f} ms, "
        f"ratio (eager / kernelized) {eager / ours:.2f}.",
    ]
    for name, text in profiles.items():
        lines += ["", f"Host profile of {name} (cProfile; forwards: 20 of them):", ""]
        lines += ["```", text, "```"]
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu_dev"
    write_markdown(args.out, "decode_modules", device_name, lines)


if __name__ == "__main__":
    main()
