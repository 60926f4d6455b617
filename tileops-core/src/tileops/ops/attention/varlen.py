"""Attention over packed sequences of different lengths (`cu_seqlens`), the layout packed
training batches use: tokens of every sequence one after another, (total, heads, head_dim);
and its backward, an op of its own (`AttentionVarlenBwdOp`) as the dense form's is."""

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
from .._common import GradOpBackward, ReferenceKernel
from ._base import (
    PARAM_TYPES,
    AttentionParams,
    call_kernel,
    check_heads,
    check_saved,
    no_keys,
)
from ._math import attend_varlen, attend_varlen_grads
from .decode import INDEX_DTYPES
from .prefill import broken_grads

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


class _Varlen(AttentionParams):
    """The forward and backward ops' shared path: checks of heads and offsets, and the call
    spec of q, k, v."""

    q_at = 0  # q's position among the inputs; k, v, cu_seqlens_q and cu_seqlens_k follow it

    def check(self, call: BoundCall) -> None:
        q, k, _, cu_q, cu_k = call.tensors[self.q_at : self.q_at + 5]
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

    def call_for(
        self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor
    ) -> AttentionVarlenCall:
        """The call spec, remembered per shapes: a model's layers call with the same ones."""
        key = (q.shape, k.shape[:2], v.shape[-1], q.dtype, q.device, cu_seqlens_q.shape[0])
        return self.remembered(key, lambda: self._new_call(q, k, v, cu_seqlens_q))

    def _new_call(
        self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor
    ) -> AttentionVarlenCall:
        total_q, heads, head_dim = q.shape
        return AttentionVarlenCall(
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


def _offsets(cu_seqlens_q: Tensor, cu_seqlens_k: Tensor) -> list[Tensor]:
    """The offsets as the interfaces take them: contiguous int32."""
    return [t.to(torch.int32).contiguous() for t in (cu_seqlens_q, cu_seqlens_k)]


# -- the backward op ------------------------------------------------------------------------


class AttentionVarlenBwdInterface(KernelInterface):
    """Interface "attention_varlen_bwd": the gradients of `AttentionVarlenFwdOp`'s out with
    respect to q, k and v, given the gradient of out.

    Layout contract: grad_out (total_q, heads, v_dim), q, k, v, cu_seqlens_q and cu_seqlens_k
    as the "attention_varlen" interface has them, all contiguous; out and lse as the forward
    returned them, both given or both None (then a kernel recomputes what it needs). Return
    (grad_q, grad_k, grad_v), contiguous, each of its input's shape and dtype (grad_k and grad_v
    summed over the query heads of each group). Calls with total_q * heads == 0 or total_k == 0
    never reach a kernel.
    """

    call_spec = AttentionVarlenCall

    def forward(
        self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
        cu_seqlens_k: Tensor, out: Tensor | None, lse: Tensor | None,
    ) -> tuple:  # fmt: skip
        raise NotImplementedError


class AttentionVarlenBwdReference(ReferenceKernel, AttentionVarlenBwdInterface):
    """The explicit gradient formulas over packed sequences (`_math.attend_varlen_grads`)."""

    build_fields = ("scale", "causal", "window")

    def __init__(self, scale: float, causal: bool, window: int | None) -> None:
        self.scale, self.causal, self.window = scale, causal, window

    def forward(
        self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
        cu_seqlens_k: Tensor, out: Tensor | None, lse: Tensor | None,
    ) -> tuple:  # fmt: skip
        options = {"scale": self.scale, "causal": self.causal, "window": self.window}
        return attend_varlen_grads(grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, **options)


class AttentionVarlenBwdOp(_Varlen, Op):
    """The gradients of `AttentionVarlenFwdOp(causal, scale, window)`'s out at q, k and v,
    given grad_out, and optionally the forward's out and lse (both or neither): (grad_q,
    grad_k, grad_v). What the forward op's backward calls."""

    namespace = "tileops"
    interfaces = {
        "attention_varlen_bwd": AttentionVarlenBwdInterface,
        "backward": BackwardInterface,
    }
    kernel_types = {
        "reference": AttentionVarlenBwdReference,
        "reference_backward": RecomputeBackward,
    }
    signature = Signature(
        (
            Input("grad_out", ("total_q", "heads", "v_dim")),
            Input("q", ("total_q", "heads", "head_dim"), dtypes=("grad_out",)),
            Input("k", ("total_k", "kv_heads", "head_dim"), dtypes=("grad_out",)),
            Input("v", ("total_k", "kv_heads", "v_dim"), dtypes=("grad_out",)),
            Input("cu_seqlens_q", ("offsets",), dtypes=INDEX_DTYPES, differentiable=False),
            Input("cu_seqlens_k", ("offsets",), dtypes=INDEX_DTYPES, differentiable=False),
            Input("out", ("total_q", "heads", "v_dim"), dtypes=("grad_out",), optional=True,
                  differentiable=False),
            Input("lse", ("total_q", "heads"), optional=True, differentiable=False),
        ),
        PARAM_TYPES,
        (Output("grad_q", like="q"), Output("grad_k", like="k"), Output("grad_v", like="v")),
    )  # fmt: skip

    q_at = 1

    def check(self, call: BoundCall) -> None:
        super().check(call)
        check_saved(type(self).__name__, *call.tensors[6:])

    def forward(
        self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
        cu_seqlens_k: Tensor, out: Tensor | None = None, lse: Tensor | None = None,
    ) -> tuple:  # fmt: skip
        if k.shape[0] == 0 or q.numel() == 0:  # no key or no query: nothing flows back
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        call = self.call_for(q, k, v, cu_seqlens_q)
        dense = [None if t is None else t.contiguous() for t in (grad_out, q, k, v)]
        saved = [None if t is None else t.contiguous() for t in (out, lse)]
        kernel = self.kernel_for("attention_varlen_bwd", call)
        grads = kernel(*dense, *_offsets(cu_seqlens_q, cu_seqlens_k), *saved)
        for grad, like in zip(grads, (q, k, v), strict=True):
            if not (grad.shape == like.shape and grad.dtype == like.dtype and grad.is_contiguous()):
                raise broken_grads(self, "attention_varlen_bwd", call, grads)
        return tuple(grads)

    def reference_forward(
        self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
        cu_seqlens_k: Tensor, out: Tensor | None = None, lse: Tensor | None = None,
    ) -> tuple:  # fmt: skip
        scale = self.scale_for(q.shape[-1])
        return attend_varlen_grads(
            grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, scale=scale, causal=self.causal,
            window=self.window,
        )  # fmt: skip

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        generator = torch.Generator().manual_seed(0)

        def randn(*shape: int) -> Tensor:
            return torch.randn(shape, generator=generator)

        cu_q = torch.tensor([0, 7, 7, 19, 30], dtype=torch.int32)
        cu_k = torch.tensor([0, 9, 12, 24, 33], dtype=torch.int32)
        q, k, v = randn(30, 4, 16), randn(33, 2, 16), randn(33, 2, 16)
        note = "GQA, an empty sequence"
        yield Case({"causal": True}, (randn(30, 4, 16), q, k, v, cu_q, cu_k), note)
        cu = torch.tensor([0, 16, 40], dtype=torch.int32)
        qkv = randn(40, 2, 16), randn(40, 2, 16), randn(40, 2, 16)
        yield Case({"causal": True, "window": 6}, (randn(40, 2, 16), *qkv, cu, cu), "window")


# -- the forward op and its backward kernel ---------------------------------------------------


class AttentionVarlenBackward(GradOpBackward):
    """`AttentionVarlenFwdOp`'s backward: the gradients through out from
    `AttentionVarlenBwdOp`, handed the forward's out and lse (None where a caller modified one
    in place since). No gradient flows through lse or the offsets."""

    grad_op = AttentionVarlenBwdOp

    def forward(self, grads: tuple, inputs: tuple, outputs: tuple = ()) -> tuple:
        out, lse = (*outputs, None, None)[:2]
        saved = (out, lse) if out is not None and lse is not None else (None, None)
        return self.wanted((*self.run_grad_op((grads[0], *inputs, *saved)), None, None))


class AttentionVarlenFwdOp(_Varlen, Op):
    """`AttentionFwdOp` over each of several packed sequences (FlashAttention's varlen form),
    returning (out, lse); the causal mask is aligned to the bottom right of each sequence.

    q (total_q, heads, head_dim), k (total_k, kv_heads, head_dim), v (total_k, kv_heads,
    v_dim); cu_seqlens_q and cu_seqlens_k (seqs + 1,) int32 or int64 offsets; out (total_q,
    heads, v_dim); lse (total_q, heads). The offsets' values are checked on CPU tensors; on a
    GPU they are the caller's promise.
    """

    namespace = "tileops"
    interfaces = {"attention_varlen": AttentionVarlenInterface, "backward": BackwardInterface}
    kernel_types = {
        "reference": AttentionVarlenReference,
        "reference_backward": AttentionVarlenBackward,
    }
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
    saves_outputs = True  # out and lse: a backward kernel starts from them, not a second forward

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor
    ) -> tuple[Tensor, Tensor]:
        if k.shape[0] == 0:
            return no_keys(q, v.shape[-1], q.shape[:-1])
        call = self.call_for(q, k, v, cu_seqlens_q)
        tensors = q.contiguous(), k.contiguous(), v.contiguous()
        out_shape = (q.shape[0], q.shape[1], v.shape[-1])
        offsets = _offsets(cu_seqlens_q, cu_seqlens_k)
        return call_kernel(self, "attention_varlen", call, out_shape, *tensors, *offsets)

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
