"""Attention on one GPU, issue 33's table in one run: torch's SDPA backends (cuDNN, FlashAttention
2, memory-efficient), the tileops ops as dispatched and every installed key alone.

Prefill: bf16, GQA 32 query / 8 KV heads, head_dim 128, batch x seq = 16K tokens at seq 1K, 4K
and 16K, causal and not; forward TFLOP/s (4 b h s^2 d, halved when causal) and forward +
backward TFLOP/s (3.5 x the forward's flops). The memory-efficient backend takes one KV head per
query head: its KV heads are repeated before the clock starts. Decode: one query token per
sequence over a KV cache at batch 1 x 4K / 32K / 128K keys, 16 x 4K, 64 x 4K and 64 x 16K, in
GB/s of K and V read and as % of a same-run device copy; the ops at decode are AttentionFwdOp
(q_len 1, one length for all) and AttentionDecodeOp (per-sequence lengths, here all full).
Packed: 16K causal tokens as sequences of PACKED lengths, AttentionVarlenFwdOp (forward, and
forward + backward through autograd) beside FlashAttention's varlen entry point given the exact
longest length (which the op does not read: it would stop the host) and cuDNN's SDPA on the
sequences right-padded into a batch (padding not timed); TFLOP/s count each sequence's own.

Times are the best of `--rounds` medians of `triton.testing.do_bench` (L2 cleared per
repetition), the contenders interleaved round by round. A forced SDPA backend or a pinned key is
set around a contender's whole timing, never per call ("SDPA as called" is the plain call).
Every output is checked against cuDNN's (or flash's) before it is timed; a key that refuses a
call is listed with its reason.

    python benchmarks/suites/attention_h200.py [--part prefill|decode|packed|all] [--quick]
        [--out DIR]

Writes `<out>/attention_<device>.{md,json}` stamped with the date, device, versions and commit.
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
from _harness.copies import copy_gbps
from _harness.provenance import result_path, results_dir, run_stamp
from _harness.timing import Forced, bench_all, call_once
from torch.nn.attention import SDPBackend, sdpa_kernel

import tileops
from tileops import (
    AttentionBwdOp,
    AttentionDecodeOp,
    AttentionFwdOp,
    AttentionVarlenFwdOp,
    TileOpsError,
)
from tileops.table import table_for

HEADS, KV_HEADS, DIM, DTYPE = 32, 8, 128, torch.bfloat16
TOKENS = 16384
SEQS = (1024, 4096, 16384)
DECODE = [(1, 4096), (1, 32768), (1, 131072), (16, 4096), (64, 4096), (64, 16384)]
PACKED = (4096, 2816, 2048, 1792, 1536, 1280, 1024, 896, 512, 384)  # 16K tokens
BACKENDS = {
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
}
Timed = dict[str, Any]  # a contender: a call, or a Forced one


def randn(*shape: int, grad: bool = False) -> torch.Tensor:
    return torch.randn(shape, device="cuda", dtype=DTYPE).requires_grad_(grad)


def sdpa(backend: str, q, k, v, causal: bool) -> Forced:
    """torch's SDPA forced onto `backend`; the efficient one on repeated KV heads (given)."""
    gqa = k.shape[1] != q.shape[1]
    call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)  # noqa: E731
    return Forced(lambda: sdpa_kernel(BACKENDS[backend]), call)


def keys_of(op_cls: type, interface: str) -> list[str]:
    """Every installed key of the interface but the reference (its scores, held a chunk of
    rows at a time, take minutes at 16K)."""
    op_cls()  # constructing an op loads the installed backends
    candidates = table_for(op_cls).candidates[interface]
    return [c.key for c in candidates if not c.key.startswith("reference")]


def pinned_call(op_cls: type, interface: str, key: str, call: Callable[[], Any]) -> Forced:
    return Forced(lambda: tileops.pinned(op_cls, interface, key), call)


def served(name: str, fn: Any, check: Callable[[Any], float], notes: dict) -> bool:
    """Run `fn` once (builds, tunes), note its error against the baseline or why it refused."""
    try:
        notes[name] = f"error {check(call_once(fn)):.1e}"
        return True
    except TileOpsError as exc:  # refused where pinned, or no kernel for this device
        notes[name] = "not served: " + str(exc).splitlines()[0][:160]
    except Exception as exc:  # a kernel that fails to build or run is reported, not timed
        notes[name] = f"failed: {type(exc).__name__}: " + (str(exc).splitlines() or [""])[-1][:160]
        return False


def rel_error(want: torch.Tensor) -> Callable[[Any], float]:
    def error(got: Any) -> float:
        got = got[0] if isinstance(got, tuple) else got
        return float((got.float() - want.float()).norm() / want.float().norm())

    return error


def forward_contenders(q, k, v, causal: bool, notes: dict) -> Timed:
    k_rep, v_rep = (t.repeat_interleave(HEADS // KV_HEADS, 1) for t in (k, v))
    baseline = call_once(sdpa("sdpa_flash", q, k, v, causal))
    check = rel_error(baseline)
    candidates: Timed = {
        "SDPA cuDNN": sdpa("sdpa_cudnn", q, k, v, causal),
        "SDPA flash": sdpa("sdpa_flash", q, k, v, causal),
        "SDPA efficient (KV repeated)": sdpa("sdpa_efficient", q, k_rep, v_rep, causal),
    }
    op = AttentionFwdOp(causal=causal)
    candidates["tileops (dispatched)"] = lambda: op(q, k, v)
    for key in keys_of(AttentionFwdOp, "attention"):
        candidates[f"tileops {key}"] = pinned_call(
            AttentionFwdOp, "attention", key, lambda: op(q, k, v)
        )
    return {n: f for n, f in candidates.items() if served(n, f, check, notes)}


def training_contenders(q, k, v, causal: bool, notes: dict) -> Timed:
    """Forward + backward: the gradients of q, k and v for a random gradient of out."""
    grad = torch.randn_like(q)

    def step(forward: Any) -> Any:
        return _with_backward(forward, (q, k, v), grad)

    want = call_once(step(sdpa("sdpa_flash", q, k, v, causal)))
    check = rel_error(want)
    candidates: Timed = {
        "SDPA cuDNN": step(sdpa("sdpa_cudnn", q, k, v, causal)),
        "SDPA flash": step(sdpa("sdpa_flash", q, k, v, causal)),
    }
    op, backward = AttentionFwdOp(causal=causal), AttentionBwdOp(causal=causal)
    candidates["tileops (dispatched)"] = step(lambda: op(q, k, v))
    for key in keys_of(AttentionBwdOp, "attention_bwd"):
        # Autograd runs the backward on a thread of its own, which a pin (per thread) does not
        # reach: the op's forward, then its backward op pinned, given the forward's out and lse
        # as autograd would call them.
        def pair() -> torch.Tensor:
            with torch.no_grad():
                out, lse = op(q, k, v)
                return backward(grad, q, k, v, out, lse)[0]

        candidates[f"tileops backward {key}"] = pinned_call(
            AttentionBwdOp, "attention_bwd", key, pair
        )
    return {n: f for n, f in candidates.items() if served(n, f, check, notes)}


def prefill(seq: int, causal: bool, rounds: int, tokens: int) -> list[dict]:
    batch = max(tokens // seq, 1)
    q = randn(batch, HEADS, seq, DIM, grad=True)
    k, v = randn(batch, KV_HEADS, seq, DIM, grad=True), randn(batch, KV_HEADS, seq, DIM, grad=True)
    flops = 4 * batch * HEADS * seq * seq * DIM / (2 if causal else 1)
    rows = []
    for part, build, factor in (("forward", forward_contenders, 1.0),
                                ("forward+backward", training_contenders, 3.5)):  # fmt: skip
        notes: dict[str, str] = {}
        with torch.no_grad() if part == "forward" else torch.enable_grad():
            times = bench_all(build(q, k, v, causal, notes), rounds)
        for name, note in notes.items():
            ms = times.get(name)
            tflops = None if ms is None else factor * flops / ms / 1e9
            rows.append({"part": part, "seq": seq, "batch": batch, "causal": causal,
                         "name": name, "ms": ms, "tflops": tflops, "note": note})  # fmt: skip
    return rows


def decode(batch: int, kv_len: int, rounds: int, copy: float) -> list[dict]:
    q = randn(batch, HEADS, 1, DIM)
    k, v = randn(batch, KV_HEADS, kv_len, DIM), randn(batch, KV_HEADS, kv_len, DIM)
    lens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    notes: dict[str, str] = {}
    check = rel_error(call_once(sdpa("sdpa_flash", q, k, v, False)))
    fwd, dec = AttentionFwdOp(causal=True), AttentionDecodeOp(causal=True)
    candidates: Timed = {
        "SDPA as called": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        "SDPA cuDNN": sdpa("sdpa_cudnn", q, k, v, False),
        "SDPA flash": sdpa("sdpa_flash", q, k, v, False),
        "tileops AttentionFwdOp (dispatched)": lambda: fwd(q, k, v),
        "tileops AttentionDecodeOp (dispatched)": lambda: dec(q, k, v, lens),
    }
    for key in keys_of(AttentionFwdOp, "attention"):
        pinned = pinned_call(AttentionFwdOp, "attention", key, lambda: fwd(q, k, v))
        candidates[f"tileops AttentionFwdOp {key}"] = pinned
    for key in keys_of(AttentionDecodeOp, "attention_decode"):
        pinned = pinned_call(AttentionDecodeOp, "attention_decode", key, lambda: dec(q, k, v, lens))
        candidates[f"tileops AttentionDecodeOp {key}"] = pinned
    with torch.no_grad():
        timed = {n: f for n, f in candidates.items() if served(n, f, check, notes)}
        times = bench_all(timed, rounds)
    kv_bytes = 2 * k.numel() * k.element_size()
    rows = []
    for name, note in notes.items():
        ms = times.get(name)
        gbps = None if ms is None else kv_bytes / ms / 1e6
        rows.append({"part": "decode", "batch": batch, "kv_len": kv_len, "name": name, "ms": ms,
                     "gbps": gbps, "copy_pct": None if gbps is None else 100 * gbps / copy,
                     "kv_mb": kv_bytes / 2**20, "note": note})  # fmt: skip
    return rows


def packed(lengths: tuple[int, ...], rounds: int) -> list[dict]:
    """Causal sequences of `lengths` packed: the varlen op against FlashAttention given the
    exact longest length and cuDNN on the right-padded batch (causal: padding is never seen)."""
    total, longest = sum(lengths), max(lengths)
    q, grad = randn(total, HEADS, DIM, grad=True), randn(total, HEADS, DIM)
    k, v = randn(total, KV_HEADS, DIM, grad=True), randn(total, KV_HEADS, DIM, grad=True)
    cu = torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)
    starts = cu.tolist()[:-1]

    def pad(t: torch.Tensor) -> torch.Tensor:
        out = t.new_zeros(len(lengths), t.shape[1], longest, t.shape[2])
        for i, (start, n) in enumerate(zip(starts, lengths, strict=True)):
            out[i, :, :n] = t.detach()[start : start + n].transpose(0, 1)
        return out

    def unpad(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t[i, :, :n].transpose(0, 1) for i, n in enumerate(lengths)])

    padded = [pad(t).requires_grad_() for t in (q, k, v)]
    op = AttentionVarlenFwdOp(causal=True)

    def exact():  # FlashAttention's varlen forward, the longest length known to the host
        return torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, longest, longest, 0.0, True, False, scale=DIM**-0.5
        )[0]

    contenders = {  # name: (forward, its inputs, the gradient of its out)
        "tileops AttentionVarlenFwdOp (dispatched)": (lambda: op(q, k, v, cu, cu), (q, k, v), grad),
        "FlashAttention varlen, exact longest length": (exact, (q, k, v), grad),
        "SDPA cuDNN, right-padded batch": (sdpa("sdpa_cudnn", *padded, True), padded, pad(grad)),
    }
    flops = sum(4 * HEADS * n * n * DIM / 2 for n in lengths)
    rows = []
    for part, factor in (("packed forward", 1.0), ("packed forward+backward", 3.5)):
        calls = {name: fn if factor == 1.0 else _with_backward(fn, inputs, g)
                 for name, (fn, inputs, g) in contenders.items()}  # fmt: skip
        want = call_once(calls["FlashAttention varlen, exact longest length"])
        notes: dict[str, str] = {}
        timed = {}
        for name, call in calls.items():
            error = rel_error(want)
            check = (lambda out, e=error: e(unpad(out))) if "padded" in name else error
            if served(name, call, check, notes):
                timed[name] = call
        with torch.no_grad() if factor == 1.0 else torch.enable_grad():
            times = bench_all(timed, rounds)
        for name, note in notes.items():
            ms = times.get(name)
            tflops = None if ms is None else factor * flops / ms / 1e9
            seqs = "/".join(map(str, lengths))
            rows.append({"part": part, "seq": seqs, "batch": 1, "causal": True, "name": name,
                         "ms": ms, "tflops": tflops, "note": note})  # fmt: skip
    return rows


def _with_backward(forward: Any, inputs: Any, grad: torch.Tensor) -> Any:
    """`forward`, then the gradient of its first input for `grad` at its out."""
    if isinstance(forward, Forced):
        return forward._replace(fn=_with_backward(forward.fn, inputs, grad))

    def step() -> torch.Tensor:
        out = forward()
        out = out[0] if isinstance(out, tuple) else out
        return torch.autograd.grad(out, inputs, grad)[0]

    return step


PREFILL_HEAD = "| contender | causal | seq | batch | TFLOP/s | ms | note |"
DECODE_HEAD = "| contender | batch | kv_len | KV MB | GB/s | % of copy | us | note |"


def prefill_line(r: dict) -> str:
    cells = [r["name"], r["causal"], r["seq"], r["batch"], _num(r["tflops"]), _num(r["ms"], 3)]
    return "| " + " | ".join(map(str, [*cells, r["note"]])) + " |"


def decode_line(r: dict) -> str:
    us = None if r["ms"] is None else r["ms"] * 1e3
    cells = [r["name"], r["batch"], r["kv_len"], _num(r["kv_mb"]), _num(r["gbps"])]
    return "| " + " | ".join(map(str, [*cells, _num(r["copy_pct"]), _num(us), r["note"]])) + " |"


def markdown(rows: list[dict], meta: dict) -> list[str]:
    lines = [
        f"# Attention on {meta['device']}",
        "",
        f"{meta['date']}, commit {meta['commit']}, torch {meta['torch']}; bf16, GQA "
        f"{HEADS}/{KV_HEADS}, head_dim {DIM}; copy {meta['copy_gbps']:.0f} GB/s.",
    ]
    for part in ("forward", "forward+backward", "packed forward", "packed forward+backward",
                 "decode"):  # fmt: skip
        part_rows = [r for r in rows if r["part"] == part]
        if not part_rows:
            continue
        head, line = (
            (DECODE_HEAD, decode_line) if part == "decode" else (PREFILL_HEAD, prefill_line)
        )
        title = "Decode, GB/s of K and V read" if part == "decode" else f"Prefill {part}, TFLOP/s"
        rule = "|" + "---|" * head.count(" | ") + "---|"
        lines += ["", f"## {title}", "", head, rule, *map(line, part_rows)]
    return lines


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("prefill", "decode", "packed", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="1K and 4K, 4K tokens: a smoke run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(results_dir("attention")))
    parser.add_argument("--commit", default=None)
    args = parser.parse_args()
    seqs, tokens = (SEQS[:2], 4096) if args.quick else (SEQS, TOKENS)
    copy = copy_gbps(1 << 30, args.rounds)
    meta = run_stamp(args.commit, copy_gbps=copy)
    rows: list[dict] = []
    if args.part in ("prefill", "all"):
        rows += [r for s in seqs for c in (True, False) for r in prefill(s, c, args.rounds, tokens)]
    if args.part in ("packed", "all"):
        rows += packed(PACKED[2:6] if args.quick else PACKED, args.rounds)
    if args.part in ("decode", "all"):
        shapes = DECODE[:2] + DECODE[3:5] if args.quick else DECODE
        rows += [r for b, n in shapes for r in decode(b, n, args.rounds, copy)]
    stem = result_path(args.out, "attention", meta["device"], "")
    stem.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    lines = markdown(rows, meta)
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
