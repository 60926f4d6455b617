"""Fused linear + cross-entropy: the ops against torch's `F.cross_entropy` on the full logits
in float64 for every option, their gradients, the mean under gradient accumulation and with
every row ignored, torch.compile, autocast, and the errors on bad input."""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import tileops
import tileops.nn as tnn
import tileops.ops
from tileops import (
    CallSpec,
    LinearCrossEntropyFwdOp,
    LinearCrossEntropyGradOp,
    OpConfigError,
    OpInputError,
)
from tileops.ops.linear_cross_entropy import _math, chunk_rows

OPS = [LinearCrossEntropyFwdOp, LinearCrossEntropyGradOp]
REDUCTIONS = ["mean", "sum", "none"]
TOKENS, HIDDEN, VOCAB = 13, 16, 50


def inputs(dtype=torch.float64, *, tokens=TOKENS, bias=True, ignored=(2, 7), seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, HIDDEN, generator=generator).to(dtype)
    weight = (torch.randn(VOCAB, HIDDEN, generator=generator) / 3).to(dtype)
    b = torch.randn(VOCAB, generator=generator).to(dtype) if bias else None
    labels = torch.randint(0, VOCAB, (tokens,), generator=generator)
    labels[[i for i in ignored if i < tokens]] = -100
    return hidden, weight, labels, b


def expected(hidden, weight, labels, bias, reduction, smoothing=0.0, ignore_index=-100):
    logits = F.linear(*(t.double() if t is not None else None for t in (hidden, weight, bias)))
    return F.cross_entropy(
        logits, labels, ignore_index=ignore_index, reduction=reduction, label_smoothing=smoothing
    )


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


# -- the catalogue's conventions ---------------------------------------------------------------


@pytest.mark.parametrize("op_cls", OPS, ids=lambda c: c.__name__)
def test_exported_with_interfaces_call_specs_and_references(op_cls):
    name = op_cls.__name__
    assert getattr(tileops, name) is op_cls and name in tileops.__all__
    assert getattr(tileops.ops, name) is op_cls and name in tileops.ops.__all__
    for interface in op_cls.interfaces.values():
        assert issubclass(interface.call_spec, CallSpec)
        assert "Layout contract" in interface.__doc__
        (reference,) = [k for k in op_cls.kernel_types.values() if issubclass(k, interface)]
        assert reference.general and reference.devices == {"cpu", "meta", "cuda"}
    accepted = [p for p in inspect.signature(op_cls).parameters if p != "target"]
    op = op_cls(label_smoothing=0.1)
    assert list(op.signature.params) == accepted
    assert op.params() == {name: getattr(op, name) for name in accepted}


@pytest.mark.parametrize("op_cls", OPS, ids=lambda c: c.__name__)
def test_sample_cases_run_and_match_the_definition(op_cls):
    for case in op_cls.sample_cases():
        op = op_cls(**case.params)
        got = op(*case.inputs)
        want = op.reference_forward(*case.inputs)
        for g, w in zip(*(r if isinstance(r, tuple) else (r,) for r in (got, want)), strict=True):
            assert g.isfinite().all()
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


# -- the loss ----------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("smoothing", [0.0, 0.25])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("chunk", [None, 1, 4])
def test_loss_matches_cross_entropy_on_full_logits_in_float64(reduction, smoothing, bias, chunk):
    hidden, weight, labels, b = inputs(bias=bias)
    op = LinearCrossEntropyFwdOp(label_smoothing=smoothing, reduction=reduction, chunk_rows=chunk)
    got = op(hidden, weight, labels, b)
    want = expected(hidden, weight, labels, b, reduction, smoothing)
    assert got.dtype == torch.float64 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_16_and_32_bit_inputs_give_a_float32_loss_from_the_rounded_logits(dtype, reduction):
    """As eager `F.cross_entropy(F.linear(h, w).float(), y)`: logits rounded once to the inputs'
    dtype, the log-softmax and the sum in float32."""
    hidden, weight, labels, b = inputs(dtype)
    got = LinearCrossEntropyFwdOp(reduction=reduction, chunk_rows=4)(hidden, weight, labels, b)
    logits = F.linear(hidden, weight, b).double()
    want = F.cross_entropy(logits, labels, reduction=reduction).float()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_other_ignore_index_and_int32_labels():
    hidden, weight, labels, b = inputs()
    labels[labels == -100] = 3
    labels[5] = 3
    op = LinearCrossEntropyFwdOp(ignore_index=3)
    got = op(hidden, weight, labels.int(), b)
    torch.testing.assert_close(got, expected(hidden, weight, labels, b, "mean", ignore_index=3))


def test_every_row_ignored_gives_zero_loss_and_zero_gradients():
    """Not torch's NaN (0 / 0): a micro-batch of padding must not poison the accumulated sum."""
    hidden, weight, labels, b = inputs()
    labels[:] = -100
    h, w, bb = leaves(hidden, weight, b)
    loss = tnn.linear_cross_entropy(h, w, labels, bb)
    assert loss.item() == 0.0
    loss.backward()
    for t in (h, w, bb):
        assert t.grad.abs().max().item() == 0.0
    empty = LinearCrossEntropyFwdOp()(hidden[:0], weight, labels[:0], b)
    assert empty.shape == () and empty.item() == 0.0
    h, w, bb = leaves(hidden[:0], torch.full_like(weight, float("nan")), b)
    tnn.linear_cross_entropy(h, w, labels[:0], bb, reduction="sum").backward()
    assert w.grad.abs().max().item() == 0.0 and w.grad.shape == weight.shape  # no token, no chunk


def test_a_label_out_of_range_on_the_host_is_refused_by_name():
    hidden, weight, labels, b = inputs()
    labels[4] = VOCAB
    with pytest.raises(OpInputError, match=r"argument 'labels' holds 50, outside \[0, 50\)"):
        LinearCrossEntropyFwdOp()(hidden, weight, labels, b)


def test_the_row_step_gives_nan_for_a_label_out_of_range_never_a_number():
    """What a GPU kernel does where the host check would need a sync."""
    logits = torch.randn(3, 5, dtype=torch.float64)
    labels = torch.tensor([1, 9, -100])
    losses = torch.empty(3, dtype=torch.float64)
    scales = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)  # ignored rows: 0 (row_scales)
    _math.torch_step(-100, 0.0)(logits, labels, scales, losses)
    assert losses[0].isfinite() and losses[1].isnan() and losses[2] == 0
    assert logits[1].isnan().all() and (logits[2] == 0).all()


# -- gradients ---------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("route", ["operator", "nn"])
def test_gradients_of_hidden_weight_and_bias_match_torch(reduction, smoothing, bias, route):
    """Through the op's operator (backward: the grad op re-running the chunks) and through
    tileops.nn (the gradients kept from the forward, scaled in the backward)."""
    hidden, weight, labels, b = inputs(bias=bias)
    h, w, bb = leaves(hidden, weight, b)
    if route == "operator":
        op = LinearCrossEntropyFwdOp(label_smoothing=smoothing, reduction=reduction, chunk_rows=3)
        got = op(h, w, labels, bb)
    else:
        got = tnn.linear_cross_entropy(
            h, w, labels, bb, label_smoothing=smoothing, reduction=reduction, chunk_rows=3
        )
    eh, ew, eb = leaves(hidden, weight, b)
    want = expected(eh, ew, labels, eb, reduction, smoothing)
    grad = torch.rand_like(want) + 0.5
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    wanted = [t for t in (h, w, bb) if t is not None]
    found = torch.autograd.grad(got, wanted, grad)
    references = torch.autograd.grad(want, [t for t in (eh, ew, eb) if t is not None], grad)
    for f, r in zip(found, references, strict=True):
        torch.testing.assert_close(f, r, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck_in_float64(reduction):
    generator = torch.Generator().manual_seed(0)
    h, w, b = (
        torch.randn(s, generator=generator, dtype=torch.float64) for s in [(3, 4), (6, 4), (6,)]
    )
    labels = torch.tensor([2, -100, 5])
    op = LinearCrossEntropyFwdOp(reduction=reduction, label_smoothing=0.1, chunk_rows=2)

    def f(hidden, weight, bias):
        return op(hidden, weight, labels, bias)

    assert torch.autograd.gradcheck(f, tuple(leaves(h, w, b)))
    if reduction == "none":  # double backward: through the grad op's own backward
        assert torch.autograd.gradgradcheck(f, tuple(leaves(h, w, b)))


def test_grad_op_returns_the_gradients_for_the_given_gradient_of_the_loss():
    hidden, weight, labels, b = inputs()
    grad = torch.rand(TOKENS, dtype=torch.float64)
    loss, gh, gw, gb = LinearCrossEntropyGradOp(reduction="none", chunk_rows=5)(
        grad, hidden, weight, labels, b
    )
    eh, ew, eb = leaves(hidden, weight, b)
    want = expected(eh, ew, labels, eb, "none")
    torch.testing.assert_close(loss, want.detach())
    for f, r in zip((gh, gw, gb), torch.autograd.grad(want, (eh, ew, eb), grad), strict=True):
        torch.testing.assert_close(f, r)
    _, _, _, no_bias = LinearCrossEntropyGradOp()(torch.ones((), dtype=torch.float64),
                                                  hidden, weight, labels)  # fmt: skip
    assert no_bias.shape == (VOCAB,) and (no_bias == 0).all()


def test_a_second_backward_through_the_stored_gradients_is_refused():
    hidden, weight, labels, b = inputs()
    h, w = leaves(hidden, weight)
    loss = tnn.linear_cross_entropy(h, w, labels)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match=r"backward through this loss ran twice"):
        loss.backward()


def test_only_one_chunk_of_logits_exists_at_a_time(monkeypatch):
    seen = []
    step = _math.torch_step

    def spying(*args):
        inner = step(*args)

        def spy(logits, *rest):
            seen.append(tuple(logits.shape))
            return inner(logits, *rest)

        return spy

    monkeypatch.setattr(tileops.ops.linear_cross_entropy.op, "torch_step", spying)
    hidden, weight, labels, b = inputs(tokens=20)
    h, w = leaves(hidden, weight)
    tnn.linear_cross_entropy(h, w, labels, chunk_rows=8).backward()
    assert seen == [(8, VOCAB), (8, VOCAB), (4, VOCAB)]


def test_the_default_chunk_keeps_the_logits_block_in_its_memory_budget():
    assert chunk_rows(128256, 2) == 512  # 512 x 128256 bf16 logits: 125 MiB of 128
    assert chunk_rows(128256, 4) == 256
    assert chunk_rows(10**9, 4) == 1
    call = LinearCrossEntropyFwdOp().call_for(*inputs(torch.bfloat16)[:2], None)
    assert call.chunk * VOCAB * 2 <= _math.CHUNK_BYTES and call.chunk >= 2**16


# -- the mean under gradient accumulation and torch.compile -------------------------------------


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_four_micro_batches_with_the_normalizer_add_up_to_the_big_batch(smoothing):
    """Liger-Kernel#802: each micro-batch's mean divided by its own count is not the big
    batch's mean; divided by the big batch's count (transformers' num_items_in_batch) it is."""
    hidden, weight, labels, b = inputs(tokens=32, ignored=(0, 1, 2, 3, 4, 5, 9, 17))
    h, w, bb = leaves(hidden, weight, b)
    big = tnn.linear_cross_entropy(h, w, labels, bb, label_smoothing=smoothing)
    big.backward()
    count = (labels != -100).sum()
    mh, mw, mb = leaves(hidden, weight, b)
    total = 0.0
    for part in range(4):
        rows = slice(8 * part, 8 * part + 8)
        loss = tnn.linear_cross_entropy(
            mh[rows], mw, labels[rows], mb, label_smoothing=smoothing, normalizer=count
        )
        loss.backward()
        total = total + loss.detach()
    torch.testing.assert_close(total, big.detach())
    for accumulated, once in ((mh, h), (mw, w), (mb, bb)):
        torch.testing.assert_close(accumulated.grad, once.grad)
    float_count = tnn.linear_cross_entropy(
        hidden, weight, labels, b, label_smoothing=smoothing, normalizer=float(count)
    )
    torch.testing.assert_close(float_count, big.detach())


@pytest.mark.parametrize("chunk", [None, 4])
def test_compiled_fullgraph_with_ignored_rows_matches_eager_and_never_gives_nan(chunk):
    """Liger-Kernel#1338: one graph serves batches with some or all rows ignored, and the
    loss of a batch with every row ignored is 0, its gradients zeros (the full logits traced,
    and the chunks)."""
    torch._dynamo.reset()
    hidden, weight, labels, b = inputs()

    def loss_of(h, w, y, bias):
        return tnn.linear_cross_entropy(h, w, y, bias, label_smoothing=0.1, chunk_rows=chunk) * 2

    compiled = torch.compile(loss_of, fullgraph=True, backend="aot_eager")
    for k, batch in enumerate((labels, torch.full_like(labels, -100))):
        got, want = leaves(hidden, weight, b), leaves(hidden, weight, b)
        with torch._dynamo.config.patch(error_on_recompile=k > 0):
            loss = compiled(got[0], got[1], batch, got[2])
        loss.backward()
        ref = loss_of(want[0], want[1], batch, want[2])
        ref.backward()
        assert loss.isfinite()
        torch.testing.assert_close(loss, ref)
        for g, r in zip(got, want, strict=True):
            torch.testing.assert_close(g.grad, r.grad)
    assert loss.item() == 0.0


@pytest.mark.parametrize("chunk", [None, 4])
def test_compiled_loss_traces_torchs_ops_unless_chunk_rows_are_given(chunk):
    torch._dynamo.reset()
    hidden, weight, labels, b = inputs()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm

    loss = torch.compile(tnn.linear_cross_entropy, backend=backend, fullgraph=True)
    loss(hidden, weight, labels, b, chunk_rows=chunk)
    ours = {t for t in graphs[0] if "tileops" in t}
    assert (ours == set()) if chunk is None else len(ours) == 1
    labels[0] = VOCAB  # out of range: NaN as the op's device kernels give, or the op's refusal
    if chunk is None:
        assert loss(hidden, weight, labels, b).isnan()
    else:
        with pytest.raises(OpInputError, match="argument 'labels' holds 50, outside"):
            loss(hidden, weight, labels, b, chunk_rows=chunk)


def test_a_gradient_of_one_leaves_the_kept_gradients_unscaled():
    """loss.backward() spares the pass over the weight's gradient; any other gradient scales."""
    hidden, weight, labels, b = inputs()

    class Muls(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Muls.count += func is torch.ops.aten.mul_.Tensor
            return func(*args, **(kwargs or {}))

    for scale, muls in ((1.0, 0), (3.0, 3)):
        got, want = leaves(hidden, weight, b), leaves(hidden, weight, b)
        loss = tnn.linear_cross_entropy(*got[:2], labels, got[2])
        Muls.count = 0
        with Muls():
            (loss * scale).backward()
        (expected(want[0], want[1], labels, want[2], "mean") * scale).backward()
        assert Muls.count == muls
        for g, r in zip(got, want, strict=True):
            torch.testing.assert_close(g.grad, r.grad)
    # a gradient that is differentiated itself is applied, even when it is 1
    scale, got = torch.ones((), dtype=hidden.dtype, requires_grad=True), leaves(hidden, weight, b)
    loss = tnn.linear_cross_entropy(*got[:2], labels, got[2])
    (loss * scale).backward(create_graph=True)
    (grad_scale,) = torch.autograd.grad(got[1].grad.sum(), scale)
    torch.testing.assert_close(grad_scale, got[1].grad.sum().detach())


def test_compiled_reduction_none_and_the_op_trace_to_one_node_each():
    torch._dynamo.reset()
    hidden, weight, labels, b = inputs()
    op = LinearCrossEntropyFwdOp(reduction="none")
    compiled = torch.compile(lambda *t: op(*t).sum(), fullgraph=True, backend="aot_eager")
    got, want = leaves(hidden, weight, b), leaves(hidden, weight, b)
    compiled(got[0], got[1], labels, got[2]).backward()
    expected(want[0], want[1], labels, want[2], "none").sum().backward()
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g.grad, r.grad)


# -- autocast ----------------------------------------------------------------------------------


def test_under_autocast_the_matmuls_run_in_its_dtype_and_the_loss_in_float32():
    hidden, weight, labels, b = inputs(torch.float32)
    h, w = leaves(hidden, weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = tnn.linear_cross_entropy(h, w, labels)
        direct = LinearCrossEntropyFwdOp()(hidden, weight, labels)
    logits = F.linear(hidden.bfloat16(), weight.bfloat16()).double()
    want = F.cross_entropy(logits, labels).float()
    assert loss.dtype == torch.float32 and direct.dtype == torch.float32
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(direct, want)
    loss.backward()
    assert h.grad.dtype == torch.float32 and w.grad.dtype == torch.float32


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params, message",
    [
        ({"reduction": "avg"}, r"'reduction' must be one of 'mean', 'sum', 'none', got 'avg'"),
        ({"label_smoothing": 1.5}, r"'label_smoothing' must be a float in \[0, 1\], got 1.5"),
        ({"chunk_rows": 0}, r"'chunk_rows' must be an int >= 1 or None"),
        ({"ignore_index": 1.5}, r"'ignore_index' must be an int"),
    ],
)
def test_bad_params_are_refused_by_name(params, message):
    with pytest.raises(OpConfigError, match=message):
        LinearCrossEntropyFwdOp(**params)
    with pytest.raises(OpConfigError, match=message):
        tnn.LinearCrossEntropyLoss(**params)


def test_bad_inputs_are_refused_by_name():
    hidden, weight, labels, b = inputs()
    op = LinearCrossEntropyFwdOp()
    cases = [
        ((hidden, weight[:, :8], labels, b), r"argument 'weight' has shape \[50, 8\]"),
        ((hidden, weight, labels[:5], b), r"argument 'labels' has shape \[5\]"),
        ((hidden, weight, labels.float(), b), r"argument 'labels' has dtype float32"),
        ((hidden, weight.float(), labels, b), r"argument 'weight' has dtype float32"),
        ((hidden, weight, labels, b[:3]), r"argument 'bias' has shape \[3\]"),
        ((hidden, weight[:0], labels, b[:0]), r"argument 'weight' has shape \[0, 16\]: no classes"),
    ]
    for args, message in cases:
        with pytest.raises(OpInputError, match=message):
            op(*args)
    name = r"tileops\.nn\.linear_cross_entropy\(\)"
    shapes = r": argument 'target' has shape \[13\], expected \[2, 13\]"
    with pytest.raises(OpInputError, match=name + shapes):
        tnn.linear_cross_entropy(hidden.view(2, 13, 8), weight[:, :8], labels)
    with pytest.raises(OpInputError, match=name + r": argument 'normalizer' must hold one number"):
        tnn.linear_cross_entropy(hidden, weight, labels, normalizer=torch.ones(2))
    with pytest.raises(OpInputError, match=name + r": argument 'normalizer' must be a number"):
        tnn.linear_cross_entropy(hidden, weight, labels, normalizer="8")
    with pytest.raises(OpInputError, match=r"argument 'labels' requires grad|'labels'"):
        op(*leaves(hidden, weight), labels.double().requires_grad_(), b)


def test_the_module_flattens_leading_dims_and_keeps_them_for_none():
    hidden, weight, labels, b = inputs(tokens=12)
    loss = tnn.LinearCrossEntropyLoss(reduction="none")
    got = loss(hidden.view(3, 4, HIDDEN), weight, labels.view(3, 4), b)
    assert got.shape == (3, 4)
    torch.testing.assert_close(got.view(-1), expected(hidden, weight, labels, b, "none"))
    assert "reduction='none'" in repr(loss)


@pytest.mark.parametrize(
    "reduction, smoothing", list(itertools.product(["mean", "sum"], [0.0, 0.3]))
)
def test_the_module_matches_cross_entropy_loss(reduction, smoothing):
    hidden, weight, labels, b = inputs()
    ours = tnn.LinearCrossEntropyLoss(reduction=reduction, label_smoothing=smoothing)
    theirs = torch.nn.CrossEntropyLoss(reduction=reduction, label_smoothing=smoothing)
    torch.testing.assert_close(
        ours(hidden, weight, labels, b), theirs(F.linear(hidden, weight, b), labels)
    )
