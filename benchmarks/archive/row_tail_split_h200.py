"""A rejected remedy for the last wave of long-row launches, kept measurable.

At M * N = 2^26 the served cluster_row plans run 5.17 waves of clusters (1024 rows of 64K
bfloat16 on 198 resident clusters), and the last wave leaves most SMs idle. This splits the
launch: the served kernel on the whole waves' rows, then a plan with 2 or 4 times the cluster
(a quarter of the slice per block) on the rest, against the served kernel on all rows; % of a
same-run copy of the op's bytes, medians of do_bench (L2 cleared), best of 3.

    python benchmarks/archive/row_tail_split_h200.py  (results/norms/row_tail_split_nvidia_h200.txt)
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
from _harness.copies import copy_moving
from _harness.ops import DTYPES, model_bytes, row_op_setup
from _harness.timing import bench_all

CASES = [("layer_norm", "bfloat16", 65536), ("layer_norm", "bfloat16", 131072),
         ("layer_norm", "bfloat16", 262144), ("softmax", "bfloat16", 131072),
         ("softmax", "bfloat16", 262144), ("layer_norm", "float32", 131072),
         ("layer_norm", "float32", 262144), ("rms_norm", "bfloat16", 131072)]  # fmt: skip


def finer(plan, factor: int, call):
    """`plan` with `factor` times the cluster and a `factor`-th of the slice, or None."""
    from tileops_cuda.rows import plans as rows

    size = plan.cluster * factor
    if size > 16 or plan.chunks % factor:
        return None
    fine = dataclasses.replace(plan, cluster=size, chunks=plan.chunks // factor,
                               dsmem=size <= 8 or plan.lanes <= 256)  # fmt: skip
    return rows.with_occupancy(fine, call)


def measure(op: str, dtype: str, n: int) -> list[str]:
    import tileops_cuda
    from tileops.ops import LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp

    op_cls = {"layer_norm": LayerNormFwdOp, "rms_norm": RMSNormFwdOp, "softmax": SoftmaxFwdOp}
    m = 2**26 // n
    x = torch.randn(m, n, device="cuda", dtype=DTYPES[dtype])
    _, args, eager, _, call = row_op_setup(op, x)
    params = args[1:]
    cls = tileops_cuda.KERNELS[op_cls[op]]["tilelang_cluster_row"]
    plan = cls.plan(call)
    served = cls.build(plan, call, f"tail/{op}/{n}/{plan}")
    active = call.sm_count * plan.blocks_per_sm // plan.cluster
    contenders = {
        "copy": copy_moving(model_bytes(args)),
        "served": lambda: served.forward(x, *params),
    }
    want = eager(*args).float()
    for factor in (2, 4):
        fine = finer(plan, factor, call)
        if fine is None:
            continue
        tail = cls.build(fine, call, f"tail/{op}/{n}/{fine}")
        for head in sorted({(m // active) * active, (m // active - 1) * active}):
            if not 0 < head < m:
                continue

            def split(head=head, tail=tail):
                return served.forward(x[:head], *params), tail.forward(x[head:], *params)

            error = ((torch.cat(split()).float() - want).norm() / want.norm()).item()
            contenders[f"head {head} + cluster {fine.cluster} tail (err {error:.1e})"] = split
    times = bench_all(contenders, 3)
    lines = [f"{op} {dtype} N={n} m={m}: served cluster {plan.cluster}, {plan.lanes} threads, "
             f"{plan.blocks_per_sm}/SM, {active} resident clusters"]  # fmt: skip
    for name, ms in times.items():
        lines.append(f"  {name}: {ms * 1000:.1f} us, {100 * times['copy'] / ms:.1f}% copy")
    return lines


if __name__ == "__main__":
    for case in CASES:
        print("\n".join(measure(*case)), flush=True)
