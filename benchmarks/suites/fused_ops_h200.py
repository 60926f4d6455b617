"""Fused training ops on one GPU against eager, torch.compile and Liger-Kernel.

Residual add + RMSNorm, SwiGLU / GeGLU and rotary embedding of q and k, forward and forward +
backward, at Llama-3-8B shapes in bfloat16.

Each op is timed (medians, L2 cleared before every repetition, `triton.testing.do_bench`)
against a device copy moving the op's model bytes in the same run, torch eager (transformers'
definitions), torch.compile of eager, Liger-Kernel's functions where installed, and tileops
(what dispatch serves; the key is reported for the forward and the backward). Every contender's
outputs and gradients are checked against eager's before anything is timed.

Model bytes (the least traffic of a fused implementation that keeps nothing but its inputs):
- add + RMSNorm: forward reads x, residual, writes out, h; backward reads x, residual, dout,
  dh, writes one dx (= dresidual): 9 (T, d) tensors, plus the weight;
- GLU: forward reads gate, up, writes out; backward reads gate, up, dout, writes dgate, dup;
- rotary: forward reads q, k, cos, sin, writes q', k'; backward reads dq', dk', cos, sin,
  writes dq, dk.

    python benchmarks/suites/fused_ops_h200.py [--ops add_rms_norm,swiglu,geglu,rotary]
        [--tokens 4096] [--out DIR]

Writes `<out>/fused_<device>.{md,json}` stamped with the date, device and git commit.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
from _harness.copies import copy_moving
from _harness.provenance import result_path, results_dir, run_stamp

import tileops
import tileops.nn as tnn

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 4096, 14336, 32, 8, 128  # Llama-3-8B
EPS = 1e-5
DTYPE = torch.bfloat16

Inputs = tuple[torch.Tensor, ...]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def eager_rotary(q, k, cos, sin):  # transformers' apply_rotary_pos_emb, unsqueeze_dim=1
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def eager_add_rms_norm(x, residual, weight):  # the decoder layer's add, then LlamaRMSNorm
    h = x + residual
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS)
    return weight * normed.to(h.dtype), h


def setup(op: str, tokens: int) -> tuple[Inputs, Callable, Callable, Callable | None, int, int]:
    """(inputs, eager fn, tileops fn, Liger fn or None, forward and forward + backward model
    bytes)."""
    new = lambda *shape: torch.randn(*shape, device="cuda", dtype=DTYPE)  # noqa: E731
    size = torch.finfo(DTYPE).bits // 8
    if op == "add_rms_norm":
        inputs = (new(tokens, HIDDEN), new(tokens, HIDDEN), new(HIDDEN))
        row = tokens * HIDDEN * size

        def ours(x, r, w):
            return tnn.add_rms_norm(x, r, w, EPS)

        return inputs, eager_add_rms_norm, ours, _liger(op), 4 * row, 9 * row
    if op in ("swiglu", "geglu"):
        act = "silu" if op == "swiglu" else "gelu_tanh"
        approximate = "none" if op == "swiglu" else "tanh"

        def eager(g, u):
            return (F.silu(g) if act == "silu" else F.gelu(g, approximate=approximate)) * u

        def ours(g, u):
            return tnn.glu(g, u, act)

        inputs = (new(tokens, INTERMEDIATE), new(tokens, INTERMEDIATE))
        row = tokens * INTERMEDIATE * size
        return inputs, eager, ours, _liger(op), 3 * row, 8 * row
    batch, seq = 2, tokens // 2
    # q and k as transformers makes them: (batch, seq, heads, head_dim) projections, transposed
    q = new(batch, seq, HEADS, HEAD_DIM).transpose(1, 2)
    k = new(batch, seq, KV_HEADS, HEAD_DIM).transpose(1, 2)
    cos, sin = new(batch, seq, HEAD_DIM), new(batch, seq, HEAD_DIM)
    forward = 2 * (q.numel() + k.numel() + cos.numel()) * size
    return (
        (q, k, cos, sin),
        eager_rotary,
        tnn.apply_rotary_pos_emb,
        _liger(op),
        forward,
        2 * forward,
    )


def _liger(op: str) -> Callable | None:
    try:
        if op == "add_rms_norm":
            try:
                from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
            except ImportError:  # an older Liger: its RMSNorm after a torch add
                from liger_kernel.ops.rms_norm import LigerRMSNormFunction

                def added(x, r, w):
                    h = x + r
                    return LigerRMSNormFunction.apply(h, w, EPS, 0.0, "llama"), h

                return added
            return lambda x, r, w: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS, 0.0, "llama")
        if op == "swiglu":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            return LigerSiLUMulFunction.apply
        if op == "geglu":
            from liger_kernel.ops.geglu import LigerGELUMulFunction

            return LigerGELUMulFunction.apply
        from liger_kernel.ops.rope import LigerRopeFunction

        return lambda q, k, cos, sin: LigerRopeFunction.apply(q, k, cos, sin)
    except ImportError:
        return None


def _differentiable(inputs: Inputs, op: str) -> list[torch.Tensor]:
    """The inputs that get gradients in training (not rotary's tables)."""
    count = 2 if op == "rotary" else len(inputs)
    return list(inputs[:count])


def fwd_bwd(fn: Callable, inputs: Inputs, wanted: list, grads: list) -> Callable[[], Any]:
    def run():
        outputs = fn(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return outputs, torch.autograd.grad(outputs, wanted, grads)

    return run


def measure(op: str, tokens: int) -> dict[str, Any]:
    from triton.testing import do_bench

    inputs, eager, ours, liger, forward_bytes, moved = setup(op, tokens)
    inputs = tuple(t.detach().requires_grad_(i < len(_differentiable(inputs, op)))
                   for i, t in enumerate(inputs))  # fmt: skip
    wanted = _differentiable(inputs, op)
    torch._dynamo.reset()
    contenders = {"eager": eager, "compile": torch.compile(eager, dynamic=False), "tileops": ours}
    if liger is not None:
        contenders["liger"] = liger
    with torch.no_grad():
        sample = eager(*inputs)
    sample = sample if isinstance(sample, tuple) else (sample,)
    grads = [torch.randn_like(o) for o in sample]
    runs = {name: fwd_bwd(fn, inputs, wanted, grads) for name, fn in contenders.items()}
    expected_out, expected_grads = runs["eager"]()
    errors, failures = {}, {}
    for name, run in list(runs.items()):
        try:
            outs, gs = run()
        except Exception as exc:  # a peer that refuses the call
            failures[name] = f"{type(exc).__name__}: {exc}"[:200]
            del runs[name], contenders[name]
            continue
        errors[name] = max(
            _rel(a, b) for a, b in zip((*outs, *gs), (*expected_out, *expected_grads), strict=True)
        )
    with tileops.record() as record:
        runs["tileops"]()
    served = sorted({f"{s.interface}:{s.key}" for s in record.counts})
    times = {"copy": do_bench(copy_moving(moved), warmup=10, rep=60, return_mode="median")}
    times["copy_fwd"] = do_bench(
        copy_moving(forward_bytes), warmup=10, rep=60, return_mode="median"
    )
    forward = {}
    with torch.no_grad():
        for name, fn in contenders.items():
            forward[name] = do_bench(
                lambda f=fn: f(*inputs), warmup=10, rep=60, return_mode="median"
            )
    both = {
        name: do_bench(run, warmup=10, rep=60, return_mode="median") for name, run in runs.items()
    }
    return {
        "op": op,
        "tokens": tokens,
        "bytes": moved,
        "forward_bytes": forward_bytes,
        "served_by": served,
        "copy_ms": times["copy"],
        "copy_fwd_ms": times["copy_fwd"],
        "forward_ms": forward,
        "fwd_bwd_ms": both,
        "pct_copy_forward": {k: 100 * times["copy_fwd"] / v for k, v in forward.items()},
        "pct_copy_fwd_bwd": {k: 100 * times["copy"] / v for k, v in both.items()},
        "rel_err": errors,
        "failed": failures,
    }


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def markdown(results: list[dict], stamp: dict) -> list[str]:
    names = ("eager", "compile", "liger", "tileops")
    lines = [
        f"# Fused training ops on {stamp['device']}",
        "",
        f"{stamp['date']}, commit {stamp['commit']}, torch {stamp['torch']}. Llama-3-8B shapes "
        "(d 4096, MLP 14336, 32/8 heads of 128), bfloat16; medians with L2 cleared; % of a copy "
        "of the model bytes in the same run.",
        "",
        "| op | tokens | served by | pass | "
        + " | ".join(f"{n} ms (% copy)" for n in names)
        + " | tileops vs best | max rel err |",
        "|---|---|---|---|" + "---|" * len(names) + "---|---|",
    ]
    for r in results:
        for label, ms, pct in (("fwd", r["forward_ms"], r["pct_copy_forward"]),
                               ("fwd+bwd", r["fwd_bwd_ms"], r["pct_copy_fwd_bwd"])):  # fmt: skip
            cells = [f"{ms[n]:.3f} ({pct[n]:.0f}%)" if n in ms else "-" for n in names]
            best = min(v for k, v in ms.items() if k != "tileops")
            lines.append(
                f"| {r['op']} | {r['tokens']} | {', '.join(r['served_by'])} | {label} | "
                + " | ".join(cells)
                + f" | {best / ms['tileops']:.2f}x | {max(r['rel_err'].values()):.1e} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="add_rms_norm,swiglu,geglu,rotary")
    parser.add_argument("--tokens", type=int, default=4096, help="batch x sequence (2 x 2048)")
    parser.add_argument("--out", default=str(results_dir("fused")))
    args = parser.parse_args()
    info = run_stamp(tileops=getattr(tileops, "__version__", ""))
    results = []
    for op in args.ops.split(","):
        results.append(measure(op, args.tokens))
        print("\n".join(markdown(results[-1:], info)[-2:]), flush=True)
        torch.cuda.empty_cache()
    base = str(result_path(args.out, "fused", info["device"], ""))
    lines = markdown(results, info)
    Path(base + ".md").write_text("\n".join(lines) + "\n")
    with open(base + ".json", "w") as f:
        json.dump({"stamp": info, "results": results}, f, indent=1)
    print("\n".join(lines))
    worst = max(max(r["rel_err"].values()) for r in results)
    print(f"largest relative error against eager: {worst:.2e}")
    if worst > 5e-2:
        raise SystemExit("a contender disagrees with eager")


if __name__ == "__main__":
    main()
