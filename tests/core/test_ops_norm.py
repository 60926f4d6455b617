"""LayerNormFwdOp and RMSNormFwdOp against F.layer_norm / F.rms_norm."""

from __future__ import annotations

import itertools

import numpy as np
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

from tileops import LayerNormFwdOp, OpConfigError, OpInputError, RMSNormFwdOp
from tileops.ops import LayerNormCall, RMSNormCall
from tileops.testing import isolated_registry

# name: (op class, torch function, affine inputs, an explicit eps)
NORMS = {
    "layer_norm": (LayerNormFwdOp, F.layer_norm, ("weight", "bias"), 1e-3),
    "rms_norm": (RMSNormFwdOp, F.rms_norm, ("weight",), 1e-6),
}
PRESENCE = [
    (name, present)
    for name, (_, _, affine, _) in NORMS.items()
    for present in itertools.product((False, True), repeat=len(affine))
]
SHAPES = [((8,), ()), ((8,), (5,)), ((3, 5), (2, 3)), ((96,), (4,)), (7, (2, 1))]


def make(name: str, normalized_shape, *, eps="default", dtype=torch.float32, present=None, seed=0):
    """The op, and its inputs (x plus affine params, None where absent) for one batch shape."""
    op_cls, _, affine, _ = NORMS[name]
    op = op_cls(normalized_shape) if eps == "default" else op_cls(normalized_shape, eps)
    present = (True,) * len(affine) if present is None else present
    shape = op.normalized_shape
    params = [
        randn(*shape, dtype=dtype, seed=seed + 1 + k) if p else None for k, p in enumerate(present)
    ]
    return op, params


def expected(name: str, op, x, *params):
    _, fn, _, _ = NORMS[name]
    return fn(x, op.normalized_shape, *params, eps=op.eps)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("normalized_shape, batch", SHAPES)
@pytest.mark.parametrize("name, present", PRESENCE)
def test_matches_torch(name, present, normalized_shape, batch, dtype):
    op, params = make(name, normalized_shape, dtype=dtype, present=present)
    x = randn(*batch, *op.normalized_shape, dtype=dtype) * 3 + 1
    assert_matches(op(x, *params), expected(name, op, x, *params))


@pytest.mark.parametrize("name", NORMS)
def test_explicit_eps_and_keyword_arguments(name):
    _, _, affine, eps = NORMS[name]
    op, params = make(name, (16,), eps=eps)
    x = randn(3, 16) * 1e-2  # small enough that eps matters
    assert_matches(
        op(x=x, **dict(zip(affine, params, strict=True))), expected(name, op, x, *params)
    )


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=DTYPE_IDS[1:])
def test_rms_norm_default_eps_is_torchs(dtype):
    """F.rms_norm's eps=None is the epsilon of the dtype it computes in: float32's for 16-bit
    x, float64's for float64 x. Tiny rows show which."""
    op = RMSNormFwdOp(8)
    x = torch.full((2, 8), 1e-3, dtype=dtype)
    assert_matches(op(x), F.rms_norm(x, (8,)))
    assert op.eps is None
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    assert op.call_for(x, None).eps == torch.finfo(compute).eps


@pytest.mark.parametrize("name", NORMS)
def test_non_contiguous_inputs(name):
    op, params = make(name, (3, 8))
    transposed = randn(3, 8, 4, 3).permute(3, 2, 0, 1)  # batch dims and normalized dims strided
    sliced = randn(5, 3, 16)[..., ::2]
    for x in (transposed, sliced):
        assert not x.is_contiguous()
        strided_params = [strided(p) for p in params]
        assert_matches(op(x, *strided_params), expected(name, op, x, *params))


@pytest.mark.parametrize("name", NORMS)
def test_kernels_get_contiguous_rows_and_vectors(name):
    log = []
    with isolated_registry():
        install_spy(NORMS[name][0], name, log)
        op, params = make(name, (3, 8))
        x = randn(3, 8, 4, 3).permute(3, 2, 0, 1)
        out = op(x, *[strided(p) for p in params])
    (args,) = log
    assert args[0].shape == (12, 24) and all(p.shape == (24,) for p in args[1:])
    assert all(a.is_contiguous() for a in args)
    assert out.shape == x.shape
    assert_matches(out, expected(name, op, x, *params))


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 8)])
def test_empty_input_returns_empty_without_a_kernel(name, shape, monkeypatch):
    op, params = make(name, (8,), dtype=torch.float16)
    forbid_kernels(monkeypatch, op)
    x = torch.empty(shape, dtype=torch.float16)
    assert_matches(op(x, *params), expected(name, op, x, *params))


@pytest.mark.parametrize("name", NORMS)
def test_zero_sized_normalized_shape(name, monkeypatch):
    op, _ = make(name, (0,))
    forbid_kernels(monkeypatch, op)
    x = torch.empty(3, 0)
    assert_matches(op(x), expected(name, op, x))


@pytest.mark.parametrize("name", NORMS)
def test_meta_tensors_infer_shapes(name):
    op, params = make(name, (4, 8), dtype=torch.bfloat16)
    x = torch.empty(5, 4, 8, dtype=torch.bfloat16, device="meta")
    out = op(x, *[p.to("meta") for p in params])
    assert out.device.type == "meta" and out.shape == x.shape and out.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("name", NORMS)
def test_nan_and_inf_propagate_as_in_torch(name, dtype):
    op, params = make(name, (6,), dtype=dtype)
    x = randn(4, 6, dtype=dtype)
    x[0, 1], x[1, 2], x[2, 3] = float("nan"), float("inf"), float("-inf")
    out = op(x, *params)
    assert_matches(out, expected(name, op, x, *params))
    assert out[:3].isnan().any(dim=1).all() and out[3].isfinite().all()


def test_op_with_several_instances_and_dtypes_shares_the_reference():
    ops = [LayerNormFwdOp(8) for _ in DTYPES]
    for op, dtype in zip(ops, DTYPES, strict=True):
        x = randn(2, 8, dtype=dtype)
        assert_matches(op(x), F.layer_norm(x, (8,)))


# -- errors --------------------------------------------------------------------------------

W = randn(8)
BAD_CALLS = [
    ("x complex", (randn(2, 8, dtype=torch.complex64),), {}, r"'x' has dtype complex64, expected"),
    ("x int", (torch.ones(2, 8, dtype=torch.int64),), {}, r"'x' has dtype int64"),
    ("x not a tensor", ([[1.0] * 8],), {}, r"'x' must be a torch.Tensor, got list"),
    ("x missing", (), {}, r"argument 'x' is required"),
    ("x trailing dims", (randn(2, 7),), {}, r"'x' has shape \[2, 7\], expected \[\.\.\., 8\]"),
    ("x rank 0", (torch.tensor(1.0),), {}, r"'x' must have at least 1 dimensions"),
    ("weight shape", (randn(2, 8), randn(4)), {}, r"'weight' has shape \[4\], expected \[8\]"),
    ("weight rank", (randn(2, 8), randn(1, 8)), {}, r"'weight' must have 1 dimensions"),
    (
        "weight dtype",
        (randn(2, 8), randn(8, dtype=torch.float16)),
        {},
        r"'weight' has dtype float16, expected float32",
    ),
    ("weight device", (randn(2, 8), W.to("meta")), {}, r"'weight' is on meta, but 'x' is on cpu"),
    ("unknown kwarg", (randn(2, 8),), {"scale": W}, r"unexpected argument 'scale'"),
    ("twice", (randn(2, 8), W), {"weight": W}, r"argument 'weight' twice"),
]


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize(
    "args, kwargs, match", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_bad_inputs_name_the_argument(name, args, kwargs, match):
    op, _ = make(name, (8,))
    with pytest.raises(OpInputError, match=match):
        op(*args, **kwargs)


def test_layer_norm_bias_is_checked_like_weight():
    with pytest.raises(OpInputError, match=r"'bias' has shape \[3, 8\], expected \[3, 4\]"):
        LayerNormFwdOp((3, 4))(randn(2, 3, 4), None, randn(3, 8))
    with pytest.raises(OpInputError, match=r"takes at most 2 tensor arguments \(x, weight\)"):
        RMSNormFwdOp(8)(randn(2, 8), W, W)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("weight_is_float32", [True, False])
@pytest.mark.parametrize("requires_grad", [False, True], ids=["eager", "autograd"])
def test_layer_norm_weight_and_bias_share_one_dtype(half, weight_is_float32, requires_grad):
    """Each may be x's dtype or float32, but not one of each: F.layer_norm refuses the mix,
    and the call spec's one `param_dtype` could not describe it to a kernel."""
    x = randn(2, 8, dtype=half).requires_grad_(requires_grad)
    wide, narrow = randn(8), randn(8, dtype=half)
    weight, bias = (wide, narrow) if weight_is_float32 else (narrow, wide)
    w, b = (str(t.dtype).removeprefix("torch.") for t in (weight, bias))
    with pytest.raises(
        OpInputError,
        match=rf"LayerNormFwdOp\(\): argument 'bias' has dtype {b}, but 'weight' has dtype {w}; "
        rf"expected 'bias' in {w} \(weight, bias must share one dtype when given\)",
    ):
        LayerNormFwdOp(8)(x, weight, bias)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_layer_norm_params_of_one_dtype_still_pass(half):
    x = randn(2, 8, dtype=half)
    for weight, bias in [(randn(8), randn(8)), (None, randn(8)), (randn(8, dtype=half), None)]:
        assert_matches(LayerNormFwdOp(8)(x, weight, bias), F.layer_norm(x, (8,), weight, bias))


BAD_CONFIGS = [
    ({"normalized_shape": ()}, "'normalized_shape' must be an int or a non-empty sequence"),
    ({"normalized_shape": (4, -1)}, "'normalized_shape' must be"),
    ({"normalized_shape": 2.0}, "'normalized_shape' must be"),
    ({"normalized_shape": (True,)}, "'normalized_shape' must be"),
    ({"normalized_shape": (np.bool_(True),)}, "'normalized_shape' must be"),
    ({"normalized_shape": 2**63}, r"sequence of ints >= 0 \(at most 2\*\*63 - 1\), got 9223"),
    ({"normalized_shape": (4, 2**64)}, r"'normalized_shape' must be"),
    ({"normalized_shape": "8"}, "'normalized_shape' must be"),
    ({"normalized_shape": 8, "eps": -1e-5}, r"'eps' must be a finite number >= 0"),
    ({"normalized_shape": 8, "eps": float("nan")}, r"'eps' must be a finite number >= 0"),
    ({"normalized_shape": 8, "eps": "1e-5"}, r"'eps' must be a finite number >= 0"),
    ({"normalized_shape": 8, "eps": True}, r"'eps' must be a finite number >= 0"),
]


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("kwargs, match", BAD_CONFIGS)
def test_bad_config_names_the_parameter(name, kwargs, match):
    with pytest.raises(OpConfigError, match=match):
        NORMS[name][0](**kwargs)


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize(
    "normalized_shape", [np.int64(8), (np.int64(2), np.int32(4)), torch.Size([8])], ids=repr
)
def test_normalized_shape_takes_any_integers_torch_takes(name, normalized_shape):
    """numpy's ints too (torch.nn.LayerNorm(np.int64(8)) works), kept as Python ints."""
    op, params = make(name, normalized_shape)
    assert all(type(d) is int for d in op.normalized_shape)
    x = randn(3, *op.normalized_shape)
    assert_matches(op(x, *params), expected(name, op, x, *params))


def test_eps_none_is_only_for_rms_norm():
    assert RMSNormFwdOp(8, None).eps is None
    with pytest.raises(OpConfigError, match="LayerNormFwdOp: parameter 'eps' must be"):
        LayerNormFwdOp(8, None)


def test_params_are_attributes_and_signature_params():
    op = LayerNormFwdOp([2, 3], eps=0)
    assert op.params() == {"normalized_shape": (2, 3), "eps": 0.0}
    assert isinstance(op.eps, float)
    assert RMSNormFwdOp(torch.Size([4])).params() == {"normalized_shape": (4,), "eps": None}


# -- explain -------------------------------------------------------------------------------


def test_explain_layer_norm_chooses_the_reference():
    cpu = torch.device("cpu")
    call = LayerNormCall(
        device=cpu, n=8, eps=1e-5, dtype=torch.float16, has_weight=True, has_bias=False
    )
    assert_reference_chosen(LayerNormFwdOp(8), "layer_norm", call)


def test_explain_rms_norm_chooses_the_reference():
    call = RMSNormCall(
        device=torch.device("meta"), n=8, eps=1e-6, dtype=torch.bfloat16, has_weight=False
    )
    assert_reference_chosen(RMSNormFwdOp(8), "rms_norm", call)


@pytest.mark.parametrize("op_cls", [RMSNormFwdOp, LayerNormFwdOp])
def test_shape_errors_cite_normalized_shape(op_cls):
    name = op_cls.__name__
    with pytest.raises(OpInputError) as error:
        op_cls(8)(randn(3, 7))
    assert str(error.value).endswith(
        f"{name}(): argument 'x' has shape [3, 7], expected [..., 8] from normalized_shape=(8,)"
    )
    with pytest.raises(OpInputError, match=r"expected \[2, 4\] from normalized_shape=\(2, 4\)$"):
        op_cls((2, 4))(randn(3, 2, 4), randn(4, 2))
    with pytest.raises(OpInputError, match=r"dimensions \(\[\.\.\., 8\] from normalized_shape"):
        op_cls(8)(torch.tensor(1.0))
