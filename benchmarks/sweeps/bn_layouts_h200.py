"""BatchNorm training layouts on one GPU, each timed on every shape, inside its region or not.

The region rules of `tileops_cuda.batch_norm` are read off this table: every training key's
kernel is built for the call through its own `entry_for` (a key outside its region still
builds where its plan fits the device) and timed beside `torch.compile` of `F.batch_norm`, as
a share of the same-run copy bandwidth on three passes' bytes.

    python benchmarks/sweeps/bn_layouts_h200.py [--shapes 32x256x3136,...]
        [--dtypes bfloat16,float32] [--out DIR] [--commit SHA]

Writes `<out>/bn_layouts_<device>.md` (after every row), stamped with the date and commit.
Every key compiles for every shape: budget about 20 s per shape and dtype.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
from _harness.copies import copy_gbps
from _harness.ops import DTYPES, EPS, MOMENTUM, bn_call_for, bn_params
from _harness.provenance import git_commit, result_path, results_dir
from _harness.timing import bench

SHAPES = ("32x256x3136", "32x128x3136", "32x64x3136", "32x512x784", "256x512x196",
          "256x1024x196", "256x128x784")  # fmt: skip


def measure(shape: tuple[int, int, int], dtype: torch.dtype) -> dict[str, str]:
    """% of copy per contender (or why it did not run) for one (batch, channels, spatial)."""
    import tileops_cuda
    from tileops.ops import BatchNormFwdOp, BatchNormTrainInterface

    x = torch.randn(shape, device="cuda", dtype=dtype) * 2 + 0.5
    w, b, rm, rv = bn_params(x)
    call = bn_call_for(x)
    moved = 3 * x.numel() * x.element_size()
    copy = copy_gbps(moved, 1)
    share = lambda ms: f"{100 * moved / ms / 1e6 / copy:.1f}"  # noqa: E731
    row = {}
    for key, cls in tileops_cuda.KERNELS[BatchNormFwdOp].items():
        if not issubclass(cls, BatchNormTrainInterface):
            continue
        try:
            kernel = cls.entry_for(call)[1]()
            row[key] = share(bench(lambda kernel=kernel: kernel(x, w, b, rm, rv), 1))
        except Exception as error:  # a plan that does not fit this device, say
            row[key] = f"did not run: {type(error).__name__}"
        if cls.refusal(call) is None:
            row[key] += " (serves)"
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda: F.batch_norm(x, rm, rv, w, b, True, MOMENTUM, EPS), dynamic=False
    )
    compiled()
    row["torch.compile"] = share(bench(compiled, 1))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--out", default=str(results_dir("batch_norm")))
    parser.add_argument("--commit", default=None)
    args = parser.parse_args()
    device = torch.cuda.get_device_name()
    lines = [f"# BatchNorm training layouts on {device}", "",
             f"{datetime.date.today().isoformat()}, commit {args.commit or git_commit()}, torch "
             f"{torch.__version__}; medians of do_bench (L2 cleared); % of a same-run copy of "
             "three passes' bytes; (serves): the key's region holds the call.", ""]  # fmt: skip
    path = result_path(args.out, "bn_layouts", device, ".md")
    header = False
    for dtype in args.dtypes.split(","):
        for text in args.shapes.split(","):
            row = measure(tuple(int(v) for v in text.split("x")), DTYPES[dtype])
            if not header:
                lines.append("| shape | dtype | " + " | ".join(row) + " |")
                lines.append("|---" * (2 + len(row)) + "|")
                header = True
            lines.append(f"| {text} | {dtype} | " + " | ".join(row.values()) + " |")
            print(lines[-1], flush=True)
            path.write_text("\n".join(lines) + "\n")  # a run cut off keeps its rows


if __name__ == "__main__":
    main()
