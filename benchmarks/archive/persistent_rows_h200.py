"""A rejected design for long rows, kept measurable: persistent clusters that stream rows.

Each cluster of `cluster` blocks (one per SM) loops over rows cid, cid + grid, ...; a block's
slice of the next row arrives by TMA into a ring of `stages` shared-memory buffers while it
normalizes the current one, and its slices of LayerNorm's / RMSNorm's weight and bias stay in
registers for every row (norm_params_h200 showed them costing 4 points each at 64K, read from
L2 per row). Against the served cluster_row kernel, at M*N = 2^26 on the H200:

    python benchmarks/archive/persistent_rows_h200.py [--out DIR]

Writes `<out>/persistent_rows_<device>.json` and prints one line per configuration.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
from _harness.copies import copy_moving
from _harness.ops import EPS, model_bytes, row_op_setup
from _harness.provenance import result_path, results_dir
from _harness.timing import bench

# kind, n, dtype, cluster size, threads, blocks per SM, stages
CONFIGS = [
    ("layer", 65536, "bfloat16", 4, 512, 1, 2), ("layer", 65536, "bfloat16", 4, 512, 1, 3),
    ("layer", 65536, "bfloat16", 2, 1024, 1, 2), ("layer", 65536, "bfloat16", 8, 256, 2, 2),
    ("layer", 131072, "bfloat16", 8, 512, 1, 2), ("layer", 131072, "bfloat16", 8, 512, 1, 3),
    ("layer", 131072, "bfloat16", 16, 256, 2, 2),
    ("layer", 262144, "bfloat16", 16, 512, 1, 2), ("layer", 262144, "bfloat16", 16, 512, 1, 3),
    ("layer", 65536, "float32", 4, 512, 1, 2), ("layer", 65536, "float32", 4, 512, 1, 3),
    ("layer", 131072, "float32", 8, 512, 1, 2), ("layer", 131072, "float32", 8, 512, 1, 3),
    ("layer", 262144, "float32", 16, 512, 1, 2), ("layer", 262144, "float32", 16, 512, 1, 3),
    ("rms", 131072, "bfloat16", 8, 512, 1, 2), ("rms", 262144, "bfloat16", 16, 512, 1, 2),
    ("rms", 262144, "float32", 16, 512, 1, 2),
]  # fmt: skip


def program(kind, n, dtype, cluster, threads, grid, stages, blocks_per_sm):
    """LayerNorm (kind "layer", weight and bias) or RMSNorm ("rms", weight) over rows of n,
    exact multiples of the cluster's vectors; S: the slices' partial statistics."""
    import tilelang.language as T

    from tileops_cuda._common import tiles
    from tileops_cuda._common.lanes import RowPlan

    vec = 16 // torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    size = n // cluster
    chunks = size // (threads * vec)
    assert chunks * threads * vec * cluster == n, "rows must be whole vectors of every lane"
    plan = RowPlan("shared", 1, threads, vec, chunks, 1, cluster)
    m = T.dynamic("m")

    @T.prim_func
    def main(X: T.Tensor((m, n), dtype), W: T.Tensor((n,), dtype), B: T.Tensor((n,), dtype),
             S: T.Tensor((m, cluster, 2), "float32"), Y: T.Tensor((m, n), dtype)):  # fmt: skip
        with T.Kernel(grid * cluster, threads=threads, cluster_dims=cluster) as bx:
            T.annotate_min_blocks_per_sm(blocks_per_sm)
            tx = T.get_thread_binding()
            cid, part = bx // cluster, bx % cluster
            base = part * size
            ring = T.alloc_shared((stages, size), dtype)
            arrived = T.alloc_barrier([threads] * stages)
            scratch = T.alloc_shared((2, threads // 32), "float32")
            w = T.alloc_local((chunks * vec,), "float32")
            b = T.alloc_local((chunks * vec,), "float32")
            t = T.alloc_local((vec,), "float32")
            for k in T.unroll(chunks):
                for v in T.vectorized(vec):
                    w[k * vec + v] = W[base + (k * threads + tx) * vec + v]
                if kind == "layer":
                    for v in T.vectorized(vec):
                        b[k * vec + v] = B[base + (k * threads + tx) * vec + v]
            count = T.ceildiv(T.max(m - cid, 0), grid)
            for s in T.unroll(stages - 1):
                if s < count:
                    T.tma_copy(X[cid + s * grid, base : base + size], ring[s, :],
                               barrier=arrived[s])  # fmt: skip
                    T.barrier_arrive(arrived[s])
            for i in T.serial(count):
                row, cur, ahead = cid + i * grid, i % stages, i + stages - 1
                if ahead < count:
                    T.tma_copy(X[cid + ahead * grid, base : base + size], ring[ahead % stages, :],
                               barrier=arrived[ahead % stages])  # fmt: skip
                    T.barrier_arrive(arrived[ahead % stages])
                T.mbarrier_wait_parity(arrived[cur], (i // stages) % 2)
                s1 = T.alloc_var("float32", init=0.0)
                for k in T.unroll(chunks):
                    for v in T.vectorized(vec):
                        t[v] = ring[cur, (k * threads + tx) * vec + v]
                    for v in T.unroll(vec):
                        s1 += t[v] * t[v] if kind == "rms" else t[v]
                total = tiles.reduce_group(s1, "sum", plan, scratch, 0, tx)
                mean = T.alloc_var("float32", init=0.0)
                var = T.alloc_var("float32", init=0.0)
                if kind == "rms":
                    tiles.share_partials(S, row, part, total, 0.0)
                    var = tiles.merged_mean(S, row, cluster, n)
                else:
                    s2 = T.alloc_var("float32", init=0.0)
                    for k in T.unroll(chunks):
                        for v in T.vectorized(vec):
                            t[v] = ring[cur, (k * threads + tx) * vec + v]
                        for v in T.unroll(vec):
                            s2 += (t[v] - total / size) * (t[v] - total / size)
                    spread = tiles.reduce_group(s2, "sum", plan, scratch, 1, tx)
                    tiles.share_partials(S, row, part, total, spread)
                    mean = tiles.merged_mean(S, row, cluster, n)
                    var = tiles.merged_var(S, row, cluster, n, mean, lambda p: T.float32(size))
                rstd = T.rsqrt(var + EPS)
                for k in T.unroll(chunks):
                    for v in T.vectorized(vec):
                        t[v] = ring[cur, (k * threads + tx) * vec + v]
                    for v in T.vectorized(vec):
                        Y[row, base + (k * threads + tx) * vec + v] = (
                            (t[v] - mean) * rstd * w[k * vec + v] + b[k * vec + v]
                            if kind == "layer" else t[v] * rstd * w[k * vec + v]
                        )  # fmt: skip
                T.sync_threads()  # the ring slot is free for the load issued next iteration

    return main


def measure(config, sms: int) -> list[dict]:
    import tilelang

    kind, n, dtype, cluster, threads, per_sm, stages = config
    op = "layer_norm" if kind == "layer" else "rms_norm"
    x = torch.randn(2**26 // n, n, device="cuda", dtype=getattr(torch, dtype))
    tile_op, args, eager, _, _ = row_op_setup(op, x)
    w, b = args[1], args[-1]
    copy, served = bench(copy_moving(model_bytes(args)), 2), bench(lambda: tile_op(*args), 2)
    want = eager(*args).float()
    rows = []
    for grid in sorted({sms * per_sm // cluster, sms * per_sm // cluster - 1}):
        func = program(kind, n, dtype, cluster, threads, grid, stages, per_sm)
        kernel = tilelang.compile(func, target={"kind": "cuda", "arch": "sm_90"})
        S = torch.empty((x.shape[0], cluster, 2), device="cuda", dtype=torch.float32)
        y = torch.empty_like(x)
        kernel(x, w, b, S, y)
        error = ((y.float() - want).norm() / want.norm()).item()
        ms = bench(lambda: kernel(x, w, b, S, y), 2)  # noqa: B023
        rows.append(
            {
                "config": f"{kind} {dtype} N={n}, cluster {cluster} x {threads} threads, "
                f"{per_sm}/SM, grid {grid} clusters, {stages} stages",  # fmt: skip
                "persistent": 100 * copy / ms,
                "served": 100 * copy / served,
                "error": error,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(results_dir("norms")))
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = [row for config in CONFIGS for row in measure(config, sms)]
    path = result_path(args.out, "persistent_rows", torch.cuda.get_device_name(), ".json")
    path.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
