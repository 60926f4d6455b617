"""SoftmaxFwdOp against torch.softmax."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
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

from tileops import OpConfigError, OpInputError, SoftmaxFwdOp
from tileops.ops import SoftmaxCall
from tileops.testing import isolated_registry

SHAPES = [(7,), (3, 7), (2, 3, 4), (2, 1, 5), (4, 130)]
CASES = [(shape, dim) for shape in SHAPES for dim in range(-len(shape), len(shape))]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape, dim", CASES)
def test_matches_torch(shape, dim, dtype):
    x = randn(*shape, dtype=dtype) * 4
    assert_matches(SoftmaxFwdOp(dim)(x), torch.softmax(x, dim))


def test_default_dim_is_last():
    x = randn(3, 5)
    assert SoftmaxFwdOp().dim == -1
    assert_matches(SoftmaxFwdOp()(x), torch.softmax(x, -1))


@pytest.mark.parametrize("dim", [0, -1])
def test_zero_dim_tensor(dim):
    x = torch.tensor(2.5)
    assert_matches(SoftmaxFwdOp(dim)(x), torch.softmax(x, dim))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_non_contiguous_inputs(dim):
    for x in (randn(6, 4, 5).transpose(0, 2), randn(4, 10)[:, ::3], strided(randn(3, 4))):
        assert not x.is_contiguous()
        assert_matches(SoftmaxFwdOp(dim)(x), torch.softmax(x, dim))


def test_kernels_get_contiguous_rows_with_dim_last():
    log = []
    x = randn(5, 3, 4)
    with isolated_registry():
        install_spy(SoftmaxFwdOp, "softmax", log)
        out = SoftmaxFwdOp(0)(x)
    ((rows,),) = log
    assert rows.shape == (12, 5) and rows.is_contiguous()
    assert_matches(out, torch.softmax(x, 0))


@pytest.mark.parametrize("shape, dim", [((0, 5), -1), ((3, 0), -1), ((3, 0), 0), ((0,), 0)])
def test_empty_input_returns_empty_without_a_kernel(shape, dim, monkeypatch):
    op = SoftmaxFwdOp(dim)
    forbid_kernels(monkeypatch, op)
    x = torch.empty(shape, dtype=torch.bfloat16)
    assert_matches(op(x), torch.softmax(x, dim))


@pytest.mark.parametrize("dim", [0, -1])
def test_meta_tensors_infer_shapes(dim):
    out = SoftmaxFwdOp(dim)(torch.empty(3, 4, 5, dtype=torch.float16, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, 4, 5) and out.dtype == torch.float16


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nan_and_inf_propagate_as_in_torch(dtype):
    inf, nan = float("inf"), float("nan")
    rows = [[inf, 1.0, 2.0], [-inf, -inf, -inf], [nan, 1.0, 2.0], [-inf, 0.0, 1.0], [1e4, 0.0, 0.0]]
    x = torch.tensor(rows, dtype=dtype)
    out = SoftmaxFwdOp()(x)
    assert_matches(out, torch.softmax(x, -1))
    assert out[:3].isnan().all() and out[3:].isfinite().all()


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    dim_seed=st.integers(0, 100),
    dtype=st.sampled_from(DTYPES),
)
def test_any_shape_and_dim(shape, dim_seed, dtype):
    dim = dim_seed % (2 * len(shape)) - len(shape)
    x = randn(*shape, dtype=dtype, seed=dim_seed) * 3
    assert_matches(SoftmaxFwdOp(dim)(x), torch.softmax(x, dim))


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dim, x, match",
    [
        (
            2,
            randn(3, 4),
            r"dim 2 is out of range for argument 'x' of shape \[3, 4\]; expected dim in \[-2, 1\]",
        ),
        (-3, randn(3, 4), r"dim -3 is out of range"),
        (1, torch.tensor(1.0), r"dim 1 is out of range .* expected dim in \[-1, 0\]"),
        (-1, randn(3, dtype=torch.complex64), r"'x' has dtype complex64, expected float32"),
        (-1, torch.arange(3), r"'x' has dtype int64"),
        (-1, 3.0, r"'x' must be a torch.Tensor, got float"),
        (-1, None, r"argument 'x' is required"),
    ],
)
def test_bad_inputs_name_the_argument(dim, x, match):
    with pytest.raises(OpInputError, match=match):
        SoftmaxFwdOp(dim)(x)


def test_dim_is_checked_even_for_empty_input():
    with pytest.raises(OpInputError, match="dim 3 is out of range"):
        SoftmaxFwdOp(3)(torch.empty(0, 4))


def test_unexpected_arguments():
    with pytest.raises(OpInputError, match=r"unexpected argument 'dim'"):
        SoftmaxFwdOp()(randn(3), dim=0)
    with pytest.raises(OpInputError, match=r"takes at most 1 tensor arguments \(x\), got 2"):
        SoftmaxFwdOp()(randn(3), randn(3))


@pytest.mark.parametrize("dim", [1.0, True, "0", None, np.bool_(True), 2**70, -(2**63) - 1])
def test_bad_config_names_the_parameter(dim):
    with pytest.raises(
        OpConfigError,
        match=r"SoftmaxFwdOp: parameter 'dim' must be an int in the int64 range "
        r"\[-2\*\*63, 2\*\*63 - 1\]",
    ):
        SoftmaxFwdOp(dim)


@pytest.mark.parametrize("dim", [np.int64(1), np.int32(-1), torch.tensor(1)], ids=repr)
def test_dim_takes_any_integer_torch_takes(dim):
    """As torch.softmax: integers of any type with `__index__`, kept as a Python int."""
    op = SoftmaxFwdOp(dim)
    assert type(op.dim) is int and op.dim == int(dim)
    x = randn(3, 4)
    assert_matches(op(x), torch.softmax(x, int(dim)))
    assert_matches(op(x.requires_grad_()), torch.softmax(x, int(dim)))  # the operator's int


@pytest.mark.parametrize("dim", [2**63 - 1, -(2**63)])
def test_an_int64_dim_is_checked_against_the_rank_at_call_time(dim):
    op = SoftmaxFwdOp(dim)
    for x in (randn(3, 4), randn(3, 4).requires_grad_()):
        with pytest.raises(OpInputError, match=rf"dim {dim} is out of range for argument 'x'"):
            op(x)


def test_explain_chooses_the_reference():
    call = SoftmaxCall(device=torch.device("cpu"), n=1000, dtype=torch.float32)
    assert_reference_chosen(SoftmaxFwdOp(), "softmax", call)
