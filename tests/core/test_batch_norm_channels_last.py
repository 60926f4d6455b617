"""BatchNorm keeps channels_last, as F.batch_norm does: kernels that declare it read x where it
lies, (batch, spatial, channels); the others refuse such calls and never read it as NCHW."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from op_helpers import randn
from torch import nn

import tileops
import tileops.nn as tnn
from tileops import Kernel, KernelDeclarationError
from tileops.backend import register_kernel_type
from tileops.ops import BatchNormCall, BatchNormFwdOp, BatchNormTrainInterface
from tileops.ops.norm.batch_norm import BatchNormTrainReference

C = 3
FORMATS = {
    "channels_last": ((2, C, 4, 5), torch.channels_last),
    "channels_last_3d": ((2, C, 2, 3, 4), torch.channels_last_3d),
}


def _x(name, dtype=torch.float32):
    shape, memory_format = FORMATS[name]
    return (randn(*shape) * 2 + 1).to(dtype).to(memory_format=memory_format)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("name", list(FORMATS))
def test_the_output_keeps_x_s_memory_format_with_torchs_values(name, training, dtype):
    x = _x(name, dtype)
    weight, bias = randn(C, seed=1).to(dtype), randn(C, seed=2).to(dtype)
    stats = randn(C, seed=3).to(dtype), (randn(C, seed=4).abs() + 0.5).to(dtype)
    theirs = tuple(t.clone() for t in stats)
    out = BatchNormFwdOp(C, training=training)(x, weight, bias, *stats)
    expected = F.batch_norm(x, *theirs, weight, bias, training)
    assert out.stride() == expected.stride() and out.is_contiguous(memory_format=FORMATS[name][1])
    tolerance = {"rtol": 1.6e-2, "atol": 1.6e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(out, expected, **tolerance)
    torch.testing.assert_close(stats, theirs, **tolerance)


def test_gradients_through_a_channels_last_x_match_torchs():
    x, weight = _x("channels_last"), randn(C, seed=1)
    results = []
    for fn in (
        lambda x, w: BatchNormFwdOp(C)(x, w, None, None, None),
        lambda x, w: F.batch_norm(x, None, None, w, None, True),
    ):
        xx, ww = x.clone().requires_grad_(), weight.clone().requires_grad_()
        y = fn(xx, ww)
        y.relu_()  # an in-place consumer, as ReLU(inplace=True)
        (y * torch.arange(y.numel()).view(y.shape)).sum().backward()
        results.append((y.detach(), xx.grad, ww.grad))
    torch.testing.assert_close(results[0], results[1], rtol=1e-4, atol=1e-4)
    assert results[0][0].stride() == results[1][0].stride()


def test_a_convnet_in_channels_last_trains_as_torchs_and_stays_channels_last():
    torch.manual_seed(0)
    eager = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True)
    ).to(memory_format=torch.channels_last)
    ours = copy.deepcopy(eager)
    tnn.kernelize(ours)
    x = randn(4, 3, 6, 6).to(memory_format=torch.channels_last)
    got, want = ours(x), eager(x)
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got.sum().backward(), want.sum().backward()
    torch.testing.assert_close(
        [p.grad for p in ours.parameters()], [p.grad for p in eager.parameters()]
    )


class _NchwOnly(Kernel, BatchNormTrainInterface):
    """A kernel written for (batch, channels, spatial) that says nothing about layouts."""

    devices = {"cpu"}
    seen: list = []

    def forward(self, x, weight, bias, running_mean, running_var):
        self.seen.append(x.shape)
        return F.batch_norm(x, running_mean, running_var, weight, bias, True)


def test_a_kernel_that_does_not_declare_channels_last_refuses_it(tileops_registry):
    register_kernel_type(BatchNormFwdOp, "nchw_only", _NchwOnly)
    _NchwOnly.seen.clear()
    op, x = BatchNormFwdOp(C), _x("channels_last")
    out = op(x, None, None, None, None)  # the reference serves it
    torch.testing.assert_close(out, F.batch_norm(x, None, None, training=True))
    assert _NchwOnly.seen == []
    explanation = str(op.explain("batch_norm_fwd_train", _spec(x)))
    assert "nchw_only [" in explanation
    assert "x is channels_last, read as (batch, spatial, channels), and the kernel does not " in (
        explanation.replace("\n", " ")
    )
    op(x.contiguous(), None, None, None, None)  # plain contiguous: its own kind of call
    assert _NchwOnly.seen == [(2, C, 20)]


def _spec(x):
    """The call spec of a channels_last (2, C, 4, 5) x with nothing else given."""
    return BatchNormCall(
        device=x.device,
        batch=x.shape[0],
        channels=C,
        spatial=20,
        eps=1e-5,
        momentum=0.1,
        dtype=x.dtype,
        has_weight=False,
        has_bias=False,
        has_running_stats=False,
        channels_last=True,
    )


def test_a_kernel_declaring_channels_last_reads_x_where_it_lies(tileops_registry):
    seen = []

    class Last(BatchNormTrainReference):
        general = False

        def forward(self, x, weight, bias, running_mean, running_var):
            seen.append((x.shape, x.data_ptr()))
            return super().forward(x, weight, bias, running_mean, running_var)

    register_kernel_type(BatchNormFwdOp, "last", Last)
    x = _x("channels_last")
    BatchNormFwdOp(C)(x, None, None, None, None)
    assert seen == [((2, 20, C), x.data_ptr())]  # (batch, spatial, channels): no copy


def test_channels_last_must_be_declared_as_a_bool():
    with pytest.raises(KernelDeclarationError, match="channels_last must be True or False"):

        class Sloppy(Kernel, BatchNormTrainInterface):
            channels_last = "yes"


@pytest.mark.parametrize("training", [True, False], ids=["train", "infer"])
def test_traced_strides_are_the_real_ones(training):
    """The fake implementation keeps channels_last too: compiled code reads the right strides."""
    op = BatchNormFwdOp(C, training=training)
    x, stats = _x("channels_last"), (torch.zeros(C), torch.ones(C))
    operator = tileops.library.operator(BatchNormFwdOp).default
    torch.library.opcheck(operator, (x, None, None, *stats, *op.params().values()))
    compiled = torch.compile(lambda x: op(x, None, None, *stats) * 2, backend="aot_eager")
    expected = F.batch_norm(x, torch.zeros(C), torch.ones(C), training=training) * 2
    torch.testing.assert_close(compiled(x), expected)
