"""Fused linear + cross-entropy for training: `linear_cross_entropy` and its module
`LinearCrossEntropyLoss`, the loss of `F.cross_entropy(F.linear(input, weight, bias), target)`
without the (tokens, vocab) logits.

For "mean" and "sum" under autograd, the forward runs `LinearCrossEntropyGradOp` once with a
gradient of 1 and keeps the gradients of input, weight and bias, which the backward only
scales by the incoming gradient (in place, not at all for a gradient of 1: a second backward
through the same graph raises).
For "none", or without autograd, it runs `LinearCrossEntropyFwdOp`, whose backward re-runs the
chunks weighted by the incoming per-row gradients. Either way no more than one chunk of logits
exists at a time, and nothing branches on the data, so a compiled graph holds for batches with
every row ignored (their loss is 0).

Under torch.compile, unless `chunk_rows` is given, the loss is traced from the full logits
through `F.cross_entropy`: Inductor fuses it into fewer passes than the chunks, which
accumulate the weight's gradient once per chunk; that measured faster, at the
logits' memory (benchmarks/results/linear_ce: compile 19.5 ms and 1.99 GiB, the chunks 24.5 ms
and 1.25 GiB, 4096 tokens of a 128K vocabulary on the H200). Pass `chunk_rows` to keep the
chunks' memory under compile too.

`normalizer` divides the "mean" instead of the number of counted rows: pass the number of
counted labels of the whole accumulated batch (transformers' `num_items_in_batch`) and the
micro-batch losses add up to the big batch's mean.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import library
from ..errors import OpInputError
from ..ops import LinearCrossEntropyFwdOp, LinearCrossEntropyGradOp
from ..ops.linear_cross_entropy._math import compute_dtype, divisor, reduce
from ._ops import op_for

Tensor = torch.Tensor
NAME = "tileops.nn.linear_cross_entropy"


def linear_cross_entropy(
    input: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None = None,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    normalizer: Tensor | float | None = None,
    chunk_rows: int | None = None,
) -> Tensor:
    """`F.cross_entropy(F.linear(input, weight, bias).float(), target, ...)`: input (..., H),
    target (...) of class indices, the loss in float32 (float64 for float64 inputs); "none"
    returns target's shape. Under autocast the matmuls run in autocast's dtype, as F.linear."""
    config = (ignore_index, label_smoothing, reduction, chunk_rows)
    _check_shapes(input, weight, target)
    if not torch.compiler.is_compiling():  # the op's own checks of the params, built once
        try:
            op_for(LinearCrossEntropyFwdOp, input.device, *config)
        except TypeError:  # an unhashable param: the op's constructor says what it expected
            LinearCrossEntropyFwdOp(*config)
    hidden, labels = input.reshape(-1, input.shape[-1]), target.reshape(-1)
    scale = _normalizer(normalizer, input.device)
    device = input.device.type
    if torch.is_autocast_enabled(device) and input.is_floating_point():
        low = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(low), weight.to(low)
        bias = None if bias is None else bias.to(low)
    with (
        torch.autocast(device, enabled=False)
        if torch.is_autocast_enabled(device)
        else contextlib.nullcontext()
    ):
        tensors = (hidden, weight, labels, bias, scale)
        grads = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (hidden, weight, bias)
        )
        if chunk_rows is None and torch.compiler.is_compiling() and not library.exporting():
            loss = _full_loss(tensors, ignore_index, label_smoothing, reduction)
        elif grads and reduction != "none":
            return _StoredGradients.apply(config, *tensors)
        else:
            loss = op_for(LinearCrossEntropyFwdOp, input.device, *config)(*tensors)
    return loss.view(target.shape) if reduction == "none" else loss


def _full_loss(tensors: tuple, ignore_index: int, smoothing: float, reduction: str) -> Tensor:
    """The loss from the full logits through `F.cross_entropy`, whose decomposition Inductor
    fuses best (what torch.compile traces where no `chunk_rows` was asked for: see the module's
    docstring). As the op: a label out of range gives NaN (never an index out of bounds; its
    row's gradient is 0), and a "mean" with every row ignored gives 0."""
    hidden, weight, labels, bias, normalizer = tensors
    logits = F.linear(hidden, weight, bias).to(compute_dtype(hidden.dtype))
    counted = labels != ignore_index
    valid = (labels >= 0) & (labels < logits.shape[1])
    safe = torch.where(valid, labels, ignore_index)
    losses = F.cross_entropy(
        logits, safe, ignore_index=ignore_index, reduction="none", label_smoothing=smoothing
    )
    nan = torch.full((), float("nan"), dtype=losses.dtype, device=losses.device)
    losses = torch.where(counted & ~valid, nan, losses)
    return reduce(losses, reduction, divisor(labels, ignore_index, normalizer, losses.dtype))


class LinearCrossEntropyLoss(nn.Module):
    """`linear_cross_entropy` as a module (the arguments of `nn.CrossEntropyLoss` that apply,
    and `chunk_rows`): `loss(input, weight, target, bias=None, normalizer=None)`."""

    def __init__(
        self,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        chunk_rows: int | None = None,
    ) -> None:
        super().__init__()
        LinearCrossEntropyFwdOp(ignore_index, label_smoothing, reduction, chunk_rows)  # checks
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing, self.chunk_rows = label_smoothing, chunk_rows

    def forward(
        self,
        input: Tensor,
        weight: Tensor,
        target: Tensor,
        bias: Tensor | None = None,
        normalizer: Tensor | float | None = None,
    ) -> Tensor:
        return linear_cross_entropy(
            input, weight, target, bias, ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing, reduction=self.reduction,
            normalizer=normalizer, chunk_rows=self.chunk_rows,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
            f"label_smoothing={self.label_smoothing}, chunk_rows={self.chunk_rows}"
        )


class _StoredGradients(torch.autograd.Function):
    """The loss, with its gradients computed in the forward and scaled in the backward."""

    @staticmethod
    def forward(ctx: Any, config: tuple, hidden, weight, labels, bias, normalizer) -> Tensor:
        one = torch.ones((), dtype=compute_dtype(hidden.dtype), device=hidden.device)
        op = op_for(LinearCrossEntropyGradOp, hidden.device, *config)
        loss, grad_hidden, grad_weight, grad_bias = op(
            one, hidden, weight, labels, bias, normalizer
        )
        ctx.save_for_backward(grad_hidden, grad_weight, None if bias is None else grad_bias)
        ctx.spent = False
        return loss

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        compiling = torch.compiler.is_compiling()
        if not compiling:
            if ctx.spent:
                raise RuntimeError(
                    f"{NAME}: backward through this loss ran twice (retain_graph=True); its "
                    "gradients were computed in the forward and scaled in place by the first "
                    "backward. Compute the loss again for a second backward"
                )
            ctx.spent = True
        saved = ctx.saved_tensors
        if compiling:  # traced: the compiler plans the buffers
            scaled = [None if g is None else g * grad for g in saved]
        elif _is_one(grad):
            scaled = list(saved)
        else:
            scaled = [None if g is None else g.mul_(grad) for g in saved]
        grad_hidden, grad_weight, grad_bias = scaled
        needs = ctx.needs_input_grad
        return (
            None,
            grad_hidden if needs[1] else None,
            grad_weight if needs[2] else None,
            None,
            grad_bias if needs[4] else None,
            None,
        )


def _is_one(grad: Tensor) -> bool:
    """Whether the incoming gradient is 1, as `loss.backward()` gives: the kept gradients are
    then the answer, and the pass over the weight's (vocab x hidden) gradient is spared for one
    host sync (at the backward's start, where the host waits for the forward anyway). Never
    under CUDA graph capture, which cannot sync, nor for a gradient that is differentiated
    itself (create_graph)."""
    if grad.requires_grad or (grad.is_cuda and torch.cuda.is_current_stream_capturing()):
        return False
    return bool(grad == 1)


def _check_shapes(input: Tensor, weight: Tensor, target: Tensor) -> None:
    for name, t in (("input", input), ("weight", weight), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise OpInputError(
                f"{NAME}(): argument {name!r} must be a torch.Tensor, got {type(t).__name__}"
            )
    if input.dim() < 1 or target.shape != input.shape[:-1]:
        raise OpInputError(
            f"{NAME}(): argument 'target' has shape {list(target.shape)}, expected "
            f"{list(input.shape[:-1])} (input's shape {list(input.shape)} without its last dim)"
        )


def _normalizer(value: Tensor | float | None, device: torch.device) -> Tensor | None:
    """The mean's divisor as a 0-d float64 tensor (autocast never casts float64), or None."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise OpInputError(
                f"{NAME}(): argument 'normalizer' must hold one number (the mean's divisor), "
                f"got a tensor of shape {list(value.shape)}"
            )
        return value.reshape(()).to(device=device, dtype=torch.float64)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OpInputError(
            f"{NAME}(): argument 'normalizer' must be a number, a one-element tensor or None, "
            f"got {type(value).__name__}"
        )
    return torch.tensor(float(value), dtype=torch.float64, device=device)
