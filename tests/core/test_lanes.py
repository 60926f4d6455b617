"""Lanes (`Op.lane_for`): once a call of an input layout ran `forward` on the op's settled
kernels (its second call: the first settles the target), later plain calls of that layout run
its kernel directly; pins, records and other layouts still take `forward`."""

from __future__ import annotations

import pytest
import torch
from op_helpers import Doubling
from torch.overrides import TorchFunctionMode

import tileops
from tileops.backend import register_kernel_type
from tileops.kernel import Kernel
from tileops.ops import (
    GemmOp,
    GLUFwdOp,
    GLUInterface,
    RMSNormFwdOp,
    RMSNormInterface,
)


def _refusing_forward(monkeypatch, op_cls: type) -> list:
    """From now on `op_cls.forward` records each call (and still runs)."""
    calls, forward = [], op_cls.forward

    def counted(self, *args):
        calls.append(args)
        return forward(self, *args)

    monkeypatch.setattr(op_cls, "forward", counted)
    return calls


def test_the_second_call_of_a_layout_runs_its_kernel_without_forward(monkeypatch):
    op, x, w = RMSNormFwdOp(8), torch.randn(3, 4, 8), torch.randn(8)
    first = op(x, w), op(x, w)
    calls = _refusing_forward(monkeypatch, RMSNormFwdOp)
    y = torch.randn(3, 4, 8)
    torch.testing.assert_close(op(y, w), torch.rms_norm(y, (8,), w))
    assert calls == [] and first[1].shape == (3, 4, 8)
    op(torch.randn(5, 8), w)  # another layout: forward once, then its own lane
    op(torch.randn(5, 8), w)
    assert len(calls) == 1


@pytest.fixture
def doubling(isolated):
    register_kernel_type(GemmOp, "doubling", Doubling)
    Doubling.served = []


def test_a_record_or_a_pin_sees_every_call_a_lane_would_have_served(doubling, monkeypatch):
    op, a, b = GemmOp(), torch.randn(2, 3), torch.randn(3, 4)
    op(a, b), op(a, b)
    calls = _refusing_forward(monkeypatch, GemmOp)
    with tileops.pinned(GemmOp, "gemm", "reference"):
        torch.testing.assert_close(op(a, b), a @ b)
    with tileops.record() as record:
        op(a, b)
    assert len(calls) == 2 and sum(record.counts.values()) == 1 and len(Doubling.served) == 3
    torch.testing.assert_close(op(a, b), 2 * (a @ b))  # no scope left: the lane again
    assert len(calls) == 2 and len(Doubling.served) == 4


def test_a_gemm_lane_hands_strided_operands_to_forward(doubling):
    op, a, b = GemmOp(), torch.randn(4, 6), torch.randn(6, 5)
    op(a, b), op(a, b)
    strided = torch.randn(6, 4).t()  # a's shape, not contiguous: forward reads it transposed
    torch.testing.assert_close(op(strided, b), 2 * (strided @ b))
    torch.testing.assert_close(op(a, b), 2 * (a @ b))


def test_flipping_determinism_leaves_the_lane_until_forward_ran_again(monkeypatch):
    op, x = RMSNormFwdOp(8), torch.randn(2, 8)
    op(x, None), op(x, None)
    calls = _refusing_forward(monkeypatch, RMSNormFwdOp)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(not before)  # re-points the op's hit cache
        op(x, None)
        op(x, None)
    finally:
        torch.use_deterministic_algorithms(before)
    assert len(calls) == 1


@pytest.mark.parametrize("requires_grad", [True, False])
def test_a_call_needing_a_gradient_runs_the_lane_inside_its_autograd_node(
    monkeypatch, requires_grad
):
    op, w = RMSNormFwdOp(8), torch.randn(8, dtype=torch.float64)
    for _ in range(2):
        op(torch.randn(2, 8, dtype=torch.float64, requires_grad=requires_grad), w)
    calls = _refusing_forward(monkeypatch, RMSNormFwdOp)
    x = torch.randn(2, 8, dtype=torch.float64, requires_grad=requires_grad)
    y = op(x, w)
    assert calls == [] and (y.grad_fn is not None) == requires_grad
    if requires_grad:
        assert torch.autograd.gradcheck(lambda x: op(x, w), (x,))


def test_a_seen_layouts_plain_call_reaches_its_lane_without_building_the_call(monkeypatch):
    """Parameters that require grad, called without grad (inference), take the lane too; with
    grad on, the call is built and runs as one autograd node."""
    from tileops.signature import Signature

    op = RMSNormFwdOp(8)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 8, dtype=torch.float64)
    with torch.no_grad():
        op(x, w), op(x, w)
    built, bound = [], Signature.bound
    monkeypatch.setattr(
        Signature, "bound", lambda self, *args: built.append(args) or bound(self, *args)
    )
    forwards = _refusing_forward(monkeypatch, RMSNormFwdOp)
    with torch.no_grad():
        y = op(x, w)
    torch.testing.assert_close(y, torch.rms_norm(x, (8,), w))
    assert built == [] and forwards == []
    assert op(x, w).grad_fn is not None and len(built) == 1
    op(x, None)  # a new layout: built and checked
    assert len(built) == 2


def test_a_backward_call_spec_is_built_once_per_combination_of_its_facts():
    from tileops.backward import backward_call

    op, x, w, dy = RMSNormFwdOp(8), torch.randn(2, 8), torch.randn(8), torch.randn(2, 8)
    first = backward_call(op, (dy,), (x, w), (), (True, True), False)
    again = backward_call(op, (dy,), (torch.randn(2, 8), w), (), (True, True), False)
    assert again is first and first.n == 8 and first.needs == (True, True)
    other = backward_call(op, (dy,), (x, w), (), (True, False), False)
    assert other is not first and other.needs == (True, False)
    strided = backward_call(op, (dy,), (torch.randn(8, 2).t(), w), (), (True, True), False)
    assert strided is not first and not strided.contiguous and first.contiguous


def test_a_backward_built_under_a_withdrawn_kernel_does_not_keep_serving_it():
    """GEMM's backward holds GemmOps of its own: built per registry generation, as every op."""
    from tileops.testing import isolated_registry

    a, b = torch.randn(2, 3, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    with isolated_registry():
        register_kernel_type(GemmOp, "doubling", Doubling)
        (doubled,) = torch.autograd.grad(GemmOp()(a, b).sum(), b)
    (db,) = torch.autograd.grad(GemmOp()(a, b).sum(), b)
    torch.testing.assert_close(doubled, 2 * db)
    torch.testing.assert_close(db, a.detach().t() @ torch.ones(2, 4))


def test_calls_leaving_out_different_inputs_keep_verdicts_and_lanes_of_their_own():
    """The layout key skips inputs left out and says which: (x, w, None) and (x, None, b) of
    one shape are two layouts."""
    from tileops.ops import LayerNormFwdOp

    op, x, t = LayerNormFwdOp(8), torch.randn(2, 8), torch.randn(8) + 2
    keys = {op.signature._layout_key(v) for v in ((x, t, None), (x, None, t), (x, None, None))}
    assert len(keys) == 3
    for _ in range(2):
        torch.testing.assert_close(op(x, t, None), torch.layer_norm(x, (8,), t, None))
        torch.testing.assert_close(op(x, None, t), torch.layer_norm(x, (8,), None, t))
        torch.testing.assert_close(op(x), torch.layer_norm(x, (8,)))


def test_inputs_left_out_beside_contiguity_keyed_ones_keep_keys_of_their_own():
    """BatchNorm keys x's and the running stats' contiguity (written in place); its affine
    params left out or given, and x's strides, make layouts of their own, each key made
    without falling back to the per-input form."""
    from tileops.ops import BatchNormFwdOp

    signature = BatchNormFwdOp(8, training=True).signature
    x, stats, w = torch.randn(4, 8, 3, 3), (torch.zeros(8), torch.ones(8)), torch.ones(8)
    strided = x.transpose(2, 3)
    calls = [(x, None, None, *stats), (x, w, None, *stats), (x, None, w, *stats)]
    calls.append((strided, None, None, *stats))
    keys = [signature._layout_key(call) for call in calls]
    assert len(set(keys)) == 4
    keyed = len(signature._keyed_at)
    for call, key in zip(calls, keys, strict=True):  # per input None or its facts, then flags
        assert len(key) == len(call) + keyed
        assert [facts is None for facts in key[: len(call)]] == [v is None for v in call]
        assert all(type(flag) is bool for flag in key[len(call) :])


def test_glu_and_rotary_calls_of_a_seen_layout_run_their_kernel_without_forward(monkeypatch):
    from tileops.ops import GLUFwdOp, RotaryFwdOp
    from tileops.ops.fused.glu import glu
    from tileops.ops.fused.rotary import rotary_pair

    glu_op, rotary_op = GLUFwdOp("silu"), RotaryFwdOp(2)
    gate, up = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    q, k, cos, sin = (torch.randn(s) for s in ((1, 5, 4, 8), (1, 5, 2, 8), (1, 5, 6), (1, 5, 6)))
    for _ in range(2):
        glu_op(gate, up), rotary_op(q, k, cos, sin)
    glu_calls = _refusing_forward(monkeypatch, GLUFwdOp)
    rotary_calls = _refusing_forward(monkeypatch, RotaryFwdOp)
    packed = torch.randn(3, 2, 32)  # the same layout's facts: strides are not among them
    torch.testing.assert_close(glu_op(packed[..., :16], packed[..., 16:]),
                               glu("silu", packed[..., :16], packed[..., 16:]))  # fmt: skip
    q = torch.randn(1, 5, 4, 8)
    for got, want in zip(rotary_op(q, k, cos, sin), rotary_pair(q, k, cos, sin, 2), strict=True):
        torch.testing.assert_close(got, want)
    assert glu_calls == [] and rotary_calls == []


def test_a_layout_check_runs_once_per_layout_and_on_every_refused_call(monkeypatch):
    from tileops.errors import OpInputError
    from tileops.ops import RotaryFwdOp

    checks, check = [], RotaryFwdOp.check
    monkeypatch.setattr(
        RotaryFwdOp, "check", lambda self, call: checks.append(1) or check(self, call)
    )
    op = RotaryFwdOp()
    q, k, cos = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 5, 8)
    for _ in range(3):
        op(q, k, cos, cos)
    assert len(checks) == 1
    for _ in range(2):
        with pytest.raises(OpInputError, match=r"'cos' has 7 rotary dims, expected an even"):
            op(q, k, torch.randn(1, 5, 7), torch.randn(1, 5, 7))
    assert len(checks) == 3
    op(torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), cos, cos)  # a new layout: checked
    assert len(checks) == 4


class RecordingRows(Kernel):
    """A CPU kernel (preferred over the reference) that checks the layout its interface
    promises and records the storage and shape of what it gets."""

    devices = {"cpu"}
    got: list = []

    def record(self, x, contiguous=True):
        assert x.dim() == 2 and (x.is_contiguous() or not contiguous and x.stride(1) == 1)
        RecordingRows.got.append((x.data_ptr(), x.shape))


class RecordingRMSNorm(RecordingRows, RMSNormInterface):
    def forward(self, x, weight):
        self.record(x)
        return torch.rms_norm(x, (x.shape[1],), weight)


class RecordingGLU(RecordingRows, GLUInterface):
    def forward(self, gate, up):
        self.record(gate, contiguous=False)  # any row stride: a packed input's half
        return torch.nn.functional.silu(gate) * up


@pytest.fixture
def recording_rows(isolated):
    register_kernel_type(RMSNormFwdOp, "recording", RecordingRMSNorm)
    register_kernel_type(GLUFwdOp, "recording", RecordingGLU)
    RecordingRows.got = []


@pytest.mark.parametrize(
    ("normalized", "shape"), [(8, (2, 8)), (8, (3, 4, 8)), ((2, 4), (2, 2, 4)), (8, (8,))]
)
def test_a_row_lane_hands_contiguous_inputs_over_as_views_and_copies_strided_ones(
    recording_rows, normalized, shape
):
    """Contiguous x of a seen layout reaches the kernel without a copy (its (rows, n) view);
    the output has x's shape and is no view, so it can be modified in place after a call
    under no_grad; x of that shape with other strides reaches it as a copy."""
    op, w = RMSNormFwdOp(normalized), torch.randn(normalized)
    dims = tuple(range(len(shape)))
    for _ in range(2):
        op(torch.randn(shape), w)
    x, strided = torch.randn(shape), torch.randn(shape[::-1]).permute(dims[::-1])
    with torch.no_grad():
        y = op(x, w)
    assert RecordingRows.got[-1][0] == x.data_ptr() and y.shape == x.shape and not y._is_view()
    y.mul_(torch.ones(shape, requires_grad=True))  # raises for a view made under no_grad
    torch.testing.assert_close(y.detach(), torch.rms_norm(x, w.shape, w))
    if strided.is_contiguous():
        return
    torch.testing.assert_close(op(strided, w), torch.rms_norm(strided, w.shape, w))
    assert RecordingRows.got[-1][0] != strided.data_ptr()


def test_a_glu_lane_hands_both_contiguous_inputs_over_as_views(recording_rows):
    op, gate, up = GLUFwdOp("silu"), torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    op(gate, up), op(gate, up)
    RecordingRows.got = []
    out = op(gate, up)
    assert RecordingRows.got == [(gate.data_ptr(), (6, 16))] and out.shape == gate.shape
    torch.testing.assert_close(out, torch.nn.functional.silu(gate) * up)
    packed = torch.randn(2, 3, 32)  # the same layout's facts, halves with a row stride of 32
    torch.testing.assert_close(
        op(packed[..., :16], packed[..., 16:]),
        torch.nn.functional.silu(packed[..., :16]) * packed[..., 16:],
    )


class _TorchCalls(TorchFunctionMode):
    """The torch functions and methods called inside it, attribute reads left out."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", repr(func))
        if name != "__get__":
            self.names.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("shape", "lane_calls"),
    [((4, 8), ["is_contiguous", "is_contiguous"]), ((3, 4, 8), ["is_contiguous"] * 2 + ["view"])],
)
def test_a_row_lane_asks_torch_for_the_contiguity_checks_and_its_views_alone(shape, lane_calls):
    """The layout key fixes the shapes, so the lane neither asks for dims nor copies: one
    (rows, n) view of x and one of the output back, for x of more than two dims."""
    op, w = RMSNormFwdOp(8), torch.randn(8)
    for _ in range(2):
        op(torch.randn(shape), w)
    x = torch.randn(shape)
    with _TorchCalls() as calls:
        op(x, w)  # the reference kernel calls torch.rms_norm
    assert calls.names == [*lane_calls, "rms_norm", *lane_calls[2:]]


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("batch", [1, 2])
def test_a_rotary_lane_expands_only_tables_of_another_shape(unsqueeze_dim, batch):
    """transformers passes (1, seq, rot) tables: the interface takes (batch, seq, rot), so
    the lane expands them for batches over 1 and hands batch 1's over as they are."""
    from tileops.ops import RotaryFwdOp
    from tileops.ops.fused.rotary import rotary_pair

    op = RotaryFwdOp(unsqueeze_dim)
    heads = (4, 2) if unsqueeze_dim == 1 else (3, 1)
    q, k = (torch.randn(batch, *((h, 3) if unsqueeze_dim == 1 else (3, h)), 8) for h in heads)
    cos, sin = torch.randn(1, 3, 6), torch.randn(1, 3, 6)
    for _ in range(2):
        op(q, k, cos, sin)
    with _TorchCalls() as calls:
        got = op(q, k, cos, sin)
    for found, want in zip(got, rotary_pair(q, k, cos, sin, unsqueeze_dim), strict=True):
        torch.testing.assert_close(found, want)
        assert found.is_contiguous()
    assert calls.names.count("expand") == (2 if batch > 1 else 0)


def _linear_calls(layer, x, grad=False):
    """The torch calls of `layer(x)` made after two calls of x's layout, and its output."""
    with torch.set_grad_enabled(grad):
        for _ in range(2):
            layer(x)
        with _TorchCalls() as calls:
            out = layer(x)
    return [n for n in calls.names if n not in ("is_contiguous", "dim")], out


def test_a_linear_layout_served_by_f_linears_product_runs_f_linear_from_its_second_call():
    """The GEMM reference is torch_native (torch.mm / addmm, F.linear's product): no-grad
    calls of a seen layout run F.linear itself, neither flattened nor dispatched; calls
    needing a gradient and a record's calls take the op."""
    from tileops.nn import Linear

    layer, x = Linear(8, 4), torch.randn(2, 3, 8)
    names, out = _linear_calls(layer, x)
    assert names == ["linear"]
    torch.testing.assert_close(out, torch.nn.functional.linear(x, layer.weight, layer.bias))
    names, out = _linear_calls(layer, x, grad=True)
    assert "flatten" in names and out.grad_fn is not None
    with torch.no_grad(), tileops.record() as record:
        layer(x)
    assert sum(record.counts.values()) == 1


def test_a_linear_layout_served_by_another_kernel_keeps_taking_the_op(doubling, shared_ops):
    """Doubling is not torch_native: every call reaches it, as does a pinned one's."""
    from tileops.nn import Linear

    layer, x = Linear(8, 4, bias=False), torch.randn(2, 3, 8)
    names, out = _linear_calls(layer, x)
    assert "linear" not in names and len(Doubling.served) == 3
    torch.testing.assert_close(out, 2 * torch.nn.functional.linear(x, layer.weight))
    with tileops.pinned(GemmOp, "gemm", "reference"), torch.no_grad():
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight))


def test_linear_through_a_gemm_of_another_layout_or_a_0_d_x_is_refused():
    from tileops.errors import OpInputError
    from tileops.ops import GemmFwdOp

    x, w = torch.randn(2, 3, 8), torch.randn(4, 8)
    with pytest.raises(OpInputError, match=r"trans_b=True and trans_a=False \(this one: tr"):
        GemmOp().linear(x, w)
    with pytest.raises(OpInputError, match="an x of at least 1 dim"):
        GemmOp(trans_b=True).linear(torch.randn(()), w)
    torch.testing.assert_close(GemmFwdOp().linear(x, w), torch.nn.functional.linear(x, w))
