"""GemmOp's backward kernel: dA and dB through GemmOp in the transposed layouts, dbias as a sum
of dy, no recompute of the forward; gradients against torch's in every layout."""

from __future__ import annotations

import itertools

import pytest
import torch
from op_helpers import randn
from torch import nn

import tileops
from tileops import GemmOp
from tileops import nn as tnn
from tileops.ops import GemmBackward, GemmCall, gemm_gradient_calls

LAYOUTS = list(itertools.product((False, True), (False, True)))
LAYOUT_IDS = ["NN", "NT", "TN", "TT"]
NEEDS = [n for n in itertools.product((False, True), repeat=3) if any(n)]
NAMES = {(False, False): "NN", (False, True): "NT", (True, False): "TN", (True, True): "TT"}


def operands(trans_a, trans_b, m=5, n=7, k=3, dtype=torch.float64, bias=True):
    a = randn(*((k, m) if trans_a else (m, k)), dtype=dtype, seed=1)
    b = randn(*((n, k) if trans_b else (k, n)), dtype=dtype, seed=2)
    return a, b, randn(n, dtype=dtype, seed=3) if bias else None


def torch_product(trans_a, trans_b, a, b, bias):
    y = (a.T if trans_a else a) @ (b.T if trans_b else b)
    return y if bias is None else y + bias


def grads_of(fn, inputs, needs, grad):
    leaves = [None if t is None else t.detach().requires_grad_(need)
              for t, need in zip(inputs, needs, strict=True)]  # fmt: skip
    out = fn(*leaves)
    wanted = [t for t, need in zip(leaves, needs, strict=True) if need and t is not None]
    found = iter(torch.autograd.grad(out, wanted, grad))
    return [next(found) if need and t is not None else None
            for t, need in zip(leaves, needs, strict=True)]  # fmt: skip


def gemm_records(record):
    """(layout, m, n, k) -> calls, of the "gemm" interface, and the backward keys run."""
    gemms, backward = {}, {}
    for served, count in record.counts.items():
        call = served.call
        if served.interface == "gemm":
            gemms[(call.layout, call.m, call.n, call.k)] = count
        else:
            backward[served.key] = backward.get(served.key, 0) + count
    return gemms, backward


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("needs", NEEDS, ids=lambda n: "".join("x" if i else "-" for i in n))
def test_gradients_match_torch_in_float64(layout, needs):
    """Every pattern of needed gradients of a, b and the bias (absent where not needed)."""
    inputs = operands(*layout, bias=needs[2])
    grad = randn(5, 7, dtype=torch.float64, seed=4)
    got = grads_of(GemmOp(*layout), inputs, needs, grad)
    want = grads_of(lambda *t: torch_product(*layout, *t), inputs, needs, grad)
    for g, w, t, need in zip(got, want, inputs, needs, strict=True):
        assert (g is None) == (not need)
        if need:
            assert g.shape == t.shape and g.dtype == t.dtype
            torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_gradients_without_a_bias_match_torch(layout):
    inputs = operands(*layout, bias=False)
    grad = randn(5, 7, dtype=torch.float64, seed=4)
    got = grads_of(GemmOp(*layout), inputs, (True, True, False), grad)
    want = grads_of(lambda *t: torch_product(*layout, *t), inputs, (True, True, False), grad)
    for g, w in zip(got[:2], want[:2], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    assert got[2] is None


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_16_bit_gradients_match_float64(layout):
    """bf16 gradients are accumulated in float32 and rounded once: within bf16's rounding of
    the float64 gradients (k = 64 terms)."""
    inputs = operands(*layout, m=33, n=48, k=64, dtype=torch.bfloat16)
    grad = randn(33, 48, dtype=torch.bfloat16, seed=4)
    got = grads_of(GemmOp(*layout), inputs, (True, True, True), grad)
    wide = [t.double() for t in inputs]
    want = grads_of(lambda *t: torch_product(*layout, *t), wide, (True,) * 3, grad.double())
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g.double(), w, rtol=1.6e-2, atol=1e-2 * w.abs().max().item())


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_gradcheck_through_the_gemm_backward(layout):
    inputs = [t.requires_grad_() for t in operands(*layout)]
    with tileops.record() as record:
        assert torch.autograd.gradcheck(GemmOp(*layout), inputs)
    assert set(gemm_records(record)[1]) == {"reference_backward"}  # never the recompute


@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_the_backward_runs_gemms_in_the_transposed_layouts_and_no_forward(
    layout, bias, monkeypatch
):
    def recompute(*args):
        raise AssertionError("the backward recomputed the forward")

    monkeypatch.setattr(GemmOp, "reference_forward", recompute)
    a, b, bias_ = (None if t is None else t.requires_grad_() for t in operands(*layout, bias=bias))
    forward = GemmCall(device=a.device, m=5, n=7, k=3, dtype=a.dtype, trans_a=layout[0],
                       trans_b=layout[1], has_bias=bias)  # fmt: skip
    with tileops.record() as record:  # the op's node (a record takes no native lane)
        GemmOp(*layout)(a, b, bias_).backward(randn(5, 7, dtype=torch.float64, seed=4))
    gemms, backward = gemm_records(record)
    assert backward == {"reference_backward": 1}
    expected = {(c.layout, c.m, c.n, c.k): 1 for c in gemm_gradient_calls(forward)}
    expected[forward.layout, 5, 7, 3] = expected.get((forward.layout, 5, 7, 3), 0) + 1
    assert gemms == expected
    assert [c.layout for c in gemm_gradient_calls(forward)] == list(EXPECTED_LAYOUTS[NAMES[layout]])


# dA, dB for y = op_a(a) @ op_b(b) (the table GRADIENT_GEMMS encodes, spelled out).
EXPECTED_LAYOUTS = {"NN": ("NT", "TN"), "NT": ("NN", "TN"), "TN": ("NT", "NN"), "TT": ("TT", "TT")}


def test_the_gradient_layouts():
    call = GemmCall(device=torch.device("cpu"), m=5, n=7, k=3, dtype=torch.float32)
    for (ta, tb), name in NAMES.items():
        forward = type(call)(**{**call.__dict__, "trans_a": ta, "trans_b": tb})
        da, db = gemm_gradient_calls(forward)
        assert (da.layout, db.layout) == EXPECTED_LAYOUTS[name]
        assert (da.m, da.n, da.k) == ((3, 5, 7) if ta else (5, 3, 7))  # a's stored shape, k = n
        assert (db.m, db.n, db.k) == ((7, 3, 5) if tb else (3, 7, 5))  # b's stored shape, k = m


@pytest.mark.parametrize(
    "needs,layouts",
    [
        ((True, False, False), ["NN"]),  # Linear's input gradient alone (frozen weights)
        ((False, True, False), ["TN"]),
        ((False, False, True), []),
        ((False, True, True), ["TN"]),
    ],
)
def test_only_the_gradients_needed_are_computed(needs, layouts):
    a, b, c = operands(False, True)
    leaves = [t.requires_grad_(need) for t, need in zip((a, b, c), needs, strict=True)]
    with tileops.record() as record:  # the op's node (a record takes no native lane)
        GemmOp(trans_b=True)(*leaves).sum().backward()
    gemms, backward = gemm_records(record)
    assert backward == {"reference_backward": 1}
    assert sorted(layout for layout, *_ in gemms) == sorted(["NT", *layouts])  # NT: forward
    assert [t.grad is not None for t in leaves] == list(needs)


def test_the_reference_backward_is_the_gemm_backward():
    """GemmBackward is GemmOp's general backward: a backend's backward kernel wins over it."""
    assert GemmOp.kernel_types["reference_backward"] is GemmBackward
    assert GemmBackward.general and GemmBackward.differentiable


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_second_derivatives_flow_through_the_gemms_without_recompute(layout, monkeypatch):
    """Under create_graph the gradients are GemmOp calls through the operator, so autograd
    differentiates them again: d/db of sum(d/da sum((op_a(a) op_b(b) + bias)^2)), as torch's."""

    def recompute(*args):
        raise AssertionError("the backward recomputed the forward")

    monkeypatch.setattr(GemmOp, "reference_forward", recompute)
    inputs = operands(*layout)
    ours = [t.clone().requires_grad_() for t in inputs]
    theirs = [t.clone().requires_grad_() for t in inputs]
    with tileops.record() as record:
        (ga,) = torch.autograd.grad(GemmOp(*layout)(*ours).square().sum(), ours[0],
                                    create_graph=True)  # fmt: skip
        got = torch.autograd.grad(ga.sum(), ours[1:])
    (want_a,) = torch.autograd.grad(torch_product(*layout, *theirs).square().sum(), theirs[0],
                                    create_graph=True)  # fmt: skip
    want = torch.autograd.grad(want_a.sum(), theirs[1:])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    assert set(gemm_records(record)[1]) == {"reference_backward"}


@pytest.mark.parametrize("shape", [(2, 3, 4), (6, 4), (4,)], ids=["3-d", "2-d", "1-d"])
@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
def test_linear_gradients_match_nn_linear(shape, bias):
    theirs = nn.Linear(4, 6, bias=bias, dtype=torch.float64)
    ours = tnn.Linear(4, 6, bias=bias, dtype=torch.float64)
    ours.load_state_dict(theirs.state_dict())
    x = randn(*shape, dtype=torch.float64)
    grad = randn(*shape[:-1], 6, dtype=torch.float64, seed=5)
    xs = x.clone().requires_grad_(), x.clone().requires_grad_()
    with tileops.record() as record:  # the op's node (a record takes no native lane)
        ours(xs[0]).backward(grad)
    theirs(xs[1]).backward(grad)
    torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=1e-12, atol=1e-12)
    for mine, want in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, want.grad, rtol=1e-12, atol=1e-12)
    rows = x.numel() // 4
    gemms, backward = gemm_records(record)
    assert backward == {"reference_backward": 1}  # one backward of one NT GEMM over flattened rows
    assert gemms == {("NT", rows, 6, 4): 1, ("NN", rows, 4, 6): 1, ("TN", 6, 4, rows): 1}


@pytest.mark.parametrize(
    "m,n,k", [(0, 7, 3), (5, 0, 3), (5, 7, 0), (0, 0, 0)], ids=["m=0", "n=0", "k=0", "all 0"]
)
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_zero_sizes(layout, m, n, k):
    inputs = operands(*layout, m=m, n=n, k=k)
    grad = randn(m, n, dtype=torch.float64, seed=4)
    got = grads_of(GemmOp(*layout), inputs, (True,) * 3, grad)
    want = grads_of(lambda *t: torch_product(*layout, *t), inputs, (True,) * 3, grad)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w)


def test_linear_with_no_rows_gives_zero_parameter_gradients():
    linear = tnn.Linear(4, 6, dtype=torch.float64)
    x = torch.empty(2, 0, 4, dtype=torch.float64, requires_grad=True)
    linear(x).sum().backward()
    assert x.grad.shape == (2, 0, 4)
    assert torch.equal(linear.weight.grad, torch.zeros(6, 4, dtype=torch.float64))
    assert torch.equal(linear.bias.grad, torch.zeros(6, dtype=torch.float64))


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_16_bit_gradients_on_the_meta_device(layout):
    a, b, c = (t.to("meta", torch.bfloat16).requires_grad_() for t in operands(*layout))
    with tileops.record() as record:  # the op's node (a record takes no native lane)
        GemmOp(*layout)(a, b, c).sum().backward()
    assert gemm_records(record)[1] == {"reference_backward": 1}
    for t in (a, b, c):
        assert t.grad.shape == t.shape and t.grad.dtype == torch.bfloat16
        assert t.grad.device.type == "meta"


def test_operands_given_as_transposed_views_are_read_in_place():
    """A (k, n) weight passed as W.T to the NN op: the backward's GEMMs read the view as it
    lies (its layout flipped), no copy; the gradient is shaped like the view."""
    a = randn(5, 3, dtype=torch.float64).requires_grad_()
    w = randn(7, 3, dtype=torch.float64, seed=2).requires_grad_()
    y = GemmOp()(a, w.T)
    with tileops.record() as record:
        y.backward(randn(5, 7, dtype=torch.float64, seed=4))
    gemms, _ = gemm_records(record)
    assert sorted(layout for layout, *_ in gemms) == ["NN", "TN"]  # dA's NT reads w as NN
    torch.testing.assert_close(w.grad, (randn(5, 7, dtype=torch.float64, seed=4).T @ a).detach())


def test_compiled_backward_is_two_gemm_nodes_and_a_sum():
    """Traced by AOTAutograd (a symbolic batch), the backward holds GemmOp's NN and TN
    operators and dy's sum: one node each, no recompute of the forward."""
    from torch._functorch.aot_autograd import aot_module_simplified

    graphs = {}

    def constant(arg):  # the layout flags and sum's dims; None for a tensor
        return arg if isinstance(arg, (bool, list)) else None

    def backend(gm, inputs):
        def keep(kind):
            def compiler(graph_module, _):
                graphs[kind] = [
                    (str(n.target), tuple(constant(a) for a in n.args[-2:]))
                    for n in graph_module.graph.nodes
                    if isinstance(n.target, torch._ops.OpOverload) and "view" not in str(n.target)
                ]  # fmt: skip
                return graph_module

            return compiler

        return aot_module_simplified(gm, inputs, fw_compiler=keep("fw"), bw_compiler=keep("bw"))

    linear = tnn.Linear(8, 6, dtype=torch.float64)
    reference = nn.Linear(8, 6, dtype=torch.float64)
    reference.load_state_dict(linear.state_dict())
    compiled = torch.compile(linear, backend=backend, fullgraph=True, dynamic=True)
    for batch in (3, 5):
        x = randn(batch, 4, 8, dtype=torch.float64)
        xs = x.clone().requires_grad_(), x.clone().requires_grad_()
        compiled(xs[0]).sum().backward()
        reference(xs[1]).sum().backward()
        torch.testing.assert_close(xs[0].grad, xs[1].grad)
    torch.testing.assert_close(linear.weight.grad, reference.weight.grad)
    gemm = "tileops.GemmOp.default"
    assert graphs["fw"] == [(gemm, (False, True))]
    assert graphs["bw"] == [
        (gemm, (False, False)),
        (gemm, (True, False)),
        ("aten.sum.dim_IntList", (None, [0])),
    ]
