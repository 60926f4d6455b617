"""Where BatchNorm training's time goes on large shapes: each layout's kernels with their GPU
times, against torch.compile's kernels and a copy, the L2 cleared by a write before each call.

A training layout moves x three times (split and tiled: two reads and a write) or twice
(cluster: x held in shared memory); inference moves it twice, the floor for any training
kernel that keeps x on chip. Scores are % of a same-run copy of three passes' bytes.

    python benchmarks/sweeps/bn_kernel_breakdown_h200.py [--shapes 256x256x3136,...] [--out DIR]

Writes `<out>/bn_kernel_breakdown_<device>.md`.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
from _harness.ops import EPS, MOMENTUM, training_case
from _harness.provenance import git_commit, results_dir, write_markdown
from _harness.timing import kernel_breakdown

SHAPES = "256x256x3136,256x128x3136,256x64x12544,256x512x784,4x128x1048576"
KEYS = ("tilelang_bn_split_channel", "tilelang_bn_cluster_channel", "tilelang_bn_group_channel",
        "tilelang_bn_tiled", "tilelang_bn_infer")  # fmt: skip


HELD_IN_PARTS = ("tilelang_bn_cluster_channel", "tilelang_bn_group_channel")


def rows_for(shape: tuple[int, int, int]) -> list[str]:
    import tileops_cuda
    from tileops.ops import BatchNormFwdOp
    from tileops_cuda.batch_norm.plans import cluster_channel_plan

    x, (w, b, rm, rv), call, three_passes_us = training_case(shape)
    label = "x".join(map(str, shape))
    contenders = {}
    for key in KEYS:
        cls = tileops_cuda.KERNELS[BatchNormFwdOp][key]
        if key in HELD_IN_PARTS and cluster_channel_plan(call) is None:
            continue  # 16 blocks' shared memory cannot hold the channel
        kernel = cls.entry_for(call)[1]()
        contenders[key] = lambda kernel=kernel: kernel(x, w, b, rm, rv)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda: F.batch_norm(x, rm, rv, w, b, True, MOMENTUM, EPS), dynamic=False
    )
    compiled()
    contenders["torch.compile"] = compiled
    lines = []
    for name, fn in contenders.items():
        parts = kernel_breakdown(fn, clear="write")
        total = sum(us for _, us in parts)
        kernels = "; ".join(f"`{kernel[:40]}` {us:.1f}" for kernel, us in parts)
        lines.append(f"| {label} | {name} | {total:.1f} | {100 * three_passes_us / total:.1f} "
                     f"| {kernels} |")  # fmt: skip
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--out", default=str(results_dir("batch_norm")))
    args = parser.parse_args()
    device = torch.cuda.get_device_name()
    lines = [f"# BatchNorm training kernels on {device}\n",
             f"{datetime.date.today()}, commit {git_commit()}, torch {torch.__version__}, "
             "bfloat16; GPU kernel times (profiler medians of 30 calls, the L2 cleared by a "
             "256 MB write before each).\n",
             "| shape | layout | us | % of copy (3 passes) | kernels (us) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for spec in args.shapes.split(","):
        lines += rows_for(tuple(map(int, spec.split("x"))))
    write_markdown(args.out, "bn_kernel_breakdown", device, lines)


if __name__ == "__main__":
    main()
