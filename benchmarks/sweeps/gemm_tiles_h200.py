"""GEMM tile sweep on one GPU: candidate tiles of tileops-cuda's Hopper and skinny kernels
against torch.matmul, measured in the same run.

The tile rules in `tileops_cuda.gemm` are read off this table. Hopper candidates vary the
tile, pipeline depth, warp policy and epilogue (C stored from registers, or staged in shared
memory) at the large square shapes; skinny candidates vary the column tile, k tile, blocks per
multiprocessor and how a split k is summed (a second kernel, or the fixup: the last block of
each column tile), at decode shapes, scored as % of a same-run copy of the weight's bytes (the
weight read dominates), from GPU kernel times.

    python benchmarks/sweeps/gemm_tiles_h200.py [--kinds hopper,skinny] [--workers 14] [--rounds 3]
        [--clear write|read] [--only REGEX] [--shapes MxNxK,...] [--out DIR]

Writes `<out>/gemm_tiles_<device>.md`. Candidates that fail to build are listed with the error.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import multiprocessing
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
from _harness.copies import copy_moving
from _harness.provenance import git_commit, results_dir, write_markdown
from _harness.timing import bench, kernel_us

SQUARE = [(4096, 4096, 4096), (8192, 8192, 8192)]
SKINNY = [(1, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096), (1, 8192, 8192), (64, 8192, 8192)]
# The Hopper kernel's decode tiles, unsplit: where it overtakes the split-K kernel in m.
DECODE = [(16, 4096, 4096), (32, 4096, 4096), (64, 4096, 4096), (32, 8192, 8192),
          (64, 8192, 8192), (64, 11008, 4096), (32, 14336, 4096)]  # fmt: skip
DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Candidate:
    kind: str  # "hopper" or "skinny"
    shape: tuple[int, int, int]
    settings: tuple  # hopper: (block_m, block_n, block_k, stages, policy, epilogue);
    # skinny: (block_n, block_k, blocks_per_sm, how a split k is summed, stages, threads)

    @property
    def label(self) -> str:
        return " ".join(map(str, self.settings))


def candidates(shapes: list[tuple[int, int, int]] | None = None) -> list[Candidate]:
    """Every candidate at its shapes, or at `shapes` (m <= 64: the decode candidates)."""
    hopper = [(128, 256, 64, s, p, "direct") for s in (3, 4) for p in ("Square", "FullRow")]
    hopper += [(128, 128, 64, s, p, "direct") for s in (4, 6) for p in ("Square", "FullRow")]
    hopper += [(256, 128, 64, 3, "FullCol", "direct"), (128, 192, 64, 4, "FullRow", "direct")]
    # C staged through shared memory and stored in bulk (the C tile takes one stage's room).
    hopper += [(128, 256, 64, 3, "FullRow", "smem"), (128, 128, 64, 4, "FullRow", "smem"),
               (256, 128, 64, 3, "FullCol", "smem")]  # fmt: skip
    # TMA copies trailed cp.async at every decode shape (results/gemm_tiles_skinny_*), so the
    # sweep varies how a split k is summed: a second kernel or the fixup (the last block). A
    # cluster sum trailed both (results/gemm_tiles_skinny_split_sum_*, commit e577926).
    skinny = [(bn, bk, bps, how, 0, 0) for bn in (64, 128) for bk in (64, 128)
              for bps in (1, 2, 4) for how in ("kernel", "fixup")]  # fmt: skip
    # One kernel, no split of k (no partials, no second launch): narrow columns fill the grid.
    skinny += [(32, bk, 0.5, "kernel", 0, 0) for bk in (64, 128)]
    # Deeper pipelines than the shared-memory rule's cap (0: the rule's): more weight in flight.
    skinny += [(64, 64, bps, how, s, 0) for bps in (1, 2) for how in ("kernel", "fixup")
               for s in (6, 8, 12) if bps * s <= 16]  # fmt: skip
    # TileLang's Hopper path (TMA copies, wgmma, a producer warpgroup) trailed cp.async and
    # mma.sync at every decode shape: 53 against 56% of copy at 64x4096x4096 (results/
    # gemm_tiles_skinny_wgmma_clean_l2_nvidia_h200.md, the option of commit d0f5262).
    # Twice the warps (0: SKINNY_THREADS): more mma issue for a 64-row tile. Slower at every
    # decode shape, 43-55% of copy against 52-55 at 64x4096x4096 (results/
    # gemm_tiles_skinny_threads_clean_l2_nvidia_h200.md).
    skinny += [(bn, 64, bps, "kernel", 0, 256) for bn in (64, 128) for bps in (1, 2)]
    # Swapped operands (C^T = B^T A^T: the weight tile as wgmma's 64-row operand, the tokens as
    # its narrow N, TMA copies) trailed at every decode shape: 45.6 against 51.7% of copy at
    # 64x4096x4096, 65.5 against 72.8 at 1x4096x4096 (results/
    # gemm_tiles_skinny_swapped_clean_l2_nvidia_h200.md, the option of commit b4fc433).
    # The Hopper kernel at m = 64 unsplit: narrow column tiles fill the grid and a deep TMA
    # pipeline keeps the weight in flight (cuBLAS's choice there: a 64 x 32 tile, no split).
    decode = [(64, bn, 128, s, "FullRow", "direct") for bn in (32, 64, 128)
              for s in (4, 6, 7, 8, 9) if s * (64 + bn) * 128 * 2 <= 225 * 1024]  # fmt: skip
    if shapes:
        square = [s for s in shapes if s[0] > 64]
        decoding = skinny_shapes = [s for s in shapes if s[0] <= 64]
    else:
        square, decoding, skinny_shapes = SQUARE, DECODE, list(dict.fromkeys(SKINNY + DECODE))
    return (
        [Candidate("hopper", shape, h) for shape in square for h in hopper]
        + [Candidate("hopper", shape, h) for shape in decoding for h in decode]
        + [Candidate("skinny", shape, k) for shape in skinny_shapes for k in skinny]
    )


def gemm_skinny_m() -> int:
    from tileops_cuda.gemm.tiles import SKINNY_M

    return SKINNY_M


def call_for(shape: tuple[int, int, int]) -> Any:
    from tileops.ops import GemmCall

    m, n, k = shape
    return GemmCall(device=torch.device("cuda"), m=m, n=n, k=k, dtype=DTYPE)


def build(candidate: Candidate) -> Any:
    """The candidate as a callable kernel (compiled through the shared disk cache)."""
    from tileops_cuda._common.compile import build_program
    from tileops_cuda.gemm import kernels as gemm

    call = call_for(candidate.shape)
    name = f"sweep/{candidate.kind}/{candidate.shape}/{candidate.settings}"
    if candidate.kind == "hopper":
        bm, bn, bk, stages, policy, epilogue = candidate.settings
        threads = 256 if bm >= 128 else 128  # a consumer warpgroup per 64 rows
        tile = gemm.Tile(bm, bn, bk, threads, stages, policy, smem_epilogue=epilogue == "smem")
        program = build_program(name, lambda: gemm.gemm_program(call, tile, tma=True), 90,
                                 features="a")  # fmt: skip
        return gemm.GemmHopper(call, [program])
    bn, bk, bps, how, stages, threads = candidate.settings
    plan = replace(gemm.skinny_plan(call, bn, bk, bps), fixup=how == "fixup")
    if stages:
        plan = replace(plan, tile=replace(plan.tile, stages=stages))
    if threads:
        plan = replace(plan, tile=replace(plan.tile, threads=threads))
    programs = [build_program(f"{name}/0", lambda: gemm.skinny_program(call, plan), 90,
                              pass_configs=gemm.MMA_SYNC_ONLY)]  # fmt: skip
    if plan.splits > 1 and not plan.fixup:
        programs.append(build_program(f"{name}/1", lambda: gemm.reduce_program(call, plan), 90))
    kernel = gemm.GemmSkinny(call, programs)
    kernel.plan_ = plan
    return kernel


def prebuild(candidate: Candidate) -> str:
    try:
        build(candidate)
        return ""
    except Exception as error:  # a candidate TileLang cannot lower is reported, not fatal
        return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"


def measure(
    shape: tuple[int, int, int], group: list[Candidate], errors: dict, rounds: int, clear: str
) -> list[str]:
    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=DTYPE)
    b = torch.randn(k, n, device="cuda", dtype=DTYPE)
    want = a.float() @ b.float()
    decode = m <= gemm_skinny_m()

    def timer(fn: Any) -> float:
        """ms per call; decode kernels (~10 us) by GPU time: do_bench would time their launch."""
        return kernel_us(fn, clear=clear) / 1000 if decode else bench(fn, rounds)

    moved = 2 * k * n * 2  # the weight's bytes read and as many written
    weight_gbps = moved / timer(copy_moving(moved)) / 1e6 if decode else 0.0

    def score(ms: float) -> str:
        if weight_gbps:
            return f"{100 * k * n * 2 / ms / 1e6 / weight_gbps:.1f}% copy"
        return f"{2 * m * n * k / ms / 1e9:.1f} TF/s"

    base = timer(lambda: torch.matmul(a, b))
    kinds = "/".join(sorted({c.kind for c in group}))
    lines = [f"\n## {kinds} {m}x{n}x{k}\n",
             "| candidate | ms | score | vs matmul | rel. error |", "|---|---|---|---|---|",
             f"| torch.matmul | {base:.4f} | {score(base)} | 1.00x | |"]  # fmt: skip
    for candidate in group:
        if errors.get(candidate):
            lines.append(f"| {candidate.label} | build failed: {errors[candidate]} | | | |")
            continue
        kernel = build(candidate)
        error = ((kernel(a, b).float() - want).norm() / want.norm()).item()
        ms = timer(lambda kernel=kernel: kernel(a, b))
        cells = f"{ms:.4f} | {score(ms)} | {base / ms:.2f}x | {error:.1e}"
        lines.append(f"| {candidate.label} | {cells} |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="hopper,skinny", help="which kernels to sweep")
    parser.add_argument("--only", default="", help="regex on 'kind label' of the candidates")
    parser.add_argument("--shapes", default="", help="MxNxK,...: these shapes instead")
    parser.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 14))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--clear",
        default="write",
        choices=("write", "read"),
        help="skinny: clear the L2 by writing or reading 256 MB before each call",
    )
    parser.add_argument("--out", default=str(results_dir("gemm")))
    args = parser.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",") if s]
    todo = [c for c in candidates(shapes) if c.kind in args.kinds.split(",")
            and re.search(args.only, f"{c.kind} {c.label}")]  # fmt: skip
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        errors = dict(zip(todo, pool.map(prebuild, todo), strict=True))
    device = torch.cuda.get_device_name()
    lines = [f"# GEMM tile sweep on {device}\n",
             f"{datetime.date.today()}, commit {git_commit()}, torch "
             f"{torch.__version__}, bfloat16; medians of do_bench (L2 cleared), best of "
             f"{args.rounds}. Hopper settings: block_m block_n block_k stages policy "
             "epilogue; skinny: block_n block_k blocks-per-SM split-sum stages threads (0: "
             "the rule's). Skinny candidates are timed as GPU kernel time (profiler, the L2 "
             f"cleared by a 256 MB {args.clear}): decode kernels are shorter than their "
             "launch path, which do_bench would time."]  # fmt: skip
    for shape in dict.fromkeys(c.shape for c in todo):
        group = [c for c in todo if c.shape == shape]
        lines += measure(shape, group, errors, args.rounds, args.clear)
    kinds = args.kinds.replace(",", "_") + ("_clean_l2" if args.clear == "read" else "")
    write_markdown(args.out, f"gemm_tiles_{kinds}", device, lines)


if __name__ == "__main__":
    main()
