"""Backward call specs of the row-wise ops: what their backward kernels select on, read off the
tensors of each backward (eagerly and under torch.compile with dynamic shapes), softmax's y
handed over from the forward, and the opaque backward operator a traced graph calls."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
from op_helpers import randn

import tileops
from tileops import Kernel
from tileops.backend import register_kernel_type
from tileops.ops import (
    LayerNormBackwardCall,
    LayerNormBackwardInterface,
    RMSNormBackwardCall,
    RMSNormBackwardInterface,
    SoftmaxBackwardCall,
    SoftmaxBackwardInterface,
)


class _Spy(Kernel):
    """A CPU backward kernel recording its calls and tensors, computing through the op's torch
    definition (detached): gradients right, and not differentiable."""

    devices = frozenset({"cpu"})
    seen: ClassVar[list]
    op_cls: ClassVar[type]

    @classmethod
    def entry_for(cls, call):
        return call, lambda: cls(call)

    def __init__(self, call) -> None:
        self.call = call

    def forward(self, grads, inputs, outputs=()):
        type(self).seen.append((self.call, grads, inputs, outputs))
        op = self.op_cls(**dict(self.call.params))
        with torch.enable_grad():
            leaves = [None if t is None else t.detach().requires_grad_() for t in inputs]
            out = op.reference_forward(*leaves)
            wanted = [t for t, need in zip(leaves, self.call.needs, strict=True) if need]
            found = iter(torch.autograd.grad(out, wanted, grads))
        return tuple(next(found) if need else None for need in self.call.needs)


def _spy(op_cls: type, interface: type, *, refuse_without_y: bool = False) -> type[_Spy]:
    def refusal(cls, call):
        if refuse_without_y and not call.has_output:
            return "needs y"
        return None

    body = {"seen": [], "op_cls": op_cls, "refusal": classmethod(refusal)}
    if interface is SoftmaxBackwardInterface:
        body["forward"] = _Spy.forward
    else:
        body["forward"] = lambda self, grads, inputs: _Spy.forward(self, grads, inputs)
    cls = type(f"Spy{op_cls.__name__}", (_Spy, interface), body)
    register_kernel_type(op_cls, "spy", cls)
    return cls


def _leaves(*tensors):
    return [None if t is None else t.detach().requires_grad_() for t in tensors]


def test_rms_norm_backward_call_carries_rows_eps_and_param_dtype(tileops_registry):
    spy = _spy(tileops.RMSNormFwdOp, RMSNormBackwardInterface)
    x, w = _leaves(randn(2, 5, 3, 4), randn(3, 4, seed=1))
    tileops.RMSNormFwdOp((3, 4))(x, w).sum().backward()
    ((call, grads, inputs, _),) = spy.seen
    assert isinstance(call, RMSNormBackwardCall)
    assert (call.n, call.dtype, call.param_dtype) == (12, torch.float32, torch.float32)
    assert call.eps == torch.finfo(torch.float32).eps  # eps=None resolved as F.rms_norm's
    assert call.needs == (True, True) and not call.create_graph
    assert not call.contiguous  # sum()'s gradient is an expanded scalar
    ref_x, ref_w = _leaves(x, w)
    F.rms_norm(ref_x, (3, 4), ref_w).sum().backward()
    torch.testing.assert_close((x.grad, w.grad), (ref_x.grad, ref_w.grad))


def test_layer_norm_backward_call_carries_which_grads_and_params(tileops_registry):
    spy = _spy(tileops.LayerNormFwdOp, LayerNormBackwardInterface)
    x, b = _leaves(randn(6, 8), randn(8, seed=2))
    x.requires_grad_(False)
    y = tileops.LayerNormFwdOp(8, eps=1e-3)(x, None, b)
    y.backward(randn(6, 8, seed=3))
    ((call, *_),) = spy.seen
    assert isinstance(call, LayerNormBackwardCall)
    assert (call.n, call.eps, call.param_dtype, call.contiguous) == (8, 1e-3, torch.float32, True)
    assert call.needs == (False, False, True)
    assert call.dtypes == (torch.float32, None, torch.float32)


def test_softmax_backward_gets_the_forwards_output(tileops_registry):
    spy = _spy(tileops.SoftmaxFwdOp, SoftmaxBackwardInterface)
    (x,) = _leaves(randn(4, 3, 7))
    y = tileops.SoftmaxFwdOp(1)(x)
    y.backward(randn(4, 3, 7, seed=1))
    ((call, _, _, outputs),) = spy.seen
    assert isinstance(call, SoftmaxBackwardCall)
    assert (call.n, call.has_output, call.contiguous) == (3, True, False)  # dim 1 is not last
    assert outputs[0].data_ptr() == y.data_ptr() and not outputs[0].requires_grad


def test_softmax_output_modified_in_place_goes_to_a_kernel_without_y(tileops_registry):
    spy = _spy(tileops.SoftmaxFwdOp, SoftmaxBackwardInterface, refuse_without_y=True)
    x, ref = _leaves(randn(5, 9), randn(5, 9))
    tileops.SoftmaxFwdOp(-1)(x).mul_(2.0).square().sum().backward()
    torch.softmax(ref, -1).clone().mul_(2.0).square().sum().backward()
    assert spy.seen == []  # y changed since the forward: the spy refused, the reference served
    torch.testing.assert_close(x.grad, ref.grad)
    op = tileops.SoftmaxFwdOp(-1)
    call = SoftmaxBackwardCall(
        device=torch.device("cpu"), op=op.op_name, params=(("dim", -1),),
        dtypes=(torch.float32,), needs=(True,), n=9, dtype=torch.float32, has_output=False,
        contiguous=True,
    )  # fmt: skip
    explanation = op.explain("backward", call)
    assert explanation.chosen == "reference_backward"
    assert "needs y" in str(explanation)


def _rms(x, w):
    return tileops.RMSNormFwdOp(16)(x, w)


def _softmax(x):
    return tileops.SoftmaxFwdOp(-1)(x)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_backward_runs_the_kernel_on_real_tensors(tileops_registry, dynamic):
    """Traced, the kernel is one opaque operator: it runs on the real tensors of each call,
    whose row counts (and softmax's row length) vary under dynamic shapes."""
    torch._dynamo.reset()
    rms = _spy(tileops.RMSNormFwdOp, RMSNormBackwardInterface)
    soft = _spy(tileops.SoftmaxFwdOp, SoftmaxBackwardInterface)
    fn = torch.compile(lambda x, w: _softmax(_rms(x, w)), dynamic=dynamic, fullgraph=True)
    for rows, n in ((3, 16), (5, 16)):
        x, w = _leaves(randn(rows, n), randn(n, seed=1))
        ref_x, ref_w = _leaves(randn(rows, n), randn(n, seed=1))
        grad = randn(rows, n, seed=4)
        fn(x, w).backward(grad)
        torch.softmax(F.rms_norm(ref_x, (n,), ref_w), -1).backward(grad)
        torch.testing.assert_close(x.grad, ref_x.grad)
        torch.testing.assert_close(w.grad, ref_w.grad)
    assert [c.n for c, *_ in rms.seen] == [16, 16]
    assert [t[1][0].shape[0] for t in soft.seen] == [3, 5]
    assert all(
        not isinstance(t, torch._subclasses.FakeTensor) for _, g, _, _ in soft.seen for t in g
    )
    assert all(o[0] is not None for *_, o in soft.seen)  # y reached the compiled backward too


def test_compiled_backward_without_kernels_traces_the_reference(tileops_registry):
    """With only the reference serving, the backward stays torch ops the compiler sees."""
    torch._dynamo.reset()
    graphs = []

    def backend(gm, inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def keep(g, _):
            graphs.append(g)
            return g

        return aot_module_simplified(gm, inputs, fw_compiler=keep, bw_compiler=keep)

    fn = torch.compile(_softmax, backend=backend, fullgraph=True)
    (x,) = _leaves(randn(4, 6))
    fn(x).sum().backward()
    backward_graph = str(graphs[-1].graph)
    assert "SoftmaxFwdOp_backward" not in backward_graph
    spy = _spy(tileops.SoftmaxFwdOp, SoftmaxBackwardInterface)
    torch._dynamo.reset()
    graphs.clear()
    fn = torch.compile(_softmax, backend=backend, fullgraph=True)
    (x,) = _leaves(randn(4, 6))
    fn(x).sum().backward()
    assert "SoftmaxFwdOp_backward" in str(graphs[-1].graph)
    assert len(spy.seen) == 1


def test_the_backward_operator_is_defined_with_the_forward_one():
    """A compiled backward loaded from the compiler's cache calls it without tracing anew."""
    from tileops.library import operator

    operator(tileops.LayerNormFwdOp)
    schema = str(torch.ops.tileops.LayerNormFwdOp_backward.default._schema)
    assert schema.startswith("tileops::LayerNormFwdOp_backward(Tensor[] grads, Tensor?[] inputs")


GRADCHECK = {
    "rms_norm": (lambda: tileops.RMSNormFwdOp((3, 4), 1e-5), [(2, 3, 3, 4), (3, 4)]),
    "rms_norm_no_weight": (lambda: tileops.RMSNormFwdOp(4), [(5, 4), None]),
    "layer_norm": (lambda: tileops.LayerNormFwdOp(6), [(4, 6), (6,), (6,)]),
    "layer_norm_bias_only": (lambda: tileops.LayerNormFwdOp(6), [(4, 6), None, (6,)]),
    "softmax_dim0": (lambda: tileops.SoftmaxFwdOp(0), [(5, 3)]),
    "softmax_0d": (lambda: tileops.SoftmaxFwdOp(0), [()]),
}


@pytest.mark.parametrize("name", GRADCHECK)
def test_gradcheck_in_float64_through_the_backward_reference(name):
    make, shapes = GRADCHECK[name]
    op = make()
    inputs = [None if s is None else randn(*s, dtype=torch.float64, seed=k).requires_grad_()
              for k, s in enumerate(shapes)]  # fmt: skip
    with tileops.pinned(type(op), "backward", "reference_backward"):
        assert torch.autograd.gradcheck(op, inputs)


def test_is_traced_tells_fake_and_functionalized_tensors_from_real_ones():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tileops.backward import is_traced

    assert not is_traced((torch.ones(2), None), ())
    assert not is_traced((None,), (torch.nn.Parameter(torch.ones(2)),))
    with FakeTensorMode():
        fake = torch.ones(2)
        wrapped = torch._to_functional_tensor(fake)  # the plain tensor type, a fake inside
    assert is_traced((fake,))
    assert type(wrapped) is torch.Tensor and is_traced((wrapped,))
