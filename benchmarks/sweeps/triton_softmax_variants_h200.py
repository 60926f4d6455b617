"""Variants of the fused Triton softmax against Liger-Kernel's, bfloat16, M*N = 2**26, % of a
same-run copy: fp32 or native-dtype max (NATIVE), `.ca` or `evict_first` loads (CA), `.cs`
stores (CS), two warp counts per n. The choices in tileops_triton (`.ca` loads, the softmax
warps) are read off its table (results/norms/triton_softmax_variants_nvidia_h200.txt).

    python benchmarks/sweeps/triton_softmax_variants_h200.py \
        > benchmarks/results/norms/triton_softmax_variants_<device>.txt
"""

import datetime
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import triton
import triton.language as tl
from _harness.copies import copy_gbps
from _harness.provenance import git_commit
from _harness.timing import bench

WARPS = {1024: (4, 8), 4096: (8, 16), 8192: (8, 16), 16384: (16, 32), 32768: (16, 32)}


@triton.jit
def soft(
    X,
    Y,
    rows,
    n,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
    NATIVE: tl.constexpr,
    CA: tl.constexpr,
    CS: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (r[:, None] < rows) & (cols[None, :] < n)
    offs = r[:, None] * n + cols[None, :]
    if CA:
        x = tl.load(X + offs, mask=mask, other=-float("inf"), cache_modifier=".ca")
    else:
        x = tl.load(X + offs, mask=mask, other=-float("inf"), eviction_policy="evict_first")
    if not NATIVE:
        x = x.to(tl.float32)
    row_max = tl.max(x, axis=1)
    e = tl.exp(x.to(tl.float32) - row_max.to(tl.float32)[:, None])
    y = e * (1.0 / tl.sum(e, axis=1))[:, None]
    if CS:
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask, cache_modifier=".cs")
    else:
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


def measure(n: int) -> list[str]:
    """The variants at row length n, best first, against Liger's softmax in the same run."""
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    m, rows = (1 << 26) // n, max(2048 // n, 1)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    want = torch.softmax(x.float(), -1)
    gbps = copy_gbps(x.numel() * 2, 3)
    pct = 100 * 2 * x.numel() * 2 / 1e6 / gbps  # % of copy = pct / ms
    liger = bench(lambda: LigerSoftmaxFunction.apply(x), 3)
    results = []
    for warps, native, ca, cs in itertools.product(WARPS[n], (0, 1), (0, 1), (0, 1)):
        flags = {"NATIVE": native, "CA": ca, "CS": cs}

        def run(warps=warps, flags=flags):
            soft[(triton.cdiv(m, rows),)](x, y, m, n, rows, n, **flags, num_warps=warps)

        run()
        error = (y.float() - want).abs().max().item()
        results.append((pct / bench(run, 2), warps, native, ca, cs, error))
    lines = [f"N={n} copy {gbps:.0f} GB/s liger {pct / liger:.1f}"]
    for score, warps, native, ca, cs, error in sorted(results, reverse=True):
        lines.append(
            f"  {score:.1f}%  warps {warps} native {native} ca {ca} cs {cs}  err {error:.1e}"
        )
    return lines


def main() -> None:
    print(f"{datetime.date.today()}, commit {git_commit()}, {torch.cuda.get_device_name()}")
    for n in WARPS:
        print("\n".join(measure(n)), flush=True)


if __name__ == "__main__":
    main()
