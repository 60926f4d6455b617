"""Eager calls under autograd and autocast take the eager route (tileops/eager.py), not the
torch.library operator: the same results and gradients as the operator gives, without its
dispatcher hops (the host cost that made kernelized models slower than eager)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tileops
from tileops.errors import OpInputError
from tileops.op import Op


@pytest.fixture
def no_operator(monkeypatch):
    """Any trip through an op's torch.library operator fails the test."""

    def refuse(op, tensors):
        raise AssertionError(f"{type(op).op_name} went through its operator")

    monkeypatch.setattr(Op, "_through_operator", refuse)


def _inputs(requires_grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(4, 6, 8, dtype=torch.float64, requires_grad=requires_grad)
    w = torch.randn(8, dtype=torch.float64, requires_grad=requires_grad)
    return x, w


@pytest.mark.parametrize("op_name", ["rms_norm", "layer_norm", "softmax"])
def test_eager_autograd_matches_the_operator_route_without_calling_it(op_name, monkeypatch):
    make = {
        "rms_norm": lambda: tileops.RMSNormFwdOp(8),
        "layer_norm": lambda: tileops.LayerNormFwdOp(8),
        "softmax": lambda: tileops.SoftmaxFwdOp(-1),
    }[op_name]
    op = make()
    call = {
        "rms_norm": lambda x, w: op(x, w),
        "layer_norm": lambda x, w: op(x, w, None),
        "softmax": lambda x, w: op(x * w),
    }[op_name]
    x, w = _inputs(True)
    expected = {
        "rms_norm": lambda: op._through_operator((x, w)),
        "layer_norm": lambda: op._through_operator((x, w, None)),
        "softmax": lambda: op._through_operator((x * w,)),
    }[op_name]()
    expected_grads = torch.autograd.grad(expected.square().sum(), (x, w))
    monkeypatch.setattr(Op, "_through_operator", lambda *a: pytest.fail("operator called"))
    y = call(x, w)
    assert type(y.grad_fn).__name__ == "_EagerOpBackward"
    grads = torch.autograd.grad(y.square().sum(), (x, w))
    torch.testing.assert_close(y, expected)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_eager_autograd_gradcheck_through_the_backward_interface(no_operator):
    x, w = _inputs(True)
    assert torch.autograd.gradcheck(lambda x, w: tileops.RMSNormFwdOp(8)(x, w), (x, w))
    assert torch.autograd.gradgradcheck(lambda x, w: tileops.RMSNormFwdOp(8)(x, w), (x, w))


def test_batch_norm_training_writes_its_running_stats_once_and_trains_as_torchs(no_operator):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5, requires_grad=True)
    w, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    ours, theirs = (torch.zeros(3), torch.ones(3)), (torch.zeros(3), torch.ones(3))
    before = ours[0]._version
    y = tileops.BatchNormFwdOp(3)(x, w, b, *ours)
    assert ours[0]._version == before + 1  # what autograd checks saved tensors against
    expected = F.batch_norm(x, *theirs, w, b, training=True)
    torch.testing.assert_close(y, expected)
    for stat, want in zip(ours, theirs, strict=True):
        torch.testing.assert_close(stat, want)
    grads = torch.autograd.grad(y.relu_().sum(), (x, w, b))  # in place on the output
    expected_grads = torch.autograd.grad(expected.relu().sum(), (x, w, b))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_a_running_stat_that_requires_grad_is_refused_with_its_name(no_operator):
    x = torch.randn(4, 3, 5, requires_grad=True)
    stat = torch.zeros(3, requires_grad=True)
    with pytest.raises(OpInputError, match="argument 'running_mean' requires grad"):
        tileops.BatchNormFwdOp(3)(x, None, None, stat, torch.ones(3))


def test_under_autocast_the_op_casts_as_torchs_counterpart_and_restores_autocast(no_operator):
    x = torch.randn(2, 8, 16, requires_grad=True)
    weight = torch.randn(16, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = tileops.GemmOp()(x.reshape(-1, 16), weight)
        expected = x.reshape(-1, 16) @ weight
        assert torch.is_autocast_enabled("cpu")  # restored after the op
    assert y.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(y, expected)
    (grad,) = torch.autograd.grad(y.float().sum(), (weight,))
    assert grad.dtype == torch.float32


def test_autocast_is_restored_when_the_op_raises_after_the_cast(no_operator):
    x = torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(OpInputError, match="weight"):
            tileops.RMSNormFwdOp(8)(x, torch.randn(5))
        assert torch.is_autocast_enabled("cpu")


def test_autocast_of_another_device_type_leaves_the_call_uncast(no_operator):
    x = torch.randn(2, 8, 16)
    weight = torch.randn(16, 16)
    torch.set_autocast_enabled("cuda", True)  # the flag alone: no GPU is needed to set it
    try:
        assert torch._C._is_any_autocast_enabled()
        y = tileops.GemmOp()(x.reshape(-1, 16), weight)
        expected = x.reshape(-1, 16) @ weight  # CPU tensors: torch leaves them alone too
    finally:
        torch.set_autocast_enabled("cuda", False)
    assert y.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(y, expected)


def test_a_tensor_left_over_from_a_torch_func_transform_trains_as_a_plain_one(no_operator):
    """A wrapper a finished `torch.func.grad` left behind (Function.apply unwraps those; the
    eager route calls the C-level apply, and the dispatcher takes them as they are)."""
    leaked = []

    def loss(t):
        leaked.append(t * 1)
        return t.sum()

    torch.func.grad(loss)(torch.randn(3, 8, dtype=torch.float64))
    x, w = leaked[0].requires_grad_(), torch.randn(8, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(tileops.RMSNormFwdOp(8)(x, w).sum(), (w,))
    plain = x.detach().clone().requires_grad_()
    (expected,) = torch.autograd.grad(F.rms_norm(plain, (8,), w).sum(), (w,))
    torch.testing.assert_close(grad, expected)
