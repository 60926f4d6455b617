"""BatchNorm and GEMM on one GPU: tileops-cuda's TileLang kernels against their peers, same run.

BatchNorm (training and inference) over ResNet-50's BatchNorm layers at batch 32 and 256 and a
(4, 128, 1024, 1024) tensor. Contenders: cuDNN through `F.batch_norm`, `torch.compile` of the
same, the tileops op as dispatched (and the key that served it), and every tileops-cuda key of
the interface that serves the call, built through its own `entry_for`. Each is reported as a
share of the copy bandwidth measured in the same run on the same bytes: a training call moves
three passes of x (read for the statistics, read again, write y), an inference call two.

GEMM (float16 / bfloat16) on square, LLM-layer and skinny (decode) shapes, misaligned ones
included: torch.matmul (cuBLAS), the tileops op as dispatched, and each tileops-cuda GEMM key
that serves the call; TFLOP/s. Decode rows (m <= 64) also give `<name> weight %`: the
weight's bytes over the call's kernel time (profiler, L2 cleared), as % of a same-run copy.

Times are medians of `triton.testing.do_bench` (the L2 is cleared before every repetition),
best of --rounds alternating rounds. BatchNorm rows also give `cudnn loop us` and `tileops loop
us`: microseconds per call over 200 back-to-back calls with a warm L2, the slower of the host's
launch path and the kernel, as in a model's layer loop; `<name> graph` columns time the
same call replayed from a CUDA graph (no host launch path), and `<name> kernel` columns its
GPU kernel time alone (profiler, L2 cleared), against a copy timed the same way: a small
layer's kernels take a few microseconds, less than an eager launch or a graph replay.

    python benchmarks/suites/batchnorm_gemm_h200.py [--part batchnorm,gemm] [--modes train,infer]
        [--dtypes bfloat16,...] [--batches 32,256] [--max-m M] [--rounds 2] [--no-compile]
        [--out DIR]
        [--commit SHA]

Writes `<out>/batchnorm_gemm_<device>.{md,json}` stamped with the date, device, versions and
commit.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
from _harness.copies import copy_gbps, copy_moving
from _harness.ops import DTYPES, EPS, MOMENTUM, bn_call_for, bn_params
from _harness.provenance import result_path, results_dir, run_stamp
from _harness.timing import bench_all, graphed, kernel_us, loop_us

# ResNet-50's BatchNorm layers as (channels, height, width), torchvision's layout.
RESNET50 = [(64, 112, 112), (64, 56, 56), (256, 56, 56), (128, 56, 56), (128, 28, 28),
            (512, 28, 28), (256, 28, 28), (256, 14, 14), (1024, 14, 14), (512, 14, 14),
            (512, 7, 7), (2048, 7, 7)]  # fmt: skip
LARGE = (4, 128, 1024, 1024)
GEMM_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 11008, 4096), (4096, 4096, 11008),
               (4096, 4095, 4096), (1000, 1001, 999), (1, 4096, 4096), (16, 4096, 4096),
               (64, 4096, 4096), (1, 11008, 4096), (32, 14336, 4096), (1, 8192, 8192),
               (16, 8192, 8192), (64, 8192, 8192)]  # fmt: skip
PASSES = {"train": 3, "infer": 2}


@dataclass
class Row:
    """One shape of one part: its contenders' times and what they mean."""

    part: str
    shape: tuple[int, ...]
    dtype: str
    served_by: str = ""
    ms: dict[str, float] = field(default_factory=dict)
    score: dict[str, float] = field(default_factory=dict)  # % of copy, or TFLOP/s
    copy_gbps: float = 0.0


# -- BatchNorm -------------------------------------------------------------------------------


def bn_shapes(batches: list[int]) -> list[tuple[int, ...]]:
    return [(b, *layer) for b in batches for layer in RESNET50] + [LARGE]


def bn_contenders(
    mode: str, x: torch.Tensor, compiled: bool
) -> tuple[dict[str, Callable[[], Any]], str]:
    """Every contender of one BatchNorm call, and the key the dispatched op chose."""
    import tileops_cuda
    from tileops.ops import BatchNormFwdOp

    training = mode == "train"
    c = x.shape[1]
    params = bn_params(x)

    def torch_bn() -> torch.Tensor:
        return F.batch_norm(x, params[2], params[3], params[0], params[1], training, MOMENTUM, EPS)

    contenders = {"cudnn": torch_bn}
    if compiled:  # a static graph per shape, as for a model of fixed shapes (no recompiles
        torch._dynamo.reset()  # turning dynamic after the second shape, or past dynamo's limit)
        contenders["torch.compile"] = torch.compile(torch_bn, dynamic=False)
    op = BatchNormFwdOp(c, EPS, MOMENTUM, training=training)
    contenders["tileops"] = lambda: op(x, *params)
    interface = "batch_norm_fwd_train" if training else "batch_norm_fwd_infer"
    call = bn_call_for(x)
    x3 = x.view(x.shape[0], c, call.spatial)
    contract = BatchNormFwdOp.interfaces[interface]
    for key, cls in tileops_cuda.KERNELS[BatchNormFwdOp].items():
        if issubclass(cls, contract) and cls.refusal(call) is None:
            kernel = cls.entry_for(call)[1]()
            contenders[key] = lambda kernel=kernel: kernel(x3, *params)
    return contenders, op.key_for(interface, call)


def measure_bn(mode: str, shape: tuple[int, ...], dtype: str, args: argparse.Namespace) -> Row:
    x = torch.randn(shape, device="cuda", dtype=DTYPES[dtype]) * 2 + 0.5
    contenders, served = bn_contenders(mode, x, not args.no_compile)
    moved = PASSES[mode] * x.numel() * x.element_size()
    row = Row(f"batchnorm_{mode}", shape, dtype, served, copy_gbps=copy_gbps(moved, args.rounds))
    for fn in contenders.values():
        fn()  # compile / build outside the timing
    row.ms = bench_all(contenders, args.rounds)
    for name, ms in row.ms.items():
        row.score[name] = 100 * moved / ms / 1e6 / row.copy_gbps
    for name in ("cudnn", "tileops"):  # back-to-back: does the host keep up with the kernel?
        row.score[f"{name} loop us"] = min(loop_us(contenders[name]) for _ in range(args.rounds))
    peers = ("cudnn", "torch.compile", "tileops")
    replays = {f"{name} graph": graphed(contenders[name]) for name in peers if name in contenders}
    for name, ms in bench_all(replays, args.rounds).items():
        row.ms[name] = ms
        row.score[name] = 100 * moved / ms / 1e6 / row.copy_gbps
    # Small layers' kernels run shorter than a launch, eager or replayed: GPU time alone.
    copy_us = kernel_us(copy_moving(moved))
    for name in peers:
        if name in contenders:
            row.score[f"{name} kernel"] = 100 * copy_us / kernel_us(contenders[name])
    return row


# -- GEMM ------------------------------------------------------------------------------------


def measure_gemm(shape: tuple[int, int, int], dtype: str, args: argparse.Namespace) -> Row:
    import tileops_cuda
    from tileops.ops import GemmCall, GemmOp
    from tileops_cuda.gemm.tiles import SKINNY_M

    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=DTYPES[dtype])
    b = torch.randn(k, n, device="cuda", dtype=DTYPES[dtype])
    op = GemmOp()
    call = GemmCall(device=a.device, m=m, n=n, k=k, dtype=a.dtype)
    contenders = {"torch.matmul": lambda: torch.matmul(a, b), "tileops": lambda: op(a, b)}
    for key, cls in tileops_cuda.KERNELS[GemmOp].items():
        if cls.refusal(call) is None and arch() in (cls.supported_archs or {arch()}):
            kernel = cls.entry_for(call)[1]()
            contenders[key] = lambda kernel=kernel: kernel(a, b)
    row = Row("gemm", shape, dtype, op.key_for("gemm", call))
    reference = a.float() @ b.float()
    errors = {n: ((fn().float() - reference).norm() / reference.norm()).item()
              for n, fn in contenders.items()}  # fmt: skip
    row.ms = bench_all(contenders, args.rounds)
    for name, ms in row.ms.items():
        row.score[name] = 2.0 * m * n * k / ms / 1e9
        row.score[f"{name} rel. error"] = errors[name]
    if m <= SKINNY_M:  # decode: kernels of ~10 us, shorter than their launch path
        weight_read_from_kernel_times(row, contenders, k * n * a.element_size())
    return row


def weight_read_from_kernel_times(row: Row, contenders: dict, weight_bytes: int) -> None:
    """`<name> weight %`: the weight's bytes over each contender's kernel time, as % of a copy
    of the same bytes timed the same way. A decode GEMM's kernels take ~10 us while launching
    them takes the H200 machine's host 20-75 us, so eager timings there time the host (a
    profile showed the dispatched op and its key alone running the same kernels for the same
    GPU time where do_bench gave 20 and 30 TFLOP/s), and a CUDA graph's replay adds its own
    launch; the profiler's kernel durations, L2 cleared before each call, do not.

    Each figure comes twice: the L2 cleared by writing a 256 MB buffer (do_bench's way), which
    leaves the L2 full of dirty lines that a read-only kernel writes back as it evicts them,
    and (`clean L2`) by reading one, as after a decode step's small activation writes."""
    copy = copy_moving(2 * weight_bytes)  # the weight's bytes read and as many written
    for clear, suffix in (("write", ""), ("read", " (clean L2)")):
        copy_us = kernel_us(copy, clear=clear)
        for name, fn in contenders.items():
            row.score[f"{name} weight %{suffix}"] = 100 * copy_us / (2 * kernel_us(fn, clear=clear))


def arch() -> int:
    major, minor = torch.cuda.get_device_capability()
    return 10 * major + minor


# -- report ----------------------------------------------------------------------------------


def markdown(rows: list[Row], meta: dict) -> str:
    lines = [
        f"# BatchNorm and GEMM on {meta['device']}",
        "",
        f"{meta['date']}, commit {meta['commit']}, torch {meta['torch']}, tilelang "
        f"{meta['tilelang']}. Medians of do_bench (L2 cleared per repetition), best of "
        f"{meta['rounds']} rounds. BatchNorm: % of the same-run copy bandwidth on the same bytes "
        "(training 3 passes of x, inference 2); GEMM: TFLOP/s.",
    ]
    for part in dict.fromkeys(r.part for r in rows):
        chosen = [r for r in rows if r.part == part]
        names = list(dict.fromkeys(n for r in chosen for n in r.score))
        unit = "TFLOP/s" if part == "gemm" else "% of copy"
        lines += ["", f"## {part} ({unit})", "", "| shape | dtype | served by | "
                  + " | ".join(names) + " |", "|---" * (3 + len(names)) + "|"]  # fmt: skip
        for r in chosen:
            cells = [_cell(r.score.get(n), n) for n in names]
            lines.append(
                f"| {'x'.join(map(str, r.shape))} | {r.dtype} | {r.served_by} | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines) + "\n"


def _cell(value: float | None, name: str) -> str:
    if value is None:
        return "-"
    return f"{value:.1e}" if name.endswith("rel. error") else f"{value:.1f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="batchnorm,gemm", help="batchnorm and/or gemm")
    parser.add_argument("--dtypes", default="bfloat16", help=f"of {','.join(DTYPES)}")
    parser.add_argument("--batches", default="32,256", help="ResNet-50 batch sizes")
    parser.add_argument("--modes", default="train,infer", help="BatchNorm modes")
    parser.add_argument("--max-m", type=int, default=None, help="GEMM shapes with m <= this")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--out", default=str(results_dir("batch_norm")))
    parser.add_argument("--commit", default=None)
    args = parser.parse_args(argv)
    args.part = args.part.split(",")
    args.dtypes = args.dtypes.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.modes = args.modes.split(",")
    unknown = [p for p in args.part if p not in ("batchnorm", "gemm")]
    unknown += [m for m in args.modes if m not in PASSES]
    unknown += [d for d in args.dtypes if d not in DTYPES]
    if unknown:
        parser.error(f"unknown parts, modes or dtypes: {unknown}")
    return args


def run(args: argparse.Namespace, meta: dict) -> list[Row]:
    """Every row, the files rewritten after each: a run cut off by a time limit keeps its rows."""
    jobs = []
    if "batchnorm" in args.part:
        jobs += [(measure_bn, (mode, shape, dtype)) for mode in args.modes
                 for shape in bn_shapes(args.batches) for dtype in args.dtypes]  # fmt: skip
    if "gemm" in args.part:  # tileops-cuda's GEMM is 16-bit only
        jobs += [(measure_gemm, (shape, dtype)) for dtype in args.dtypes if dtype != "float32"
                 for shape in GEMM_SHAPES if shape[0] <= (args.max_m or shape[0])]  # fmt: skip
    rows = []
    for measure, job in jobs:
        rows.append(measure(*job, args))
        print(rows[-1].part, rows[-1].shape, rows[-1].dtype, _scores(rows[-1]), flush=True)
        write(rows, meta, Path(args.out))
    return rows


def write(rows: list[Row], meta: dict, out: Path) -> str:
    stem = result_path(out, "batchnorm_gemm", meta["device"], "")
    payload = {**meta, "rows": [asdict(r) for r in rows]}
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    text = markdown(rows, meta)
    stem.with_suffix(".md").write_text(text)
    return text


def _scores(row: Row) -> str:
    return ", ".join(f"{name} {value:.3g}" for name, value in row.score.items())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import tilelang

    meta = run_stamp(args.commit, tilelang=tilelang.__version__, rounds=args.rounds)
    print(write(run(args, meta), meta, Path(args.out)))


if __name__ == "__main__":
    main()
