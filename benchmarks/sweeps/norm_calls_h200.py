"""LayerNorm and RMSNorm as a model calls them, torch's function against the op, over rows x n:
where does the op's TileLang path beat torch's own, per call, once the host is counted?

For each op, row length n and row count (bfloat16 x and params), it times per call (median of
interleaved back-to-back loops, synchronised at the end of each: whichever of host and GPU is
slower, as in a layer loop), for torch's function and the op as it serves in this process:
- training calls: forward and `backward(dy)` with x and the params requiring grad;
- plain calls (nothing requires grad);
and the GPU kernel time of one training call of each (torch.profiler, L2 cleared). The op's own
node (TileLang forward and backward kernels) serves training calls where ATen's norms are denied:

    TILEOPS_DENY=LayerNormFwdOp=aten_layer_norm,RMSNormFwdOp=aten_rms_norm \
        python benchmarks/sweeps/norm_calls_h200.py --label node
    python benchmarks/sweeps/norm_calls_h200.py [--ops layer_norm,rms_norm]
        [--sizes 1024,...] [--rows 16,...] [--label NAME] [--out DIR]

Writes `<out>/norm_calls[_<label>]_<device>.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
from _harness.ops import row_op_setup
from _harness.provenance import result_path, results_dir, run_stamp
from _harness.timing import kernel_us, per_call_ns

SIZES = [1024, 2048, 4096, 8192, 16384, 32768]
ROWS = [16, 256, 2048, 8192, 32768]
MAX_ELEMENTS = 2**27


def training(fn: Callable[..., torch.Tensor], args: tuple, dy: torch.Tensor) -> Callable[[], Any]:
    def run() -> None:
        fn(*args).backward(dy)

    return run


def measure(op_name: str, n: int, rows: int) -> dict[str, Any]:
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    op, args, eager, _, _ = row_op_setup(op_name, x)
    grad_args = tuple(a.detach().requires_grad_() for a in args)
    dy = torch.randn_like(x)
    calls = {
        "train torch": training(eager, grad_args, dy),
        "train op": training(op, grad_args, dy),
        "plain torch": lambda: eager(*args),
        "plain op": lambda: op(*args),
    }
    number = 40 if rows * n >= 2**25 else 100
    us = {name: ns / 1e3 for name, ns in per_call_ns(calls, "cuda", number, 5).items()}
    y = op(*grad_args)
    node = type(y.grad_fn).__name__  # the op's own node, or torch's where its native lane ran
    gpu = {f"gpu {name[6:]}": kernel_us(calls[name]) for name in ("train torch", "train op")}
    return {"op": op_name, "n": n, "rows": rows, "node": node, **us, **gpu}


def table(results: list[dict[str, Any]], stamp: dict[str, Any]) -> list[str]:
    lines = [
        "# LayerNorm and RMSNorm as called: torch's function against the op",
        "",
        "  ".join(f"{k}: {v}" for k, v in stamp.items()),
        "",
        "bfloat16 x and params. us per call (median of interleaved loops, host and GPU as a "
        "layer loop pays them). train: forward + backward(dy), x and params requiring grad; "
        "node: what the op's training call records. ratio > 1: the op faster than torch. "
        "GPU: kernel time of one training call.",
        "",
        "| op | n | rows | node | train torch | train op | train ratio | GPU torch | GPU op "
        "| plain torch | plain op | plain ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['op']} | {r['n']} | {r['rows']} | {r['node']} | {r['train torch']:.1f} "
            f"| {r['train op']:.1f} | {r['train torch'] / r['train op']:.2f} "
            f"| {r['gpu torch']:.1f} | {r['gpu op']:.1f} | {r['plain torch']:.1f} "
            f"| {r['plain op']:.1f} | {r['plain torch'] / r['plain op']:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="layer_norm,rms_norm")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--label", default="", help="in the file name: norm_calls_<label>")
    parser.add_argument("--out", default=str(results_dir("norms")))
    args = parser.parse_args()
    stamp = run_stamp(TILEOPS_DENY=os.environ.get("TILEOPS_DENY", ""))
    results = []
    for op_name in args.ops.split(","):
        for n in map(int, args.sizes.split(",")):
            for rows in map(int, args.rows.split(",")):
                if rows * n <= MAX_ELEMENTS:
                    results.append(measure(op_name, n, rows))
                    print(table(results, stamp)[-1], flush=True)
    device = torch.cuda.get_device_name()
    prefix = f"norm_calls_{args.label}" if args.label else "norm_calls"
    result_path(args.out, prefix, device, ".md").write_text("\n".join(table(results, stamp)) + "\n")
    payload = {"stamp": stamp, "results": results}
    result_path(args.out, prefix, device, ".json").write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
