"""Triton's fused linear + cross-entropy kernels: the chunked driver of tileops-core (a
cuBLAS/torch matmul per chunk of rows, then the gradient matmuls) with the row step in one
Triton program that writes the losses and overwrites the logits block with its gradient.

They serve float16, bfloat16 and float32 calls on every CUDA arch Triton runs on (CPU too,
under the interpreter), over the torch reference kernels, whose row step holds a float32 copy
of the block and runs several kernels.
"""

from __future__ import annotations

import torch

from tileops import CallSpec, Kernel
from tileops.ops import (
    ChunkedLinearCrossEntropy,
    LinearCrossEntropyGradInterface,
    LinearCrossEntropyInterface,
)

from ..declare import DEVICES, dtype_refusal
from ..launching import launch

LINEAR_CE_KEY = "triton"
MAX_BLOCK = 8192
"""Columns a program reads at a time (32 warps, 8 values per lane)."""


def triton_step(ignore_index: int, smoothing: float, block: int | None = None):
    """The row step (`_math.RowStep`) as one launch of `programs.ce_rows` per block."""

    def step(logits, labels, scales, losses) -> None:
        from . import programs

        rows, vocab = logits.shape
        if rows == 0:
            return
        width = block or min(triton_next_power_of_2(vocab), MAX_BLOCK)
        launch(programs.ce_rows, (rows,),
            logits, logits.stride(0), labels, losses if scales is None else scales, losses,
            vocab, ignore_index, smoothing, smoothing / vocab,
            WRITE_GRAD=scales is not None, SMOOTH=smoothing > 0, BLOCK=width,
            num_warps=max(1, min(32, width // 256)),
        )  # fmt: skip

    return step


def triton_next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def own_path_builder(op_cls: type):
    """A target builder running the op's own path (these kernels) for a call settled on the
    triton target, so its detector's claim on every op is served without the full logits."""

    def build(*specs: object, **params: object):
        op = op_cls(**params)

        def run(*inputs: torch.Tensor | None, **outputs: torch.Tensor) -> object:
            result = op.forward(*inputs)
            return tuple(result) if isinstance(result, (tuple, list)) else result

        return run

    return build


class TritonChunked(ChunkedLinearCrossEntropy, Kernel):
    """What both kernels declare: Triton's devices and dtypes, over the torch reference."""

    devices = DEVICES
    supported_archs = None
    preferred_over = frozenset({"reference"})

    @classmethod
    def refusal(cls, call: CallSpec) -> str | None:
        return dtype_refusal(call.dtype)

    def make_step(self):
        return triton_step(self.ignore_index, self.label_smoothing)


class TritonLinearCrossEntropy(TritonChunked, LinearCrossEntropyInterface):
    """The loss, chunk by chunk: no gradient pass."""

    def forward(self, hidden, weight, labels, bias, normalizer) -> torch.Tensor:
        return self.loss(hidden, weight, labels, bias, normalizer)


class TritonLinearCrossEntropyGrad(TritonChunked, LinearCrossEntropyGradInterface):
    """The loss and the gradients of hidden, weight and bias in one chunked pass."""

    def forward(self, grad_loss, hidden, weight, labels, bias, normalizer) -> tuple:
        return self.grads(grad_loss, hidden, weight, labels, bias, normalizer)
