"""LayerNorm and RMSNorm as a model calls them, torch's function against the op, over rows x n:
where does the op's TileLang path beat torch's own, per call, once the host is counted?

For each op, row length n and row count (bfloat16 x and params), it times per call (median of
interleaved back-to-back loops, synchronised at the end of each: whichever of host and GPU is
slower, as in a layer loop):
- training calls: forward and `backward(dy)` with x and the params requiring grad, for torch's
  function, the op as it serves now, and the op pinned to its TileLang forward key (its autograd
  node and backward kernel);
- plain calls (nothing requires grad): torch's function and the op.
Beside them, the GPU kernel time of one training call (torch.profiler, L2 cleared) for torch
and the pinned op.

    python benchmarks/sweeps/norm_calls_h200.py [--ops layer_norm,rms_norm]
        [--sizes 1024,...] [--rows 16,...] [--out DIR]

Writes `<out>/norm_calls_<device>.{md,json}`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
from _harness.ops import row_op_setup
from _harness.provenance import result_path, results_dir, run_stamp
from _harness.timing import kernel_us, per_call_ns

import tileops

SIZES = [1024, 2048, 4096, 8192, 16384, 32768]
ROWS = [16, 256, 2048, 8192, 32768]
MAX_ELEMENTS = 2**27


def training(fn: Callable[..., torch.Tensor], args: tuple, dy: torch.Tensor) -> Callable[[], Any]:
    def run() -> None:
        fn(*args).backward(dy)

    return run


def measure(op_name: str, n: int, rows: int) -> dict[str, Any]:
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    op, args, eager, interface, call = row_op_setup(op_name, x)
    key = op.key_for(interface, call)
    grad_args = tuple(a.detach().requires_grad_() for a in args)
    dy = torch.randn_like(x)
    pinned = training(op, grad_args, dy)

    def node() -> None:
        with tileops.pinned(type(op), interface, key):
            pinned()

    calls = {
        "train torch": training(eager, grad_args, dy),
        "train op": training(op, grad_args, dy),
        "train op node": node,
        "plain torch": lambda: eager(*args),
        "plain op": lambda: op(*args),
    }
    number = 40 if rows * n >= 2**25 else 100
    us = {name: ns / 1e3 for name, ns in per_call_ns(calls, "cuda", number, 5).items()}
    gpu = {
        "gpu torch": kernel_us(calls["train torch"]),
        "gpu op node": kernel_us(node),
    }
    for tensor in grad_args:
        tensor.grad = None
    return {"op": op_name, "n": n, "rows": rows, "key": key, **us, **gpu}


def table(results: list[dict[str, Any]], stamp: dict[str, Any]) -> list[str]:
    lines = [
        "# LayerNorm and RMSNorm as called: torch's function against the op",
        "",
        "  ".join(f"{k}: {v}" for k, v in stamp.items()),
        "",
        "bfloat16 x and params. us per call (median of interleaved loops, host and GPU as a "
        "layer loop pays them). train: forward + backward(dy), x and params requiring grad; "
        "node: the op pinned to its TileLang key (its autograd node and backward kernel). "
        "ratio > 1: the op's node faster than torch. GPU: kernel time of one training call.",
        "",
        "| op | n | rows | key | train torch | train op | train node | node ratio "
        "| GPU torch | GPU node | plain torch | plain op | plain ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['op']} | {r['n']} | {r['rows']} | {r['key']} | {r['train torch']:.1f} "
            f"| {r['train op']:.1f} | {r['train op node']:.1f} "
            f"| {r['train torch'] / r['train op node']:.2f} | {r['gpu torch']:.1f} "
            f"| {r['gpu op node']:.1f} | {r['plain torch']:.1f} | {r['plain op']:.1f} "
            f"| {r['plain torch'] / r['plain op']:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="layer_norm,rms_norm")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--out", default=str(results_dir("norms")))
    args = parser.parse_args()
    stamp = run_stamp()
    results = []
    for op_name in args.ops.split(","):
        for n in map(int, args.sizes.split(",")):
            for rows in map(int, args.rows.split(",")):
                if rows * n <= MAX_ELEMENTS:
                    results.append(measure(op_name, n, rows))
                    print(table(results, stamp)[-1], flush=True)
    device = torch.cuda.get_device_name()
    result_path(args.out, "norm_calls", device, ".md").write_text(
        "\n".join(table(results, stamp)) + "\n"
    )
    payload = {"stamp": stamp, "results": results}
    result_path(args.out, "norm_calls", device, ".json").write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
