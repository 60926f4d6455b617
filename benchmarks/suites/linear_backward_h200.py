"""`tileops.nn.Linear` forward + backward against `torch.nn.Linear`, bf16, at Llama's shapes.

M x N x K = tokens x out x in: decode 1 x 4096 x 4096, prefill 8192 x 4096 x 4096 (attention
projections), 8192 x 14336 x 4096 (gate / up) and 8192 x 4096 x 14336 (down), no bias (as
Llama), plus 8192 x 4096 x 4096 with a bias. One step is `y = linear(x); y.backward(dy)` with
gradients for x, the weight (and the bias): the forward NT GEMM, then the backward's NN (dx)
and TN (dW) GEMMs. Contenders, each a variant in a process of its own (the operator's rules
are read once per process), each timing `nn.Linear` beside it:

- `tnn.Linear`: as dispatched (GemmOp's backward kernel; each GEMM on the key the table picks);
- `tnn.Linear, TileLang`: cuBLAS denied (`TILEOPS_DENY=GemmOp.gemm=cublas`): every GEMM on
  the TileLang keys, the figures a new measured region would come from;
- `tnn.Linear, recompute`: the recompute backward (torch re-runs the forward and
  differentiates it, `tileops.backward.RecomputeBackward`) registered over GemmOp's own: the
  backward before GemmBackward.

Per contender: the keys serving the forward, dx and dW (`tileops.record`), the step's and the
forward's medians of do_bench (L2 cleared per repetition, best of --rounds), back-to-back steps
(`loop`, L2 warm), the ratio to nn.Linear's step in the same process, and the gradients'
relative error against float64. Writes `<out>/linear_backward_<device>.{md,json}`.

    python benchmarks/suites/linear_backward_h200.py [--variants default,tilelang,recompute]
        [--rounds 2] [--out DIR] [--commit SHA]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

SHAPES = [  # tokens, out, in, bias
    (1, 4096, 4096, False),
    (8192, 4096, 4096, False),
    (8192, 14336, 4096, False),
    (8192, 4096, 14336, False),
    (8192, 4096, 4096, True),
]
VARIANTS = {  # name -> (contender label, TILEOPS_DENY)
    "default": ("tnn.Linear", ""),
    "tilelang": ("tnn.Linear, TileLang", "GemmOp.gemm=cublas"),
    "recompute": ("tnn.Linear, recompute", ""),
}


def use_recompute() -> None:
    """Serve GemmOp's backward by recomputing the forward in torch (the old reference)."""
    from tileops.backend import register_kernel_type
    from tileops.backward import RecomputeBackward
    from tileops.ops import GemmOp

    class Recompute(RecomputeBackward):
        general = False  # wins over GemmBackward, the op's general reference backward

    register_kernel_type(GemmOp, "recompute_backward", Recompute)


def measure(m: int, n: int, k: int, bias: bool, rounds: int) -> dict:
    """One shape in this process: nn.Linear and tnn.Linear (as this process's rules dispatch
    it), forward + backward and forward alone."""
    import torch
    from _harness.timing import bench_all, loop_us
    from torch import nn

    import tileops
    import tileops.nn as tnn

    torch.manual_seed(0)
    theirs = nn.Linear(k, n, bias=bias, device="cuda", dtype=torch.bfloat16)
    ours = tnn.Linear(k, n, bias=bias, device="cuda", dtype=torch.bfloat16)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    modules = {"nn.Linear": theirs, "tnn.Linear": ours}

    def step(module: nn.Module):
        def run() -> None:
            x.grad = None
            for p in module.parameters():
                p.grad = None
            module(x).backward(dy)

        return run

    def forward(module: nn.Module):
        def run() -> None:
            with torch.no_grad():
                module(x)

        return run

    step(ours)()  # builds every entry outside the timing
    with tileops.record() as record:
        step(ours)()
    keys = served_keys(record)
    errors = {name: gradient_error(module, x, dy) for name, module in modules.items()}
    steps = bench_all({name: step(mod) for name, mod in modules.items()}, rounds)
    forwards = bench_all({name: forward(mod) for name, mod in modules.items()}, rounds)
    loops = {name: loop_us(step(mod)) for name, mod in modules.items()}
    return {
        "m": m, "n": n, "k": k, "bias": bias, "keys": keys,
        "step_us": {name: 1e3 * ms for name, ms in steps.items()},
        "forward_us": {name: 1e3 * ms for name, ms in forwards.items()},
        "loop_us": loops,
        "rel_error": errors,
    }  # fmt: skip


def served_keys(record) -> dict[str, str]:
    """ "forward", "dx", "dW" -> the key that ran it, and "backward" -> the backward's key."""
    names = {"NT": "forward", "NN": "dx", "TN": "dW"}
    keys = {}
    for served in record.counts:
        if served.interface == "gemm":
            keys[names.get(served.call.layout, served.call.layout)] = served.key
        else:
            keys[served.interface] = served.key
    return keys


def gradient_error(module, x, dy) -> float:
    """The largest relative error of the step's gradients against float64's."""
    import torch
    import torch.nn.functional as F

    x.grad = None
    for p in module.parameters():
        p.grad = None
    module(x).backward(dy)
    tensors = [x, *module.parameters()]
    wide = [t.detach().double().requires_grad_() for t in tensors]
    want = torch.autograd.grad(F.linear(*wide), wide, dy.double())
    return max(
        ((t.grad.double() - w).norm() / w.norm().clamp_min(1e-30)).item()
        for t, w in zip(tensors, want, strict=True)
    )


def run_variant(name: str, rounds: int) -> list[dict]:
    """Every shape in a child process whose TILEOPS_DENY is the variant's."""
    env = {**os.environ, "TILEOPS_DENY": VARIANTS[name][1]}
    command = [sys.executable, __file__, "--child", name, "--rounds", str(rounds)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        sys.stderr.write(out.stderr)
        raise SystemExit(f"variant {name!r} failed (exit {out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


def markdown(results: dict[str, list[dict]], meta: dict, rounds: int) -> str:
    lines = [
        f"# tileops.nn.Linear forward + backward, bf16, on {meta['device']}",
        "",
        f"{meta['date']}, commit {meta['commit']}, torch {meta['torch']}. Medians of do_bench (L2"
        f" cleared per repetition), best of {rounds} rounds; `loop`: back-to-back steps, L2 warm."
        " A step: y = linear(x); y.backward(dy), gradients for x and the parameters. M x N x K ="
        " tokens x out x in. `vs nn` : nn.Linear's time over the contender's, same process"
        " (> 1: faster). Keys: forward / dx / dW (backward kernel).",
        "",
        "| M x N x K | bias | contender | keys | step us | vs nn | forward us | fwd vs nn "
        "| loop us | loop vs nn | grad rel. error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    shapes = {(r["m"], r["n"], r["k"], r["bias"]) for rows in results.values() for r in rows}
    for shape in sorted(shapes, key=lambda s: (s[0], s[1], s[2], s[3])):
        m, n, k, bias = shape
        for variant, rows in results.items():
            row = next(r for r in rows if (r["m"], r["n"], r["k"], r["bias"]) == shape)
            names = [("nn.Linear", "nn.Linear")] if variant == next(iter(results)) else []
            names.append(("tnn.Linear", VARIANTS[variant][0]))
            for name, label in names:
                keys = row["keys"]
                shown = "cuBLAS (torch)" if name == "nn.Linear" else (
                    f"{keys.get('forward')} / {keys.get('dx', '-')} / {keys.get('dW', '-')} "
                    f"({keys.get('backward')})"
                )  # fmt: skip
                step, fwd, loop = (row[f][name] for f in ("step_us", "forward_us", "loop_us"))
                base = [row[f]["nn.Linear"] for f in ("step_us", "forward_us", "loop_us")]
                lines.append(
                    f"| {m} x {n} x {k} | {'yes' if bias else 'no'} | {label} | {shown} | "
                    f"{step:.1f} | {base[0] / step:.2f} | {fwd:.1f} | {base[1] / fwd:.2f} | "
                    f"{loop:.1f} | {base[2] / loop:.2f} | {row['rel_error'][name]:.1e} |"
                )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--commit", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child == "recompute":
            use_recompute()
        rows = [measure(*shape, args.rounds) for shape in SHAPES]
        print(json.dumps(rows))
        return
    from _harness.provenance import result_path, results_dir, run_stamp

    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose among {list(VARIANTS)}")
    results = {name: run_variant(name, args.rounds) for name in variants}
    meta = run_stamp(args.commit)
    text = markdown(results, meta, args.rounds)
    stem = result_path(args.out or results_dir("gemm"), "linear_backward", meta["device"], "")
    stem.with_suffix(".json").write_text(json.dumps({**meta, "results": results}, indent=1))
    stem.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
