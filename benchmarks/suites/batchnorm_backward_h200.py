"""BatchNorm training forward + backward on one GPU, over ResNet-50's layers: torch's
F.batch_norm (cuDNN) against the op with its GPU backward (`aten_bn_backward`) and with the
recompute reference backward pinned, bf16 x with float32 parameters (as under autocast), NCHW
and channels_last.

    python benchmarks/suites/batchnorm_backward_h200.py [--batch 128] [--rounds 3] [--out DIR]

Writes `<out>/batchnorm_backward_<device>.md`, stamped with the date, device and commit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
from _harness.provenance import results_dir, run_stamp, write_markdown
from _harness.timing import bench_all

import tileops
from tileops.ops import BatchNormFwdOp

# ResNet-50's BatchNorm layers: (channels, height, width) at 224 x 224.
LAYERS = [(64, 112, 112), (64, 56, 56), (256, 56, 56), (128, 28, 28), (512, 28, 28),
          (256, 14, 14), (1024, 14, 14), (512, 7, 7), (2048, 7, 7)]  # fmt: skip


def contenders(x: torch.Tensor) -> dict:
    c = x.shape[1]
    weight, bias = (torch.rand(c, device="cuda").requires_grad_() for _ in range(2))
    stats = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    dy = torch.randn_like(x)
    op = BatchNormFwdOp(c)

    def eager():
        F.batch_norm(x, *stats, weight, bias, True, 0.1, 1e-5).backward(dy)

    def ours():
        op(x, weight, bias, *stats).backward(dy)

    def recompute():
        with tileops.pinned(BatchNormFwdOp, "backward", "reference_backward"):
            op(x, weight, bias, *stats).backward(dy)

    return {"cuDNN": eager, "op": ours, "op, recompute backward": recompute}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(results_dir("batch_norm")))
    args = parser.parse_args()
    stamp = run_stamp()
    lines = [
        f"# BatchNorm training forward + backward ({stamp['device']})",
        "",
        " ".join(f"{k}: {v}" for k, v in stamp.items()),
        "",
        f"`python benchmarks/suites/batchnorm_backward_h200.py --batch {args.batch}`: bf16 x, "
        "float32 weight, bias and running stats; ms, best of medians; ratio = cuDNN / op.",
        "",
        "| layout | channels x h x w | cuDNN ms | op ms | ratio | op, recompute backward ms |",
        "|---|---|---|---|---|---|",
    ]
    for layout in (torch.contiguous_format, torch.channels_last):
        name = "NCHW" if layout is torch.contiguous_format else "channels_last"
        for c, h, w in LAYERS:
            x = torch.randn(args.batch, c, h, w, device="cuda", dtype=torch.bfloat16)
            x = x.contiguous(memory_format=layout).requires_grad_()
            ms = bench_all(contenders(x), args.rounds)
            ratio = ms["cuDNN"] / ms["op"]
            lines.append(
                f"| {name} | {c}x{h}x{w} | {ms['cuDNN']:.3f} | {ms['op']:.3f} | {ratio:.2f} | "
                f"{ms['op, recompute backward']:.3f} |"
            )
    write_markdown(args.out, "batchnorm_backward", stamp["device"], lines)


if __name__ == "__main__":
    main()
