"""Under torch.compile, a call that torch's own kernel serves eagerly (a `torch_native` kernel:
the op's native lane) is traced as torch's function, so the compiler sees, fuses and
differentiates torch's ops as in the model without tileops; every other call, and every call
under torch.export, autocast, a target, a scope, or sizes that vary, stays one operator node.

On the CPU, GemmOp's reference kernel is `torch_native`; RMSNorm's is not (a test kernel is)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from op_helpers import Capture, Doubling
from torch import nn

import tileops
from tileops import nn as tnn
from tileops.backend import register_kernel_type
from tileops.errors import OpInputError
from tileops.kernel import Kernel
from tileops.ops import (
    BatchNormFwdOp,
    BatchNormTrainInterface,
    GemmOp,
    RMSNormFwdOp,
    RMSNormInterface,
)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles anew: Dynamo makes a size dynamic once a frame saw two."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _linear_pair(**kwargs) -> tuple[tnn.Linear, nn.Linear]:
    ours = tnn.Linear(16, 8, **kwargs)
    theirs = nn.Linear(16, 8, **kwargs)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def test_a_linear_under_autograd_compiles_to_torchs_ops_and_gradients(shared_ops):
    ours, theirs = _linear_pair(dtype=torch.float64)
    capture = Capture()
    compiled = torch.compile(ours, backend=capture, fullgraph=True)
    x = torch.randn(4, 5, 16, dtype=torch.float64)
    xs = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiled(xs[0]).sum().backward()
    theirs(xs[1]).sum().backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad)
    assert capture.tileops() == set()
    assert "aten.addmm.default" in capture.graphs[0] and "aten.mm.default" in capture.graphs[1]


def test_a_gemm_op_called_in_a_compiled_function_traces_torchs_product():
    op, capture = GemmOp(trans_a=True), Capture()
    a, b = torch.randn(6, 3), torch.randn(6, 4)
    out = torch.compile(lambda a, b: op(a, b), backend=capture, fullgraph=True)(a, b)
    torch.testing.assert_close(out, a.t() @ b)
    assert capture.tileops() == set() and "aten.mm.default" in capture.ops()


def test_export_keeps_the_operator(shared_ops):
    ours, _ = _linear_pair()
    program = torch.export.export(ours, (torch.randn(3, 16),))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert targets == ["tileops.GemmOp.default"]


def test_a_call_another_kernel_serves_stays_the_operator(isolated, shared_ops):
    register_kernel_type(GemmOp, "doubling", Doubling)
    ours, theirs = _linear_pair()
    capture, x = Capture(), torch.randn(3, 16)
    out = torch.compile(ours, backend=capture, fullgraph=True)(x)
    torch.testing.assert_close(out, 2 * theirs(x))
    assert capture.tileops() == {"tileops.GemmOp.default"}


def test_a_scope_begun_after_compiling_retraces_to_the_operator(shared_ops):
    ours, theirs = _linear_pair()
    capture, x = Capture(), torch.randn(3, 16)
    compiled = torch.compile(ours, backend=capture, fullgraph=True)
    with torch.no_grad():
        compiled(x)
        assert capture.tileops() == set()
        with tileops.record() as record:
            torch.testing.assert_close(compiled(x), theirs(x))
    assert capture.tileops() == {"tileops.GemmOp.default"}
    assert sum(record.counts.values()) == 1  # the record saw the call


def test_sizes_that_vary_keep_the_operator(shared_ops):
    ours, _ = _linear_pair()
    capture = Capture()
    torch.compile(ours, backend=capture, fullgraph=True, dynamic=True)(torch.randn(3, 16))
    assert capture.tileops() == {"tileops.GemmOp.default"}


def test_autocast_keeps_the_operator(shared_ops):
    ours, _ = _linear_pair()
    capture = Capture()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.compile(ours, backend=capture, fullgraph=True)(torch.randn(3, 16))
    assert out.dtype == torch.bfloat16
    assert capture.tileops() == {"tileops.GemmOp.default"}


def test_a_target_keeps_the_operator():
    capture, op = Capture(), GemmOp(target="builtin")
    compiled = torch.compile(lambda a, b: op(a, b), backend=capture, fullgraph=True)
    compiled(torch.randn(2, 3), torch.randn(3, 4))
    assert capture.tileops() == {"tileops.GemmOp.default"}


def test_a_refused_call_still_raises_the_ops_error(shared_ops):
    op = GemmOp()
    compiled = torch.compile(lambda a, b: op(a, b), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="GemmOp") as caught:
        compiled(torch.randn(2, 3), torch.randn(4, 5))
    assert isinstance(caught.value, OpInputError) or isinstance(
        caught.value.__cause__, OpInputError
    )


class NativeRMSNorm(Kernel, RMSNormInterface):
    """torch's rms_norm on the CPU, declared torch_native and preferred over the reference."""

    devices = {"cpu"}
    torch_native = True

    @classmethod
    def entry_for(cls, call):
        return (call.eps,), lambda: cls(call.eps)

    def __init__(self, eps):
        self.eps = eps

    def forward(self, x, weight):
        return F.rms_norm(x, x.shape[-1:], weight, self.eps)


def test_a_norm_under_autograd_that_torchs_kernel_serves_compiles_to_torchs_ops(
    isolated, shared_ops
):
    register_kernel_type(RMSNormFwdOp, "native_rms", NativeRMSNorm)
    norm = tnn.RMSNorm(16, eps=1e-6)
    x = torch.randn(4, 16, requires_grad=True)
    training, inference = Capture(), Capture()
    torch.compile(norm, backend=training, fullgraph=True)(x).sum().backward()
    with torch.no_grad():  # a plain call: the op's own lane eagerly, its operator compiled
        out = torch.compile(norm, backend=inference, fullgraph=True)(x)
    torch.testing.assert_close(out, F.rms_norm(x, (16,), norm.weight, 1e-6))
    assert training.tileops() == set() and inference.tileops() == {"tileops.RMSNormFwdOp.default"}


def test_a_norm_the_reference_serves_stays_the_operator(shared_ops):
    capture, x = Capture(), torch.randn(4, 16, requires_grad=True)
    torch.compile(tnn.RMSNorm(16), backend=capture, fullgraph=True)(x).sum().backward()
    assert "tileops.RMSNormFwdOp.default" in capture.tileops()


class NativeBatchNorm(Kernel, BatchNormTrainInterface):
    """torch's batch_norm on the CPU in training, declared torch_native."""

    devices = {"cpu"}
    channels_last = True
    torch_native = True

    @classmethod
    def entry_for(cls, call):
        return (call.eps, call.momentum), lambda: cls(call.eps, call.momentum)

    def __init__(self, eps, momentum):
        self.eps, self.momentum = eps, momentum

    def forward(self, x, weight, bias, running_mean, running_var):
        stats = running_mean, running_var
        return F.batch_norm(x, *stats, weight, bias, True, self.momentum, self.eps).contiguous()


def test_a_batch_norm_torchs_kernel_serves_compiles_to_torchs_ops_and_updates_its_stats(
    isolated, shared_ops
):
    register_kernel_type(BatchNormFwdOp, "native_bn", NativeBatchNorm)
    ours, theirs = tnn.BatchNorm2d(4), nn.BatchNorm2d(4)
    x = torch.randn(2, 4, 3, 3)
    xs = x.clone().requires_grad_(), x.clone().requires_grad_()
    capture = Capture()
    torch.compile(ours, backend=capture, fullgraph=True)(xs[0]).square().sum().backward()
    theirs(xs[1]).square().sum().backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad)
    torch.testing.assert_close(ours.running_var, theirs.running_var)
    torch.testing.assert_close(ours.running_mean, theirs.running_mean)
    assert capture.tileops() == set()
