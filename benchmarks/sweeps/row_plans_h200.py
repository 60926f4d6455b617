"""Row plan sweep on one GPU: threads per block (and, for cluster_row, slice size) of
tileops-cuda's row kernels, and the launch plans of tileops-triton-backend's, against a
same-run copy of the op's bytes.

The plan constants in `tileops_cuda.rows` are read off this table. cluster_row candidates split
the row over clusters of 2, 4, 8 or (beyond the portable sizes) 16 blocks of 256 to 1024
threads, each block keeping a 16-128 KB slice; block_row, smem_row and stream_row candidates
give the row 128 to 1024 threads. LayerNorm's shared-memory candidates run with and without their
statistics gathered while the row loads (`RowPlan.one_pass`), on sm_90 every shared-memory
candidate also with its slice brought by TMA (`RowPlan.bulk`), and softmax's also with scaled
exponents (`RowPlan.scaled_exp`), and cluster_row's also with their partials exchanged in
shared memory (`RowPlan.dsmem`, "DSMEM"). Every candidate runs at the
occupancy `with_occupancy` gives it; `--only REGEX` keeps the candidates whose label matches.
The `triton` layout sweeps the Triton programs (`tileops_triton.rows`): the whole row in one
block of 4 to 32 warps (bfloat16 rows also held as loaded, with capped registers), or
looped over 512- to 8192-element chunks with 4 to 16 warps.

    python benchmarks/sweeps/row_plans_h200.py
        [--layouts cluster_row,block_row,smem_row,stream_row,triton]
        [--ops ...] [--dtypes bfloat16,float32] [--sizes 65536,131072,262144] [--workers 14]
        [--only REGEX] [--out DIR]

Writes `<out>/row_plans_<layouts>_<device>.md`; candidates that fail to build are listed with
the error.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import multiprocessing
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
from _harness.copies import copy_moving
from _harness.ops import DTYPES, ELEMENTS, EPS, model_bytes, row_op_setup
from _harness.provenance import git_commit, result_path, results_dir
from _harness.timing import bench

THREADS = (256, 512, 1024)
CLUSTER_SIZES = (2, 4, 8, 16)
SLICE_BYTES_RANGE = (16 * 1024, 128 * 1024)
BLOCK_THREADS = (128, 256, 512, 1024)
REGISTER_VALUES_MAX = 64  # block_row candidates keep at most this many values per thread
TRITON_WARPS = {"fused": (4, 8, 16, 32), "looped": (4, 8, 16)}
TRITON_CHUNKS = (512, 1024, 2048, 4096, 8192)
TRITON_FUSED_MAX = 65536


def plans(layout: str, op: str, call: Any) -> list[Any]:
    """The candidate plans of `layout` for `call`; LayerNorm's shared-memory plans with and
    without one-pass statistics; shared-memory plans with and without TMA (sm_90); softmax's
    with and without scaled exponents; cluster plans with and without DSMEM partials."""
    import dataclasses

    from tileops_cuda.rows.plans import bulk_eligible

    found = cluster_plans(call) if layout == "cluster_row" else block_plans(layout, call)
    if op == "layer_norm":
        found += [dataclasses.replace(p, one_pass=True) for p in found
                  if p.hold == "shared" and p.vec > 1]  # fmt: skip
    found += [dataclasses.replace(p, bulk=True) for p in found
              if bulk_eligible(p, call.n, call.dtype, call.arch)]  # fmt: skip
    if op == "softmax":
        found += [dataclasses.replace(p, scaled_exp=True) for p in found]
    if layout == "cluster_row":
        found += [dataclasses.replace(p, dsmem=True) for p in found]
    return found


def block_plans(layout: str, call: Any) -> list[Any]:
    """One block per row: 128 to 1024 threads; stream_row's read the row twice at any length
    (the second read mostly from L2)."""
    from tileops_cuda.rows import plans as rows

    hold = {"block_row": "registers", "stream_row": "none"}.get(layout, "shared")
    vec = rows.vector_width(call.n, call.dtype)
    found = []
    for lanes in BLOCK_THREADS:
        chunks = -(-call.n // (lanes * vec))
        plan = rows.RowPlan(hold, 1, lanes, vec, chunks)
        if hold == "shared":
            fits = rows.plan_smem_bytes(plan, call.dtype) <= call.smem_budget
        elif hold == "registers":
            fits = chunks * vec <= REGISTER_VALUES_MAX
        else:  # read twice, kept nowhere
            fits = True
        if fits:
            found.append(rows.with_occupancy(plan, call))
    return found


def cluster_plans(call: Any) -> list[Any]:
    """Every (threads, cluster size) candidate whose slices hold SLICE_BYTES_RANGE bytes and fit
    the budget; 16 blocks is a non-portable size, which TileLang's launcher allows (it sets the
    kernel's non-portable cluster attribute)."""
    from tileops_cuda.rows import plans as rows

    vec, itemsize = rows.vector_width(call.n, call.dtype), rows.ITEMSIZE[call.dtype]
    low, high = SLICE_BYTES_RANGE
    found = []
    for threads in THREADS:
        for size in CLUSTER_SIZES:
            chunks = -(-call.n // (size * threads * vec))
            plan = rows.RowPlan("shared", 1, threads, vec, chunks, cluster=size)
            fits = rows.plan_smem_bytes(plan, call.dtype) <= call.smem_budget
            if fits and low <= plan.slice * itemsize <= high:
                found.append(rows.with_occupancy(plan, call))
    return found


def build(layout: str, op: str, call: Any, plan: Any) -> Any:
    import tileops_cuda
    from tileops.ops import LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp

    op_cls = {"layer_norm": LayerNormFwdOp, "rms_norm": RMSNormFwdOp, "softmax": SoftmaxFwdOp}[op]
    cls = tileops_cuda.KERNELS[op_cls][f"tilelang_{layout}"]
    return cls.build(plan, call, f"sweep/{cls.__name__}/{call.n}/{plan}")


Job = tuple[str, str, str, int]  # layout, op, dtype, n


def _setup(job: Job, rows_: int) -> tuple[tuple, Any, Any]:
    _, op, dtype, n = job
    x = torch.randn(rows_, n, device="cuda", dtype=DTYPES[dtype])
    _, args, eager, _, call = row_op_setup(op, x)
    return args, eager, call


ONLY = os.environ.get("ROW_PLANS_ONLY", "")  # --only, seen by the spawned workers too


def candidates(job: Job, call: Any) -> list[tuple[str, Callable[[], Any]]]:
    """(label, build) for every candidate of the job's layout whose label matches --only."""
    layout, op, dtype, _ = job
    if layout == "triton":
        found = [(triton_label(p), lambda p=p: triton_kernel(op, p))
                 for p in triton_plans(op, call)]  # fmt: skip
    else:
        itemsize = DTYPES[dtype].itemsize
        found = [(plan_label(p, itemsize), lambda p=p: build(layout, op, call, p))
                 for p in plans(layout, op, call)]  # fmt: skip
    return [(label, make) for label, make in found if re.search(ONLY, label)]


def plan_label(plan: Any, itemsize: int) -> str:
    one_pass = ", one pass" if plan.one_pass else ""
    bulk = ", TMA" if plan.bulk else ""
    scaled = ", scaled exp" if plan.scaled_exp else ""
    dsmem = ", DSMEM" if plan.dsmem else ""
    return (f"{plan.lanes} threads, cluster {plan.cluster}, {plan.slice * itemsize // 1024} KB "
            f"per block, {plan.blocks_per_sm}/SM{one_pass}{bulk}{scaled}{dsmem}")  # fmt: skip


def triton_plans(op: str, call: Any) -> list[Any]:
    """The whole row in one program (up to TRITON_FUSED_MAX), or looped over chunks; RMSNorm's
    fused rows read through L1 or with `evict_first` (RowPlan.cached); bfloat16 rows also held
    as loaded (RowPlan.held), uncapped and with the registers of 2 and 3 programs per SM."""
    from tileops_triton.compile import next_pow2
    from tileops_triton.rows.plans import RowPlan

    block = next_pow2(call.n)
    found = []
    if block <= TRITON_FUSED_MAX:
        reads = (True, False) if op == "rms_norm" else (True,)
        found += [RowPlan(True, block, 1, warps, cached) for warps in TRITON_WARPS["fused"]
                  for cached in reads]  # fmt: skip
        if call.dtype == torch.bfloat16:
            held = [(warps, cap) for warps in TRITON_WARPS["fused"] for cap in register_caps(warps)]
            found += [RowPlan(True, block, 1, w, held=True, maxnreg=cap) for w, cap in held]
    chunks = [c for c in TRITON_CHUNKS if c < call.n]
    found += [RowPlan(False, c, 1, warps) for c in chunks for warps in TRITON_WARPS["looped"]]
    return found


def register_caps(warps: int) -> list[int | None]:
    """No cap, and the registers per thread that fit 2 and 3 programs of `warps` on an SM
    (multiples of 8; 24 is the least worth trying, 255 the most a thread can have)."""
    caps = [65536 // (programs * warps * 32) // 8 * 8 for programs in (2, 3)]
    return [None, *(cap for cap in caps if 24 <= cap < 255)]


def triton_label(plan: Any) -> str:
    read = "" if plan.cached else ", evict_first"
    shape = "held" if plan.held else "fused" if plan.fused else "looped"
    cap = f", {plan.maxnreg} registers" if plan.maxnreg else ""
    return f"triton {shape} {plan.block}, {plan.warps} warps{read}{cap}"


def triton_kernel(op: str, plan: Any) -> Callable[..., torch.Tensor]:
    """The Triton launcher of `op` with `plan`, as a kernel of the op's arguments."""
    from tileops_triton.rows import launch

    def run(x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        if op == "layer_norm":
            launch.layer_norm(plan, x, *params, EPS, out)
        elif op == "rms_norm":
            launch.rms_norm(plan, x, *params, EPS, out)
        else:
            launch.softmax(plan, x, out)
        return out

    return run


def labels(job: Job) -> list[tuple[Job, str]]:
    """(job, label) for each of the job's candidates: the unit of the parallel prebuild."""
    _, _, call = _setup(job, 1)
    return [(job, label) for label, _ in candidates(job, call)]


def prebuild(job_label: tuple[Job, str]) -> str | None:
    """Compile one candidate (in a worker: fills TileLang's and Triton's disk caches; Triton
    compiles at a first launch, on one row). Returns its error, if it fails."""
    job, label = job_label
    args, _, call = _setup(job, 1)
    make = dict(candidates(job, call))[label]
    try:
        kernel = make()
        if job[0] == "triton":
            kernel(*args)
    except Exception as error:  # a plan that cannot be lowered is reported, not fatal
        return f"{label}: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
    return None


def measure(job: Job, rounds: int) -> list[str]:
    layout, op, dtype, n = job
    args, eager, call = _setup(job, ELEMENTS // n)
    copy = bench(copy_moving(model_bytes(args)), rounds)
    want = eager(*args).float()
    lines = [f"\n## {layout}: {op} {dtype} N={n}\n", "| candidate | % copy | rel. error |",
             "|---|---|---|"]  # fmt: skip
    for label, make in candidates(job, call):
        try:
            kernel = make()
            error = ((kernel(*args).float() - want).norm() / want.norm()).item()
        except Exception as failure:  # reported in the table, not fatal
            lines.append(f"| {label} | failed: {str(failure).splitlines()[0][:120]} | |")
            continue
        ms = bench(lambda kernel=kernel: kernel(*args), rounds)
        lines.append(f"| {label} | {100 * copy / ms:.1f} | {error:.1e} |")
        print(job, lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default="cluster_row")
    parser.add_argument("--ops", default="layer_norm,rms_norm,softmax")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--sizes", default="65536,131072,262144")
    parser.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 14))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default="", help="regex over candidate labels")
    parser.add_argument("--out", default=str(results_dir("norms")))
    args = parser.parse_args()
    global ONLY
    ONLY = os.environ["ROW_PLANS_ONLY"] = args.only
    sizes = [int(size) for size in args.sizes.split(",")]
    layouts, ops, dtypes = args.layouts.split(","), args.ops.split(","), args.dtypes.split(",")
    todo = [(lay, op, dt, n) for lay in layouts for dt in dtypes for op in ops for n in sizes]
    context = multiprocessing.get_context("spawn")
    units = [unit for job in todo for unit in labels(job)]
    with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        for error in pool.map(prebuild, units):
            if error:
                print(error)
    device = torch.cuda.get_device_name()
    lines = [f"# Row plan sweep on {device}\n",
             f"{datetime.date.today()}, commit {git_commit()}, torch "
             f"{torch.__version__}; M*N = 2^26, medians of do_bench (L2 cleared), best of "
             f"{args.rounds}; % of a same-run copy of the op's bytes."]  # fmt: skip
    path = result_path(args.out, f"row_plans_{'_'.join(layouts)}", device, ".md")
    for job in todo:
        lines += measure(job, args.rounds)
        path.write_text("\n".join(lines) + "\n")  # after every case: a cut-off run keeps its rows
        torch.cuda.empty_cache()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
