"""Host time per op call at decode-sized inputs, against torch and a custom_op wrapper.

Run `python benchmarks/suites/host_overhead.py [--device cuda]`. For each op: the torch function it
matches called eagerly, the kernel that serves the op called directly, the tileops op called
eagerly (the dispatcher directly), the op through its `tileops::` torch.library operator (the
route tracing, autograd and autocast take), and a `torch.library.custom_op` wrapper around the
op, the usual way to make an op compile-safe.
Each row is the median over repeats of a loop's wall time per call, with the device
synchronised at the end of each loop, so on a GPU the figure is host time whenever launching
is slower than the kernel (true at these sizes). The goal: the eager op's overhead above the
kernel it runs stays below half of the custom_op wrapper's overhead above that kernel.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
from _harness.ops import serving_entry
from _harness.provenance import git_commit
from _harness.timing import per_call_ns

import tileops
from tileops import library


def cases(device: str, dtype: torch.dtype) -> dict:
    """(op, inputs, the torch function it matches) at decode-sized inputs: rows of 1 x 4096,
    a 1 x 256 x 256 GEMM, BatchNorm training on an 8 x 64 x 7 x 7 layer."""
    x = torch.randn(1, 4096, device=device, dtype=dtype)
    w, b = (torch.randn(4096, device=device, dtype=dtype) for _ in range(2))
    a, weight = (torch.randn(shape, device=device, dtype=dtype) for shape in ((1, 256), (256, 256)))
    image = torch.randn(8, 64, 7, 7, device=device, dtype=dtype)
    per_channel = [torch.rand(64, device=device, dtype=dtype) + 0.5 for _ in range(4)]
    return {
        "rms_norm": (tileops.RMSNormFwdOp(4096), (x, w), lambda: F.rms_norm(x, (4096,), w)),
        "layer_norm": (
            tileops.LayerNormFwdOp(4096),
            (x, w, b),
            lambda: F.layer_norm(x, (4096,), w, b),
        ),
        "softmax": (tileops.SoftmaxFwdOp(), (x,), lambda: torch.softmax(x, -1)),
        "gemm": (tileops.GemmOp(), (a, weight), lambda: torch.mm(a, weight)),
        "batch_norm": (
            tileops.BatchNormFwdOp(64),
            (image, *per_channel),
            lambda: F.batch_norm(image, *per_channel[2:], *per_channel[:2], True),
        ),
    }


def wrapper(name: str, op: tileops.Op, inputs: tuple) -> object:
    """A torch.library.custom_op around the op: what users write to make an op compile-safe
    (BatchNorm's running statistics, its last two inputs, declared as mutated)."""
    annotations = ", ".join(f"t{k}: torch.Tensor" for k in range(len(inputs)))
    args = ", ".join(f"t{k}" for k in range(len(inputs)))
    namespace = {"torch": torch, "op": op}
    exec(f"def {name}({annotations}) -> torch.Tensor:\n    return op({args})", namespace)
    mutated = (f"t{len(inputs) - 2}", f"t{len(inputs) - 1}") if name == "batch_norm" else ()
    return torch.library.custom_op(f"bench::{name}", namespace[name], mutates_args=mutated)


def serving_kernel(op: tileops.Op, inputs: tuple) -> object:
    """The kernel entry that serves `op(*inputs)`, bound to the canonical arguments it gets."""
    kernel, args = serving_entry(op, inputs)
    return lambda: kernel(*args)


def _padded(op: tileops.Op, inputs: tuple) -> tuple:
    """`inputs` with None for the optional ones left out (GemmOp's bias): the operator takes
    every input of the signature, then the params."""
    return (*inputs, *[None] * (len(op.signature.inputs) - len(inputs)))


def measure(device: str, dtype: torch.dtype, number: int, repeats: int) -> list[tuple]:
    rows = []
    for name, (op, inputs, torch_fn) in cases(device, dtype).items():
        custom = wrapper(name, op, inputs)
        traced = library.operator(type(op))
        params, padded = tuple(op.params().values()), _padded(op, inputs)
        fns = {
            "torch": torch_fn,
            "kernel": serving_kernel(op, inputs),
            "op": lambda op=op, i=inputs: op(*i),
            "operator": lambda t=traced, i=padded, p=params: t(*i, *p),
            "custom_op": lambda c=custom, i=inputs: c(*i),
        }
        rows.append((name, per_call_ns(fns, device, number, repeats)))
    return rows


def report(rows: list[tuple], device: str, dtype: torch.dtype) -> str:
    commit = git_commit()
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    lines = [
        "host time per call, decode-sized inputs (rows 1 x 4096, GEMM 1 x 256 x 256, BatchNorm "
        f"8 x 64 x 7 x 7), {str(dtype).replace('torch.', '')} on {device} ({name}); "
        f"torch {torch.__version__}; {datetime.date.today()} commit {commit or 'unknown'}",
        "",
        f"{'op':<12} {'torch ns':>9} {'kernel ns':>10} {'op ns':>9} {'operator ns':>12} "
        f"{'custom_op ns':>13} {'op - kernel':>12} {'custom_op - kernel':>19} {'ratio':>6}",
    ]
    for op, t in rows:
        over_op, over_custom = t["op"] - t["kernel"], t["custom_op"] - t["kernel"]
        ratio = over_op / over_custom if over_custom > 0 else float("nan")
        lines.append(
            f"{op:<12} {t['torch']:>9,.0f} {t['kernel']:>10,.0f} {t['op']:>9,.0f} "
            f"{t['operator']:>12,.0f} {t['custom_op']:>13,.0f} {over_op:>12,.0f} "
            f"{over_custom:>19,.0f} {ratio:>6.2f}"
        )
    lines += [
        "",
        "ratio: the op's overhead above the kernel it runs divided by the custom_op wrapper's; "
        "goal < 0.5",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(1)  # host timings: one thread, no intra-op pool waking up
    print(report(measure(args.device, dtype, args.number, args.repeats), args.device, dtype))


if __name__ == "__main__":
    main()
