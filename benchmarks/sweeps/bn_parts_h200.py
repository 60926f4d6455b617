"""BatchNorm training with the channel held on chip (registers or shared memory), in one block
or in parts: a thread-block cluster per channel (cluster_channel) or plain blocks meeting in L2
(group_channel), with the parts, the threads per block and where the channel is held forced;
GPU kernel times (every kernel of a call, the group's zeroed counters included), the L2
cleared by a write before each call.

A cluster stays inside one GPC, so large clusters leave multiprocessors idle
(`cluster_placement.cu` counts them); plain blocks take every slot but wait in L2 for the
channel's other parts. Fewer threads per block or parts per channel change how many blocks
share a multiprocessor, and so whether one block's load overlaps another's reductions.

    python benchmarks/sweeps/bn_parts_h200.py [--shapes 256x256x3136,...]
        [--variants group/smem/16/512]

A variant is layout/hold/parts/threads: layout cluster or group (parts 1: one block per
channel), hold reg or smem, parts 0 for the plan's own. Writes `<out>/bn_parts_<device>.md`.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
from _harness.ops import EPS, MOMENTUM, bn_call_for, training_case
from _harness.provenance import git_commit, results_dir, write_markdown
from _harness.timing import kernel_us

SHAPES = "256x256x3136,256x128x3136,256x64x3136,32x64x12544,32x64x3136,256x128x784,32x512x784"
VARIANTS = (
    "cluster/smem/0/512,group/smem/0/512,group/smem/4/512,group/smem/8/512,group/smem/16/512,"
    "group/smem/32/256"
)


REGISTER_VALUES_MAX = 64


def kernel_for(call, layout: str, hold: str, parts: int, threads: int):
    """The training kernel of `layout` (cluster or group) with the channel in `parts` parts of
    `threads`-thread blocks, held in registers (reg) or shared memory (smem); None where a part
    does not fit shared memory."""
    from tileops_cuda._common.compile import build_program
    from tileops_cuda._common.lanes import RowPlan, plan_smem_bytes, with_occupancy
    from tileops_cuda.batch_norm import kernels as bn

    vec = bn.vector_width(call.spatial, call.dtype)
    chunks = -(-bn.values_per_channel(call) // vec // (parts * threads))
    where = {"reg": "registers", "smem": "shared"}[hold]
    plan = with_occupancy(RowPlan(where, 1, threads, vec, chunks, cluster=parts), call)
    if where == "shared" and plan_smem_bytes(plan, call.dtype) > call.smem_budget:
        return None
    if where == "registers" and chunks * vec > REGISTER_VALUES_MAX:
        return None  # a long unrolled body that spills
    cls = {"cluster": bn.BatchNormClusterChannel, "group": bn.BatchNormGroupChannel}[layout]
    if parts == 1:
        cls = bn.BatchNormBlockChannel  # one block per channel: no partials to meet
    name = (f"bn_parts/{cls.layout}/{hold}/{parts}/{threads}/"
            f"{call.batch}x{call.channels}x{call.spatial}")  # fmt: skip
    fields = (call.batch, plan)
    program = build_program(name, lambda: bn.train_program(cls.layout, call, fields), 90)
    kernel = cls.__new__(cls)
    bn._BatchNorm.__init__(kernel, call, [program])
    kernel.cluster = parts
    return kernel


def parse_variant(call, spec: str) -> tuple[str, str, int, int]:
    from tileops_cuda.batch_norm.plans import cluster_channel_plan

    layout, hold, parts, threads = spec.split("/")
    plan = cluster_channel_plan(call)
    return layout, hold, int(parts) or (plan.cluster if plan else 16), int(threads)


def prebuild(job: tuple[tuple[int, ...], str]) -> None:
    """Compile one (shape, variant) into the disk cache (a worker of the build pool)."""
    shape, spec = job
    call = bn_call_for(torch.empty(shape, device="cuda", dtype=torch.bfloat16))
    try:
        kernel_for(call, *parse_variant(call, spec))
    except Exception as error:  # reported again, per row, when timed
        print(f"{shape} {spec}: {type(error).__name__}", flush=True)


def rows_for(shape: tuple[int, ...], variants: list[str]) -> list[str]:
    x, (w, b, rm, rv), call, three_passes_us = training_case(shape)
    want = F.batch_norm(x.float(), rm.float(), rv.float(), w.float(), b.float(), True, 0.0, EPS)
    label = "x".join(map(str, shape))
    lines = []
    for spec in variants:
        layout, hold, parts, threads = parse_variant(call, spec)
        variant = f"| {label} | {layout} | {hold} | {parts} | {threads} |"
        try:
            kernel = kernel_for(call, layout, hold, parts, threads)
        except Exception as error:
            lines.append(f"{variant} {type(error).__name__} | | |")
            continue
        if kernel is None:
            lines.append(f"{variant} does not fit | | |")
            print(lines[-1], flush=True)
            continue
        y = kernel(x, w, b, rm.clone(), rv.clone())
        y = y[0] if isinstance(y, tuple) else y  # training kernels keep their statistics too
        error = (y.float() - want).abs().max().item()
        us = kernel_us(lambda kernel=kernel: kernel(x, w, b, rm, rv))
        lines.append(f"{variant} {us:.1f} "
                     f"| {100 * three_passes_us / us:.1f} | {error:.3g} |")  # fmt: skip
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--variants", default=VARIANTS)
    parser.add_argument("--out", default=str(results_dir("batch_norm")))
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
             "| shape | layout | hold | parts | threads | us | % of copy | error |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for shape in shapes:
        lines += rows_for(shape, variants)
    write_markdown(args.out, "bn_parts", device, lines)


if __name__ == "__main__":
    main()
