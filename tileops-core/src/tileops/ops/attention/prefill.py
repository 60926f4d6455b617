"""Attention forward, matching `F.scaled_dot_product_attention` (and transformers' attention
functions) on (batch, heads, seq, head_dim) tensors, with grouped-query attention, the causal
mask aligned to the bottom right, a sliding window and the log-sum-exp; and its backward, an op
of its own (`AttentionBwdOp`) so that its kernels are chosen by shape as the forward's are."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ...backward import BackwardInterface, RecomputeBackward
from ...callspec import CallSpec
from ...errors import BackendError
from ...kernel import KernelInterface
from ...op import Op
from ...signature import BoundCall, Input, Output, Signature
from .._common import GradOpBackward, ReferenceKernel, sample_case
from ._base import (
    PARAM_TYPES,
    AttentionParams,
    call_kernel,
    check_heads,
    check_saved,
    no_keys,
)
from ._math import attend, attend_grads

if TYPE_CHECKING:
    from ...samples import Case

Tensor = torch.Tensor
Q = Input("q", ("batch", "heads", "q_len", "head_dim"))
K = Input("k", ("batch", "kv_heads", "kv_len", "head_dim"), dtypes=("q",))
V = Input("v", ("batch", "kv_heads", "kv_len", "v_dim"), dtypes=("q",))
OUT = Output("out", shape=("batch", "heads", "q_len", "v_dim"), dtype_of="q")
LSE = Output(
    "lse",
    shape=("batch", "heads", "q_len"),
    dtype_of="q",
    min_dtype=torch.float32,
    differentiable=False,
)


class AttentionCall(CallSpec):
    """One attention call: q (batch, heads, q_len, head_dim) over k and v (batch, kv_heads,
    kv_len, head_dim or v_dim). `causal` is False where it changes nothing (one query row and
    no window); `scale` is the factor resolved (1 / sqrt(head_dim) by default); `window` the
    sliding window's keys, None for none. For one query row (decode), `kv_len` above 1 is
    rounded up to a power of two: a cache growing by a token per step keeps hitting the
    dispatch cache; kernels read the length off k."""

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    v_dim: int
    causal: bool
    scale: float
    dtype: torch.dtype
    window: int | None = None


def decode_bucket(kv_len: int) -> int:
    """A key length (or a cache's capacity, a block table's width) as a decode call spec holds
    it: 1 as is, else the next power of two."""
    return 1 << (kv_len - 1).bit_length() if kv_len > 1 else kv_len


class AttentionInterface(KernelInterface):
    """Interface "attention": `softmax(q @ k^T * scale, masked) @ v` and its log-sum-exp.

    Layout contract: q (batch, heads, q_len, head_dim), k (batch, kv_heads, kv_len, head_dim)
    and v (batch, kv_heads, kv_len, v_dim), contiguous, of the call's dtype; heads is a multiple
    of kv_heads, query head `i` reading kv head `i // (heads // kv_heads)`. The mask is the
    call's: causal aligned to the bottom right (query `i` sees keys `j <= kv_len - q_len + i`),
    a sliding window of `window` keys ending there (see `tileops.ops.attention._math`). Return
    (out, lse): out a contiguous (batch, heads, q_len, v_dim) tensor of the call's dtype, lse a
    contiguous (batch, heads, q_len) float32 tensor (float64 for float64 calls) of the natural
    log-sum-exp of each row's scaled, masked scores; a row that sees no key gets zeros and -inf.
    Calls with batch * heads * q_len == 0 or kv_len == 0 never reach a kernel.
    """

    call_spec = AttentionCall

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


class AttentionReference(ReferenceKernel, AttentionInterface):
    """The explicit masked softmax (`_math.attend`): 16-bit inputs computed in float32, the
    output rounded once, the log-sum-exp kept in float32."""

    build_fields = ("scale", "causal", "window")

    def __init__(self, scale: float, causal: bool, window: int | None) -> None:
        self.scale, self.causal, self.window = scale, causal, window

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return attend(q, k, v, scale=self.scale, causal=self.causal, window=self.window)


class _Attention(AttentionParams):
    """The forward and backward ops' shared path: checks and the call spec of q, k, v."""

    q_at: ClassVar[int] = 0  # q's position among the inputs; k follows it
    layout_checks = True

    def check(self, call: BoundCall) -> None:
        q, k = call.tensors[self.q_at], call.tensors[self.q_at + 1]
        check_heads(type(self).__name__, q.shape[1], k.shape[1], q.shape[-1])

    def call_for(self, q: Tensor, k: Tensor, v: Tensor) -> AttentionCall:
        kv_len = k.shape[2]
        kv_len = decode_bucket(kv_len) if q.shape[2] == 1 else kv_len
        key = (*self.call_facts(q, v), kv_len)
        return self.remembered(key, lambda: AttentionCall(kv_len=kv_len, **self.call_fields(q, v)))


# -- the backward op ------------------------------------------------------------------------


class AttentionBwdInterface(KernelInterface):
    """Interface "attention_bwd": the gradients of `AttentionFwdOp`'s out with respect to q, k
    and v, given the gradient of out.

    Layout contract: grad_out (batch, heads, q_len, v_dim), q, k and v as the "attention"
    interface has them, all contiguous of the call's dtype; out and lse as the forward returned
    them (contiguous, the interface's lse: natural log-sum-exp in float32, or float64), both
    given or both None (then a kernel recomputes what it needs from q, k and v). Return
    (grad_q, grad_k, grad_v), contiguous, each of its input's shape and dtype (grad_k and
    grad_v summed over the query heads of each group). Calls with batch * heads * q_len == 0 or
    kv_len == 0 never reach a kernel.
    """

    call_spec = AttentionCall

    def forward(
        self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor | None,
        lse: Tensor | None,
    ) -> tuple:  # fmt: skip
        raise NotImplementedError


class AttentionBwdReference(ReferenceKernel, AttentionBwdInterface):
    """The explicit gradient formulas (`_math.attend_grads`), the probabilities recomputed in
    float32 for 16-bit inputs, each gradient rounded once."""

    build_fields = ("scale", "causal", "window")

    def __init__(self, scale: float, causal: bool, window: int | None) -> None:
        self.scale, self.causal, self.window = scale, causal, window

    def forward(
        self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor | None,
        lse: Tensor | None,
    ) -> tuple:  # fmt: skip
        options = {"scale": self.scale, "causal": self.causal, "window": self.window}
        return attend_grads(grad_out, q, k, v, **options)


class AttentionBwdOp(_Attention, Op):
    """The gradients of `AttentionFwdOp(causal, scale, window)`'s out at q, k and v, given
    grad_out, and optionally the forward's out and lse (both or neither; with them a kernel
    need not run the forward again): (grad_q, grad_k, grad_v). What the forward op's backward
    calls."""

    namespace = "tileops"
    interfaces = {"attention_bwd": AttentionBwdInterface, "backward": BackwardInterface}
    kernel_types = {"reference": AttentionBwdReference, "reference_backward": RecomputeBackward}
    signature = Signature(
        (
            Input("grad_out", ("batch", "heads", "q_len", "v_dim")),
            Q,
            K,
            V,
            Input("out", ("batch", "heads", "q_len", "v_dim"), dtypes=("q",), optional=True,
                  differentiable=False),
            Input("lse", ("batch", "heads", "q_len"), optional=True, differentiable=False),
        ),
        PARAM_TYPES,
        (Output("grad_q", like="q"), Output("grad_k", like="k"), Output("grad_v", like="v")),
    )  # fmt: skip

    q_at = 1

    def check(self, call: BoundCall) -> None:
        super().check(call)
        check_saved(type(self).__name__, *call.tensors[4:])

    def forward(
        self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor | None = None,
        lse: Tensor | None = None,
    ) -> tuple:  # fmt: skip
        if k.shape[2] == 0:  # no key: out is zeros whatever q, k, v are
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        call = self.call_for(q, k, v)
        args = [None if t is None else t.contiguous() for t in (grad_out, q, k, v, out, lse)]
        kernel = self.kernel_for("attention_bwd", call)
        grads = kernel(*args)
        for grad, like in zip(grads, (q, k, v), strict=True):
            if not (grad.shape == like.shape and grad.dtype == like.dtype and grad.is_contiguous()):
                raise broken_grads(self, "attention_bwd", call, grads)
        return tuple(grads)

    def reference_forward(
        self, grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor | None = None,
        lse: Tensor | None = None,
    ) -> tuple:  # fmt: skip
        scale = self.scale_for(q.shape[-1])  # from q, k and v alone: out and lse are a shortcut
        return attend_grads(grad_out, q, k, v, scale=scale, causal=self.causal, window=self.window)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        shapes = (2, 4, 16, 32), (2, 4, 16, 32), (2, 2, 24, 32), (2, 2, 24, 32)
        yield sample_case({"causal": True}, *shapes, note="GQA, q_len < kv_len")
        shapes = (1, 2, 12, 16), (1, 2, 12, 16), (1, 1, 12, 16), (1, 1, 12, 16)
        yield sample_case({"causal": True, "window": 4}, *shapes, note="sliding window")


def broken_grads(op: Op, interface: str, call: Any, grads: Any) -> Exception:
    """The error for a backward kernel whose gradients break its interface's contract."""
    shown = [f"{str(g.dtype).removeprefix('torch.')}{list(g.shape)}" for g in grads]
    return BackendError(
        f"Output of {op._table.serving(interface, call)} is wrong: it returned {shown}; "
        "the interface's layout contract expects contiguous gradients shaped and typed like q, "
        "k and v. Fix the kernel, or refuse such calls in its refusal()."
    )


# -- the forward op and its backward kernel ---------------------------------------------------


class AttentionBackward(GradOpBackward):
    """`AttentionFwdOp`'s backward: the gradients through out from `AttentionBwdOp`, handed the
    forward's out and lse (None where a caller modified one in place since). No gradient flows
    through lse."""

    grad_op = AttentionBwdOp

    def forward(self, grads: tuple, inputs: tuple, outputs: tuple = ()) -> tuple:
        out, lse = (*outputs, None, None)[:2]
        saved = (out, lse) if out is not None and lse is not None else (None, None)
        return self.wanted(self.run_grad_op((grads[0], *inputs, *saved)))


class AttentionFwdOp(_Attention, Op):
    """`F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)` with a causal
    mask aligned to the bottom right (`is_causal` where q_len == kv_len) and an optional
    sliding window, returning (out, lse). lse is not differentiable (as torch's own attention
    kernels declare it): gradients flow through out.

    q (batch, heads, q_len, head_dim), k (batch, kv_heads, kv_len, head_dim), v (batch,
    kv_heads, kv_len, v_dim); out (batch, heads, q_len, v_dim); lse (batch, heads, q_len) in
    float32 (float64 for float64 inputs).
    """

    namespace = "tileops"
    interfaces = {"attention": AttentionInterface, "backward": BackwardInterface}
    kernel_types = {"reference": AttentionReference, "reference_backward": AttentionBackward}
    signature = Signature((Q, K, V), PARAM_TYPES, (OUT, LSE))
    saves_outputs = True  # out and lse: a backward kernel starts from them, not a second forward

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if k.shape[2] == 0:
            return no_keys(q, v.shape[-1], q.shape[:-1])
        call = self.call_for(q, k, v)
        out_shape = (*q.shape[:-1], v.shape[-1])
        args = q.contiguous(), k.contiguous(), v.contiguous()
        return call_kernel(self, "attention", call, out_shape, *args)

    def lane_for(self, call: BoundCall) -> Callable[..., tuple[Tensor, Tensor]] | None:
        """The kernel that served this layout, for its later calls: a model's layers call with
        one layout after another (each decode step's, a prefill batch's)."""
        q, k, v = call.tensors
        kernel = None if k.shape[2] == 0 else self._hits.get(("attention", self.call_for(q, k, v)))
        if kernel is None:
            return None

        def lane(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
            return kernel(q.contiguous(), k.contiguous(), v.contiguous())

        return lane

    def reference_forward(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        scale = self.scale_for(q.shape[-1])
        return attend(q, k, v, scale=scale, causal=self.causal, window=self.window)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        yield sample_case({}, (2, 4, 16, 32), (2, 4, 16, 32), (2, 4, 16, 32))
        shapes = (1, 8, 24, 64), (1, 2, 40, 64), (1, 2, 40, 64)
        yield sample_case({"causal": True}, *shapes, note="GQA, q_len < kv_len")
        shapes = (2, 4, 32, 16), (2, 1, 32, 16), (2, 1, 32, 16)
        params = {"causal": True, "scale": 0.2, "window": 8}
        yield sample_case(params, *shapes, note="MQA, sliding window")
        shapes = (4, 8, 1, 64), (4, 2, 100, 64), (4, 2, 100, 64)
        yield sample_case({"causal": True}, *shapes, note="decode")
