"""Launchers of the fused programs, shared by the kernel classes and the benchmark suite.
The programs are imported on first launch (they import triton)."""

from __future__ import annotations

import functools

import torch

from ..compile import cdiv, next_pow2
from ..launching import launch

MAX_ROW = 16384
"""The longest add + RMSNorm row held whole by one forward program; longer ones stay with the
reference."""
BACKWARD_MAX_ROW = 8192
"""The longest row the backward program holds without spilling; longer ones stay with the
recompute reference."""
ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}
GLU_BLOCK = 1024
PARTS_PER_SM = 4  # add + RMSNorm backward: programs per multiprocessor, each a block of rows
INTERPRETER_PARTS = 4


def _row_warps(block: int) -> int:
    """The forward's warps for a row block: 16 elements of each array per thread up to 8K."""
    return max(1, min(block // 512, 16))


def _backward_warps(block: int) -> int:
    """The backward holds more arrays (x, residual, dy, the weight, dweight's sums): 4 elements
    of each per thread up to 4K, 8 at 8K (ptxas: no spills on sm_80 and sm_90 up to
    `BACKWARD_MAX_ROW`; tests/triton/test_fused_compile.py)."""
    return max(1, min(block // 128, 32))


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    out: torch.Tensor,
    h: torch.Tensor,
) -> None:
    """Write the norm of `x + residual` into `out` and the sum into `h`; all (rows, n)."""
    from . import programs

    rows, n = x.shape
    block = next_pow2(n)
    w = x if weight is None else weight
    launch(programs.add_rms_norm_fwd, (rows,),
        x, residual, w, out, h, n, eps, BLOCK=block, HAS_W=weight is not None,
        num_warps=_row_warps(block),
    )  # fmt: skip


def add_rms_norm_backward(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    dy: torch.Tensor,
    dh: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(d(x + residual), dweight) from the contiguous (rows, n) `x`, `residual`, `dy` and `dh`
    (the new residual's gradient, or None); dweight summed over the programs' partial rows."""
    from . import programs

    rows, n = x.shape
    block = next_pow2(n)
    parts = min(rows, _parts(x.device))
    per_program = cdiv(rows, parts)
    parts = cdiv(rows, per_program)
    dx = torch.empty_like(x)
    partial = None
    if weight is not None:
        partial = torch.empty((parts, n), dtype=torch.float32, device=x.device)
    launch(programs.add_rms_norm_bwd, (parts,),
        x, residual, x if weight is None else weight, dy, dy if dh is None else dh, dx,
        dx if partial is None else partial, rows, n, eps, per_program, BLOCK=block,
        HAS_W=weight is not None, HAS_DH=dh is not None, num_warps=_backward_warps(block),
    )  # fmt: skip
    dweight = None if partial is None else partial.sum(0).to(weight.dtype)
    return dx, dweight


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _parts(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_PARTS
    return PARTS_PER_SM * _sm_count(device)


def glu(act: str, gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor) -> None:
    """Write `act(gate) * up` of the (rows, n) `gate` and `up` (unit column stride) into the
    contiguous `out`."""
    from . import programs

    rows, n = gate.shape
    block = min(next_pow2(n), GLU_BLOCK)
    launch(programs.glu_fwd, (rows, cdiv(n, block)),
        gate, up, out, n, gate.stride(0), up.stride(0), ACT=ACTIVATIONS[act], BLOCK=block,
        num_warps=4,
    )  # fmt: skip


def glu_backward(
    act: str, gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup), contiguous (rows, n), from (rows, n) tensors of unit column stride."""
    from . import programs

    rows, n = gate.shape
    block = min(next_pow2(n), GLU_BLOCK)
    dgate = torch.empty((rows, n), dtype=gate.dtype, device=gate.device)
    dup = torch.empty_like(dgate)
    launch(programs.glu_bwd, (rows, cdiv(n, block)),
        gate, up, dy, dgate, dup, n, gate.stride(0), up.stride(0), dy.stride(0),
        ACT=ACTIVATIONS[act], BLOCK=block, num_warps=4,
    )  # fmt: skip
    return dgate, dup


def rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_out: torch.Tensor,
    k_out: torch.Tensor,
    *,
    backward: bool = False,
) -> None:
    """Rotate (batch, heads, seq, head_dim) `q` and `k` (unit stride along head_dim) by the
    (batch, seq, rot) tables into `q_out` and `k_out`; with `backward`, by the transpose of
    the rotation (the gradients of q and k from those of the outputs)."""
    from . import programs

    batch, q_heads, seq, head_dim = q.shape
    rot = cos.shape[-1]
    rest = head_dim - rot
    strides = [t.stride()[:3] for t in (q, k, q_out, k_out)]
    qb, qh, qs = strides[0]
    kb, kh, ks = strides[1]
    qob, qoh, qos = strides[2]
    kob, koh, kos = strides[3]
    launch(programs.rotary, (batch * seq,),
        q, k, cos, sin, q_out, k_out, seq, q_heads, k.shape[1], rot, head_dim,
        qb, qh, qs, kb, kh, ks, qob, qoh, qos, kob, koh, kos, cos.stride(0), cos.stride(1),
        Q_HEADS=next_pow2(q_heads), K_HEADS=next_pow2(k.shape[1]), HALF=next_pow2(rot // 2),
        PASS=next_pow2(rest) if rest else 0, BACKWARD=backward, num_warps=4,
    )  # fmt: skip
