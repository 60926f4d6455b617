"""Autograd through every op on the CPU: gradients w.r.t. every float input match torch's."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from op_helpers import randn

import tileops
from tileops import (
    BatchNormFwdOp,
    GemmOp,
    LayerNormFwdOp,
    Op,
    OpInputError,
    RMSNormFwdOp,
    SoftmaxFwdOp,
)

C = 3


def _stats(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return randn(C, dtype=dtype, seed=7), randn(C, dtype=dtype, seed=8).abs() + 0.5


def _batch_norm(training: bool) -> Callable[[torch.dtype], tuple]:
    """BatchNorm with running stats: each side gets its own copy (training updates them)."""

    def make(dtype: torch.dtype) -> tuple:
        x = randn(4, C, 5, dtype=dtype)
        w, b = randn(C, dtype=dtype, seed=1), randn(C, dtype=dtype, seed=2)
        op, (mean, var) = BatchNormFwdOp(C, training=training), _stats(dtype)

        def theirs(x, w, b):
            return F.batch_norm(x, *_stats(dtype), w, b, training, 0.1, 1e-5)

        return lambda x, w, b: op(x, w, b, mean, var), theirs, (x, w, b)

    return make


def _norm(op_cls: type[Op], fn: Callable, affine: int) -> Callable[[torch.dtype], tuple]:
    def make(dtype: torch.dtype) -> tuple:
        op = op_cls((3, 4), 1e-5)
        params = [randn(3, 4, dtype=dtype, seed=1 + k) for k in range(affine)]
        x = randn(2, 5, 3, 4, dtype=dtype)
        return op, lambda *t: fn(t[0], (3, 4), *t[1:], eps=1e-5), (x, *params)

    return make


def _softmax(dtype: torch.dtype) -> tuple:
    return SoftmaxFwdOp(1), lambda x: torch.softmax(x, 1), (randn(3, 4, 5, dtype=dtype),)


def _gemm(dtype: torch.dtype) -> tuple:
    a, b = randn(3, 4, dtype=dtype), randn(4, 5, dtype=dtype, seed=1)
    return GemmOp(), lambda a, b: a @ b, (a, b.t().contiguous().t())  # b column-major


def _linear(dtype: torch.dtype) -> tuple:
    """The NT layout with a bias: F.linear's gradients for x, the weight and the bias."""
    x, weight = randn(3, 4, dtype=dtype), randn(5, 4, dtype=dtype, seed=1)
    return GemmOp(trans_b=True), F.linear, (x, weight, randn(5, dtype=dtype, seed=2))


def _gemm_tn(dtype: torch.dtype) -> tuple:
    a, b = randn(4, 3, dtype=dtype), randn(4, 5, dtype=dtype, seed=1)
    return GemmOp(trans_a=True), lambda a, b: a.T @ b, (a, b)


CASES = {
    "layer_norm": _norm(LayerNormFwdOp, F.layer_norm, 2),
    "rms_norm": _norm(RMSNormFwdOp, F.rms_norm, 1),
    "softmax": _softmax,
    "batch_norm_train": _batch_norm(training=True),
    "batch_norm_infer": _batch_norm(training=False),
    "gemm": _gemm,
    "gemm_nt_bias": _linear,
    "gemm_tn": _gemm_tn,
}


def _leaves(inputs: tuple) -> tuple[torch.Tensor, ...]:
    return tuple(t.detach().requires_grad_() for t in inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", CASES)
def test_gradients_match_torch(name, dtype):
    ours, theirs, inputs = CASES[name](dtype)
    mine, reference = _leaves(inputs), _leaves(inputs)
    out, expected = ours(*mine), theirs(*reference)
    grad = randn(*out.shape, dtype=dtype, seed=9)
    got = torch.autograd.grad(out, mine, grad)
    want = torch.autograd.grad(expected, reference, grad)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        torch.testing.assert_close(g, w, **tolerance)


@pytest.mark.parametrize("name", CASES)
def test_gradcheck_in_float64(name):
    ours, _, inputs = CASES[name](torch.float64)
    assert torch.autograd.gradcheck(ours, _leaves(inputs))


def test_running_stats_are_updated_outside_autograd():
    op = BatchNormFwdOp(C)
    mean, var = _stats(torch.float32)
    x = randn(4, C, 5).requires_grad_()
    op(x, None, None, mean, var).sum().backward()
    assert mean.grad_fn is None and var.grad_fn is None
    assert not mean.requires_grad and not var.requires_grad
    expected_mean, _ = _stats(torch.float32)
    F.batch_norm(x.detach(), expected_mean, torch.ones(C), training=True)
    torch.testing.assert_close(mean, expected_mean)


@pytest.mark.parametrize("name", CASES)
def test_16_bit_gradients_on_the_meta_device(name):
    """The recompute runs the op's torch definition on meta tensors too (tracing, fake runs)."""
    ours, _, inputs = CASES[name](torch.bfloat16)
    leaves = tuple(t.to("meta").requires_grad_() for t in inputs)
    if name.startswith("batch_norm"):
        meta_stats = [t.to("meta") for t in _stats(torch.bfloat16)]
        op = BatchNormFwdOp(C, training=name.endswith("train"))
        out = op(*leaves, *meta_stats)
    else:
        out = ours(*leaves)
    grads = torch.autograd.grad(out.sum(), leaves)
    for g, t in zip(grads, leaves, strict=True):
        assert (g.device.type, g.dtype, g.shape) == ("meta", t.dtype, t.shape)


def _cubed(fn: Callable) -> Callable:
    """A scalar with second derivatives in every input (a sum of the outputs has none in x)."""
    return lambda *t: fn(*t).pow(3).sum()


def _along(grads: tuple, directions: list) -> torch.Tensor:
    return sum((g * d).sum() for g, d in zip(grads, directions, strict=True))


@pytest.mark.parametrize("name", CASES)
def test_double_backward_matches_torch_in_float64(name):
    ours, theirs, inputs = CASES[name](torch.float64)
    mine, reference = _leaves(inputs), _leaves(inputs)
    got = torch.autograd.grad(_cubed(ours)(*mine), mine, create_graph=True)
    want = torch.autograd.grad(_cubed(theirs)(*reference), reference, create_graph=True)
    assert all(g.requires_grad for g in got)
    directions = [randn(*t.shape, dtype=torch.float64, seed=10 + k) for k, t in enumerate(inputs)]
    second = torch.autograd.grad(_along(got, directions), mine)
    expected = torch.autograd.grad(_along(want, directions), reference)
    for g, w in zip(second, expected, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("name", CASES)
def test_hessian_matches_torch_in_float64(name):
    ours, theirs, inputs = CASES[name](torch.float64)
    got = torch.autograd.functional.hessian(_cubed(ours), inputs)
    want = torch.autograd.functional.hessian(_cubed(theirs), inputs)
    for row, expected_row in zip(got, want, strict=True):
        for block, expected in zip(row, expected_row, strict=True):
            torch.testing.assert_close(block, expected)


@pytest.mark.parametrize("name", CASES)
def test_gradgradcheck_in_float64(name):
    ours, _, inputs = CASES[name](torch.float64)
    assert torch.autograd.gradgradcheck(ours, _leaves(inputs), fast_mode=True)


def test_the_same_tensor_twice_gets_each_arguments_second_derivatives():
    a = randn(3, 3, dtype=torch.float64)
    got = torch.autograd.functional.hessian(_cubed(lambda a: GemmOp()(a, a)), a)
    want = torch.autograd.functional.hessian(_cubed(lambda a: a @ a), a)
    torch.testing.assert_close(got, want)


def test_double_backward_updates_the_running_stats_once():
    op = BatchNormFwdOp(C)
    mean, var = _stats(torch.float64)
    x = randn(4, C, 5, dtype=torch.float64).requires_grad_()
    (g,) = torch.autograd.grad(op(x, None, None, mean, var).pow(3).sum(), x, create_graph=True)
    g.sum().backward()
    expected_mean, expected_var = _stats(torch.float64)
    F.batch_norm(x.detach(), expected_mean, expected_var, training=True)
    torch.testing.assert_close((mean, var), (expected_mean, expected_var))


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
@pytest.mark.parametrize("stat", ["running_mean", "running_var"])
def test_running_stats_that_require_grad_are_refused_at_the_call(training, stat):
    """F.batch_norm refuses them under autograd: they get no gradient (and training writes them)."""
    op = BatchNormFwdOp(C, training=training)
    mean, var = _stats(torch.float32)
    stats = {"running_mean": mean, "running_var": var}
    stats[stat].requires_grad_()
    x = randn(4, C, 5)
    with pytest.raises(OpInputError, match=f"argument '{stat}' requires grad, but the op has no"):
        op(x, None, None, mean, var)
    torch.testing.assert_close((mean, var), _stats(torch.float32))  # not updated
    with torch.no_grad():  # no autograd: accepted, as F.batch_norm accepts it
        op(x, None, None, mean, var)


def _backward_in_a_thread_of_its_own(loss: torch.Tensor) -> None:
    """As autograd runs a GPU backward: in a device thread that does not see the caller's
    context (its pins and records)."""
    worker = threading.Thread(target=loss.backward)
    worker.start()
    worker.join()


@pytest.mark.parametrize("mutating", [False, True], ids=["rms_norm", "batch_norm"])
def test_a_backward_run_elsewhere_keeps_its_forwards_records_and_pins(mutating):
    if mutating:
        op, x = BatchNormFwdOp(4), randn(3, 4, 5).requires_grad_()
        args = (x, None, None, torch.zeros(4), torch.ones(4))
    else:
        op, x = RMSNormFwdOp(5), randn(3, 5).requires_grad_()
        args = (x, None)
    with tileops.record() as inside, tileops.pinned(type(op), "backward", "reference_backward"):
        loss = op(*args).square().sum()
    _backward_in_a_thread_of_its_own(loss)
    interfaces = {served.interface: served.key for served in inside.counts}
    assert interfaces["backward"] == "reference_backward"
    assert x.grad is not None
