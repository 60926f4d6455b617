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
    "gemm_nt_bias": (GemmOp(trans_b=True), F.linear, [(64, 512), (64, 512), (64,)]),
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


# Inputs where a 16-bit computation shows: statistics of rows far from zero cancel, and
# squares and products of values near the float16 maximum overflow 16 bits.
HOSTILE = {
    "offset": lambda x: x * 4 + 1e4,
    "constant_near_max": lambda x: torch.full_like(x, 6e4),
    "near_max": lambda x: 65504 - 32 * x.abs().round(),
}


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("dtype", HALF, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", CASES)
def test_16_bit_inputs_far_from_zero_compute_in_float32_and_round_once(name, dtype, kind):
    op, fn, _ = CASES[name]
    x, *rest = _inputs(name, dtype)
    x = HOSTILE[kind](x.float()).to(dtype)
    if name == "gemm":
        rest = [b / 64 for b in rest]  # products that fit float16, summed over 512 terms
    out = op(x, *rest, *_extra(name, dtype))
    expected = fn(*[t.float() for t in (x, *rest)]).to(dtype)
    assert out.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out.float(), expected.float(), rtol=eps, atol=1e-6)


def test_a_constant_float16_row_normalizes_to_zero():
    x = torch.full((1, 8), 60000.0, dtype=torch.float16)
    assert torch.equal(LayerNormFwdOp(8)(x), torch.zeros(1, 8, dtype=torch.float16))


@pytest.mark.parametrize("dtype", HALF, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("offset", [1e4, 6e4])
def test_16_bit_inference_near_the_running_mean_computes_in_float32(dtype, offset):
    x = (randn(16, C, 49) * 4 + offset).to(dtype)
    mean = x.float().mean((0, 2)).to(dtype)  # x - mean cancels: 16-bit arithmetic shows
    var, w, b = (randn(C, seed=k, dtype=dtype).abs() + 0.5 for k in (1, 2, 3))
    out = BatchNormFwdOp(C, training=False)(x, w, b, mean, var)
    floats = [t.float() for t in (mean, var, w, b)]
    expected = F.batch_norm(x.float(), *floats, training=False).to(dtype)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out.float(), expected.float(), rtol=eps, atol=1e-6)


def _float32_params(name: str) -> list[torch.Tensor]:
    if name.startswith("batch_norm"):
        return [randn(C, seed=1), randn(C, seed=2), torch.zeros(C), torch.ones(C)]
    return [randn(512, seed=k) for k in range(1, 3 if name == "layer_norm" else 2)]


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("dtype", HALF, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "batch_norm_train", "batch_norm_infer"])
def test_mixed_precision_far_from_zero_computes_in_float32_and_rounds_once(name, dtype, kind):
    """16-bit x beside float32 params (as under autocast): torch's mixed path must not leak."""
    op, _, shapes = CASES[name]
    x = HOSTILE[kind](randn(*shapes[0]) * 3 + 1).to(dtype)
    params = _float32_params(name)
    expected = _float32_params(name)
    if name.startswith("batch_norm"):
        w, b, mean, var = expected
        want = F.batch_norm(x.float(), mean, var, w, b, name.endswith("train"), 0.1, 1e-5)
    else:
        want = CASES[name][1](x.float(), *expected)
    out = op(x, *params)
    assert out.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(out.float(), want.to(dtype).float(), rtol=eps, atol=1e-6)
    if name == "batch_norm_train":  # float32 running stats blended in place, as torch does
        torch.testing.assert_close(params[2:], expected[2:], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", HALF, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", CASES)
def test_the_torch_definition_computes_as_the_op_promises(name, dtype):
    """`reference_forward` (what gradients differentiate) is the float32 math rounded once too."""
    op, _, _ = CASES[name]
    x, *rest = _inputs(name, dtype)
    x = HOSTILE["offset"](x.float()).to(dtype)
    if name == "gemm":
        rest = [b / 64 for b in rest]
    out = op(x, *rest, *_extra(name, dtype))
    definition = op.reference_forward(x, *rest, *_extra(name, dtype))
    assert definition.dtype == dtype
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(definition.float(), out.float(), rtol=eps, atol=1e-6)
