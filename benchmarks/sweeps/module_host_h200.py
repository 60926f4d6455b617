"""Host time of one training call (forward and backward) of a kernelized module against torch's,
at a host-bound size, and where the kernelized one spends it (cProfile, by cumulative and by own
time).

    python benchmarks/sweeps/module_host_h200.py [--calls 300] [--top 45] [--out DIR]

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
from _harness.provenance import result_path, results_dir, run_stamp
from _harness.timing import host_profile
from torch import nn

import tileops.nn

ORDERS = ("cumulative", "tottime")


def modules() -> dict[str, tuple[nn.Module, torch.Tensor, bool]]:
    """TransformerEncoderLayer d=1024's modules on its (8, 512, 1024) bf16 activations, and a
    ResNet-50 BatchNorm2d layer under bf16 autocast, NCHW and channels_last: (module, x,
    autocast)."""
    with torch.device("cuda"):
        x = torch.randn(8, 512, 1024, dtype=torch.bfloat16, requires_grad=True)
        image = torch.randn(32, 256, 14, 14, dtype=torch.bfloat16, requires_grad=True)
        last = image.detach().to(memory_format=torch.channels_last).requires_grad_()
        return {
            "Linear 1024->4096": (nn.Linear(1024, 4096).bfloat16(), x, False),
            "LayerNorm 1024": (nn.LayerNorm(1024).bfloat16(), x, False),
            "BatchNorm2d 32x256x14x14, autocast": (nn.BatchNorm2d(256), image, True),
            "BatchNorm2d channels_last, autocast": (nn.BatchNorm2d(256), last, True),
        }


def step(module: nn.Module, x: torch.Tensor, autocast: bool) -> Callable[[], None]:
    def run() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            y = module(x)
        y.sum().backward()

    return run


def per_call_us(run: Callable[[], None], calls: int) -> float:
    for _ in range(20):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--out", default=str(results_dir("dispatch")))
    args = parser.parse_args()
    lines = ["# Module training calls: host time, torch against kernelized", ""]
    lines += ["  ".join(f"{k}: {v}" for k, v in run_stamp().items()), ""]
    for name, (module, x, autocast) in modules().items():
        ours = copy.deepcopy(module)
        tileops.nn.kernelize(ours)
        torch_us = per_call_us(step(module, x, autocast), args.calls)
        ours_us = per_call_us(step(ours, x, autocast), args.calls)
        profile = host_profile(step(ours, x, autocast), args.calls, args.top, ORDERS)
        lines += [f"## {name}", "", f"forward + backward per call: torch {torch_us:.1f} us, "
                  f"kernelized {ours_us:.1f} us ({torch_us / ours_us:.2f}x)", "", "```",
                  profile, "```", ""]  # fmt: skip
        print("\n".join(lines[-6:-4]), flush=True)
    path = result_path(args.out, "module_host", torch.cuda.get_device_name(), ".md")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
