"""BatchNorm training with a channel held in parts: a thread-block cluster per channel
(cluster_channel) against the same parts as plain blocks meeting in L2 (group_channel), with the
number of parts and threads per block forced; GPU kernel times (every kernel of a call, the
group's zeroed counters included), the L2 cleared by a write before each call.

A cluster stays inside one GPC, so large clusters leave multiprocessors idle
(`cluster_placement.cu` counts them); plain blocks take every slot but wait in L2 for the
channel's other parts.

    python benchmarks/bn_parts_h200.py [--shapes 256x256x3136,...] [--variants cluster/0/512,...]

A variant is layout/parts/threads (parts 0: the plan's own). Writes
`<out>/bn_parts_<device>.md`.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
from pathlib import Path

import torch
import torch.nn.functional as F
from batchnorm_gemm_h200 import EPS, MOMENTUM, bn_call_for, bn_params, kernel_us
from provenance import git_commit, write_markdown

SHAPES = "256x256x3136,256x128x3136,256x64x3136,32x64x12544,32x64x3136,256x128x784,32x512x784"
VARIANTS = "cluster/0/512,group/0/512,group/4/512,group/8/512,group/16/512,group/32/256"


def kernel_for(call, layout: str, parts: int, threads: int):
    """The training kernel of `layout` (cluster or group) with the channel in `parts` parts of
    `threads`-thread blocks; None where a part does not fit shared memory."""
    from tileops_cuda import batch_norm as bn
    from tileops_cuda.compile import build_program
    from tileops_cuda.rows import RowPlan, plan_smem_bytes, with_occupancy

    vec = bn.vector_width(call.spatial, call.dtype)
    chunks = -(-bn.values_per_channel(call) // vec // (parts * threads))
    plan = with_occupancy(RowPlan("shared", 1, threads, vec, chunks, cluster=parts), call)
    if plan_smem_bytes(plan, call.dtype) > call.smem_budget:
        return None
    cls = {"cluster": bn.BatchNormClusterChannel, "group": bn.BatchNormGroupChannel}[layout]
    name = f"bn_parts/{cls.layout}/{parts}/{threads}/{call.batch}x{call.channels}x{call.spatial}"
    fields = (call.batch, plan)
    program = build_program(name, lambda: bn.train_program(cls.layout, call, fields), 90)
    kernel = cls.__new__(cls)
    bn._BatchNorm.__init__(kernel, call, [program])
    kernel.cluster = parts
    return kernel


def parse_variant(call, spec: str) -> tuple[str, int, int]:
    from tileops_cuda.batch_norm import cluster_channel_plan

    layout, parts, threads = spec.split("/")
    plan = cluster_channel_plan(call)
    return layout, int(parts) or (plan.cluster if plan else 16), int(threads)


def prebuild(job: tuple[tuple[int, ...], str]) -> None:
    """Compile one (shape, variant) into the disk cache (a worker of the build pool)."""
    shape, spec = job
    call = bn_call_for(torch.empty(shape, device="cuda", dtype=torch.bfloat16))
    kernel_for(call, *parse_variant(call, spec))


def rows_for(shape: tuple[int, ...], variants: list[str]) -> list[str]:
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 0.5
    w, b, rm, rv = bn_params(x)
    call = bn_call_for(x)
    src = torch.empty(x.numel(), dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    three_passes_us = 1.5 * kernel_us(lambda: dst.copy_(src))
    want = F.batch_norm(x.float(), rm.float(), rv.float(), w.float(), b.float(), True, 0.0, EPS)
    label = "x".join(map(str, shape))
    lines = []
    for spec in variants:
        layout, parts, threads = parse_variant(call, spec)
        kernel = kernel_for(call, layout, parts, threads)
        if kernel is None:
            lines.append(f"| {label} | {layout} | {parts} | {threads} | does not fit | | |")
            continue
        error = (kernel(x, w, b, rm.clone(), rv.clone()).float() - want).abs().max().item()
        us = kernel_us(lambda kernel=kernel: kernel(x, w, b, rm, rv))
        lines.append(f"| {label} | {layout} | {parts} | {threads} | {us:.1f} "
                     f"| {100 * three_passes_us / us:.1f} | {error:.3g} |")  # fmt: skip
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--variants", default=VARIANTS)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    variants = args.variants.split(",")
    with multiprocessing.get_context("spawn").Pool(min(14, len(shapes) * len(variants))) as pool:
        pool.map(prebuild, [(shape, spec) for shape in shapes for spec in variants])
    device = torch.cuda.get_device_name()
    lines = [f"# BatchNorm training, a channel in parts, on {device}\n",
             f"{datetime.date.today()}, commit {git_commit()}, torch {torch.__version__}, "
             f"bfloat16, momentum {MOMENTUM}; GPU kernel times (profiler medians of 30 calls, "
             "the L2 cleared by a 256 MB write before each); % of a same-run copy of three "
             "passes' bytes; max |error| of y against float32 torch.\n",
             "| shape | layout | parts | threads | us | % of copy | error |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for shape in shapes:
        lines += rows_for(shape, variants)
    write_markdown(args.out, "bn_parts", device, lines)


if __name__ == "__main__":
    main()
