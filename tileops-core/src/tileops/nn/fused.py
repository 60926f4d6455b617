"""The fused training ops as torch functions and modules: `add_rms_norm` (`AddRMSNorm`),
`glu` (`SwiGLU`) and `apply_rotary_pos_emb`, transformers' function of that name."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ArgumentError
from ..ops import AddRMSNormFwdOp, GLUFwdOp, RotaryFwdOp
from ..ops.fused.glu import ACTIVATIONS
from ._ops import cast, compute_dtype, op_for


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`h = x + residual` and `rms_norm(h, weight, eps)` over the last dim, in one pass:
    returns (normalized, h), h being the next layer's residual."""
    if x.dim() == 0:
        raise ArgumentError("add_rms_norm(): argument 'x' is 0-d; it normalizes the last dim")
    op = op_for(AddRMSNormFwdOp, x.device, (x.shape[-1],), eps)
    dtype = compute_dtype(x, weight)
    if dtype == x.dtype:
        return op(x, residual, weight)
    out, h = op(x.to(dtype), residual.to(dtype), cast(weight, dtype))
    return out.to(x.dtype), h.to(x.dtype)


def glu(x: torch.Tensor, up: torch.Tensor | None = None, act: str = "silu") -> torch.Tensor:
    """`act(gate) * up`: SwiGLU for act="silu", GeGLU for "gelu" / "gelu_tanh". With `up`
    None, `x` is packed: its last dim holds the gate, then up (transformers' Phi-3
    `gate_up_proj`, Liger's and vLLM's order); its halves are read in place."""
    if up is None:
        if x.dim() == 0 or x.shape[-1] % 2:
            shape = list(x.shape)
            raise ArgumentError(
                f"glu(): argument 'x' of shape {shape} is packed (gate, then up), so its last "
                "dim must be even; pass `up` for separate inputs"
            )
        half = x.shape[-1] // 2
        x, up = x[..., :half], x[..., half:]
    return op_for(GLUFwdOp, x.device, act)(x, up)


def apply_rotary_pos_emb(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' `apply_rotary_pos_emb` through `RotaryFwdOp`: (q_embed, k_embed), with
    partial rotary where cos/sin are narrower than head_dim."""
    return op_for(RotaryFwdOp, q.device, unsqueeze_dim)(q, k, cos, sin)


class AddRMSNorm(nn.Module):
    """RMSNorm after a residual add: `forward(x, residual)` returns (normalized, x + residual).
    Arguments and parameters as `torch.nn.RMSNorm`'s over one trailing dim."""

    def __init__(
        self,
        hidden_size: int,
        eps: float | None = None,
        elementwise_affine: bool = True,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        AddRMSNormFwdOp(hidden_size, eps)  # the op's own checks of the configuration
        self.hidden_size, self.eps = hidden_size, eps
        self.weight = None
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return add_rms_norm(x, residual, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class SwiGLU(nn.Module):
    """`act(gate) * up` of a packed input (gate, then up, along the last dim) or of two
    inputs: `forward(x)` or `forward(gate, up)`. `act`: "silu" (SwiGLU), "gelu", "gelu_tanh"
    (GeGLU)."""

    def __init__(self, act: str = "silu") -> None:
        super().__init__()
        if act not in ACTIVATIONS:
            raise ArgumentError(
                f"SwiGLU(): argument 'act' must be one of {', '.join(map(repr, ACTIVATIONS))}, "
                f"got {act!r}"
            )
        self.act = act

    def forward(self, x: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
        return glu(x, up, self.act)

    def extra_repr(self) -> str:
        return f"act={self.act!r}"
