"""Host time per op call at a decode-sized input, against torch and a custom_op wrapper.

Run `python benchmarks/host_overhead.py [--device cuda]`. For each op: the torch function it
matches called eagerly, the tileops op called eagerly (the dispatcher directly), the op through
its `tileops::` torch.library operator (the route tracing, autograd and autocast take), and a
`torch.library.custom_op` wrapper around the op, the usual way to make an op compile-safe.
Each row is the median over repeats of a loop's wall time per call, with the device
synchronised at the end of each loop, so on a GPU the figure is host time whenever launching
is slower than the kernel (true at this size). The issue's goal: the eager op's overhead above
its kernel stays below half of the custom_op wrapper's.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

import tileops
from tileops import library


def cases(device: str, dtype: torch.dtype) -> dict:
    """(op, inputs, the torch function it matches) at a decode-sized input, 1 x 4096."""
    x = torch.randn(1, 4096, device=device, dtype=dtype)
    w, b = (torch.randn(4096, device=device, dtype=dtype) for _ in range(2))
    return {
        "rms_norm": (tileops.RMSNormFwdOp(4096), (x, w), lambda: F.rms_norm(x, (4096,), w)),
        "layer_norm": (
            tileops.LayerNormFwdOp(4096),
            (x, w, b),
            lambda: F.layer_norm(x, (4096,), w, b),
        ),
        "softmax": (tileops.SoftmaxFwdOp(), (x,), lambda: torch.softmax(x, -1)),
    }


def wrapper(name: str, op: tileops.Op, inputs: tuple) -> object:
    """A torch.library.custom_op around the op: what users write to make an op compile-safe."""
    annotations = ", ".join(f"t{k}: torch.Tensor" for k in range(len(inputs)))
    args = ", ".join(f"t{k}" for k in range(len(inputs)))
    namespace = {"torch": torch, "op": op}
    exec(f"def {name}({annotations}) -> torch.Tensor:\n    return op({args})", namespace)
    return torch.library.custom_op(f"bench::{name}", namespace[name], mutates_args=())


def per_call_ns(fn, device: str, number: int, repeats: int) -> float:
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(number // 10):
        fn()
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        synchronize()
        times.append((time.perf_counter() - start) / number * 1e9)
    return statistics.median(times)


def measure(device: str, dtype: torch.dtype, number: int, repeats: int) -> list[tuple]:
    rows = []
    for name, (op, inputs, torch_fn) in cases(device, dtype).items():
        custom = wrapper(name, op, inputs)
        traced = library.operator(type(op))
        params = tuple(op.params().values())
        timings = {
            "torch": per_call_ns(torch_fn, device, number, repeats),
            "op": per_call_ns(lambda op=op, i=inputs: op(*i), device, number, repeats),
            "operator": per_call_ns(
                lambda t=traced, i=inputs, p=params: t(*i, *p), device, number, repeats
            ),
            "custom_op": per_call_ns(lambda c=custom, i=inputs: c(*i), device, number, repeats),
        }
        rows.append((name, timings))
    return rows


def report(rows: list[tuple], device: str, dtype: torch.dtype) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    lines = [
        f"host time per call, 1 x 4096 {str(dtype).replace('torch.', '')} on {device} ({name}); "
        f"torch {torch.__version__}; {datetime.date.today()} commit {commit or 'unknown'}",
        "",
        f"{'op':<12} {'torch ns':>10} {'op ns':>10} {'operator ns':>12} {'custom_op ns':>13} "
        f"{'op over torch':>14} {'custom_op over torch':>21} {'ratio':>6}",
    ]
    for op, t in rows:
        over_op, over_custom = t["op"] - t["torch"], t["custom_op"] - t["torch"]
        ratio = over_op / over_custom if over_custom > 0 else float("nan")
        lines.append(
            f"{op:<12} {t['torch']:>10,.0f} {t['op']:>10,.0f} {t['operator']:>12,.0f} "
            f"{t['custom_op']:>13,.0f} {over_op:>14,.0f} {over_custom:>21,.0f} {ratio:>6.2f}"
        )
    lines += [
        "",
        "ratio: the op's overhead over torch's own call divided by the custom_op wrapper's; "
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
    print(report(measure(args.device, dtype, args.number, args.repeats), args.device, dtype))


if __name__ == "__main__":
    main()
