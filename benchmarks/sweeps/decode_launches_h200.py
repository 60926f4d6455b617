"""What one kernelized Llama decode forward (batch 1, cache 256) launches, and whether any of
it waits for the GPU: the host's synchronizations (torch's sync debug mode), Triton launches
that took Triton's own path rather than `launching.launch`'s direct one, the CUDA API calls
per forward (profiler); the host µs of layer 0's gated MLP and attention with their parts
swapped for torch's one at a time, and of the fused calls alone beside their eager code.

    python benchmarks/sweeps/decode_launches_h200.py [--forwards 5] [--out DIR] [--tiny]

Writes `<out>/decode_launches_<device>.md`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suites"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from _harness.provenance import results_dir, run_stamp, write_markdown
from _harness.timing import relative_paths
from decode_modules_h200 import decode_forward, host_and_loop_us, recorded_inputs
from models_h200 import contender, works

SYNC_MODE_NOTICE = "Synchronization debug mode is a prototype feature"
"""The notice torch warns with when the mode is set, which is no synchronization."""


def synchronizations(forward: Callable[[], Any]) -> list[str]:
    """The warnings of torch's sync debug mode over one forward, and the stack of the first."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            forward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    caught = [w for w in caught if not str(w.message).startswith(SYNC_MODE_NOTICE)]
    lines = [f"{len(caught)} synchronizing call(s)"]
    lines += sorted(
        {relative_paths(f"- {w.filename}:{w.lineno}: {str(w.message)[:120]}") for w in caught}
    )
    if caught:
        torch.cuda.set_sync_debug_mode("error")
        try:
            forward()
        except RuntimeError:
            lines += ["", "The first, where it was called:", "```"]
            lines += relative_paths(traceback.format_exc(limit=-14)).splitlines()
            lines += ["```"]
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return lines


@contextlib.contextmanager
def counted_launches() -> Iterator[collections.Counter]:
    """Counts `launching.launch` calls, and Triton's own launches per program name."""
    from triton.runtime.jit import JITFunction

    from tileops_triton import launching

    counts: collections.Counter = collections.Counter()
    own_run, own_launch = JITFunction.run, launching.launch

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts[f"Triton's path: {self.fn.__name__}"] += 1
        return own_run(self, *args, **kwargs)

    def launch(program: Any, *args: Any, **kwargs: Any) -> None:
        counts[f"launching.launch: {program.fn.__name__}"] += 1
        own_launch(program, *args, **kwargs)

    JITFunction.run, launching.launch = run, launch
    modules = [m for n, m in sys.modules.items() if n.startswith("tileops_triton") and m]
    rebound = [m for m in modules if getattr(m, "launch", None) is own_launch]
    for module in rebound:
        module.launch = launch
    try:
        yield counts
    finally:
        JITFunction.run, launching.launch = own_run, own_launch
        for module in rebound:
            module.launch = own_launch


def api_calls(forward: Callable[[], Any], forwards: int) -> list[str]:
    """CUDA runtime and driver calls per forward (the profiler's CPU events named cuda*/cu*)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            forward()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.key.startswith(("cuda", "cu"))]
    rows.sort(key=lambda e: -e.cpu_time_total)
    return [
        f"| {e.key} | {e.count / forwards:.1f} | {e.cpu_time_total / forwards:.1f} |" for e in rows
    ]


def host_and_loop_table(title: str, cases: dict[str, Callable[[], Any]], calls: int) -> list[str]:
    """A table of each case's host and loop µs per call (`host_and_loop_us`)."""
    lines = [f"| {title} | host µs | loop µs |", "|---|---|---|"]
    for name, fn in cases.items():
        host, loop = host_and_loop_us(fn, calls)
        lines.append(f"| {name} | {host:.1f} | {loop:.1f} |")
    return lines


def fused_calls(device: str, calls: int) -> list[str]:
    """Host and loop µs of the decode shapes' fused calls beside the eager code they replace."""
    from transformers.models.llama import modeling_llama

    from tileops.nn import apply_rotary_pos_emb, glu

    bf16 = {"device": device, "dtype": torch.bfloat16}
    gate, up = torch.randn(1, 1, 14336, **bf16), torch.randn(1, 1, 14336, **bf16)
    q, k = torch.randn(1, 1, 32, 128, **bf16).transpose(1, 2), torch.randn(1, 8, 1, 128, **bf16)
    cos, sin = torch.randn(1, 1, 128, **bf16), torch.randn(1, 1, 128, **bf16)
    cases: dict[str, Callable[[], Any]] = {
        "glu 1x1x14336: tileops.nn.glu": lambda: glu(gate, up),
        "glu 1x1x14336: F.silu(gate) * up": lambda: F.silu(gate) * up,
        "rotary q 32, k 8 heads: tileops": lambda: apply_rotary_pos_emb(q, k, cos, sin),
        "rotary q 32, k 8 heads: transformers": lambda: modeling_llama.apply_rotary_pos_emb(
            q, k, cos, sin
        ),
    }
    if device == "cuda":
        from tileops_triton.fused import launch as fused

        g2, u2, out = gate.view(1, -1), up.view(1, -1), torch.empty(1, 14336, **bf16)
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        cases["glu: tileops_triton launch alone"] = lambda: fused.glu("silu", g2, u2, out)
        cases["rotary: tileops_triton launch alone"] = lambda: fused.rotary(
            q, k, cos, sin, q_out, k_out
        )
        cases["torch.empty_like (a floor)"] = lambda: torch.empty_like(out)
    return host_and_loop_table("call", cases, calls)


def mlp_parts(model: torch.nn.Module, device: str, calls: int) -> list[str]:
    """Host and loop µs of the kernelized gated MLP of layer 0, and of the same product with
    its parts taken from torch one at a time: which part costs more inside the MLP than alone."""
    from tileops.nn import glu

    mlp = model.get_submodule("model.layers.0.mlp")
    wg, wu, wd = (mlp.get_submodule(n).weight for n in ("gate_proj", "up_proj", "down_proj"))
    x = torch.randn(1, 1, wg.shape[1], device=device, dtype=wg.dtype)
    cases: dict[str, Callable[[], Any]] = {
        "the module": lambda: mlp(x),
        "tnn.Linear x3, tileops glu": lambda: mlp.down_proj(glu(mlp.gate_proj(x), mlp.up_proj(x))),
        "tnn.Linear x3, torch silu * up": lambda: mlp.down_proj(
            F.silu(mlp.gate_proj(x)) * mlp.up_proj(x)
        ),
        "F.linear x3, tileops glu": lambda: F.linear(glu(F.linear(x, wg), F.linear(x, wu)), wd),
        "F.linear x3, torch silu * up": lambda: F.linear(
            F.silu(F.linear(x, wg)) * F.linear(x, wu), wd
        ),
        "tileops glu alone": lambda: glu(x, x),
    }
    return host_and_loop_table("gated MLP, layer 0", cases, calls)


def attention_parts(model: torch.nn.Module, inputs: dict, calls: int) -> list[str]:
    """Host and loop µs of layer 0's kernelized attention (tileops' rotary, without the
    cache) against its class's own forward on the same modules (transformers' rotary)."""
    attention = model.get_submodule("model.layers.0.self_attn")
    given, kwargs = inputs["model.layers.0.self_attn"]
    own_forward = attention.torch_type.forward
    cases = {
        "the module (tileops rotary)": lambda: attention(*given, **kwargs),
        "its class's forward (transformers' rotary)": lambda: own_forward(
            attention, *given, **kwargs
        ),
    }
    return host_and_loop_table("attention, layer 0", cases, calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--forwards", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--tiny", action="store_true", help="a CPU smoke run")
    parser.add_argument("--out", default=str(results_dir("models")))
    args = parser.parse_args()
    device = "cpu" if args.tiny else "cuda"
    work = next(w for w in works(device, args.tiny) if w.work.startswith("decode b1"))
    lines = ["# What a kernelized Llama decode forward launches and waits for", ""]
    lines += ["  ".join(f"{k}: {v}" for k, v in run_stamp().items()), ""]
    with torch.inference_mode():
        for name, kernelized in (("eager", False), ("kernelized", True)):
            model, _ = contender(work, kernelized, compiled=False)
            inputs, cache = recorded_inputs(model, work.batch(0))
            forward = decode_forward(model, work.batch(0), cache)
            for _ in range(3):
                forward()
            lines += [f"## {name}", ""]
            if device == "cuda":
                lines += ["Synchronizations in one forward:", ""]
                lines += synchronizations(forward) + [""]
                lines += [f"CUDA API calls per forward ({args.forwards} forwards):", ""]
                lines += ["| call | per forward | CPU µs per forward |", "|---|---|---|"]
                lines += api_calls(forward, args.forwards) + [""]
            if kernelized:
                with counted_launches() as counts:
                    for _ in range(args.forwards):
                        forward()
                lines += [f"Triton launches per forward ({args.forwards} forwards):", ""]
                lines += [f"- {k}: {v / args.forwards:g}" for k, v in sorted(counts.items())]
                lines += [""]
                lines += mlp_parts(model, device, args.calls // 4) + [""]
                lines += attention_parts(model, inputs, args.calls // 4) + [""]
            del model, cache, forward, inputs
        lines += ["## Fused calls alone", ""] + fused_calls(device, args.calls)
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu_dev"
    write_markdown(args.out, "decode_launches", device_name, lines)


if __name__ == "__main__":
    main()
