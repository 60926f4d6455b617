"""How fast can any kernel read a decode GEMM's weight from a clean L2, and what cuBLAS launches
at the decode shapes: the bound behind the skinny GEMM goal (85% of copy bandwidth).

For each size: a device copy of it (the decode tables' baseline: the weight's bytes read and
as many written) and the fastest of a grid of Triton read-only kernels (every byte loaded once,
XOR-folded), both as GPU kernel time after a 256 MB read clears the L2. Then, at the decode
shapes, each kernel torch.matmul (cuBLAS) and tileops launch, with its time.

    python benchmarks/sweeps/weight_read_bound_h200.py [--out DIR]

Writes `<out>/weight_read_bound_<device>.md`.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import triton
import triton.language as tl
from _harness.provenance import git_commit, results_dir, write_markdown
from _harness.timing import kernel_breakdown, kernel_us

SIZES_MB = (16, 32, 64, 128, 1024)
DECODE = [(m, n, n) for n in (4096, 8192) for m in (1, 16, 64)]
# Read kernel grid: programs (from one per SM to 64), elements per load, warps.
PROGRAMS = (132, 264, 528, 1056, 2112, 4224, 8448)
BLOCKS = (1024, 2048, 4096)
WARPS = (4, 8)


@triton.jit
def read_kernel(x, out, n, BLOCK: tl.constexpr, PROGRAMS: tl.constexpr):
    """Each program folds a strided share of x into one value: every byte read once."""
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), tl.int32)
    for start in range(pid * BLOCK, n, PROGRAMS * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc ^= tl.load(x + offs, mask=offs < n, other=0)
    tl.store(out + pid, tl.sum(acc, 0))


def _reader(x: torch.Tensor, out: torch.Tensor, programs: int, block: int, warps: int):
    launch = read_kernel[(programs,)]
    return lambda: launch(x, out, x.numel(), BLOCK=block, PROGRAMS=programs, num_warps=warps)


def read_bound(megabytes: int) -> str:
    nbytes = megabytes << 20
    x = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda").random_()
    y = torch.empty_like(x)
    out = torch.empty(max(PROGRAMS), dtype=torch.int32, device="cuda")
    copy_us = kernel_us(lambda: y.copy_(x), clear="read")
    reads = [
        (kernel_us(_reader(x, out, *config), clear="read"), " / ".join(map(str, config)))
        for config in itertools.product(PROGRAMS, BLOCKS, WARPS)
    ]
    best_us, config = min(reads)
    copy_rate, read_rate = 2 * nbytes / copy_us / 1e6, nbytes / best_us / 1e6
    return (f"| {megabytes} MB | {copy_us:.1f} | {copy_rate:.2f} | {best_us:.1f} | "
            f"{read_rate:.2f} | {100 * read_rate / copy_rate:.1f} | {config} |")  # fmt: skip


def decode_kernels(shape: tuple[int, int, int]) -> list[str]:
    from tileops.ops import GemmOp

    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    op = GemmOp()
    lines = []
    for label, fn in (("torch.matmul", lambda: torch.matmul(a, b)), ("tileops", lambda: op(a, b))):
        for name, us in kernel_breakdown(fn):
            lines.append(f"| {m}x{n}x{k} | {label} | `{name[:90]}` | {us:.1f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(results_dir("gemm")))
    args = parser.parse_args()
    device = torch.cuda.get_device_name()
    lines = [f"# Weight read bound on {device}\n",
             f"{datetime.date.today()}, commit {git_commit()}, torch {torch.__version__}, "
             f"triton {triton.__version__}. GPU kernel times (profiler medians of 30 calls), the "
             "L2 cleared by reading 256 MB before each. `read % of copy`: the best read-only "
             "kernel's rate as % of the copy's (bytes read and written over its time), the "
             "decode tables' `weight %` baseline.\n",
             "| size | copy us | copy TB/s | best read us | read TB/s | read % of copy | "
             "programs / block / warps |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    lines += [read_bound(mb) for mb in SIZES_MB]
    lines += ["\n## Decode kernels (bfloat16, clean L2)\n", "| shape | caller | kernel | us |",
              "|---|---|---|---|"]  # fmt: skip
    for shape in DECODE:
        lines += decode_kernels(shape)
    write_markdown(args.out, "weight_read_bound", device, lines)


if __name__ == "__main__":
    main()
