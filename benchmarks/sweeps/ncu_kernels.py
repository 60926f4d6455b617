"""One tileops call launched a few times, for Nsight Compute to profile on the GPU.

Cases: `<op>_<n>_<params>` (op ln, rms or softmax; M * n = 2^26 bfloat16 elements; params wb,
w or none), `gemm_<m>_<n>_<k>` or `bn_<batch>_<channels>_<spatial>_<train|infer>` (BatchNorm
with weight, bias and running stats; bfloat16). The first call compiles; profile later launches:

    ncu --clock-control none -k regex:main_kernel --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy python benchmarks/sweeps/ncu_kernels.py ln_65536_wb

(results/norms/ncu_norms_gemm_nvidia_h200.md)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
from _harness.ops import row_op_setup

OPS = {"ln": "layer_norm", "rms": "rms_norm", "softmax": "softmax"}


def call_of(case: str) -> Callable[[], torch.Tensor]:
    """The tileops call that `case` names, its inputs made once."""
    kind, *rest = case.split("_")
    if kind == "bn":
        return batch_norm_call(*map(int, rest[:3]), training=rest[3] == "train")
    if kind == "gemm":
        from tileops.ops import GemmOp

        m, n, k = map(int, rest)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        op = GemmOp()
        return lambda: op(a, b)
    n, params = int(rest[0]), rest[1]
    x = torch.randn(2**26 // n, n, device="cuda", dtype=torch.bfloat16)
    op, args, *_ = row_op_setup(OPS[kind], x)
    kept = {"wb": 2, "w": 1, "none": 0}[params]
    args = (x, *args[1 : 1 + kept], *(None,) * (len(args) - 1 - kept))
    return lambda: op(*args)


def batch_norm_call(batch: int, channels: int, spatial: int, training: bool):
    from tileops.ops import BatchNormFwdOp

    x = torch.randn(batch, channels, spatial, device="cuda", dtype=torch.bfloat16)
    params = [torch.rand(channels, device="cuda", dtype=x.dtype) for _ in range(4)]
    op = BatchNormFwdOp(channels, training=training)
    return lambda: op(x, *params)


if __name__ == "__main__":
    run = call_of(sys.argv[1])
    for _ in range(4):
        run()
    torch.cuda.synchronize()
