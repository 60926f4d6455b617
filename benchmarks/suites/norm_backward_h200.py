"""Training passes of the row-wise ops on one GPU: forward + backward, and backward alone, of
LayerNorm, RMSNorm and Softmax against eager, torch.compile and Liger-Kernel.

For each op, dtype and row length N (M * N = 2**26 elements) it times, as medians with the L2
cleared before every repetition (`triton.testing.do_bench`): a device-to-device copy moving the
pass's model bytes; for each contender the forward with the backward (dx, and dweight/dbias for
the norms, from a fixed dy) and the backward alone (on a graph kept from one forward), and the
backward's GPU kernel time alone (profiler), which leaves the host's launch path out. Model
bytes: forward x read, y written, params read; backward x (softmax: y) and dy read, dx written,
params read and their gradients written. The backward kernel tileops selects is named. ATen's
norms are denied (`TILEOPS_DENY`, unless set), so tileops' figures are its own kernels': an
autograd call of a norm would otherwise run torch's function where ATen's serves it.

    python benchmarks/suites/norm_backward_h200.py [--ops layer_norm,rms_norm,softmax]
        [--dtypes bfloat16] [--sizes 1024,...,65536] [--out DIR]

Writes `<out>/norm_backward_<device>.{md,json}` stamped with the date, device and git commit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

os.environ.setdefault("TILEOPS_DENY", "LayerNormFwdOp=aten_layer_norm,RMSNormFwdOp=aten_rms_norm")

import torch
from _harness.copies import copy_moving
from _harness.ops import DTYPES, ELEMENTS, EPS, row_op_setup
from _harness.provenance import result_path, results_dir, run_stamp
from _harness.timing import kernel_us

import tileops
from tileops.backward import backward_call

SIZES = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
PEERS = ("tileops", "eager", "compile", "liger")


def _liger(op: str) -> Callable[..., Any] | None:
    """Liger-Kernel's autograd function for `op`, or None where it is not installed."""
    try:
        if op == "layer_norm":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            return lambda x, w, b: LigerLayerNormFunction.apply(x, w, b, EPS)
        if op == "rms_norm":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            return lambda x, w: LigerRMSNormFunction.apply(x, w, EPS)
        from liger_kernel.ops.softmax import LigerSoftmaxFunction

        return lambda x: LigerSoftmaxFunction.apply(x)
    except ImportError:
        return None


def pass_bytes(op: str, args: tuple) -> tuple[int, int]:
    """(forward, backward) model bytes of one pass over `args` (x first)."""
    x, params = args[0], sum(a.numel() for a in args[1:])
    forward = (2 * x.numel() + params) * x.element_size()
    backward = (3 * x.numel() + 2 * params) * x.element_size()
    return forward, backward


def training_pass(fn: Callable[..., Any], args: tuple, dy: torch.Tensor) -> Callable[[], Any]:
    """Forward and backward of `fn` on leaves of `args`: the gradients of all of them."""
    leaves = [a.detach().requires_grad_() for a in args]
    return lambda: torch.autograd.grad(fn(*leaves), leaves, dy)


def backward_pass(fn: Callable[..., Any], args: tuple, dy: torch.Tensor) -> Callable[[], Any]:
    """The backward alone, again and again on the graph of one forward."""
    leaves = [a.detach().requires_grad_() for a in args]
    y = fn(*leaves)
    return lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)


def contenders(op: str, dtype: torch.dtype, n: int) -> tuple[dict, tuple, torch.Tensor, Any]:
    """name -> the op's function of each contender, the inputs, dy, and the tileops op."""
    x = torch.randn(ELEMENTS // n, n, device="cuda", dtype=dtype)
    tile_op, args, eager, _, _ = row_op_setup(op, x)
    dy = torch.randn_like(x)
    torch._dynamo.reset()  # a static graph per case (see norms_h200.py)
    # The backward alone runs again on one graph (retain_graph), which a compiled backward
    # that donates its saved buffers refuses.
    torch._functorch.config.donated_buffer = False
    fns = {"tileops": tile_op, "eager": eager, "compile": torch.compile(eager, dynamic=False)}
    liger = _liger(op)
    if liger is not None:
        fns["liger"] = liger
    return fns, args, dy, tile_op


def served_by(tile_op: Any, args: tuple, dy: torch.Tensor) -> str:
    """The key serving tileops' backward of this case."""
    outputs = (tile_op(*args),) if type(tile_op).saves_outputs else ()
    needs = (True,) * len(args)
    return tile_op.key_for("backward", backward_call(tile_op, (dy,), args, outputs, needs, False))


def measure(op: str, dtype: torch.dtype, n: int) -> dict[str, Any]:
    from triton.testing import do_bench

    fns, args, dy, tile_op = contenders(op, dtype, n)
    forward, backward = pass_bytes(op, args)
    record: dict[str, Any] = {"op": op, "dtype": str(dtype)[6:], "n": n, "rows": ELEMENTS // n,
                              "bytes": {"both": forward + backward, "backward": backward},
                              "served_by": served_by(tile_op, args, dy), "ms": {}, "failed": {},
                              "rel_err": {}, "kernel_us": {}}  # fmt: skip
    want = training_pass(fns["eager"], args, dy)()[0].float()
    for name, fn in fns.items():
        try:
            both, alone = training_pass(fn, args, dy), backward_pass(fn, args, dy)
            got = both()[0].float()
        except Exception as exc:  # a peer that refuses the shape
            record["failed"][name] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        record["rel_err"][name] = float((got - want).norm() / want.norm().clamp_min(1e-30))
        record["ms"][name] = {kind: do_bench(f, warmup=10, rep=60, return_mode="median")
                              for kind, f in (("both", both), ("backward", alone))}  # fmt: skip
        record["kernel_us"][name] = _kernel_us(alone)
    for kind, nbytes in record["bytes"].items():
        record["ms"].setdefault("copy", {})[kind] = do_bench(
            copy_moving(nbytes), warmup=10, rep=60, return_mode="median"
        )
    record["kernel_us"]["copy"] = _kernel_us(copy_moving(backward))
    return record


def _kernel_us(fn: Callable[[], Any]) -> float | None:
    """The GPU kernel time of one call of `fn` (the profiler's, L2 cleared before each): the
    kernels' bandwidth with the host's launch path left out; None where its calls launch
    varying numbers of kernels."""
    try:
        return kernel_us(fn, calls=20)
    except RuntimeError:
        return None


def pct_copy(record: dict, name: str, kind: str) -> float:
    return 100 * record["ms"]["copy"][kind] / record["ms"][name][kind]


def kernel_pct_copy(record: dict, name: str) -> str:
    """The backward's kernels' share of copy speed (kernel time against the copy's), or -."""
    times = record.get("kernel_us", {})
    if times.get(name) is None or times.get("copy") is None:
        return "-"
    return f"{100 * times['copy'] / times[name]:.0f}"


def markdown(results: list[dict], stamp: dict) -> str:
    head = " | ".join(f"{p} fwd+bwd ms" for p in PEERS)
    pct = " | ".join(f"{p} bwd % copy" for p in PEERS)
    kernels = " | ".join(f"{p} bwd kernels % copy" for p in PEERS)
    lines = [
        f"# Forward + backward of the row-wise ops on {stamp['device']}",
        "",
        f"{stamp['date']}, commit {stamp['commit']}, torch {stamp['torch']}. M*N = 2^26; "
        "medians with L2 cleared; % copy: a same-run copy of the pass's model bytes "
        "(backward: x or y and dy read, dx written, params read, their gradients written). "
        "bwd kernels % copy: the backward's GPU kernel time (profiler, L2 cleared) against the "
        "copy kernel's, the host's launch path left out.",
        "",
        f"| op | dtype | N | backward served by | copy GB/s (bwd) | {head} | {pct} | {kernels} | "
        "fwd+bwd vs best peer |",
        "|---|---|---|---|---|" + "---|" * (3 * len(PEERS) + 1),
    ]
    for r in results:
        ms = r["ms"]
        copy_gbps = r["bytes"]["backward"] / ms["copy"]["backward"] / 1e6
        times = " | ".join(f"{ms[p]['both']:.3f}" if p in ms else "-" for p in PEERS)
        shares = " | ".join(f"{pct_copy(r, p, 'backward'):.0f}" if p in ms else "-"
                            for p in PEERS)  # fmt: skip
        kernel_shares = " | ".join(kernel_pct_copy(r, p) for p in PEERS)
        peers = [ms[p]["both"] for p in PEERS[1:] if p in ms]
        versus = f"{min(peers) / ms['tileops']['both']:.2f}x" if "tileops" in ms and peers else "-"
        label = f"{r['n'] // 1024}K" if r["n"] >= 1024 else str(r["n"])
        lines.append(f"| {r['op']} | {r['dtype']} | {label} | {r['served_by']} | "
                     f"{copy_gbps:.0f} | {times} | {shares} | {kernel_shares} | "
                     f"{versus} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def write(results: list[dict], info: dict, out: str) -> Path:
    base = result_path(out, "norm_backward", info["device"], "")
    base.with_suffix(".md").write_text(markdown(results, info))
    base.with_suffix(".json").write_text(json.dumps({"stamp": info, "results": results}, indent=1))
    return base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="layer_norm,rms_norm,softmax")
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--out", default=str(results_dir("norms")))
    args = parser.parse_args()
    info = run_stamp(tileops=getattr(tileops, "__version__", ""))
    results = []
    for dtype in args.dtypes.split(","):
        for op in args.ops.split(","):
            for n in map(int, args.sizes.split(",")):
                results.append(measure(op, DTYPES[dtype], n))
                print(markdown(results[-1:], info).splitlines()[-1], flush=True)
                write(results, info, args.out)  # after every case: a cut-off run keeps its rows
                torch.cuda.empty_cache()
    print(markdown(results, info))
    worst = max(max(r["rel_err"].values(), default=0.0) for r in results)
    print(f"largest relative error of dx against eager: {worst:.2e}")
    for r in results:
        for name, why in r["failed"].items():
            print(f"{r['op']} {r['dtype']} N={r['n']}: {name} failed: {why}")


if __name__ == "__main__":
    main()
