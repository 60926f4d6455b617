"""bf16 GEMM on one GPU, in the same run as its peers. Two parts:

`--part triton` (the default): the Triton backend's kernel against torch.matmul. Shapes: 4096^3
and 8192^3, and skinny M = 1, 16, 64 with N = K = 4096. The Triton kernel is built as the
dispatcher builds it (`TritonGemm.entry_for`), tuned on its first call (the warm-up), then both
are timed alternately as medians of `triton.testing.do_bench` (which clears the L2 before each
repetition) on fresh random inputs. The goal: Triton at 4096^3 reaches at least 85% of
torch.matmul's TFLOP/s. Writes `<out>/gemm_<device>.{md,json}`.

`--part linear`: `tileops.nn.Linear` as a model calls it, M x N x K = tokens x out x in: decode
1 x 4096 x 4096, prefill 8192 x 4096 x 4096 and 8192 x 4096 x 14336 (Llama's down projection),
with and without a bias. Contenders: the module as called (one NT GemmOp, the bias its
epilogue), `F.linear` (cuBLAS), the serving kernel alone (`kernel`), the kernel without its
bias epilogue plus a separate add (`kernel, bias added`: the Linear before the epilogue), and
the Linear before NT layouts (`before: W^T copy`: an NN GemmOp on a transposed copy of the
weight, or at few rows `(W x^T)^T`, whichever copies less). Medians of do_bench (L2 cleared)
and back-to-back calls (`loop`, L2 warm: host-bound at decode). Writes
`<out>/linear_<device>.{md,json}`.

    python benchmarks/suites/gemm_h200.py [--part triton|linear] [--out DIR] [--commit SHA]

Result files are stamped with the date, device, versions and commit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import triton
from _harness.provenance import result_path, results_dir, run_stamp
from _harness.timing import bench_all, loop_us

from tileops.ops import GemmCall
from tileops_triton.compile import chosen
from tileops_triton.gemm.kernels import TritonGemm

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (1, 4096, 4096), (16, 4096, 4096),
          (64, 4096, 4096)]  # fmt: skip
GOAL = (4096, 4096, 4096), 0.85
ROUNDS = 2


def measure(m: int, n: int, k: int) -> dict:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    call = GemmCall(device=a.device, m=m, n=n, k=k, dtype=a.dtype)
    kernel = TritonGemm.entry_for(call)[1]()
    error = relative_error(kernel(a, b), a, b)  # also the tuning run
    contenders = {"triton": lambda: kernel(a, b), "torch": lambda: torch.matmul(a, b)}
    times = bench_all(contenders, ROUNDS)
    flop = 2.0 * m * n * k
    row = {"m": m, "n": n, "k": k, "rel_error": error, "config": str(kernel_config(kernel))}
    for name, ms in times.items():
        row[f"{name}_ms"] = ms
        row[f"{name}_tflops"] = flop / ms / 1e9
    row["ratio"] = row["triton_tflops"] / row["torch_tflops"]
    return row


def relative_error(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    ref = a.float() @ b.float()
    return ((out.float() - ref).norm() / ref.norm()).item()


def kernel_config(kernel: TritonGemm) -> object:
    return chosen("gemm", kernel.identity)


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"# bf16 GEMM on {meta['device']}",
        "",
        f"{meta['date']}, commit {meta['commit']}, torch {meta['torch']}, triton {meta['triton']}."
        " Medians of do_bench (L2 cleared per repetition), best of "
        f"{ROUNDS} alternating rounds.",
        "",
        "| M | N | K | Triton TFLOP/s | torch TFLOP/s | ratio | rel. error | Triton config |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['m']} | {r['n']} | {r['k']} | {r['triton_tflops']:.1f} | "
            f"{r['torch_tflops']:.1f} | {r['ratio']:.2f} | {r['rel_error']:.1e} | {r['config']} |"
        )
    (gm, gn, gk), goal = GOAL
    got = next(r["ratio"] for r in rows if (r["m"], r["n"], r["k"]) == (gm, gn, gk))
    verdict = "met" if got >= goal else "not met"
    lines += ["", f"Goal: Triton >= {goal:.0%} of torch at {gm}^3: {got:.0%}, {verdict}."]
    return "\n".join(lines) + "\n"


# -- tileops.nn.Linear ------------------------------------------------------------------------

LINEAR_SHAPES = [(1, 4096, 4096), (8192, 4096, 4096), (8192, 4096, 14336)]  # tokens, out, in
LINEAR_CONTENDERS = ("tnn.Linear", "F.linear", "kernel", "kernel, bias added", "before: W^T copy")


def measure_linear(m: int, n: int, k: int, bias: bool) -> dict:
    import torch.nn.functional as F

    import tileops.nn as tnn
    from tileops.ops import GemmOp

    linear = tnn.Linear(k, n, bias=bias, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w, b = linear.weight.detach(), None if linear.bias is None else linear.bias.detach()
    op = GemmOp(trans_b=True)
    call = GemmCall(device=x.device, m=m, n=n, k=k, dtype=x.dtype, trans_b=True, has_bias=bias)
    key, kernel = op.key_for("gemm", call), op.kernel_for("gemm", call)  # the entry dispatch runs
    contenders = {
        "tnn.Linear": lambda: linear(x),
        "F.linear": lambda: F.linear(x, w, b),
        "kernel": lambda: kernel(x, w, b),
    }
    if bias:
        plain = op.kernel_for("gemm", dataclasses.replace(call, has_bias=False))
        contenders["kernel, bias added"] = lambda: plain(x, w, None) + b
    contenders["before: W^T copy"] = before_nt(GemmOp(), x, w, b)
    with torch.no_grad():
        reference = F.linear(x.double(), w.double(), None if b is None else b.double())
        errors = {name: relative_error_to(fn(), reference) for name, fn in contenders.items()}
        ms = bench_all(contenders, ROUNDS)
        loops = {name: loop_us(fn) for name, fn in contenders.items()}
    row = {"m": m, "n": n, "k": k, "bias": bias, "key": key}
    for name in contenders:
        row[name] = {"us": 1e3 * ms[name], "loop_us": loops[name], "rel_error": errors[name],
                     "tflops": 2.0 * m * n * k / ms[name] / 1e9}  # fmt: skip
    return row


def before_nt(nn_op: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> Any:
    """The Linear before NT layouts, on an NN GemmOp: `x @ (W^T copy)`, or at few rows
    `(W @ x^T)^T` (copies x^T and the result), whichever copied less; the bias added after."""
    (m, k), n = x.shape, w.shape[0]
    if m * (k + n) >= k * n:
        product = lambda: nn_op(x, w.t().contiguous())  # noqa: E731
    else:
        product = lambda: nn_op(w, x.t().contiguous()).t().contiguous()  # noqa: E731
    return product if b is None else (lambda: product() + b)


def relative_error_to(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out.double() - reference).norm() / reference.norm()).item()


def linear_markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        f"# tileops.nn.Linear, bf16, on {meta['device']}",
        "",
        f"{meta['date']}, commit {meta['commit']}, torch {meta['torch']}, triton {meta['triton']}."
        f" Medians of do_bench (L2 cleared per repetition), best of {ROUNDS} alternating rounds;"
        " `loop`: back-to-back calls, L2 warm. M x N x K = tokens x out x in. Ratios: F.linear's"
        " time over the contender's (> 1: faster than F.linear).",
        "",
        "| M x N x K | bias | key | contender | us | loop us | TFLOP/s | vs F.linear | loop vs "
        "F.linear | rel. error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        theirs = r["F.linear"]
        for name in LINEAR_CONTENDERS:
            if name not in r:
                continue
            t = r[name]
            lines.append(
                f"| {r['m']} x {r['n']} x {r['k']} | {'yes' if r['bias'] else 'no'} | {r['key']} "
                f"| {name} | {t['us']:.1f} | {t['loop_us']:.1f} | {t['tflops']:.0f} | "
                f"{theirs['us'] / t['us']:.2f} | {theirs['loop_us'] / t['loop_us']:.2f} | "
                f"{t['rel_error']:.1e} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("triton", "linear"), default="triton")
    parser.add_argument("--out", default=str(results_dir("gemm")))
    parser.add_argument("--commit", default=None)
    args = parser.parse_args()
    meta = run_stamp(args.commit, triton=triton.__version__)
    if args.part == "linear":
        rows = [measure_linear(*s, bias) for s in LINEAR_SHAPES for bias in (False, True)]
        prefix, text = "linear", linear_markdown(rows, meta)
    else:
        rows = [measure(*shape) for shape in SHAPES]
        prefix, text = "gemm", markdown(rows, meta)
    stem = result_path(args.out, prefix, meta["device"], "")
    stem.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    stem.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
