"""The reference kernels' numerics contract: 16-bit inputs compute in float32 and round once.

The kernels call torch's functions on 16-bit tensors where torch's CPU kernels compute in
float32; these tests hold them to the float32 computation on upcast inputs, rounded once, so
a torch release that changes that (or a kernel that does its arithmetic in 16 bits) fails here.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from op_helpers import randn

from tileops import BatchNormFwdOp, GemmOp, LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp

HALF = [torch.float16, torch.bfloat16]
C = 64


def _layer_norm(*t):
    return F.layer_norm(t[0], (512,), *t[1:], eps=1e-5)


def _rms_norm(*t):
    return F.rms_norm(t[0], (512,), *t[1:], eps=1e-5)


def _batch_norm(training: bool):
    stats = torch.zeros(C), torch.ones(C)
    return lambda *t: F.batch_norm(t[0], *stats, *t[1:], training=training, eps=1e-5)


# name: (op, torch function, input shapes)
CASES = {
    "layer_norm": (LayerNormFwdOp(512), _layer_norm, [(64, 512), (512,), (512,)]),
    "rms_norm": (RMSNormFwdOp(512, 1e-5), _rms_norm, [(64, 512), (512,)]),
    "softmax": (SoftmaxFwdOp(), lambda x: torch.softmax(x, -1), [(64, 512)]),
    "batch_norm_train": (BatchNormFwdOp(C), _batch_norm(True), [(16, C, 49)]),
    "batch_norm_train_affine": (BatchNormFwdOp(C), _batch_norm(True), [(16, C, 49), (C,), (C,)]),
    "batch_norm_infer": (
        BatchNormFwdOp(C, training=False),
        _batch_norm(False),
        [(16, C, 49), (C,), (C,)],
    ),
    "gemm": (GemmOp(), torch.mm, [(64, 512), (512, 64)]),
}


def _inputs(name: str, dtype: torch.dtype) -> list[torch.Tensor]:
    return [randn(*s, dtype=dtype, seed=k) * 3 + 1 for k, s in enumerate(CASES[name][2])]


def _extra(name: str, dtype: torch.dtype) -> list[torch.Tensor | None]:
    """BatchNorm's absent affine params and its running stats, as the op takes them."""
    if not name.startswith("batch_norm"):
        return []
    affine = [] if name.endswith(("affine", "infer")) else [None, None]
    return [*affine, torch.zeros(C, dtype=dtype), torch.ones(C, dtype=dtype)]


@pytest.mark.parametrize("dtype", HALF, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", CASES)
def test_16_bit_inputs_compute_in_float32_and_round_once(name, dtype):
    op, fn, _ = CASES[name]
    inputs = _inputs(name, dtype)
    out = op(*inputs, *_extra(name, dtype))
    expected = fn(*[t.float() for t in inputs]).to(dtype)
    assert out.dtype == dtype
    # An ulp at most: float32 sums in another order may round the other way; a computation
    # that rounds to 16 bits on the way (blocked sums, a 16-bit exp) is several ulps off.
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out.float(), expected.float(), rtol=eps, atol=1e-6)


@pytest.mark.parametrize("dtype", HALF, ids=["float16", "bfloat16"])
def test_16_bit_running_stats_are_blended_in_float32(dtype):
    x = randn(16, C, 49, dtype=dtype) * 3 + 1
    mean, var = torch.zeros(C, dtype=dtype), torch.ones(C, dtype=dtype)
    BatchNormFwdOp(C, momentum=0.3)(x, None, None, mean, var)
    expected = torch.zeros(C), torch.ones(C)
    F.batch_norm(x.float(), *expected, training=True, momentum=0.3)
    for got, want in zip((mean, var), expected, strict=True):
        assert got.dtype == dtype
        torch.testing.assert_close(got, want.to(dtype), rtol=0, atol=0)
