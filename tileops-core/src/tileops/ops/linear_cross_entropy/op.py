"""Fused linear + cross-entropy: `F.cross_entropy(hidden @ weight.T + bias, labels)` without
ever holding the (tokens, vocab) logits, and its gradients in the same chunked pass.

Two ops, as attention's forward and backward: `LinearCrossEntropyFwdOp` returns the loss (its
backward interface runs the second op with the incoming gradient); `LinearCrossEntropyGradOp`
returns the loss together with the gradients of hidden, weight and bias for a given gradient
of the loss, which is what a training forward calls once (grad_loss = 1) to keep the gradients
and only scale them in the backward (`tileops.nn.linear_cross_entropy`). See `_math` for the
definition, the mean's divisor and ignored rows.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

import torch

from ...backward import BackwardInterface, RecomputeBackward
from ...callspec import CallSpec
from ...errors import BackendError, OpConfigError, OpInputError
from ...kernel import Build, KernelInterface
from ...op import Op
from ...samples import Case
from ...signature import FLOAT_DTYPES, BoundCall, Input, Output, Signature
from .._common import (
    GradOpBackward,
    ReferenceKernel,
    _as_int,
    _is_real,
    contiguous,
    int_param,
)
from ._math import (
    REDUCTIONS,
    RowStep,
    chunk_rows,
    compute_dtype,
    divisor,
    full_grads,
    full_losses,
    reduce,
    row_scales,
    run_chunks,
    torch_step,
)

Tensor = torch.Tensor
LABEL_DTYPES = (torch.int64, torch.int32)
PARAM_TYPES = {
    "ignore_index": "int",
    "label_smoothing": "float",
    "reduction": "str",
    "chunk_rows": "int?",
}

HIDDEN = Input("hidden", ("tokens", "hidden"))
WEIGHT = Input("weight", ("vocab", "hidden"), dtypes=("hidden",))
LABELS = Input("labels", ("tokens",), dtypes=LABEL_DTYPES, differentiable=False)
BIAS = Input("bias", ("vocab",), dtypes=("hidden",), optional=True)
NORMALIZER = Input(
    "normalizer", (), dtypes=(*FLOAT_DTYPES, *LABEL_DTYPES), optional=True, differentiable=False
)
INPUTS = (HIDDEN, WEIGHT, LABELS, BIAS, NORMALIZER)


def _loss(rows: bool) -> Output:
    shape = ("tokens",) if rows else ()
    return Output("loss", shape=shape, dtype_of="hidden", min_dtype=torch.float32)


def _grad_loss(rows: bool) -> Input:
    return Input("grad_loss", ("tokens",) if rows else ())


GRADS = (
    Output("grad_hidden", like="hidden"),
    Output("grad_weight", like="weight"),
    Output("grad_bias", shape=("vocab",), dtype_of="weight"),
)
FWD_SIGNATURES = {rows: Signature(INPUTS, PARAM_TYPES, (_loss(rows),)) for rows in (True, False)}
GRAD_SIGNATURES = {
    rows: Signature((_grad_loss(rows), *INPUTS), PARAM_TYPES, (_loss(rows), *GRADS))
    for rows in (True, False)
}


class LinearCrossEntropyCall(CallSpec):
    """One call: `vocab` classes over rows of `hidden` features in `dtype`; `chunk` rows of
    logits at a time (from the op's `chunk_rows`, else the memory budget)."""

    vocab: int
    hidden: int
    dtype: torch.dtype
    has_bias: bool
    ignore_index: int
    label_smoothing: float
    reduction: str
    chunk: int


class LinearCrossEntropyInterface(KernelInterface):
    """Interface "linear_cross_entropy": the loss of `hidden @ weight.T + bias` against labels.

    Layout contract: hidden (tokens, hidden) and weight (vocab, hidden) contiguous of the
    call's dtype, labels (tokens,) int64 or int32, bias (vocab,) or None, normalizer a 0-d
    tensor or None (see `_math`). Return the loss in float32 (float64 for float64 calls):
    contiguous (tokens,) for reduction "none", else 0-d. Never hold more than `call.chunk`
    rows of logits.
    """

    call_spec = LinearCrossEntropyCall

    def forward(
        self, hidden: Tensor, weight: Tensor, labels: Tensor, bias: Tensor | None,
        normalizer: Tensor | None,
    ) -> Tensor:  # fmt: skip
        raise NotImplementedError


class LinearCrossEntropyGradInterface(KernelInterface):
    """Interface "linear_cross_entropy_grad": the loss and its gradients at hidden, weight and
    bias, for the gradient `grad_loss` of the loss (0-d, or (tokens,) for "none").

    Layout contract: the inputs of "linear_cross_entropy" after a contiguous grad_loss. Return
    (loss, grad_hidden, grad_weight, grad_bias): the loss as "linear_cross_entropy" returns
    it, the gradients contiguous and shaped and typed like hidden, weight and a (vocab,)
    bias of weight's dtype (zeros without bias).
    """

    call_spec = LinearCrossEntropyCall

    def forward(
        self, grad_loss: Tensor, hidden: Tensor, weight: Tensor, labels: Tensor,
        bias: Tensor | None, normalizer: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
        raise NotImplementedError


class ChunkedLinearCrossEntropy:
    """Mixin of the chunked kernels: a logits block from a matmul, a row step, the gradient
    matmuls (`_math.run_chunks`). Subclasses supply the row step (`make_step`)."""

    build_fields = ("ignore_index", "label_smoothing", "reduction", "chunk")

    @classmethod
    def entry_for(cls, call: LinearCrossEntropyCall) -> tuple[Hashable, Build]:
        identity = tuple(getattr(call, name) for name in cls.build_fields)
        return identity, lambda: cls(*identity)

    def __init__(self, ignore_index: int, label_smoothing: float, reduction: str, chunk: int):
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing
        self.reduction, self.chunk = reduction, chunk
        self.step = self.make_step()

    def make_step(self) -> RowStep:
        return torch_step(self.ignore_index, self.label_smoothing)

    def loss(self, hidden, weight, labels, bias, normalizer) -> Tensor:
        losses, *_ = run_chunks(self.step, hidden, weight, labels, bias, None, self.chunk)
        denominator = None
        if self.reduction == "mean":
            denominator = divisor(labels, self.ignore_index, normalizer, losses.dtype)
        return reduce(losses, self.reduction, denominator)

    def grads(self, grad_loss, hidden, weight, labels, bias, normalizer) -> tuple:
        dtype = compute_dtype(hidden.dtype)
        denominator = divisor(labels, self.ignore_index, normalizer, dtype)
        scales = row_scales(grad_loss, labels, self.ignore_index, self.reduction, denominator)
        losses, gh, gw, gb = run_chunks(self.step, hidden, weight, labels, bias, scales, self.chunk)
        if gb is None:
            gb = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
        return reduce(losses, self.reduction, denominator), gh, gw, gb


class LinearCrossEntropyReference(
    ChunkedLinearCrossEntropy, ReferenceKernel, LinearCrossEntropyInterface
):
    """Chunked in torch: a matmul per chunk, the log-softmax in float32 (float64)."""

    def forward(self, hidden, weight, labels, bias, normalizer) -> Tensor:
        return self.loss(hidden, weight, labels, bias, normalizer)


class LinearCrossEntropyGradReference(
    ChunkedLinearCrossEntropy, ReferenceKernel, LinearCrossEntropyGradInterface
):
    """Chunked in torch: per chunk the logits, their gradient in place, three matmuls."""

    def forward(self, grad_loss, hidden, weight, labels, bias, normalizer) -> tuple:
        return self.grads(grad_loss, hidden, weight, labels, bias, normalizer)


# -- the ops ---------------------------------------------------------------------------------


class _LinearCrossEntropy:
    """Mixin (not an Op) of both ops: params, checks, the call spec, autocast."""

    def __init__(
        self,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
        chunk_rows: int | None = None,
        *,
        target: str | None = None,
    ) -> None:
        op = type(self).__name__
        self.ignore_index = int_param(op, "ignore_index", ignore_index)
        if not (_is_real(label_smoothing) and 0.0 <= label_smoothing <= 1.0):
            raise OpConfigError(
                f"{op}: parameter 'label_smoothing' must be a float in [0, 1], "
                f"got {label_smoothing!r}"
            )
        self.label_smoothing = float(label_smoothing)
        if reduction not in REDUCTIONS:
            raise OpConfigError(
                f"{op}: parameter 'reduction' must be one of 'mean', 'sum', 'none', "
                f"got {reduction!r}"
            )
        self.reduction = reduction
        rows = _as_int(chunk_rows) if chunk_rows is not None else None
        if chunk_rows is not None and (rows is None or rows < 1):
            raise OpConfigError(
                f"{op}: parameter 'chunk_rows' must be an int >= 1 or None (rows of logits "
                f"held at once; None: from the memory budget), got {chunk_rows!r}"
            )
        self.chunk_rows = rows
        self.signature = self.signatures[reduction == "none"]
        self._calls: dict[tuple, LinearCrossEntropyCall] = {}
        super().__init__(target=target)

    def check(self, call: BoundCall) -> None:
        labels, weight = call.tensors[-3], call.tensors[-4]
        op = type(self).__name__
        if weight.shape[0] == 0:
            raise OpInputError(
                f"{op}(): argument 'weight' has shape {list(weight.shape)}: no classes; "
                "expected at least one row (vocab >= 1)"
            )
        # On the host the labels are checked here; on a GPU (no sync) a label out of range
        # gives a NaN loss instead (see _math).
        if labels.device.type == "cpu" and labels.numel():
            counted = labels[labels != self.ignore_index]
            bad = counted[(counted < 0) | (counted >= weight.shape[0])]
            if bad.numel():
                raise OpInputError(
                    f"{op}(): argument 'labels' holds {int(bad[0])}, outside [0, "
                    f"{weight.shape[0]}) (vocab = weight's dim 0) and not ignore_index="
                    f"{self.ignore_index}; expected class indices in range or ignore_index"
                )

    def call_for(self, hidden: Tensor, weight: Tensor, bias: Tensor | None):
        key = (hidden.dtype, hidden.device, weight.shape, bias is not None)
        call = self._calls.get(key)
        if call is None:
            vocab = weight.shape[0]
            chunk = self.chunk_rows or chunk_rows(vocab, hidden.element_size())
            call = self._calls[key] = LinearCrossEntropyCall(
                device=hidden.device, vocab=vocab, hidden=weight.shape[1], dtype=hidden.dtype,
                has_bias=bias is not None, ignore_index=self.ignore_index,
                label_smoothing=self.label_smoothing, reduction=self.reduction, chunk=chunk,
            )  # fmt: skip
        return call

    def autocast_dtype(self, device_type: str, tensors: tuple) -> torch.dtype | None:
        """As autocast runs `F.linear` (the matmuls) in its lower dtype; the loss is computed
        in float32 whatever the inputs."""
        return torch.get_autocast_dtype(device_type)


class LinearCrossEntropyGradOp(_LinearCrossEntropy, Op):
    """(loss, grad_hidden, grad_weight, grad_bias) of `LinearCrossEntropyFwdOp`'s loss for the
    loss's gradient `grad_loss`: what its backward calls, and what a training forward calls
    once with grad_loss = 1 (the gradients then only need scaling)."""

    namespace = "tileops"
    interfaces = {
        "linear_cross_entropy_grad": LinearCrossEntropyGradInterface,
        "backward": BackwardInterface,
    }
    kernel_types = {
        "reference": LinearCrossEntropyGradReference,
        "reference_backward": RecomputeBackward,
    }
    signatures = GRAD_SIGNATURES
    signature = GRAD_SIGNATURES[True]

    def forward(self, grad_loss, hidden, weight, labels, bias, normalizer) -> tuple:
        call = self.call_for(hidden, weight, bias)
        args = [contiguous(t) for t in (grad_loss, hidden, weight, labels, bias)]
        grads = self.kernel_for("linear_cross_entropy_grad", call)(*args, normalizer)
        _check_grads(self, call, grads, labels, hidden, weight)
        return tuple(grads)

    def reference_forward(self, grad_loss, hidden, weight, labels, bias, normalizer) -> tuple:
        return full_grads(
            grad_loss, hidden, weight, labels, bias, normalizer, self.ignore_index,
            self.label_smoothing, self.reduction,
        )  # fmt: skip

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        hidden, weight, labels, bias = _sample_inputs()
        yield Case({"reduction": "mean"}, (torch.ones(()), hidden, weight, labels, bias, None))
        grad = torch.linspace(0.5, 1.5, labels.shape[0])
        yield Case({"reduction": "none"}, (grad, hidden, weight, labels, None, None), "no bias")


class LinearCrossEntropyBackward(GradOpBackward):
    """`LinearCrossEntropyFwdOp`'s backward: the gradients from `LinearCrossEntropyGradOp`."""

    grad_op = LinearCrossEntropyGradOp

    def forward(self, grads: tuple, inputs: tuple) -> tuple:
        _, grad_hidden, grad_weight, grad_bias = self.run_grad_op((grads[0], *inputs))
        return self.wanted((grad_hidden, grad_weight, None, grad_bias, None))


class LinearCrossEntropyFwdOp(_LinearCrossEntropy, Op):
    """`F.cross_entropy(F.linear(hidden, weight, bias).float(), labels, ignore_index=...,
    label_smoothing=..., reduction=...)` on (tokens, hidden) rows, chunked: never the full
    logits. "mean" divides by `normalizer` when given, else by the counted rows (at least 1:
    every row ignored gives 0). The loss is float32 (float64 for float64 inputs)."""

    namespace = "tileops"
    interfaces = {
        "linear_cross_entropy": LinearCrossEntropyInterface,
        "backward": BackwardInterface,
    }
    kernel_types = {
        "reference": LinearCrossEntropyReference,
        "reference_backward": LinearCrossEntropyBackward,
    }
    signatures = FWD_SIGNATURES
    signature = FWD_SIGNATURES[True]

    def forward(self, hidden, weight, labels, bias, normalizer) -> Tensor:
        call = self.call_for(hidden, weight, bias)
        shape = labels.shape if self.reduction == "none" else torch.Size()
        args = [contiguous(t) for t in (hidden, weight, labels, bias)]
        dtype = compute_dtype(hidden.dtype)
        return self.call_kernel("linear_cross_entropy", call, shape, dtype, *args, normalizer)

    def reference_forward(self, hidden, weight, labels, bias, normalizer) -> Tensor:
        losses = full_losses(hidden, weight, labels, bias, self.ignore_index, self.label_smoothing)
        denominator = divisor(labels, self.ignore_index, normalizer, losses.dtype)
        return reduce(losses, self.reduction, denominator)

    @classmethod
    def sample_cases(cls) -> Iterable[Case]:
        hidden, weight, labels, bias = _sample_inputs()
        yield Case({}, (hidden, weight, labels, bias, None))
        params = {"reduction": "sum", "label_smoothing": 0.1, "chunk_rows": 4}
        yield Case(params, (hidden, weight, labels, None, None), "smoothing, several chunks")


def _sample_inputs() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(12, 16, generator=generator)
    weight = torch.randn(40, 16, generator=generator) / 4
    labels = torch.randint(0, 40, (12,), generator=generator)
    labels[3] = -100
    return hidden, weight, labels, torch.randn(40, generator=generator)


def _check_grads(op: Op, call, grads: Any, labels, hidden, weight) -> None:
    loss_shape = labels.shape if call.reduction == "none" else torch.Size()
    loss_dtype = compute_dtype(hidden.dtype)
    expected = (
        (loss_shape, loss_dtype),
        (hidden.shape, hidden.dtype),
        (weight.shape, weight.dtype),
        (weight.shape[:1], weight.dtype),
    )
    if isinstance(grads, (tuple, list)) and len(grads) == 4:
        if all(
            isinstance(g, Tensor) and g.shape == s and g.dtype == d and g.is_contiguous()
            and g.device == hidden.device
            for g, (s, d) in zip(grads, expected, strict=True)
        ):  # fmt: skip
            return
    shown = [
        f"{str(g.dtype).removeprefix('torch.')}{list(g.shape)}" if isinstance(g, Tensor) else g
        for g in (grads if isinstance(grads, (tuple, list)) else [grads])
    ]
    raise BackendError(
        f"Output of {op._table.serving('linear_cross_entropy_grad', call)} is wrong: it "
        f"returned {shown}; the interface's layout contract expects a contiguous loss and "
        "gradients shaped and typed like hidden, weight and (vocab,) of weight's dtype."
    )
