"""Where a decode-sized op call spends its host time, step by step down to the launch.

For RMSNorm 1 x 4096, a 1 x 4096 x 4096 GEMM (`tnn.Linear`'s shape at decode), attention
decode at batch 1 over 4096 keys (against `F.scaled_dot_product_attention`), and Llama's
SwiGLU and rotary at one token (against transformers' code), bfloat16, it
times per call (median of interleaved loops, synchronised at the end of each, so host-bound
figures): torch's function, `torch.empty_like`, the TileLang program called directly with its
output preallocated under each of TileLang's execution backends, the serving kernel entry, the op,
the `tileops.nn` module, and the op under `torch.inference_mode` (for decode, the split-KV
kernel's allocations and launches instead of the backends). Then a cProfile of the op's calls
(the functions that cost the most, by own time).

    python benchmarks/sweeps/launch_path_h200.py [--number 2000] [--repeats 7] [--out DIR]

Writes `<out>/launch_path_<device>.txt`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for _harness

import torch
import torch.nn.functional as F
from _harness.ops import serving_entry
from _harness.provenance import result_path, results_dir, run_stamp
from _harness.timing import host_profile, per_call_ns

import tileops
import tileops.nn
from tileops_cuda._common.compile import entry_function

BACKENDS = ("tvm_ffi", "cython")


def direct_launches(kernel: Any, args: tuple) -> dict[str, Callable[[], Any]]:
    """A row kernel's TileLang program rebuilt under each execution backend, called directly
    with every buffer preallocated (what a launch costs with nothing of ours around it)."""
    compiled = getattr(kernel, "compiled", None)
    if not hasattr(compiled, "prim_func") or not hasattr(kernel, "workspace"):
        return {}  # the GEMM kernels hold a list of programs and their own buffers
    import tilelang

    buffers = [*args, *kernel.workspace(args[0]), torch.empty_like(args[0])]
    found = {}
    for backend in BACKENDS:
        try:
            jit = tilelang.compile(
                compiled.prim_func,
                target=compiled.target,
                pass_configs=compiled.pass_configs,
                execution_backend=backend,
            )
            jit(*buffers)
        except Exception as error:  # a backend that cannot build here is a finding, not a stop
            print(f"execution_backend={backend}: {type(error).__name__}: {error}")
            continue
        found[f"tilelang {backend}, preallocated"] = lambda j=jit: j(*buffers)
        if backend == "tvm_ffi":  # the executable's entry function, TileLang's wrapper skipped
            entry = entry_function(jit)
            if entry is jit:  # a finding too: Launch falls back to TileLang's call the same way
                print("tvm_ffi: no entry function found; Launch would call TileLang's wrapper")
            found["tvm_ffi entry function, preallocated"] = lambda e=entry: e(*buffers)
    return found


def decode_pieces(kernel: Any, args: tuple) -> dict[str, Callable[[], Any]]:
    """The split-KV decode kernel's host path in pieces: its partials looked up and its two
    outputs allocated, and its two launches on preallocated buffers, through `Launch` (the
    entry functions) and through TileLang's own calls."""
    q, k, v, lens = args
    o_part, lse_part = kernel._partials(q)
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)
    split_args, combine_args = (q, k, v, lens, o_part, lse_part), (o_part, lse_part, out, lse)

    def allocations() -> None:
        kernel._partials(q)
        torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)

    def launches(run: list) -> Callable[[], Any]:
        return lambda: (run[0](*split_args), run[1](*combine_args))

    return {
        "partials and outputs": allocations,
        "split launch, preallocated": lambda: kernel.launches[0](*split_args),
        "combine launch, preallocated": lambda: kernel.launches[1](*combine_args),
        "both launches, preallocated": launches(kernel.launches),
        "both TileLang calls, preallocated": launches(kernel.compiled),
    }


def decode_case() -> tuple:
    """AttentionDecodeOp at batch 1 over 4096 keys, GQA 32/8, head_dim 128 (issue 33's)."""
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    lens = torch.full((1,), 4096, dtype=torch.int32, device="cuda")
    op = tileops.AttentionDecodeOp(causal=True)
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    return op, (q, k, v, lens), sdpa, None


def fused_cases() -> dict[str, tuple]:
    """SwiGLU of Llama's MLP (1 x 14336) and rotary of its q and k (GQA 32/8, head_dim 128)
    at one decode token, against transformers' eager code; the Triton program launched through
    Triton's own path and through `launching.launch`, outputs preallocated."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from tileops_triton.fused import launch as fused
    from tileops_triton.fused import programs

    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    gate, up = torch.randn(1, 14336, **bf16), torch.randn(1, 14336, **bf16)
    out = torch.empty_like(gate)
    grid = (1, 14336 // fused.GLU_BLOCK)
    glu_pieces = {
        "Triton's launch, preallocated": lambda: programs.glu_fwd[grid](
            gate, up, out, 14336, 14336, 14336, ACT=0, BLOCK=fused.GLU_BLOCK, num_warps=4
        ),
        "launching.launch, preallocated": lambda: fused.glu("silu", gate, up, out),
    }
    q, k = torch.randn(1, 32, 1, 128, **bf16), torch.randn(1, 8, 1, 128, **bf16)
    cos, sin = torch.randn(1, 1, 128, **bf16), torch.randn(1, 1, 128, **bf16)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    rotary_pieces = {
        "launching.launch, preallocated": lambda: fused.rotary(q, k, cos, sin, q_out, k_out),
    }
    return {
        "glu 1x14336": (
            tileops.GLUFwdOp("silu"),
            (gate, up),
            lambda: F.silu(gate) * up,
            lambda: tileops.nn.glu(gate, up),
            glu_pieces,
        ),
        "rotary 1x32/8x128": (
            tileops.RotaryFwdOp(1),
            (q, k, cos, sin),
            lambda: apply_rotary_pos_emb(q, k, cos, sin),
            lambda: tileops.nn.apply_rotary_pos_emb(q, k, cos, sin),
            rotary_pieces,
        ),
    }


def cases() -> dict[str, tuple]:
    """(op, inputs, torch function, tileops.nn module call or None[, pieces]) at decode
    shapes."""
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    norm = tileops.nn.RMSNorm(4096, eps=1e-6).to("cuda", torch.bfloat16)
    linear = tileops.nn.Linear(4096, 4096, bias=False).to("cuda", torch.bfloat16)
    weight_t = linear.weight.detach().t().contiguous()
    return {
        "rms_norm 1x4096": (
            tileops.RMSNormFwdOp(4096, eps=1e-6),
            (x, w),
            lambda: F.rms_norm(x, (4096,), w, 1e-6),
            lambda: norm(x),
        ),
        "gemm 1x4096x4096": (
            tileops.GemmOp(),
            (x, weight_t),
            lambda: F.linear(x, linear.weight),
            lambda: linear(x),
        ),
        "attention decode 1x4096": decode_case(),
        **fused_cases(),
    }


def measure(name: str, case: tuple, number: int, repeats: int) -> list[str]:
    """One case's per-call figures and profiles, as report lines."""
    op, inputs, torch_fn, module_call, *given = case
    if given:  # the pieces given, and the op's own kernel entry
        op(*inputs)
        kernel, pieces = next(iter(op._hits.values())), given[0]
        entry = None
    elif isinstance(op, tileops.AttentionDecodeOp):
        op(*inputs)
        kernel, kernel_args = next(iter(op._hits.values())), inputs
        pieces = decode_pieces(kernel, inputs)
        entry = lambda: kernel.forward(*kernel_args)  # noqa: E731
    else:
        kernel, kernel_args = serving_entry(op, inputs)
        pieces = direct_launches(kernel, kernel_args)
        entry = lambda: kernel(*kernel_args)  # noqa: E731

    def op_call() -> Any:
        return op(*inputs)

    fns = {
        "torch function": torch_fn,
        "torch.empty_like": lambda: torch.empty_like(inputs[0]),
        **pieces,
        **({f"kernel entry ({type(kernel).__name__})": entry} if entry else {}),
        "op": op_call,
        **({"tileops.nn module": module_call} if module_call else {}),
    }
    with torch.no_grad():
        found = per_call_ns(fns, "cuda", number, repeats)
    with torch.inference_mode():
        found.update(per_call_ns({"op, inference_mode": op_call}, "cuda", number, 3))
    base = found["torch function"]
    lines = [f"## {name}: ns per call (ratio to the torch function)"]
    lines += [f"  {k:<44} {v:>9,.0f}  {v / base:5.2f}" for k, v in found.items()]
    lines += ["", "cProfile of the op's calls:", host_profile(op_call, 5000, 25), ""]
    if module_call is None:
        return lines
    return lines + ["cProfile of the module's calls:", host_profile(module_call, 5000, 25), ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(results_dir("dispatch")))
    args = parser.parse_args()
    stamp = run_stamp()
    lines = ["  ".join(f"{k}: {v}" for k, v in stamp.items()), ""]
    for name, case in cases().items():
        lines += measure(name, case, args.number, args.repeats)
    path = result_path(args.out, "launch_path", stamp["device"], ".txt")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
