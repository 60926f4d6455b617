"""Host time of one training call (forward and backward) of a kernelized module against torch's,
at a host-bound size, and where the kernelized one spends it (cProfile, by cumulative and by own
time).

    python benchmarks/sweeps/module_host_h200.py [--calls 300] [--top 45] [--device cpu]
        [--out DIR]

On the CPU (`--device cpu`) the modules keep their types at a tenth of the size, so the call is
host time too (but a CPU backward runs the recompute reference where the GPU has kernels).
Writes `<out>/module_host_<device>.md`.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch
from _harness.provenance import git_commit, result_path, results_dir, run_stamp
from _harness.timing import host_profile
from torch import nn

import tileops.nn

ORDERS = ("cumulative", "tottime")


def modules(device: str) -> dict[str, tuple[nn.Module, torch.Tensor, bool]]:
    """TransformerEncoderLayer d=1024's modules on its (8, 512, 1024) bf16 activations, and a
    ResNet-50 BatchNorm2d layer under bf16 autocast, NCHW and channels_last: (module, x,
    autocast). A tenth of each size on the CPU."""
    d, rows, c = (1024, 8 * 512, 256) if device == "cuda" else (128, 64, 32)
    with torch.device(device):
        x = torch.randn(rows, d, dtype=torch.bfloat16, requires_grad=True)
        image = torch.randn(32, c, 14, 14, dtype=torch.bfloat16, requires_grad=True)
        last = image.detach().to(memory_format=torch.channels_last).requires_grad_()
        return {
            f"Linear {d}->{4 * d}": (nn.Linear(d, 4 * d).bfloat16(), x, False),
            f"LayerNorm {d}": (nn.LayerNorm(d).bfloat16(), x, False),
            f"BatchNorm2d 32x{c}x14x14, autocast": (nn.BatchNorm2d(c), image, True),
            "BatchNorm2d channels_last, autocast": (nn.BatchNorm2d(c), last, True),
        }


def step(module: nn.Module, x: torch.Tensor, autocast: bool) -> Callable[[], None]:
    def run() -> None:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
            y = module(x)
        y.float().sum().backward()

    return run


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def per_call_us(run: Callable[[], None], calls: int) -> float:
    for _ in range(20):
        run()
    _sync()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        _sync()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=str(results_dir("dispatch")))
    args = parser.parse_args()
    stamp = run_stamp() if args.device == "cuda" else {"device": "cpu", "commit": git_commit()}
    lines = ["# Module training calls: host time, torch against kernelized", ""]
    lines += ["  ".join(f"{k}: {v}" for k, v in stamp.items()), ""]
    for name, (module, x, autocast) in modules(args.device).items():
        ours = copy.deepcopy(module)
        tileops.nn.kernelize(ours)
        torch_us = per_call_us(step(module, x, autocast), args.calls)
        ours_us = per_call_us(step(ours, x, autocast), args.calls)
        profile = host_profile(step(ours, x, autocast), args.calls, args.top, ORDERS)
        lines += [f"## {name}", "", f"forward + backward per call: torch {torch_us:.1f} us, "
                  f"kernelized {ours_us:.1f} us ({torch_us / ours_us:.2f}x)", "", "```",
                  profile, "```", ""]  # fmt: skip
        print("\n".join(lines[-6:-4]), flush=True)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    path = result_path(args.out, "module_host", name, ".md")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
