"""Ops' outputs followed by in-place ops, as models use them (`ReLU(inplace=True)`, residual
`add_`): an output is never a view autograd would refuse to modify, with or without grad."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from op_helpers import assert_trains_as_eager, randn
from torch import nn

import tileops
from tileops import Kernel
from tileops.backend import register_kernel_type
from tileops.ops import SoftmaxInterface

C = 4


def _cases():
    """name: (op call, torch's function) on (x, w) of shapes (2, C, 3, 8) and (8,)."""
    mean, var = torch.zeros(C), torch.ones(C)
    bn_train, bn_infer = tileops.BatchNormFwdOp(C), tileops.BatchNormFwdOp(C, training=False)
    gemm = tileops.GemmOp()
    return {
        "layer_norm": (
            lambda x, w: tileops.LayerNormFwdOp(8)(x, w, None),
            lambda x, w: F.layer_norm(x, (8,), w),
        ),
        "rms_norm": (
            lambda x, w: tileops.RMSNormFwdOp(8)(x, w),
            lambda x, w: F.rms_norm(x, (8,), w),
        ),
        # torch's softmax saves its output, so it refuses in-place changes: compare to a clone.
        "softmax_last": (
            lambda x, w: tileops.SoftmaxFwdOp(-1)(x * w),
            lambda x, w: F.softmax(x * w, -1).clone(),
        ),
        "softmax_dim1": (
            lambda x, w: tileops.SoftmaxFwdOp(1)(x * w),
            lambda x, w: F.softmax(x * w, 1).clone(),
        ),
        "gemm": (
            lambda x, w: gemm(x.reshape(-1, 8), w.diag()),
            lambda x, w: x.reshape(-1, 8) @ w.diag(),
        ),
        "batch_norm_train": (
            lambda x, w: bn_train(x * w, None, None, mean.clone(), var.clone()),
            lambda x, w: F.batch_norm(x * w, mean.clone(), var.clone(), training=True),
        ),
        "batch_norm_infer": (
            lambda x, w: bn_infer(x * w, None, None, mean, var),
            lambda x, w: F.batch_norm(x * w, mean, var),
        ),
    }


INPLACE = {
    "relu_": lambda y: y.relu_(),
    "add_": lambda y: y.add_(1.5),
    "mul_": lambda y: y.mul_(torch.linspace(0.5, 2, y.shape[-1])),
}


def _grads(fn, consumer, x, w):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = consumer(fn(x, w))
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
    return y.detach(), x.grad, w.grad


@pytest.mark.parametrize("consumer", INPLACE)
@pytest.mark.parametrize("name", list(_cases()))
def test_an_output_modified_in_place_under_autograd_gives_torchs_gradients(name, consumer):
    ours, theirs = _cases()[name]
    x, w = randn(2, C, 3, 8), randn(8, seed=1)
    got, want = _grads(ours, INPLACE[consumer], x, w), _grads(theirs, INPLACE[consumer], x, w)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(_cases()))
def test_an_output_made_under_no_grad_may_be_modified_in_place_with_grad(name):
    """torch allows it for its functions' outputs (they are no views); so for ours."""
    ours, theirs = _cases()[name]
    x, w = randn(2, C, 3, 8), randn(8, seed=1)
    scale = torch.full((8,), 2.0, requires_grad=True)
    results = []
    for fn in (ours, theirs):
        with torch.no_grad():
            y = fn(x, w)
        y.mul_(scale).sum().backward()
        results.append((y.detach(), scale.grad.clone()))
        scale.grad = None
    for g, e in zip(*results, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def _convnet(bn: type[nn.Module]) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        bn(8),
        nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1),
        bn(8),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )


def test_a_convnet_with_inplace_relu_after_batchnorm_trains_as_torchs():
    torch.manual_seed(0)
    x, labels = randn(6, 3, 8, 8, seed=3), torch.arange(6) % 5
    assert_trains_as_eager(_convnet(nn.BatchNorm2d), x, labels, swapped=3)


class _ViewingSoftmax(Kernel, SoftmaxInterface):
    """Returns a view of a larger buffer of its own: contiguous, right shape, still a view."""

    devices = {"cpu"}

    def forward(self, x):
        buffer = torch.empty(x.numel() + 1, dtype=x.dtype)
        out = buffer[1:].view(x.shape)
        return out.copy_(torch.softmax(x, -1))


def test_a_kernel_returning_a_view_of_its_own_buffer_is_modifiable_in_place(tileops_registry):
    register_kernel_type(tileops.SoftmaxFwdOp, "viewing", _ViewingSoftmax)
    x = randn(3, 8).requires_grad_()
    y = tileops.SoftmaxFwdOp(-1)(x)
    y.mul_(2.0).sum().backward()
    torch.testing.assert_close(x.grad, torch.zeros_like(x), atol=1e-6, rtol=0)  # d(2*sum)=0


def test_running_stats_written_under_autograd_invalidate_graphs_that_saved_them():
    """Inputs the op writes get their version bumped (as a torch.library custom op's do): a
    graph that saved the old values refuses to backpropagate through the new ones."""
    x = randn(4, C, 5).requires_grad_()
    mean, var = torch.zeros(C), torch.ones(C)
    saved = (x.sum(dim=(0, 2)) * mean).sum()  # mul saves `mean` for x's gradient
    tileops.BatchNormFwdOp(C)(x, None, None, mean, var)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()


def test_inputs_the_op_only_reads_keep_their_version():
    """BatchNorm's inference op reads its running stats: a graph that saved them stays valid."""
    x = randn(4, C, 5).requires_grad_()
    mean, var = torch.zeros(C), torch.ones(C)
    versions = mean._version, var._version
    tileops.BatchNormFwdOp(C, training=False)(x, None, None, mean, var).sum().backward()
    assert (mean._version, var._version) == versions
