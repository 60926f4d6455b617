"""GemmOp against a @ b."""

from __future__ import annotations

import pytest
import torch
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

from tileops import GemmOp, OpInputError
from tileops.ops import GemmCall
from tileops.testing import isolated_registry

SIZES = [(1, 1, 1), (3, 5, 7), (16, 64, 8), (33, 17, 65), (2, 300, 3)]


def tolerance(dtype: torch.dtype, k: int) -> dict[str, float]:
    """Rounding of torch's own 16-bit path grows with k; ours rounds once."""
    scale = max(1.0, k**0.5 / 4)
    base = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
    base = base[dtype]
    return {"rtol": base * scale, "atol": base * scale}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("m, k, n", SIZES)
def test_matches_torch(m, k, n, dtype):
    a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype, seed=1)
    assert_matches(GemmOp()(a, b), a @ b, **tolerance(dtype, k))


def test_keyword_arguments():
    a, b = randn(3, 4), randn(4, 5, seed=1)
    assert_matches(GemmOp()(b=b, a=a), a @ b)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_non_contiguous_inputs(dtype):
    a = randn(12, 6, dtype=dtype).t()  # (6, 12), column-major
    b = randn(12, 20, dtype=dtype, seed=1)[:, ::2]  # (12, 10), strided rows
    for x, y in ((a, b), (strided(a), strided(b))):
        assert not x.is_contiguous() and not y.is_contiguous()
        assert_matches(GemmOp()(x, y), x @ y, **tolerance(dtype, 12))


def test_kernels_get_contiguous_operands():
    log = []
    a, b = randn(12, 6).t(), randn(12, 5, seed=1)
    with isolated_registry():
        install_spy(GemmOp, "gemm", log)
        out = GemmOp()(a, b)
    ((ka, kb),) = log
    assert ka.shape == (6, 12) and kb.shape == (12, 5) and ka.is_contiguous() and kb.is_contiguous()
    assert_matches(out, a @ b)


@pytest.mark.parametrize("m, k, n", [(0, 4, 3), (3, 4, 0), (0, 0, 0)])
def test_empty_output_without_a_kernel(m, k, n, monkeypatch):
    op = GemmOp()
    forbid_kernels(monkeypatch, op)
    a, b = torch.empty(m, k, dtype=torch.float16), torch.empty(k, n, dtype=torch.float16)
    assert_matches(op(a, b), a @ b)


def test_empty_inner_dimension_gives_zeros():
    a, b = torch.empty(3, 0), torch.empty(0, 4)
    assert_matches(GemmOp()(a, b), torch.zeros(3, 4))


def test_meta_tensors_infer_shapes():
    a = torch.empty(7, 3, dtype=torch.bfloat16, device="meta")
    out = GemmOp()(a, torch.empty(3, 9, dtype=torch.bfloat16, device="meta"))
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
    ("extra", (A, randn(4, 2), randn(2)), r"takes at most 2 tensor arguments \(a, b\), got 3"),
]


@pytest.mark.parametrize("args, match", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_inputs_name_the_argument(args, match):
    with pytest.raises(OpInputError, match=match):
        GemmOp()(*args)


def test_explain_chooses_the_reference():
    call = GemmCall(device=torch.device("cpu"), m=128, n=256, k=64, dtype=torch.bfloat16)
    assert_reference_chosen(GemmOp(), "gemm", call)
