"""Rotary position embedding of q and k together, with the semantics of transformers'
`apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)`: `x * cos + rotate_half(x) * sin` with
the cos/sin tables as given (not assumed to repeat their halves), and partial rotary: when the
tables are narrower than head_dim, only the first `rot` dims rotate and the rest pass through
(as Phi-3's, GLM's and NeoX's rotary do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch

from ...backward import BackwardInterface, RecomputeBackward
from ...callspec import CallSpec
from ...errors import OpConfigError, OpInputError, add_note
from ...kernel import KernelInterface
from ...op import Op
from ...signature import BATCH, BoundCall, Input, Output, Signature
from .._common import ReferenceKernel, int_param, sample_case, upcasts

if TYPE_CHECKING:
    from ...samples import Case

# unsqueeze_dim -> where q's and k's heads are: 1 for (batch, heads, seq, head_dim), 2 for
# (batch, seq, heads, head_dim); -3 and -2 are the same dims of the 3-D tables.
HEADS_DIM = {1: 1, -3: 1, 2: 2, -2: 2}


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int
) -> torch.Tensor:
    """One tensor's rotation, as transformers computes it, with partial rotary."""
    rot = cos.shape[-1]
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    turned, kept = x[..., :rot], x[..., rot:]
    rotated = turned * cos + rotate_half(turned) * sin
    return torch.cat((rotated, kept), dim=-1) if kept.shape[-1] else rotated


def rotary_pair(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's torch definition: 16-bit inputs computed in float32, rounded once."""
    if upcasts(q):
        cos, sin = cos.float(), sin.float()
        q_out = rotary(q.float(), cos, sin, unsqueeze_dim).to(q.dtype)
        return q_out, rotary(k.float(), cos, sin, unsqueeze_dim).to(k.dtype)
    return rotary(q, cos, sin, unsqueeze_dim), rotary(k, cos, sin, unsqueeze_dim)


class RotaryCall(CallSpec):
    """One call: the inputs' dtype, head_dim and the rotated width `rot` (the tables')."""

    dtype: torch.dtype
    head_dim: int
    rot: int


class RotaryInterface(KernelInterface):
    """Interface "rotary": write `x * cos + rotate_half(x) * sin` over the first `rot` dims of
    each head of q and k (the rest copied), computed in float32 for 16-bit inputs.

    Layout contract: `q` (batch, q_heads, seq, head_dim) and `k` (batch, k_heads, seq,
    head_dim) of one dtype, any strides with unit stride along head_dim; `cos` and `sin`
    (batch, seq, rot) of that dtype, unit stride along rot, any other strides (stride 0 where
    the caller's tables broadcast over the batch); `q_out` and `k_out` buffers of q's and k's
    shapes and dtype to write, any strides. Return nothing. Calls with an empty q or k never
    reach a kernel.
    """

    call_spec = RotaryCall

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        q_out: torch.Tensor,
        k_out: torch.Tensor,
    ) -> None:
        raise NotImplementedError


class RotaryReference(ReferenceKernel, RotaryInterface):
    """The torch definition, heads on dim 1."""

    def forward(self, q, k, cos, sin, q_out, k_out) -> None:  # noqa: ANN001
        q_rot, k_rot = rotary_pair(q, k, cos, sin, 1)
        q_out.copy_(q_rot)
        k_out.copy_(k_rot)


class RotaryFwdOp(Op):
    """transformers' `apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)` -> (q_embed,
    k_embed) for 4-D q and k (heads on dim `unsqueeze_dim`, 1 or 2) and 3-D (batch or 1, seq,
    rot) tables; rot even, at most head_dim (partial rotary below it)."""

    namespace = "tileops"
    layout_checks = True
    interfaces = {"rotary": RotaryInterface, "backward": BackwardInterface}
    kernel_types = {"reference": RotaryReference, "reference_backward": RecomputeBackward}
    signature = Signature(
        (
            Input("q", (BATCH,)),
            Input("k", (BATCH,), dtypes=("q",)),
            Input("cos", (BATCH,), dtypes=("q",)),
            Input("sin", (BATCH,), dtypes=("q",)),
        ),
        {"unsqueeze_dim": "int"},
        (Output("q_embed", like="q"), Output("k_embed", like="k")),
    )

    def __init__(self, unsqueeze_dim: int = 1, *, target: str | None = None) -> None:
        value = int_param(type(self).__name__, "unsqueeze_dim", unsqueeze_dim)
        if value not in HEADS_DIM:
            raise OpConfigError(
                f"{type(self).__name__}: parameter 'unsqueeze_dim' must be 1 (q, k of shape "
                "(batch, heads, seq, head_dim)) or 2 ((batch, seq, heads, head_dim)), or -3 / "
                f"-2 for those, got {unsqueeze_dim!r}"
            )
        self.unsqueeze_dim = value
        super().__init__(target=target)

    def check(self, call: BoundCall) -> None:
        check_rotary(type(self).__name__, HEADS_DIM[self.unsqueeze_dim], *call.tensors)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not (q.numel() and k.numel()):  # one of them empty: nothing worth a kernel
            return tuple(t.contiguous() for t in self.reference_forward(q, k, cos, sin))
        call = self._spec(q, cos)
        try:
            return self._rotation(self.kernel_for("rotary", call), q, k, cos)(q, k, cos, sin)
        except Exception as exc:
            add_note(exc, f"raised by {self._table.serving('rotary', call)}")
            raise

    def lane_for(self, call: BoundCall) -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
        q, k, cos, _ = call.tensors
        if not (q.numel() and k.numel()):
            return None
        kernel = self._hits.get(("rotary", self._spec(q, cos)))
        if kernel is None:
            return None
        return self._rotation(kernel, q, k, cos)

    def _spec(self, q: torch.Tensor, cos: torch.Tensor) -> RotaryCall:
        return RotaryCall(device=q.device, dtype=q.dtype, head_dim=q.shape[-1], rot=cos.shape[-1])

    def _rotation(
        self, kernel: Callable[..., None], q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor
    ) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        """(q, k, cos, sin) -> (q_embed, k_embed) by `kernel` for inputs of these shapes: new
        contiguous outputs, the tables expanded to (batch, seq, rot) and every tensor viewed
        with heads second, as the interface takes them. The sizes are read once here: torch
        parses ints faster than a Size, and tables of that shape need no expanding."""
        q_dims, k_dims = tuple(q.shape), tuple(k.shape)
        swap = HEADS_DIM[self.unsqueeze_dim] != 1
        table = (q.shape[0], q.shape[1 if swap else 2], cos.shape[-1])
        expand = tuple(cos.shape) != table

        def rotate(
            q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            q_out, k_out = q.new_empty(*q_dims), k.new_empty(*k_dims)  # contiguous
            if expand:
                cos, sin = cos.expand(*table), sin.expand(*table)
            if swap:
                kernel(q.transpose(1, 2), k.transpose(1, 2), cos, sin,
                       q_out.transpose(1, 2), k_out.transpose(1, 2))  # fmt: skip
            else:
                kernel(q, k, cos, sin, q_out, k_out)
            return q_out, k_out

        return rotate

    def reference_forward(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_pair(q, k, cos, sin, self.unsqueeze_dim)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        yield sample_case({}, (2, 4, 6, 16), (2, 2, 6, 16), (2, 6, 16), (2, 6, 16))
        shapes = (1, 5, 3, 24), (1, 5, 1, 24), (1, 5, 8), (1, 5, 8)
        yield sample_case({"unsqueeze_dim": 2}, *shapes, note="heads on dim 2, partial rotary")


def check_rotary(op: str, heads_dim: int, q, k, cos, sin) -> None:  # noqa: ANN001
    """The shapes transformers' broadcasting accepts for the layouts the op serves."""
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            raise OpInputError(
                f"{op}(): argument {name!r} has shape {list(t.shape)}, expected 4 dims (batch, "
                f"{'heads, seq' if heads_dim == 1 else 'seq, heads'}, head_dim)"
            )
    seq_dim = 3 - heads_dim
    if (k.shape[0], k.shape[seq_dim], k.shape[3]) != (q.shape[0], q.shape[seq_dim], q.shape[3]):
        raise OpInputError(
            f"{op}(): argument 'k' has shape {list(k.shape)}, expected q's batch, seq and "
            f"head_dim ({q.shape[0]}, {q.shape[seq_dim]}, {q.shape[3]}) at dims 0, {seq_dim}, 3"
        )
    if cos.dim() != 3 or sin.shape != cos.shape:
        raise OpInputError(
            f"{op}(): arguments 'cos' and 'sin' have shapes {list(cos.shape)} and "
            f"{list(sin.shape)}, expected one shape (batch or 1, seq, rot)"
        )
    batch, seq, head_dim = q.shape[0], q.shape[seq_dim], q.shape[3]
    rot = cos.shape[2]
    if cos.shape[0] not in (1, batch) or cos.shape[1] not in (1, seq):
        raise OpInputError(
            f"{op}(): argument 'cos' has shape {list(cos.shape)}, expected ({batch} or 1, "
            f"{seq} or 1, rot), to broadcast over q of shape {list(q.shape)}"
        )
    if rot % 2 or not 2 <= rot <= head_dim:
        raise OpInputError(
            f"{op}(): argument 'cos' has {rot} rotary dims, expected an even number from 2 to "
            f"head_dim ({head_dim})"
        )
