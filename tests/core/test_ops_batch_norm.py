"""BatchNormFwdOp against F.batch_norm, running-stat updates included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from op_helpers import (
    DTYPE_IDS,
    DTYPES,
    TOLERANCES,
    assert_matches,
    assert_reference_chosen,
    forbid_kernels,
    install_spy,
    randn,
    strided,
)

from tileops import BatchNormFwdOp, OpConfigError, OpInputError
from tileops.ops import BatchNormCall
from tileops.testing import isolated_registry

C = 3
SHAPES = [(4, C), (4, C, 5), (2, C, 4, 5), (1, C, 7), (3, C, 1, 1, 2)]
AFFINE = {"plain": (False, False), "affine": (True, True), "weight only": (True, False)}


def inputs(shape, dtype=torch.float32, affine=(True, True), stats=True, seed=0):
    """x, weight, bias, running_mean, running_var (None where absent); variances positive."""
    x = randn(*shape, dtype=dtype, seed=seed) * 2 + 0.5
    weight, bias = (
        randn(shape[1], dtype=dtype, seed=seed + k) if p else None for k, p in enumerate(affine, 1)
    )
    mean = randn(shape[1], dtype=dtype, seed=seed + 3) if stats else None
    var = randn(shape[1], dtype=dtype, seed=seed + 4).abs() + 0.5 if stats else None
    return x, weight, bias, mean, var


def clone(tensors):
    return [None if t is None else t.clone() for t in tensors]


def check_against_torch(op: BatchNormFwdOp, args, **tolerance) -> None:
    """Run the op and F.batch_norm on copies; compare outputs and the running stats after."""
    ours, theirs = clone(args), clone(args)
    out = op(*ours)
    x, weight, bias, mean, var = theirs
    want = F.batch_norm(x, mean, var, weight, bias, op.training, op.momentum, op.eps)
    assert_matches(out, want, **tolerance)
    for got, expected in zip(ours[3:], theirs[3:], strict=True):
        if got is not None:
            assert_matches(got, expected, **tolerance)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", AFFINE.values(), ids=AFFINE.keys())
@pytest.mark.parametrize("training, stats", [(True, True), (True, False), (False, True)])
def test_matches_torch(training, stats, affine, shape, dtype):
    op = BatchNormFwdOp(C, training=training)
    check_against_torch(op, inputs(shape, dtype, affine, stats))


@pytest.mark.parametrize("momentum", [0.0, 0.5, 1.0, 1])
@pytest.mark.parametrize("eps", [1e-7, 1e-3])
def test_momentum_and_eps(momentum, eps):
    check_against_torch(BatchNormFwdOp(C, eps, momentum), inputs((6, C, 4)))


def test_zero_eps_is_for_inference_only():
    # Written out: F.batch_norm accepts eps=0 in inference from torch 2.13 on, not before.
    x, weight, bias, mean, var = inputs((6, C, 4))
    out = BatchNormFwdOp(C, eps=0, training=False)(x, weight, bias, mean, var)
    want = (x - mean[:, None]) / var.sqrt()[:, None] * weight[:, None] + bias[:, None]
    assert_matches(out, want)
    with pytest.raises(OpConfigError, match="parameter 'eps' must be > 0 when training"):
        BatchNormFwdOp(C, eps=0.0)


def test_running_stats_are_updated_in_place_and_converge():
    op = BatchNormFwdOp(C, momentum=0.5)
    mean, var = torch.zeros(C), torch.ones(C)
    x = randn(64, C, 8) * 3 + 2
    for _ in range(30):
        op(x, None, None, mean, var)
    torch.testing.assert_close(mean, x.mean(dim=(0, 2)), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(var, x.var(dim=(0, 2)), rtol=1e-4, atol=1e-4)  # unbiased


def test_non_contiguous_inputs():
    x, weight, bias, mean, var = inputs((2, C, 4, 5))
    channels_last = x.to(memory_format=torch.channels_last)
    check_against_torch(
        BatchNormFwdOp(C), (channels_last, strided(weight), strided(bias), mean, var)
    )
    assert not strided(x).is_contiguous()
    infer = BatchNormFwdOp(C, training=False)  # running stats are only read: any strides
    check_against_torch(infer, (strided(x), weight, bias, strided(mean), strided(var)))


def test_kernels_get_a_contiguous_3d_x_and_the_callers_running_stats():
    log = []
    x, weight, bias, mean, var = inputs((2, C, 4, 5))
    with isolated_registry():
        install_spy(BatchNormFwdOp, "batch_norm_fwd_train", log)
        out = BatchNormFwdOp(C)(strided(x), strided(weight), bias, mean, var)
    (args,) = log
    assert args[0].shape == (2, C, 20) and all(a.is_contiguous() for a in args)
    assert args[3] is mean and args[4] is var  # updated where the caller sees it
    assert out.shape == x.shape


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(0, C), (0, C, 4), (4, C, 0)])
def test_empty_input_returns_empty_and_leaves_stats_alone(shape, training, monkeypatch):
    op = BatchNormFwdOp(C, training=training)
    forbid_kernels(monkeypatch, op)
    check_against_torch(op, inputs(shape, torch.float16))


@pytest.mark.parametrize("training", [True, False])
def test_meta_tensors_infer_shapes(training):
    x, weight, bias, mean, var = (t.to("meta") for t in inputs((2, C, 4)))
    out = BatchNormFwdOp(C, training=training)(x, weight, bias, mean, var)
    assert out.device.type == "meta" and out.shape == (2, C, 4) and out.dtype == torch.float32


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("training", [True, False])
def test_nan_and_inf_propagate_as_in_torch(training, dtype):
    args = inputs((4, C, 5), dtype)
    args[0][0, 1, 2] = float("nan")
    args[0][1, 2, 0] = float("inf")
    if not training:
        args[3][0] = float("inf")
    check_against_torch(BatchNormFwdOp(C, training=training), args)


def test_sixteen_bit_stats_match_within_their_precision():
    """Running stats of 16-bit dtype round once, after a float32 update."""
    args = inputs((8, C, 16), torch.bfloat16)
    check_against_torch(BatchNormFwdOp(C, momentum=0.3), args, **TOLERANCES[torch.bfloat16])


# -- mixed precision (autocast: 16-bit x, float32 per-channel tensors) -----------------------

HALF = (torch.float16, torch.bfloat16)
HALF_IDS = ["float16", "bfloat16"]


def mixed_inputs(shape, dtype, affine=(True, True), stats=True):
    """16-bit x beside float32 weight, bias and running stats, as autocast leaves them."""
    x, *rest = inputs(shape, torch.float32, affine, stats)
    return (x.to(dtype), *rest)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", AFFINE.values(), ids=AFFINE.keys())
@pytest.mark.parametrize("training, stats", [(True, True), (True, False), (False, True)])
def test_mixed_precision_matches_torch(training, stats, affine, shape, dtype):
    """Output of x's dtype; running stats stay float32, updated as F.batch_norm updates them."""
    args = mixed_inputs(shape, dtype, affine, stats)
    check_against_torch(BatchNormFwdOp(C, training=training), args, **TOLERANCES[dtype])
    out = BatchNormFwdOp(C, training=training)(*clone(args))
    assert out.dtype == dtype
    if stats:
        assert args[3].dtype == args[4].dtype == torch.float32


def test_mixed_precision_running_stats_are_float32_exact():
    """The float32 running stats get torch's float32 blend, not a 16-bit rounding of it."""
    args = mixed_inputs((8, C, 16), torch.bfloat16)
    ours, theirs = clone(args), clone(args)
    BatchNormFwdOp(C, momentum=0.3)(*ours)
    x, weight, bias, mean, var = theirs
    F.batch_norm(x, mean, var, weight, bias, True, 0.3, 1e-5)
    for got, want in zip(ours[3:], theirs[3:], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("training", [True, False])
def test_call_spec_carries_the_per_channel_dtype(training):
    log = []
    with isolated_registry():
        interface = "batch_norm_fwd_train" if training else "batch_norm_fwd_infer"
        install_spy(BatchNormFwdOp, interface, log)
        op = BatchNormFwdOp(C, training=training)
        calls = []
        original = op.kernel_for
        op.kernel_for = lambda name, call: calls.append(call) or original(name, call)
        op(*mixed_inputs((4, C, 5), torch.bfloat16))
        op(*inputs((4, C, 5), torch.bfloat16))
        op(*inputs((4, C, 5), torch.bfloat16, affine=(False, False), stats=training is False))
    assert [c.param_dtype for c in calls] == [
        torch.float32,
        torch.bfloat16,
        None if training else torch.bfloat16,
    ]


@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.float32, torch.float32, torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, None, torch.float32, torch.float32),
        (torch.float32, torch.bfloat16, None, None),
    ],
)
def test_per_channel_dtypes_must_agree(dtypes):
    """F.batch_norm refuses a mix (CPU: 'mixed dtype'); the op says which arguments differ."""
    x, *rest = inputs((4, C, 5), torch.bfloat16)
    per_channel = [None if d is None else t.to(d) for t, d in zip(rest, dtypes, strict=True)]
    training = per_channel[2] is None or dtypes[0] != torch.bfloat16
    with pytest.raises(OpInputError, match="the per-channel arguments mix dtypes"):
        BatchNormFwdOp(C, training=training)(x, *per_channel)


# -- errors --------------------------------------------------------------------------------

X = randn(4, C, 5)
MEAN, VAR = torch.zeros(C), torch.ones(C)
BAD_CALLS = [
    (
        "channels",
        True,
        (randn(4, 5),),
        r"BatchNormFwdOp\(\): argument 'x' has shape \[4, 5\], expected \[batch, 3, \.\.\.\] "
        r"from num_features=3$",
    ),
    ("rank", True, (randn(4),), r"'x' must have at least 2 dimensions"),
    ("x dtype", True, (X.to(torch.complex64),), r"'x' has dtype complex64"),
    (
        "weight shape",
        True,
        (X, randn(4)),
        r"'weight' has shape \[4\], expected \[3\] from num_features=3$",
    ),
    ("bias dtype", True, (X, None, randn(C).half()), r"'bias' has dtype float16, expected float32"),
    ("var dtype", False, (X, None, None, MEAN, VAR.double()), r"'running_var' has dtype float64"),
    ("mean shape", False, (X, None, None, torch.zeros(4), VAR), r"'running_mean' has shape \[4\]"),
    ("device", True, (X, MEAN.to("meta")), r"'weight' is on meta, but 'x' is on cpu"),
    (
        "infer without stats",
        False,
        (X,),
        r"'running_mean' is required in inference \(training=False\)",
    ),
    ("infer without var", False, (X, None, None, MEAN), r"'running_var' is required in inference"),
    (
        "one stat",
        True,
        (X, None, None, None, VAR),
        r"'running_mean' is missing while 'running_var' is given",
    ),
    (
        "one value",
        True,
        (randn(1, C),),
        r"'x' of shape \[1, 3\] has one value per channel; expected more than 1 value per "
        "channel when training",
    ),
    ("one value 4d", True, (randn(1, C, 1, 1),), r"more than 1 value per channel"),
    (
        "strided stat",
        True,
        (X, None, None, torch.zeros(C, 2)[:, 0], VAR),
        r"'running_mean' is written in place and must be contiguous",
    ),
]


@pytest.mark.parametrize(
    "training, args, match", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_bad_inputs_name_the_argument(training, args, match):
    with pytest.raises(OpInputError, match=match):
        BatchNormFwdOp(C, training=training)(*args)


def test_one_value_per_channel_is_fine_in_inference():
    check_against_torch(BatchNormFwdOp(C, training=False), inputs((1, C)))


BAD_CONFIGS = [
    ({"num_features": 0}, r"'num_features' must be an int >= 1 \(at most 2\*\*63 - 1\), got 0"),
    ({"num_features": 3.0}, "'num_features' must be an int >= 1"),
    ({"num_features": True}, "'num_features' must be an int >= 1"),
    ({"num_features": np.bool_(True)}, "'num_features' must be an int >= 1"),
    ({"num_features": 2**63}, r"'num_features' must be an int >= 1 \(at most 2\*\*63 - 1\)"),
    ({"num_features": C, "eps": -1.0}, "'eps' must be a finite number >= 0"),
    ({"num_features": C, "eps": None}, "'eps' must be a finite number >= 0, got None"),
    ({"num_features": C, "momentum": None}, "'momentum' must be a float in \\[0, 1\\], got None"),
    ({"num_features": C, "momentum": "0.1"}, "'momentum' must be a float"),
    ({"num_features": C, "momentum": True}, "'momentum' must be a float"),
    ({"num_features": C, "momentum": 1.5}, "'momentum' must be a float in \\[0, 1\\]"),
    ({"num_features": C, "training": 1}, "'training' must be a bool, got 1"),
    ({"num_features": C, "training": "yes"}, "'training' must be a bool"),
]


@pytest.mark.parametrize("kwargs, match", BAD_CONFIGS)
def test_bad_config_names_the_parameter(kwargs, match):
    with pytest.raises(OpConfigError, match=f"BatchNormFwdOp: parameter {match}"):
        BatchNormFwdOp(**kwargs)


def test_num_features_takes_any_integer_torch_takes():
    op = BatchNormFwdOp(np.int64(C))
    assert type(op.num_features) is int and op.num_features == C
    check_against_torch(op, inputs((4, C, 5)))


def test_signature_follows_training():
    train, infer = BatchNormFwdOp(C), BatchNormFwdOp(C, training=False)
    assert train.params() == {"num_features": C, "eps": 1e-5, "momentum": 0.1, "training": True}
    assert [i.name for i in train.signature.inputs if i.written] == ["running_mean", "running_var"]
    assert not any(i.written for i in infer.signature.inputs)
    assert BatchNormFwdOp.signature is train.signature


# -- explain -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "training, interface, key",
    [
        (True, "batch_norm_fwd_train", "reference"),
        (False, "batch_norm_fwd_infer", "reference_infer"),
    ],
)
def test_explain_chooses_the_reference(training, interface, key):
    call = BatchNormCall(
        device=torch.device("cpu"),
        batch=8,
        channels=C,
        spatial=49,
        eps=1e-5,
        momentum=0.1,
        dtype=torch.float16,
        has_weight=True,
        has_bias=True,
        has_running_stats=True,
    )
    assert_reference_chosen(BatchNormFwdOp(C, training=training), interface, call, key)
