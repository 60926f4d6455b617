"""Host time of the decode step's op calls through their lanes, beside torch's own calls.

Run `python benchmarks/suites/lane_host.py [--number 20000] [--repeats 7] [--out DIR]` on any
machine (it needs no GPU). Each op runs on CPU tensors of Llama decode shapes (batch 1, one
token, bfloat16) with a stand-in kernel registered for it (preferred over the reference) that
only allocates its outputs, so the figures are the host path alone: the op as called against
the stand-in called directly, and `tileops.nn.Linear` against nn.Linear (the GEMM reference,
as cuBLAS on a GPU, is torch-native). Rows are medians of loops timed in turns. Writes
`<out>/lane_host_cpu.md`; run it on two checkouts in one session to compare them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
from _harness.provenance import results_dir, run_stamp, write_markdown
from _harness.timing import per_call_ns

import tileops.nn as tnn
from tileops import Kernel
from tileops.backend import register_kernel_type
from tileops.ops import GLUFwdOp, GLUInterface, RMSNormFwdOp, RMSNormInterface, RotaryFwdOp
from tileops.ops.fused.rotary import RotaryInterface
from tileops.testing import isolated_registry

DTYPE = torch.bfloat16


class StandIn(Kernel):
    devices = {"cpu"}


class RowsStandIn(StandIn, RMSNormInterface):
    def forward(self, x, weight):  # noqa: ANN001, ANN201
        return torch.empty_like(x)


class GLUStandIn(StandIn, GLUInterface):
    def forward(self, gate, up):  # noqa: ANN001, ANN201
        return torch.empty_like(gate)


class RotaryStandIn(StandIn, RotaryInterface):
    def forward(self, q, k, cos, sin, q_out, k_out) -> None:  # noqa: ANN001
        return None


def cases() -> dict[str, tuple]:
    """(the op's call, a baseline's, what the baseline is) per case, at Llama decode shapes.
    The stand-ins' baseline is the stand-in called directly on what the interface takes (so
    the difference is what the op adds); Linear's is nn.Linear (the same product, 64
    features so the CPU computes little)."""
    x2, x3 = torch.randn(1, 4096, dtype=DTYPE), torch.randn(1, 1, 4096, dtype=DTYPE)
    w = torch.randn(4096, dtype=DTYPE)
    gate, up = (torch.randn(1, 1, 14336, dtype=DTYPE) for _ in range(2))
    q = torch.randn(1, 1, 32, 128, dtype=DTYPE).transpose(1, 2)
    k = torch.randn(1, 1, 8, 128, dtype=DTYPE).transpose(1, 2)
    cos, sin = torch.randn(1, 1, 128, dtype=DTYPE), torch.randn(1, 1, 128, dtype=DTYPE)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    norm, glu, rotary = RMSNormFwdOp(4096), GLUFwdOp("silu"), RotaryFwdOp(1)
    rows, swiglu, turn = RowsStandIn(), GLUStandIn(), RotaryStandIn()
    torch_linear, tile_linear = torch.nn.Linear(64, 64, bias=False), tnn.Linear(64, 64, bias=False)
    x_linear, kernel = torch.randn(1, 1, 64), "the stand-in kernel alone"
    x3_rows, gate_rows, up_rows = x3.view(1, 4096), gate.view(1, 14336), up.view(1, 14336)
    return {
        "RMSNorm 1x4096": (lambda: norm(x2, w), lambda: rows(x2, w), kernel),
        "RMSNorm 1x1x4096": (lambda: norm(x3, w), lambda: rows(x3_rows, w), kernel),
        "SwiGLU 1x1x14336": (lambda: glu(gate, up), lambda: swiglu(gate_rows, up_rows), kernel),
        "rotary q 32, k 8 heads": (
            lambda: rotary(q, k, cos, sin),
            lambda: turn(q, k, cos, sin, q_out, k_out),
            kernel,
        ),
        "Linear 1x1x64 -> 64": (
            lambda: tile_linear(x_linear),
            lambda: torch_linear(x_linear),
            "nn.Linear",
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(results_dir("dispatch")))
    args = parser.parse_args()
    torch.set_num_threads(1)
    stamp = run_stamp()
    lines = [
        "# Decode ops' host time through their lanes (stand-in kernels, CPU)",
        "",
        "  ".join(f"{k}: {v}" for k, v in stamp.items()),
        "",
        f"ns per call, median of {args.repeats} loops of {args.number}, no grad, timed in turns.",
        "",
        "| case | op as called | baseline | baseline is | op - baseline |",
        "|---|---|---|---|",
    ]
    with isolated_registry(), torch.no_grad():
        register_kernel_type(RMSNormFwdOp, "stand_in", RowsStandIn)
        register_kernel_type(GLUFwdOp, "stand_in", GLUStandIn)
        register_kernel_type(RotaryFwdOp, "stand_in", RotaryStandIn)
        tnn._ops._shared_op.cache_clear()  # the shared ops of this registry
        for name, (op_call, base_call, base) in cases().items():
            contenders = {"op": op_call, "base": base_call}
            times = per_call_ns(contenders, "cpu", args.number, args.repeats)
            op_ns, base_ns = times["op"], times["base"]
            lines.append(
                f"| {name} | {op_ns:,.0f} | {base_ns:,.0f} | {base} | {op_ns - base_ns:,.0f} |"
            )
        tnn._ops._shared_op.cache_clear()
    write_markdown(args.out, "lane_host", "cpu", lines)


if __name__ == "__main__":
    main()
