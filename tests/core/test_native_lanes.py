"""Native lanes (`Op.native_lane_for`): where the kernel serving an input layout declares
`torch_native` (cuBLAS, cuDNN; on the CPU the GEMM reference), the autograd calls of that layout
run torch's own function under torch's autograd from the first (decided before it runs, so a
checkpoint's recompute takes the same path): torch's nodes and backward, no node of the op's.
Other kernels, other strides, pins and records keep the op's node; the op's checks still run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_lanes import Doubling

import tileops
import tileops.nn as tnn
from tileops.backend import register_kernel_type
from tileops.errors import KernelDeclarationError, OpInputError
from tileops.kernel import Kernel
from tileops.ops import (
    BatchNormFwdOp,
    BatchNormTrainInterface,
    GemmOp,
    LayerNormFwdOp,
    LayerNormInterface,
)
from tileops.ops.norm.layer_norm import LayerNormRecompute

F64 = torch.float64


def _node(t: torch.Tensor) -> str:
    return type(t.grad_fn).__name__


def _leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=F64, requires_grad=True)


def _gradients(fn, *inputs: torch.Tensor) -> tuple:
    out = fn(*inputs)
    dy = torch.randn_like(out)
    return out, torch.autograd.grad(out, inputs, dy)


def test_a_layout_served_by_a_torch_native_kernel_records_torch_nodes_from_its_first_call():
    op, w, bias, x = GemmOp(trans_b=True), _leaf(5, 4), _leaf(5), _leaf(3, 4)
    assert _node(op(x, w, bias)) == "AddmmBackward0"
    torch.manual_seed(1)
    got = _gradients(lambda x, w, b: op(x, w, b), x, w, bias)
    torch.manual_seed(1)
    want = _gradients(F.linear, x, w, bias)
    torch.testing.assert_close(got, want)
    assert _node(op(x, w)) == "MmBackward0"  # without bias: another layout, its own lane


def test_a_checkpointed_call_recomputes_on_the_path_its_forward_took():
    op, w, x = GemmOp(trans_b=True), _leaf(5, 4), _leaf(7, 4)  # a layout not seen before
    y = torch.utils.checkpoint.checkpoint(lambda x: op(x, w), x, use_reentrant=False)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(7, 5, dtype=F64) @ w.detach())


def test_a_kernel_not_declared_torch_native_keeps_the_ops_node(isolated):
    register_kernel_type(GemmOp, "doubling", Doubling)
    op, a, b = GemmOp(), _leaf(2, 3), _leaf(3, 4)
    for _ in range(3):
        y = op(a, b)
    assert _node(y) == "_EagerOpBackward"
    (da,) = torch.autograd.grad(y.sum(), a)
    torch.testing.assert_close(da, 2 * torch.ones(2, 4, dtype=F64) @ b.t())  # d(2ab)/da


def test_strided_operands_pins_and_records_take_the_ops_node():
    op, a, b = GemmOp(), _leaf(4, 6), _leaf(6, 5)
    op(a, b), op(a, b)
    strided = _leaf(6, 4).t()  # a's shape, not contiguous: the lane steps aside
    y = op(strided, b)
    assert _node(y) == "_EagerOpBackward"
    ones = torch.ones(4, 5, dtype=F64)
    torch.testing.assert_close(torch.autograd.grad(y.sum(), b)[0], strided.detach().t() @ ones)
    with tileops.pinned(GemmOp, "gemm", "reference"):
        assert _node(op(a, b)) == "_EagerOpBackward"
    with tileops.record() as record:
        assert _node(op(a, b)) == "_EagerOpBackward"
    assert sum(record.counts.values()) == 1
    assert _node(op(a, b)) == "MmBackward0"


def test_linear_trains_through_torch_nodes_and_matches_torch():
    torch.manual_seed(0)
    ref = torch.nn.Linear(8, 6, dtype=F64)
    mod = tnn.Linear(8, 6, dtype=F64)
    mod.load_state_dict(ref.state_dict())
    for _ in range(3):
        x = torch.randn(2, 5, 8, dtype=F64)
        for m in (ref, mod):
            m.zero_grad()
            m(x).square().sum().backward()
        torch.testing.assert_close(mod.weight.grad, ref.weight.grad)
        torch.testing.assert_close(mod.bias.grad, ref.bias.grad)
    assert _node(mod(x)) == "ViewBackward0"  # the view of torch's addmm output


class NativeBatchNorm(Kernel, BatchNormTrainInterface):
    """A CPU training kernel computing F.batch_norm on the interface's layout (channels_last
    too), declared torch_native as cuDNN's is."""

    devices = {"cpu"}
    channels_last = True
    torch_native = True
    served: list = []

    def __init__(self, call):
        self.call = call

    def forward(self, x, weight, bias, running_mean, running_var):
        NativeBatchNorm.served.append(x.shape)
        x = x.transpose(1, 2) if self.call.channels_last else x
        stats, call = (running_mean, running_var), self.call
        y = F.batch_norm(x, *stats, weight, bias, True, call.momentum, call.eps)
        return y.transpose(1, 2).contiguous() if call.channels_last else y


@pytest.fixture
def native_batch_norm(isolated):
    register_kernel_type(BatchNormFwdOp, "native", NativeBatchNorm)
    NativeBatchNorm.served = []


def _batch_norm_inputs(memory_format=torch.contiguous_format):
    x = torch.randn(4, 3, 5, 2, dtype=F64).to(memory_format=memory_format).requires_grad_()
    return x, _leaf(3), _leaf(3)


def test_batch_norm_served_natively_matches_torch_with_its_running_stats(native_batch_norm):
    op = BatchNormFwdOp(3, momentum=0.2)
    stats = torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64)
    want_stats = tuple(t.clone() for t in stats)
    for _ in range(3):
        x, w, b = _batch_norm_inputs(torch.channels_last)
        y = op(x, w, b, *stats)
        want = F.batch_norm(x, *want_stats, w, b, True, 0.2, 1e-5)
        torch.testing.assert_close(y, want)
        dy = torch.randn_like(y)
        torch.testing.assert_close(
            torch.autograd.grad(y, (x, w, b), dy), torch.autograd.grad(want, (x, w, b), dy)
        )
        torch.testing.assert_close(stats, want_stats)
        assert y.is_contiguous(memory_format=torch.channels_last)
        assert _node(y) == "NativeBatchNormBackward0"
    assert NativeBatchNorm.served == []  # selected, never run


class PlainBatchNorm(NativeBatchNorm):
    """The same computation, not declared torch_native, for (batch, channels, spatial) x only
    (as the TileLang kernels), preferred where both serve."""

    channels_last = False
    torch_native = False
    preferred_over = {"native"}


def test_each_memory_format_keeps_a_lane_of_its_own(native_batch_norm):
    register_kernel_type(BatchNormFwdOp, "plain", PlainBatchNorm)
    op = BatchNormFwdOp(3)
    nodes = [_node(op(*_batch_norm_inputs())) for _ in range(2)]  # "plain": the op's node
    nodes += [_node(op(*_batch_norm_inputs(torch.channels_last))) for _ in range(2)]
    nodes.append(_node(op(*_batch_norm_inputs())))
    native = "NativeBatchNormBackward0"
    assert nodes == ["_EagerOpBackward"] * 2 + [native] * 2 + ["_EagerOpBackward"]
    assert [s[1:] for s in NativeBatchNorm.served] == [(3, 10)] * 3


def test_the_ops_checks_still_run_on_a_native_lane(native_batch_norm, monkeypatch):
    op = BatchNormFwdOp(3)
    op(*_batch_norm_inputs()), op(*_batch_norm_inputs())

    def refusing(self, call):
        raise OpInputError("checked")

    monkeypatch.setattr(BatchNormFwdOp, "check", refusing)
    with pytest.raises(OpInputError, match="checked"):
        op(*_batch_norm_inputs())


def test_torch_native_must_be_a_bool():
    with pytest.raises(KernelDeclarationError, match="torch_native must be True or False"):

        class Bad(Kernel, BatchNormTrainInterface):
            torch_native = "yes"


def test_under_autocast_a_native_lane_checks_the_call_once(native_batch_norm, monkeypatch):
    op, checked = BatchNormFwdOp(3), []
    check = BatchNormFwdOp.check
    monkeypatch.setattr(
        BatchNormFwdOp, "check", lambda self, call: checked.append(check(self, call))
    )
    x, w, b = (t.float() for t in _batch_norm_inputs(torch.channels_last))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        op(x.detach().requires_grad_(), w, b), op(x.detach().requires_grad_(), w, b)
        checked.clear()
        y = op(x.detach().requires_grad_(), w, b)
    assert _node(y) == "NativeBatchNormBackward0" and len(checked) == 1


def test_a_native_lane_serves_plain_calls_where_the_op_has_no_lane(native_batch_norm):
    """BatchNorm keeps state, so it has no lane of its own: without autograd its calls of a
    layout served natively run torch.batch_norm from the third, running stats updated."""
    op = BatchNormFwdOp(3, momentum=0.3)
    stats = torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64)
    want_stats = tuple(t.clone() for t in stats)
    with torch.no_grad():
        for _ in range(3):
            x, w, b = _batch_norm_inputs(torch.channels_last)
            y = op(x, w, b, *stats)
            torch.testing.assert_close(y, F.batch_norm(x, *want_stats, w, b, True, 0.3, 1e-5))
            assert y.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(stats, want_stats)
        assert len(NativeBatchNorm.served) == 2  # the first call settles the op's target
        op(*_batch_norm_inputs(torch.channels_last)[:1])  # another layout: the kernel again
    assert len(NativeBatchNorm.served) == 3


# -- row norms: the lane weighs each autograd call's size (`Op.weighs_backward`) ---------------


class SmallRowsLayerNorm(Kernel, LayerNormInterface):
    """A CPU LayerNorm declared torch_native that serves autograd calls of at most 8 rows, as
    ATen's serves the sizes where the op's node measured slower."""

    devices = {"cpu"}
    torch_native = True
    asked: list = []

    @classmethod
    def refusal(cls, call):
        cls.asked.append((call.grad, call.rows))
        if not call.grad or call.rows > 8:
            return "plain calls and more than 8 rows are the reference's"
        return None

    def __init__(self, call):
        self.eps = call.eps

    def forward(self, x, weight, bias):
        return F.layer_norm(x, x.shape[-1:], weight, bias, self.eps)


class OwnLayerNormBackward(LayerNormRecompute):
    """A backend's backward kernel (not general, not torch's): it leaves native lanes on for
    an op whose forward selection weighs the backward."""

    general = False
    preferred_over = frozenset({"reference_backward"})


@pytest.fixture
def small_rows_layer_norm(isolated):
    register_kernel_type(LayerNormFwdOp, "small_rows", SmallRowsLayerNorm)
    register_kernel_type(LayerNormFwdOp, "own_backward", OwnLayerNormBackward)
    SmallRowsLayerNorm.asked = []


def _layer_norm_inputs(rows):
    return _leaf(rows, 6), _leaf(6), _leaf(6)


def test_autograd_row_norm_calls_take_torch_where_their_size_is_served_natively(
    small_rows_layer_norm,
):
    op = LayerNormFwdOp(6)
    torch_layer_norm = lambda x, w, b: F.layer_norm(x, (6,), w, b)  # noqa: E731
    for _ in range(2):  # the layout's first call, then its lane
        for rows, node in ((3, "NativeLayerNormBackward0"), (8, "NativeLayerNormBackward0"),
                           (9, "_EagerOpBackward")):  # 9 rows: 16 as a power of two  # fmt: skip
            x, w, b = _layer_norm_inputs(rows)
            assert _node(op(x, w, b)) == node
            torch.manual_seed(2)
            got = _gradients(op, x, w, b)
            torch.manual_seed(2)
            torch.testing.assert_close(got, _gradients(torch_layer_norm, x, w, b))


def test_a_row_norm_lane_selects_each_size_once_and_leaves_plain_calls_to_the_op(
    small_rows_layer_norm,
):
    op = LayerNormFwdOp(6)
    for _ in range(3):
        assert _node(op(*_layer_norm_inputs(3))) == "NativeLayerNormBackward0"
        x, w, b = _layer_norm_inputs(3)
        with torch.no_grad():
            y = op(x, w, b)
        assert y.grad_fn is None
        torch.testing.assert_close(y, F.layer_norm(x, (6,), w, b))
    assert [ask for ask in SmallRowsLayerNorm.asked if ask[0]] == [(True, 4)]  # 3 rows: 4
