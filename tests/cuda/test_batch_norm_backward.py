"""BatchNorm's backward on the GPU (`aten_bn_backward`): which calls it serves (simulated, no
GPU needed), and its gradients against float64 torch on a real GPU, NCHW and channels_last, in
training and inference, mixed precision included; and that it runs no second forward."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import tileops
from tileops.backward import BackwardCall
from tileops.ops import BatchNormFwdOp
from tileops.testing import simulate_device
from tileops_cuda.batch_norm.backward import BatchNormBackwardNative

KEY = "aten_bn_backward"


def _backward_call(dtype: torch.dtype, training: bool = True) -> BackwardCall:
    op = BatchNormFwdOp(8, training=training)
    return BackwardCall(
        device=torch.device("cuda:0"),
        op=type(op).op_name,
        params=tuple(op.params().items()),
        dtypes=(dtype, torch.float32, torch.float32, torch.float32, torch.float32),
        needs=(True, True, True, False, False),
    )


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_native_backward_serves_16_and_32_bit_calls(dtype, training):
    with simulate_device("cuda:0", arch=90, sm_count=132):
        key = BatchNormFwdOp(8, training=training).key_for(
            "backward", _backward_call(dtype, training)
        )
    assert key == KEY


def test_float64_goes_to_the_recompute_reference_with_the_reason():
    assert "would lose float64 precision" in BatchNormBackwardNative.refusal(
        _backward_call(torch.float64)
    )
    with simulate_device("cuda:0", arch=90, sm_count=132):
        key = BatchNormFwdOp(8).key_for("backward", _backward_call(torch.float64))
    assert key == "reference_backward"


def test_double_backward_goes_to_the_recompute_reference():
    call = dataclasses.replace(_backward_call(torch.float32), create_graph=True)
    assert "differentiable" in BatchNormBackwardNative.refusal(call)


gpu = pytest.mark.gpu  # skipped without CUDA (tests/conftest.py)
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
SHAPES = [(32, 64, 56, 56), (256, 2048, 7, 7), (8, 16), (4, 3, 5, 7), (2, 4, 3, 3, 3)]


def _grads(x, params, stats, training, dtype, channels_last, dy):
    """Gradients of the op's output (or F.batch_norm's, in float64) against `dy`."""
    x = x.detach().clone()
    if channels_last and x.dim() in (4, 5):
        x = x.contiguous(
            memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        )
    x = x.to(dtype).requires_grad_()
    leaves = [None if p is None else p.detach().clone().requires_grad_() for p in params]
    mean, var = (None, None) if stats is None else (s.clone() for s in stats)
    if dtype is torch.float64:
        y = F.batch_norm(x, mean, var, *leaves, training, 0.1, 1e-5)
    else:
        y = BatchNormFwdOp(x.shape[1], training=training)(x, *leaves, mean, var)
    y.backward(dy.to(y.dtype))
    return [x.grad, *(None if p is None else p.grad for p in leaves)], y


@gpu
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_native_backward_matches_float64(shape, dtype, affine, training, channels_last):
    torch.manual_seed(0)
    c = shape[1]
    x = torch.randn(shape, device="cuda", dtype=torch.float64) * 2 + 0.5
    pdtype = torch.float32  # mixed precision beside 16-bit x, as under autocast
    weight = (
        torch.rand(c, device="cuda", dtype=torch.float64) + 0.5
        if affine in ("both", "weight")
        else None
    )
    bias = (
        torch.randn(c, device="cuda", dtype=torch.float64) if affine in ("both", "bias") else None
    )
    stats = (
        torch.randn(c, device="cuda", dtype=torch.float64),
        torch.rand(c, device="cuda", dtype=torch.float64) + 0.5,
    )
    mine_params = [None if p is None else p.to(pdtype) for p in (weight, bias)]
    mine_stats = tuple(s.to(pdtype) for s in stats)
    dy = torch.randn(shape, device="cuda").to(dtype).double()  # exact in both
    with tileops.record() as record:
        got, y = _grads(x, mine_params, mine_stats, training, dtype, channels_last, dy)
    # float64 on the CPU: torch's CUDA batch norm fails a bias without a weight in backward
    cpu = [None if t is None else t.cpu() for t in (x, weight, bias, *stats, dy)]
    want, _ = _grads(cpu[0], cpu[1:3], tuple(cpu[3:5]), training, torch.float64, False, cpu[5])
    assert any(served.key == KEY for served in record.counts), record.counts
    for name, g, w in zip(("x", "weight", "bias"), got, want, strict=True):
        assert (g is None) == (w is None), name
        if g is not None:
            err = (g.double().cpu() - w).norm() / w.norm().clamp_min(1e-12)
            assert err < TOLERANCE[dtype], f"{name}: relative error {err:.2e}"
    if channels_last and x.dim() == 4:
        assert got[0].is_contiguous(memory_format=torch.channels_last)


def test_gradients_the_mask_left_out_are_dropped(monkeypatch):
    """On the GPU the native kernel may return a bias gradient its mask did not ask for (2-d
    x): only the asked-for gradients go back to autograd, which refuses one for an absent
    input."""
    native = torch.ops.aten.native_batch_norm_backward

    def eager(dy, x, weight, *rest):
        dx, dweight, _ = native(dy, x, weight, *rest[:-1], [True, True, True])
        return dx, dweight, dy.sum(0)

    monkeypatch.setattr(torch.ops.aten, "native_batch_norm_backward", eager)
    kernel = BatchNormBackwardNative(False, 1e-5, (True, True, False, False, False))
    x, dy = torch.randn(8, 16), torch.randn(8, 16)
    stats = torch.zeros(16), torch.ones(16)
    grads = kernel.forward((dy,), (x, torch.ones(16), None, *stats))
    assert grads[0] is not None and grads[1] is not None and grads[2:] == (None, None, None)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_the_native_backward_reads_the_stats_the_forward_kept(channels_last):
    """On the CPU too: with the forward's (mean, invstd) as state, no statistics pass runs
    (torch.batch_norm_stats has no CPU kernel) and the gradients are F.batch_norm's."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5, 5) * 2 + 0.5
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b, dy = torch.rand(6) + 0.5, torch.randn(6), torch.randn(4, 6, 5, 5)
    var, mean = torch.var_mean(x, (0, 2, 3), correction=0)
    kernel = BatchNormBackwardNative(True, 1e-5, (True, True, True, False, False))
    got = kernel.forward((dy,), (x, w, b, None, None), state=(mean, torch.rsqrt(var + 1e-5)))
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    y = F.batch_norm(leaves[0], None, None, leaves[1], leaves[2], True, 0.1, 1e-5)
    want = torch.autograd.grad(y, leaves, dy)
    for g, expected in zip(got[:3], want, strict=True):
        torch.testing.assert_close(g, expected, rtol=1e-4, atol=1e-4)
    assert got[3:] == (None, None)


@gpu
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("shape", [(32, 64, 56, 56), (128, 512, 7, 7), (8, 16)], ids=str)
def test_training_under_autocast_keeps_the_batch_stats_for_the_backward(
    shape, channels_last, monkeypatch
):
    """ResNet's case (bfloat16 x, float32 params): whichever kernel ran the forward (TileLang,
    or ATen's through the cuDNN key), the backward never passes over x for the statistics."""
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda").to(torch.bfloat16)
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    c = shape[1]
    w, b = (torch.rand(c, device="cuda") + 0.5).requires_grad_(), torch.zeros(c, device="cuda")
    stats = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    y = BatchNormFwdOp(c)(x, w, b.requires_grad_(), *stats)
    monkeypatch.setattr(torch, "batch_norm_stats", lambda *a: pytest.fail("stats recomputed"))
    dy = torch.randn(shape, device="cuda").to(torch.bfloat16)
    got = torch.autograd.grad(y, (x, w, b), dy)
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    reference = F.batch_norm(leaves[0], None, None, leaves[1], leaves[2], True)
    want = torch.autograd.grad(reference, leaves, dy.double())
    for name, g, expected in zip(("x", "weight", "bias"), got, want, strict=True):
        err = (g.double() - expected).norm() / expected.norm().clamp_min(1e-12)
        assert err < 3e-2, f"{name}: relative error {err:.2e}"
