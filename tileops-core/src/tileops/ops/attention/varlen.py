"""Attention over packed sequences of different lengths (`cu_seqlens`), the layout packed
training batches use: tokens of every sequence one after another, (total, heads, head_dim)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ...backward import BackwardInterface, RecomputeBackward
from ...callspec import CallSpec
from ...errors import OpInputError
from ...kernel import KernelInterface
from ...op import Op
from ...samples import Case
from ...signature import BoundCall, Input, Output, Signature
from .._common import ReferenceKernel
from ._base import PARAM_TYPES, AttentionParams, call_kernel, check_heads, no_keys
from ._math import attend_varlen
from .decode import INDEX_DTYPES

Tensor = torch.Tensor


class AttentionVarlenCall(CallSpec):
    """One packed call: `seqs` sequences, `total_q` query and `total_k` key tokens in all."""

    seqs: int
    heads: int
    kv_heads: int
    total_q: int
    total_k: int
    head_dim: int
    v_dim: int
    causal: bool
    scale: float
    dtype: torch.dtype
    window: int | None = None


class AttentionVarlenInterface(KernelInterface):
    """Interface "attention_varlen": each packed sequence's queries over its own keys.

    Layout contract: q (total_q, heads, head_dim), k (total_k, kv_heads, head_dim), v (total_k,
    kv_heads, v_dim), contiguous, of the call's dtype; cu_seqlens_q and cu_seqlens_k contiguous
    int32 (seqs + 1,) tensors, each starting at 0, non-decreasing, ending at total_q and total_k:
    sequence s holds query tokens cu_seqlens_q[s]:cu_seqlens_q[s + 1] and key tokens
    cu_seqlens_k[s]:cu_seqlens_k[s + 1]. Masks and heads per sequence as for the "attention"
    interface. Return (out, lse): out a contiguous (total_q, heads, v_dim) tensor of the call's
    dtype, lse a contiguous (total_q, heads) float32 tensor (float64 for float64 calls). Calls
    with total_q * heads == 0 or total_k == 0 never reach a kernel.
    """

    call_spec = AttentionVarlenCall

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor
    ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


class AttentionVarlenReference(ReferenceKernel, AttentionVarlenInterface):
    """The explicit masked softmax over every query and key token, keys of other sequences
    masked (`_math.attend_varlen`), a chunk of query tokens at a time."""

    build_fields = ("scale", "causal", "window")

    def __init__(self, scale: float, causal: bool, window: int | None) -> None:
        self.scale, self.causal, self.window = scale, causal, window

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor
    ) -> tuple[Tensor, Tensor]:
        return attend_varlen(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            scale=self.scale,
            causal=self.causal,
            window=self.window,
        )


class AttentionVarlenFwdOp(AttentionParams, Op):
    """`AttentionFwdOp` over each of several packed sequences (FlashAttention's varlen form),
    returning (out, lse); the causal mask is aligned to the bottom right of each sequence.

    q (total_q, heads, head_dim), k (total_k, kv_heads, head_dim), v (total_k, kv_heads,
    v_dim); cu_seqlens_q and cu_seqlens_k (seqs + 1,) int32 or int64 offsets; out (total_q,
    heads, v_dim); lse (total_q, heads). The offsets' values are checked on CPU tensors; on a
    GPU they are the caller's promise.
    """

    namespace = "tileops"
    interfaces = {"attention_varlen": AttentionVarlenInterface, "backward": BackwardInterface}
    kernel_types = {"reference": AttentionVarlenReference, "reference_backward": RecomputeBackward}
    signature = Signature(
        (
            Input("q", ("total_q", "heads", "head_dim")),
            Input("k", ("total_k", "kv_heads", "head_dim"), dtypes=("q",)),
            Input("v", ("total_k", "kv_heads", "v_dim"), dtypes=("q",)),
            Input("cu_seqlens_q", ("offsets",), dtypes=INDEX_DTYPES, differentiable=False),
            Input("cu_seqlens_k", ("offsets",), dtypes=INDEX_DTYPES, differentiable=False),
        ),
        PARAM_TYPES,
        (
            Output("out", shape=("total_q", "heads", "v_dim"), dtype_of="q"),
            Output(
                "lse",
                shape=("total_q", "heads"),
                dtype_of="q",
                min_dtype=torch.float32,
                differentiable=False,
            ),
        ),
    )

    def check(self, call: BoundCall) -> None:
        q, k, _, cu_q, cu_k = call.tensors
        op = type(self).__name__
        check_heads(op, q.shape[1], k.shape[1], q.shape[-1])
        if cu_q.shape[0] == 0:
            raise OpInputError(
                f"{op}(): argument 'cu_seqlens_q' is empty; expected seqs + 1 offsets, "
                "starting at 0"
            )
        for name, offsets, total in (
            ("cu_seqlens_q", cu_q, q.shape[0]),
            ("cu_seqlens_k", cu_k, k.shape[0]),
        ):
            if offsets.device.type == "cpu":
                _check_offsets(op, name, offsets, total)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor
    ) -> tuple[Tensor, Tensor]:
        if k.shape[0] == 0:
            return no_keys(q, v.shape[-1], q.shape[:-1])
        total_q, heads, head_dim = q.shape
        call = AttentionVarlenCall(
            device=q.device,
            seqs=cu_seqlens_q.shape[0] - 1,
            heads=heads,
            kv_heads=k.shape[1],
            total_q=total_q,
            total_k=k.shape[0],
            head_dim=head_dim,
            v_dim=v.shape[-1],
            causal=self.causal,
            scale=self.scale_for(head_dim),
            dtype=q.dtype,
            window=self.window,
        )
        offsets = [t.to(torch.int32).contiguous() for t in (cu_seqlens_q, cu_seqlens_k)]
        tensors = q.contiguous(), k.contiguous(), v.contiguous(), *offsets
        out_shape = (total_q, heads, v.shape[-1])
        return call_kernel(self, "attention_varlen", call, out_shape, *tensors)

    def reference_forward(
        self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor
    ) -> tuple[Tensor, Tensor]:
        scale = self.scale_for(q.shape[-1])
        return attend_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, scale=scale, causal=self.causal, window=self.window
        )

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        generator = torch.Generator().manual_seed(0)

        def randn(*shape: int) -> Tensor:
            return torch.randn(shape, generator=generator)

        cu_q = torch.tensor([0, 7, 7, 19, 50], dtype=torch.int32)
        cu_k = torch.tensor([0, 9, 12, 24, 55], dtype=torch.int32)
        kv = randn(55, 2, 32), randn(55, 2, 32)
        yield Case({"causal": True}, (randn(50, 4, 32), *kv, cu_q, cu_k), "GQA, an empty sequence")
        yield Case({}, (randn(50, 4, 32), *kv, cu_q, cu_k), "non-causal")
        cu = torch.tensor([0, 16, 40], dtype=torch.int32)
        qkv = randn(40, 2, 16), randn(40, 2, 16), randn(40, 2, 16)
        yield Case({"causal": True, "window": 6}, (*qkv, cu, cu), "sliding window")


def _check_offsets(op: str, name: str, offsets: Tensor, total: int) -> None:
    """Offsets start at 0, never decrease and end at the packed tensor's token count."""
    steps = offsets[1:] - offsets[:-1]
    if int(offsets[0]) != 0 or int(offsets[-1]) != total or bool((steps < 0).any()):
        raise OpInputError(
            f"{op}(): argument {name!r} holds {_shown(offsets)}; "
            f"expected offsets starting at 0, non-decreasing, ending at {total} (the tokens of "
            f"{'q' if name.endswith('q') else 'k and v'})"
        )


def _shown(offsets: Tensor) -> str:
    values = offsets.tolist()
    return str(values) if len(values) <= 8 else f"{str(values[:8])[:-1]}, ...]"
