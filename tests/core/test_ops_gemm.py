"""GemmOp against op(a) @ op(b) (+ bias), in every layout."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from op_helpers import (
    DTYPE_IDS,
    DTYPES,
    assert_matches,
    assert_reference_chosen,
    forbid_kernels,
    install_spy,
    randn,
    strided,
)

from tileops import GemmOp, OpConfigError, OpInputError
from tileops.ops import GemmCall
from tileops.testing import isolated_registry

SIZES = [(1, 1, 1), (3, 5, 7), (16, 64, 8), (33, 17, 65), (2, 300, 3)]
LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]
LAYOUT_IDS = ["NN", "NT", "TN", "TT"]


def tolerance(dtype: torch.dtype, k: int) -> dict[str, float]:
    """Rounding of torch's own 16-bit path grows with k; ours rounds once."""
    scale = max(1.0, k**0.5 / 4)
    base = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
    base = base[dtype]
    return {"rtol": base * scale, "atol": base * scale}


def stored(t: torch.Tensor, trans: bool) -> torch.Tensor:
    """`t` as a transposed operand is stored: its transpose, contiguous."""
    return t.t().contiguous() if trans else t


def spied_call(layout: tuple[bool, bool], *inputs: torch.Tensor) -> tuple[tuple, GemmCall]:
    """What `GemmOp(*layout)` hands its kernel for `inputs`, and the call spec it asks with."""
    log, calls = [], []
    with isolated_registry():
        install_spy(GemmOp, "gemm", log)
        op = GemmOp(*layout)
        kernel_for = op.kernel_for
        op.kernel_for = lambda interface, call: calls.append(call) or kernel_for(interface, call)
        out = op(*inputs)
    assert_matches(out, op.reference_forward(*inputs))
    (args,) = log
    return args, calls[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("m, k, n", SIZES)
def test_matches_torch(m, k, n, dtype):
    a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype, seed=1)
    assert_matches(GemmOp()(a, b), a @ b, **tolerance(dtype, k))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("trans_a, trans_b", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("m, k, n", SIZES)
def test_every_layout_matches_torch(m, k, n, trans_a, trans_b, dtype):
    a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype, seed=1)
    out = GemmOp(trans_a, trans_b)(stored(a, trans_a), stored(b, trans_b))
    assert_matches(out, a @ b, **tolerance(dtype, k))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("trans_a, trans_b", LAYOUTS, ids=LAYOUT_IDS)
def test_bias_matches_addmm_exactly(trans_a, trans_b, dtype):
    a, b = randn(9, 40, dtype=dtype), randn(40, 6, dtype=dtype, seed=1)
    bias = randn(6, dtype=dtype, seed=2)
    sa, sb = stored(a, trans_a), stored(b, trans_b)
    out = GemmOp(trans_a, trans_b)(sa, sb, bias)
    # addmm on the same views: a BLAS may sum a transposed operand in another order, so
    # bitwise equality holds only against the same layouts
    assert_matches(out, torch.addmm(bias, sa.t() if trans_a else sa, sb.t() if trans_b else sb),
                   rtol=0, atol=0)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nt_with_bias_is_f_linear_exactly(dtype):
    x, weight = randn(7, 24, dtype=dtype), randn(5, 24, dtype=dtype, seed=1)
    bias = randn(5, dtype=dtype, seed=2)
    out = GemmOp(trans_b=True)(x, weight, bias)
    assert_matches(out, F.linear(x, weight, bias), rtol=0, atol=0)


@pytest.mark.parametrize(
    "dtype, k", [(torch.bfloat16, 257), (torch.float16, 2049)], ids=["bfloat16", "float16"]
)
def test_bias_is_added_before_the_one_rounding(dtype, k):
    """k ones sum to an odd integer one past the 16-bit spacing: rounded alone it ties down to
    k - 1, plus the bias of 1 it is exactly k + 1. Adding after rounding loses the 1."""
    a, b, bias = torch.ones(3, k, dtype=dtype), torch.ones(k, 4, dtype=dtype), torch.ones(4)
    out = GemmOp()(a, b, bias.to(dtype))
    assert out.eq(k + 1).all() and (torch.mm(a, b) + bias.to(dtype)).eq(k - 1).all()


@pytest.mark.parametrize("trans_a, trans_b", LAYOUTS, ids=LAYOUT_IDS)
def test_kernels_read_each_operand_where_it_lies(trans_a, trans_b):
    """A contiguous operand is handed over as it is, in the op's layout; the call says so."""
    a, b = stored(randn(6, 12), trans_a), stored(randn(12, 5, seed=1), trans_b)
    (ka, kb, bias), call = spied_call((trans_a, trans_b), a, b)
    assert ka is a and kb is b and bias is None
    assert (call.trans_a, call.trans_b, call.has_bias) == (trans_a, trans_b, False)
    assert call.layout == "NT"[trans_a] + "NT"[trans_b] and (call.m, call.n, call.k) == (6, 5, 12)


def test_a_transposed_view_is_read_in_the_other_layout_without_a_copy():
    """`GemmOp()(x, W.t())` reads W in place as an NT call, as torch.mm reads it; likewise a."""
    x, weight = randn(12, 4), randn(5, 12, seed=1)
    (ka, kb, _), call = spied_call((False, False), x.t(), weight.t())
    assert ka.data_ptr() == x.data_ptr() and kb.data_ptr() == weight.data_ptr()
    assert ka.shape == (12, 4) and kb.shape == (5, 12) and call.layout == "TT"
    (_, kb, _), call = spied_call((False, True), x.t(), weight)
    assert kb is weight and call.layout == "TT"


def test_other_strides_are_copied_once_in_the_ops_layout():
    a, b = strided(randn(6, 12)), randn(12, 10, seed=1)[:, ::2]
    bias = randn(10, seed=2)[::2]
    (ka, kb, kbias), call = spied_call((False, False), a, b, bias)
    assert ka.shape == (6, 12) and kb.shape == (12, 5) and kbias.shape == (5,)
    assert ka.is_contiguous() and kb.is_contiguous() and kbias.is_contiguous()
    assert call.layout == "NN" and call.has_bias


def test_keyword_arguments():
    a, b = randn(3, 4), randn(4, 5, seed=1)
    assert_matches(GemmOp()(b=b, a=a), a @ b)
    assert_matches(GemmOp()(a, b, bias=randn(5)), torch.addmm(randn(5), a, b))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_non_contiguous_inputs(dtype):
    a = randn(12, 6, dtype=dtype).t()  # (6, 12), column-major
    b = randn(12, 20, dtype=dtype, seed=1)[:, ::2]  # (12, 10), strided rows
    for x, y in ((a, b), (strided(a), strided(b))):
        assert not x.is_contiguous() and not y.is_contiguous()
        assert_matches(GemmOp()(x, y), x @ y, **tolerance(dtype, 12))


@pytest.mark.parametrize("m, k, n", [(0, 4, 3), (3, 4, 0), (0, 0, 0)])
def test_empty_output_without_a_kernel(m, k, n, monkeypatch):
    op = GemmOp()
    forbid_kernels(monkeypatch, op)
    a, b = torch.empty(m, k, dtype=torch.float16), torch.empty(k, n, dtype=torch.float16)
    assert_matches(op(a, b), a @ b)


def test_empty_inner_dimension_gives_zeros():
    a, b = torch.empty(3, 0), torch.empty(0, 4)
    assert_matches(GemmOp()(a, b), torch.zeros(3, 4))


@pytest.mark.parametrize("trans_a, trans_b", LAYOUTS, ids=LAYOUT_IDS)
def test_empty_inner_dimension_with_a_bias_gives_the_bias(trans_a, trans_b):
    a, b, bias = torch.empty(3, 0), torch.empty(0, 4), randn(4)
    out = GemmOp(trans_a, trans_b)(stored(a, trans_a), stored(b, trans_b), bias)
    assert_matches(out, bias.expand(3, 4).contiguous())


@pytest.mark.parametrize("trans_a, trans_b", LAYOUTS, ids=LAYOUT_IDS)
def test_meta_tensors_infer_shapes(trans_a, trans_b):
    a = stored(torch.empty(7, 3, dtype=torch.bfloat16, device="meta"), trans_a)
    b = stored(torch.empty(3, 9, dtype=torch.bfloat16, device="meta"), trans_b)
    out = GemmOp(trans_a, trans_b)(a, b)
    assert out.device.type == "meta" and out.shape == (7, 9) and out.dtype == torch.bfloat16


def test_nan_and_inf_propagate_as_in_torch():
    a, b = randn(4, 5), randn(5, 3, seed=1)
    a[0, 1] = float("nan")
    b[2, 2] = float("inf")
    out = GemmOp()(a, b)
    assert_matches(out, a @ b)
    assert out[0].isnan().all() and not out[1:, :2].isnan().any()


# -- errors --------------------------------------------------------------------------------

A = randn(3, 4)
BAD_CALLS = [
    (
        "inner",
        (A, randn(5, 2)),
        r"GemmOp\(\): argument 'b' has shape \[5, 2\], expected \[4, n\]: its dim 0 must equal "
        r"a's dim 1 \(k = 4\)$",
    ),
    (
        "a rank",
        (randn(4), randn(4, 2)),
        r"'a' must have 2 dimensions \(\[m, k\]\), got shape \[4\]",
    ),
    ("b rank", (A, randn(2, 4, 2)), r"'b' must have 2 dimensions"),
    ("b dtype", (A, randn(4, 2, dtype=torch.float16)), r"'b' has dtype float16, expected float32"),
    (
        "a dtype",
        (A.to(torch.complex64), randn(4, 2)),
        r"'a' has dtype complex64, expected float32, float16, bfloat16, float64",
    ),
    ("b dtype 64", (A, randn(4, 2).double()), r"'b' has dtype float64, expected float32"),
    ("a int", (torch.ones(3, 4, dtype=torch.int32), randn(4, 2)), r"'a' has dtype int32"),
    ("device", (A, torch.empty(4, 2, device="meta")), r"'b' is on meta, but 'a' is on cpu"),
    ("missing b", (A,), r"argument 'b' is required"),
    (
        "extra",
        (A, randn(4, 2), randn(2), randn(2)),
        r"takes at most 3 tensor arguments \(a, b, bias\), got 4",
    ),
    (
        "bias length",
        (A, randn(4, 2), randn(3)),
        r"argument 'bias' has shape \[3\], expected \[2\]: its dim 0 must equal b's dim 1 "
        r"\(n = 2\)$",
    ),
    ("bias rank", (A, randn(4, 2), randn(1, 2)), r"'bias' must have 1 dimensions \(\[n\]\)"),
    ("bias dtype", (A, randn(4, 2), randn(2).double()), r"'bias' has dtype float64, expected"),
]


@pytest.mark.parametrize("args, match", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_inputs_name_the_argument(args, match):
    with pytest.raises(OpInputError, match=match):
        GemmOp()(*args)


# (trans_a, trans_b), a's shape, b's shape, the error: each layout checks its own patterns.
BAD_LAYOUT_CALLS = [
    (
        (False, True),
        (3, 4),
        (2, 5),
        r"argument 'b' has shape \[2, 5\], expected \[n, 4\]: its dim 1 must equal a's dim 1 "
        r"\(k = 4\)$",
    ),
    (
        (True, False),
        (3, 4),
        (4, 2),
        r"argument 'b' has shape \[4, 2\], expected \[3, n\]: its dim 0 must equal a's dim 0 "
        r"\(k = 3\)$",
    ),
    (
        (True, True),
        (3, 4),
        (2, 4),
        r"argument 'b' has shape \[2, 4\], expected \[n, 3\]: its dim 1 must equal a's dim 0 "
        r"\(k = 3\)$",
    ),
    ((True, False), (3,), (3, 2), r"argument 'a' must have 2 dimensions \(\[k, m\]\)"),
    ((False, True), (3, 4), (4,), r"argument 'b' must have 2 dimensions \(\[n, k\]\)"),
]


@pytest.mark.parametrize("layout, a_shape, b_shape, match", BAD_LAYOUT_CALLS)
def test_shape_errors_follow_the_layout(layout, a_shape, b_shape, match):
    with pytest.raises(OpInputError, match=match):
        GemmOp(*layout)(randn(*a_shape), randn(*b_shape))


@pytest.mark.parametrize("name", ["trans_a", "trans_b"])
def test_layout_flags_must_be_bools(name):
    with pytest.raises(OpConfigError, match=f"GemmOp: parameter '{name}' must be a bool, got 1"):
        GemmOp(**{name: 1})


def test_layout_flags_take_upstream_tileops_names_and_positions():
    """Upstream's `GemmFwdOp(trans_a, trans_b)`: the same names, in the same order."""
    op = GemmOp(True, False)
    assert (op.trans_a, op.trans_b) == (True, False)
    assert op.params() == {"trans_a": True, "trans_b": False}


def test_explain_chooses_the_reference():
    call = GemmCall(device=torch.device("cpu"), m=128, n=256, k=64, dtype=torch.bfloat16)
    assert_reference_chosen(GemmOp(), "gemm", call)
    nt = GemmCall(device=torch.device("cpu"), m=1, n=256, k=64, dtype=torch.bfloat16,
                  trans_b=True, has_bias=True)  # fmt: skip
    assert_reference_chosen(GemmOp(trans_b=True), "gemm", nt)
