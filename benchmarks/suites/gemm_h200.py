"""bf16 GEMM on one GPU: the Triton backend's kernel against torch.matmul, in the same run.

Shapes: 4096^3 and 8192^3, and skinny M = 1, 16, 64 with N = K = 4096. The Triton kernel is
built as the dispatcher builds it (`TritonGemm.entry_for`), tuned on its first call (the
warm-up), then both are timed alternately as medians of `triton.testing.do_bench` (which
clears the L2 before each repetition) on fresh random inputs. The goal: Triton at 4096^3
reaches at least 85% of torch.matmul's TFLOP/s.

    python benchmarks/suites/gemm_h200.py [--out DIR] [--commit SHA]

Writes `<out>/gemm_<device>.{md,json}` stamped with the date, device, versions and commit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import triton
from _harness.provenance import result_path, results_dir, run_stamp
from _harness.timing import bench_all

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(results_dir("gemm")))
    parser.add_argument("--commit", default=None)
    args = parser.parse_args()
    meta = run_stamp(args.commit, triton=triton.__version__)
    rows = [measure(*shape) for shape in SHAPES]
    stem = result_path(args.out, "gemm", meta["device"], "")
    stem.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    text = markdown(rows, meta)
    stem.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
