"""Row-wise ops on one GPU: LayerNorm, RMSNorm and Softmax against a copy of the same bytes.

For each op, dtype and row length N (M * N = 2**26 elements) it times, as medians with the L2
cleared before every repetition (`triton.testing.do_bench`): a device-to-device copy moving the
op's model bytes (x read, y written, params read); torch eager; torch.compile of the same;
Liger-Kernel where installed; the tileops op as dispatched (and which key served it); and every
installed key of the op that serves the call on this device, built through its own `entry_for`
(so any backend's kernels appear once installed).

    python benchmarks/suites/norms_h200.py [--ops layer_norm,rms_norm,softmax] [--dtypes ...]
        [--sizes 256,1024,...] [--out DIR]

Writes `<out>/norms_<device>.{md,json,png}` stamped with the date, device and git commit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
from _harness.copies import copy_moving
from _harness.ops import DTYPES, ELEMENTS, EPS, model_bytes, row_op_setup
from _harness.provenance import result_path, results_dir, run_stamp

import tileops
from tileops.backend import key_serves, register_kernel_type
from tileops.errors import TileOpsError
from tileops.registry import REGISTRY
from tileops.table import table_for
from tileops.testing import isolated_registry

SIZES = [256, 1024, 4096, 8192, 16384, 32768, 65536, 131072, 262144]


@dataclass
class Case:
    """One op at one shape: its inputs and every contender, by name."""

    op: str
    dtype: str
    n: int
    model_bytes: int
    contenders: dict[str, Callable[[], Any]] = field(default_factory=dict)
    served_by: str = ""


def _liger(op: str) -> Callable[..., Any] | None:
    """Liger-Kernel's forward for `op`, or None where it is not installed."""
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


def _keys(op_obj: Any, interface: str, call: Any) -> dict[str, Callable[..., Any]]:
    """Every installed key of the op that runs on this device and serves `call`, built. Each is
    judged as if it were the only backend installed, so a key that steps aside for another
    backend's (Triton beside TileLang) is still timed beside it."""
    op_cls = type(op_obj)
    built = {}
    for cand in table_for(op_cls).candidates[interface]:
        registered = REGISTRY.kernel_types(op_cls).get(cand.key)
        with isolated_registry():
            REGISTRY.withdraw_kernel_types(op_cls)
            if registered is not None:
                register_kernel_type(op_cls, cand.key, cand.cls)
            if not key_serves(op_cls, cand.key, call):
                continue
        _, build = cand.cls.entry_for(call)
        try:
            built[cand.key] = build()
        except Exception as exc:  # a key that fails to build is reported, not timed
            print(f"{cand.key} failed to build for {call}: {str(exc).splitlines()[-1]}")
    return built


def make_case(op: str, dtype: torch.dtype, n: int) -> Case:
    x = torch.randn(ELEMENTS // n, n, device="cuda", dtype=dtype)
    tile_op, args, eager, interface, call = row_op_setup(op, x)
    case = Case(op, str(dtype).replace("torch.", ""), n, model_bytes(args))
    case.contenders["copy"] = copy_moving(case.model_bytes)
    case.contenders["eager"] = lambda: eager(*args)
    # Each case compiles its own static graph: cases share `eager`'s code object, and past
    # dynamo's recompile limit (8) it would run them eagerly under the compile label.
    torch._dynamo.reset()
    compiled = torch.compile(eager, dynamic=False)
    case.contenders["compile"] = lambda: compiled(*args)
    liger = _liger(op)
    if liger is not None:
        case.contenders["liger"] = lambda: liger(*args)
    try:
        case.served_by = tile_op.key_for(interface, call)
        case.contenders["tileops"] = lambda: tile_op(*args)
    except TileOpsError as exc:  # e.g. ambiguous between installed backends
        case.served_by = f"none ({type(exc).__name__})"
    for key, kernel in _keys(tile_op, interface, call).items():
        case.contenders[f"key:{key}"] = lambda k=kernel: k(*args)
    return case


def check(case: Case, reference: torch.Tensor, outputs: dict[str, torch.Tensor]) -> dict:
    """Relative error of each contender's output against eager's (a wrong kernel must not
    look fast)."""
    errors = {}
    ref = reference.float()
    for name, out in outputs.items():
        diff = (out.float() - ref).norm() / ref.norm().clamp_min(1e-30)
        errors[name] = float(diff)
    return errors


def measure(case: Case) -> dict[str, Any]:
    from triton.testing import do_bench

    failures = {}
    with torch.no_grad():
        outputs = {}
        for name, fn in list(case.contenders.items()):
            try:
                outputs[name] = fn()
            except Exception as exc:  # a peer that refuses the shape (Liger beyond 64K)
                failures[name] = f"{type(exc).__name__}: {exc}"[:200]
                del case.contenders[name]
        outputs.pop("copy")
        errors = check(case, outputs["eager"], outputs)
        times = {}
        for name, fn in case.contenders.items():
            times[name] = do_bench(fn, warmup=10, rep=60, return_mode="median")
    gbps = {name: case.model_bytes / (ms * 1e-3) / 1e9 for name, ms in times.items()}
    return {
        "op": case.op,
        "dtype": case.dtype,
        "n": case.n,
        "rows": ELEMENTS // case.n,
        "model_bytes": case.model_bytes,
        "served_by": case.served_by,
        "ms": times,
        "gbps": gbps,
        "pct_copy": {k: 100 * v / gbps["copy"] for k, v in gbps.items()},
        "rel_err": errors,
        "failed": failures,
    }


def _label(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 else str(n)


def markdown(results: list[dict], stamp: dict) -> str:
    lines = [
        f"# Row-wise ops on {stamp['device']}",
        "",
        f"{stamp['date']}, commit {stamp['commit']}, torch {stamp['torch']}. M*N = 2^26; "
        "medians with L2 cleared; GB/s on model bytes (x read + y written + params).",
        "",
        "| op | dtype | N | served by | copy GB/s | tileops GB/s | % copy | vs eager | "
        "vs compile | vs liger | eager / compile / liger % copy | keys % copy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        pct, ms = r["pct_copy"], dict(r["ms"])
        if "tileops" not in ms:  # not dispatchable: show the fastest installed key instead
            ms["tileops"] = min(v for k, v in ms.items() if k.startswith("key:"))
            pct = {
                **pct,
                "tileops": r["model_bytes"] / ms["tileops"] / 1e6 / r["gbps"]["copy"] * 100,
            }
        peers = " / ".join(
            f"{pct[k]:.0f}" if k in pct else "-" for k in ("eager", "compile", "liger")
        )
        speed = [
            f"{ms[k] / ms['tileops']:.2f}x" if k in ms else "-"
            for k in ("eager", "compile", "liger")
        ]
        keys = ", ".join(f"{k[4:]} {v:.0f}" for k, v in pct.items() if k.startswith("key:"))
        lines.append(
            f"| {r['op']} | {r['dtype']} | {_label(r['n'])} | {r['served_by']} | "
            f"{r['gbps']['copy']:.0f} | {r['model_bytes'] / ms['tileops'] / 1e6:.0f} | "
            f"{pct['tileops']:.1f} | "
            f"{' | '.join(speed)} | {peers} | {keys} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: list[dict], stamp: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["op"], r["dtype"]) for r in results})
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for ax, (op, dtype) in zip(axes[0], groups, strict=True):
        rows = [r for r in results if r["op"] == op and r["dtype"] == dtype]
        names = [k for k in rows[0]["pct_copy"] if k != "copy"]
        for name in names:
            pts = [(r["n"], r["pct_copy"][name]) for r in rows if name in r["pct_copy"]]
            ax.plot(*zip(*pts, strict=True), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op} {dtype}")
        ax.set_xlabel("N")
        ax.set_ylabel("% of copy bandwidth")
        ax.set_ylim(0, 110)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{stamp['device']} {stamp['date']} {stamp['commit']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _prebuild(job: tuple[str, str, int]) -> None:
    """Compile every key's entry for one case (in a worker: fills the kernels' disk caches)."""
    op, dtype, n = job
    x = torch.empty(1, n, device="cuda", dtype=DTYPES[dtype])
    tile_op, _, _, interface, call = row_op_setup(op, x)
    _keys(tile_op, interface, call)


def prebuild(jobs: list[tuple[str, str, int]], workers: int) -> None:
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        list(pool.map(_prebuild, jobs))


def write(results: list[dict], info: dict, out: str) -> str:
    base = str(result_path(out, "norms", info["device"], ""))
    with open(base + ".md", "w") as f:
        f.write(markdown(results, info))
    with open(base + ".json", "w") as f:
        json.dump({"stamp": info, "results": results}, f, indent=1)
    return base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="layer_norm,rms_norm,softmax")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--out", default=str(results_dir("norms")))
    parser.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 12))
    args = parser.parse_args()
    info = run_stamp(tileops=getattr(tileops, "__version__", ""))
    jobs = [
        (op, dtype, n)
        for dtype in args.dtypes.split(",")
        for op in args.ops.split(",")
        for n in map(int, args.sizes.split(","))
    ]
    prebuild(jobs, args.workers)
    results = []
    for op, dtype, n in jobs:
        results.append(measure(make_case(op, DTYPES[dtype], n)))
        print(markdown(results[-1:], info).splitlines()[-1], flush=True)
        base = write(results, info, args.out)  # after every case: a cut-off run keeps its rows
        torch.cuda.empty_cache()
    plot(results, info, base + ".png")
    print(markdown(results, info))
    worst = max(max(r["rel_err"].values()) for r in results)
    print(f"largest relative error against eager: {worst:.2e}")
    if not math.isfinite(worst):
        raise SystemExit("a contender produced non-finite output")


if __name__ == "__main__":
    main()
