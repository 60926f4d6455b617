"""What a forward kernel keeps for the backward (`Op.keeps_state`): BatchNorm's batch mean and
invstd reach a backward kernel that declares `takes_state`, on the eager autograd route only,
checked on the way; the backward computes them itself where nothing was kept."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tileops
from tileops.backend import register_kernel_type
from tileops.errors import BackendError
from tileops.kernel import Kernel
from tileops.ops import BackwardInterface, BatchNormFwdOp, BatchNormTrainInterface

EPS = 1e-5


def _stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dims = [0, *range(2, x.dim())]
    var, mean = torch.var_mean(x.float(), dims, correction=0)
    return mean, torch.rsqrt(var + EPS)


def _keeping(kept: tuple) -> type:
    """A CPU training kernel that returns F.batch_norm's output and `kept(x)` as its state."""

    class Keeping(Kernel, BatchNormTrainInterface):
        devices = {"cpu"}

        @classmethod
        def entry_for(cls, call):
            return (), cls

        def forward(self, x, weight, bias, running_mean, running_var):
            stats = running_mean, running_var
            y = F.batch_norm(x, *stats, weight, bias, True, 0.1, EPS)
            return (y, *kept[0](x))

    return Keeping


class Taking(Kernel, BackwardInterface):
    """A CPU backward that takes state, records what it got, and computes as ATen does."""

    devices = {"cpu"}
    takes_state = True
    received: list = []

    @classmethod
    def entry_for(cls, call):
        return (), cls

    def forward(self, grads, inputs, state=()):
        Taking.received.append(state)
        (dy,), (x, weight, *_) = grads, inputs
        mean, invstd = state or _stats(x)
        dx, dw, db = torch.ops.aten.native_batch_norm_backward(
            dy, x, weight, None, None, mean, invstd, True, EPS, [True, True, True]
        )
        return dx, dw, db, None, None


@pytest.fixture
def planted(isolated):
    kept = [_stats]
    register_kernel_type(BatchNormFwdOp, "keeping", _keeping(kept))
    register_kernel_type(BatchNormFwdOp, "taking", Taking)
    Taking.received = []
    return kept


def _inputs():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5, requires_grad=True)
    return x, torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)


def test_the_batch_stats_a_forward_kernel_kept_reach_the_backward_and_train_as_torchs(planted):
    x, w, b = _inputs()
    y = BatchNormFwdOp(3)(x, w, b, torch.zeros(3), torch.ones(3))
    grads = torch.autograd.grad(y.square().sum(), (x, w, b))
    (state,) = Taking.received
    for got, want in zip(state, _stats(x.detach()), strict=True):
        torch.testing.assert_close(got, want)
    expected = F.batch_norm(x, torch.zeros(3), torch.ones(3), w, b, True, 0.1, EPS)
    wanted = torch.autograd.grad(expected.square().sum(), (x, w, b))
    for got, want in zip(grads, wanted, strict=True):
        torch.testing.assert_close(got, want)


def test_without_autograd_nothing_is_kept_and_the_output_is_the_kernels(planted):
    x, w, b = (t.detach() for t in _inputs())
    y = BatchNormFwdOp(3)(x, w, b, None, None)
    torch.testing.assert_close(y, F.batch_norm(x, None, None, w, b, True, 0.1, EPS))


def test_a_traced_call_keeps_nothing_and_the_backward_computes_the_stats(planted):
    x, w, b = _inputs()
    op = BatchNormFwdOp(3)
    y = op._through_operator((x, w, b, None, None))  # the operator route compile takes
    torch.autograd.grad(y.sum(), (x, w, b))
    assert Taking.received == [()]


@pytest.mark.parametrize(
    ("kept", "problem"),
    [
        (lambda x: (_stats(x)[0],), "it kept (a contiguous float32 tensor of shape [3] on cpu)"),
        (lambda x: (_stats(x)[0].double(), _stats(x)[1]), "a contiguous float64 tensor"),
        (lambda x: (_stats(x)[0][:2], _stats(x)[1]), "of shape [2] on cpu"),
        (lambda x: ("mean", _stats(x)[1]), "it kept (str, "),
    ],
)
def test_wrong_kept_state_is_an_error_naming_the_kernel(planted, kept, problem):
    planted[0] = kept
    x, w, b = _inputs()
    with pytest.raises(BackendError) as info:
        BatchNormFwdOp(3)(x, w, b, None, None)
    message = str(info.value)
    assert "State kept by" in message and "'keeping'" in message and problem in message
    assert "expected (mean, invstd), each a contiguous float32 tensor of shape [3]" in message


def test_an_op_that_keeps_no_state_refuses_a_tuple_from_its_kernel(isolated):
    class Pair(Kernel, tileops.ops.RMSNormInterface):
        devices = {"cpu"}

        @classmethod
        def entry_for(cls, call):
            return (), cls

        def forward(self, x, weight):
            return x.clone(), x.clone()

    register_kernel_type(tileops.RMSNormFwdOp, "pair", Pair)
    with pytest.raises(BackendError, match="Output of .*'pair'.* is wrong: it returned tuple"):
        tileops.RMSNormFwdOp(4)(torch.randn(2, 4), None)


def test_an_op_that_keeps_state_cannot_declare_a_lane():
    with pytest.raises(TypeError, match="an op whose kernels keep state defines no lane_for"):

        class Laned(BatchNormFwdOp):
            def lane_for(self, call):
                return None
