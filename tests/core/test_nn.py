"""tileops.nn modules against their torch.nn counterparts on the CPU: construction, state_dict,
outputs and gradients, BatchNorm's running statistics, and the errors for bad arguments."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import tileops.nn as tnn
from tileops import GemmOp, Kernel, OpConfigError, OpInputError
from tileops.backend import register_kernel_type
from tileops.ops import GemmInterface
from tileops.testing import isolated_registry

DTYPES = [torch.float32, torch.float64]

# (torch type, constructor kwargs, input shapes the module accepts)
CASES = {
    "rms_norm": (nn.RMSNorm, {"normalized_shape": 6}, [(6,), (2, 3, 6), (2, 3, 4, 6)]),
    "rms_norm_eps_2d": (nn.RMSNorm, {"normalized_shape": (4, 6), "eps": 1e-3}, [(3, 4, 6)]),
    "rms_norm_no_affine": (
        nn.RMSNorm,
        {"normalized_shape": 6, "elementwise_affine": False},
        [(5, 6)],
    ),
    "layer_norm": (nn.LayerNorm, {"normalized_shape": 6}, [(6,), (2, 3, 6), (2, 3, 4, 6)]),
    "layer_norm_2d": (nn.LayerNorm, {"normalized_shape": [4, 6], "eps": 1e-3}, [(3, 4, 6)]),
    "layer_norm_no_bias": (nn.LayerNorm, {"normalized_shape": 6, "bias": False}, [(5, 6)]),
    "layer_norm_no_affine": (
        nn.LayerNorm,
        {"normalized_shape": 6, "elementwise_affine": False, "bias": False},
        [(5, 6)],
    ),
    "softmax": (nn.Softmax, {"dim": -1}, [(6,), (2, 3, 6), (2, 3, 4, 6)]),
    "softmax_dim1": (nn.Softmax, {"dim": 1}, [(2, 3, 6), (2, 3, 4, 6)]),
    "batch_norm_1d": (nn.BatchNorm1d, {"num_features": 3}, [(4, 3), (4, 3, 5)]),
    "batch_norm_2d": (nn.BatchNorm2d, {"num_features": 3, "momentum": None}, [(4, 3, 2, 5)]),
    "batch_norm_3d": (nn.BatchNorm3d, {"num_features": 3, "affine": False}, [(2, 3, 2, 2, 3)]),
    "linear": (nn.Linear, {"in_features": 6, "out_features": 5}, [(6,), (2, 3, 6), (2, 3, 4, 6)]),
    "linear_no_bias": (nn.Linear, {"in_features": 6, "out_features": 5, "bias": False}, [(7, 6)]),
}
SHAPED = [(name, shape) for name, (_, _, shapes) in CASES.items() for shape in shapes]


def ours_of(torch_type: type[nn.Module]) -> type[nn.Module]:
    return getattr(tnn, torch_type.__name__)


def pair(name: str, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, nn.Module]:
    """A tileops module and a torch one built with the same arguments and the same values
    (random, so gradients tell weight from bias)."""
    torch_type, kwargs, _ = CASES[name]
    theirs = torch_type(**kwargs, **_factory(torch_type, dtype))
    with torch.no_grad():
        for t in (*theirs.parameters(), *theirs.buffers()):
            if t.is_floating_point():
                t.copy_(torch.rand_like(t) + 0.5)
    ours = ours_of(torch_type)(**kwargs, **_factory(torch_type, dtype))
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def _factory(torch_type: type[nn.Module], dtype: torch.dtype) -> dict:
    return {} if torch_type is nn.Softmax else {"dtype": dtype}


def run_both(ours, theirs, x, *, seed: int = 0):
    """Outputs and gradients (x first, then each parameter) of both modules on x."""
    results = []
    for module in (ours, theirs):
        leaf = x.detach().clone().requires_grad_()
        out = module(leaf)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
        params = [p for p in module.parameters() if p.requires_grad]
        grads = torch.autograd.grad(out, [leaf, *params], grad)
        results.append((out, grads))
    return results


def assert_same_state(ours: nn.Module, theirs: nn.Module, **tolerance: float) -> None:
    """Same state_dict keys, in order, with values of the same dtype within `tolerance`."""
    mine, expected = ours.state_dict(), theirs.state_dict()
    assert list(mine) == list(expected)
    for name, value in mine.items():
        torch.testing.assert_close(value, expected[name], msg=name, **tolerance)


# -- construction ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_construction_matches_torch(name):
    torch_type, kwargs, _ = CASES[name]
    torch.manual_seed(0)
    theirs = torch_type(**kwargs)
    torch.manual_seed(0)
    ours = ours_of(torch_type)(**kwargs)
    assert isinstance(ours, torch_type) and type(ours).__module__.startswith("tileops.nn")
    assert repr(ours) == repr(theirs) and ours.extra_repr() == theirs.extra_repr()
    assert_same_state(ours, theirs, rtol=0, atol=0)  # reset_parameters is torch's
    assert [type(p) for p in ours.parameters()] == [type(p) for p in theirs.parameters()]


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "batch_norm_2d", "linear"])
def test_device_and_dtype_arguments_are_honoured(name):
    torch_type, kwargs, _ = CASES[name]
    module = ours_of(torch_type)(**kwargs, device="cpu", dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in module.parameters())


def test_positional_arguments_and_defaults_are_torchs():
    assert tnn.LayerNorm(4, 1e-3, False).extra_repr() == nn.LayerNorm(4, 1e-3, False).extra_repr()
    assert tnn.BatchNorm2d(3, 1e-3, None, False, False).extra_repr() == (
        nn.BatchNorm2d(3, 1e-3, None, False, False).extra_repr()
    )
    assert tnn.Linear(3, 4, False).bias is None
    assert tnn.RMSNorm(4).eps is None and tnn.Softmax().dim is None


@pytest.mark.parametrize("name", CASES)
def test_state_dict_loads_both_ways_strictly(name):
    ours, theirs = pair(name)
    fresh_theirs = CASES[name][0](**CASES[name][1])
    fresh_theirs.load_state_dict(ours.state_dict(), strict=True)
    fresh_ours = ours_of(CASES[name][0])(**CASES[name][1])
    fresh_ours.load_state_dict(theirs.state_dict(), strict=True)
    assert_same_state(fresh_ours, fresh_theirs, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["layer_norm", "batch_norm_2d", "linear"])
def test_modules_copy_and_pickle(name):
    ours, _ = pair(name)
    clone = pickle.loads(pickle.dumps(copy.deepcopy(ours)))
    assert type(clone) is type(ours)
    x = torch.randn(CASES[name][2][-1])
    torch.testing.assert_close(clone.eval()(x), ours.eval()(x))


def test_import_tileops_leaves_nn_unloaded():
    code = "import sys, tileops; assert 'tileops.nn' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- outputs and gradients -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize(("name", "shape"), SHAPED, ids=[f"{n}-{len(s)}d" for n, s in SHAPED])
def test_outputs_and_gradients_match_torch(name, shape, dtype):
    ours, theirs = pair(name, dtype)
    x = torch.randn(shape, dtype=dtype)
    (out, grads), (expected, expected_grads) = run_both(ours, theirs, x)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    torch.testing.assert_close(out, expected)
    assert len(grads) == len(expected_grads)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("rows", [1, 3, 64], ids=["decode", "few_rows", "many_rows"])
def test_linear_matches_torch_at_any_row_count(rows):
    ours, theirs = tnn.Linear(16, 8), nn.Linear(16, 8)
    ours.load_state_dict(theirs.state_dict())
    (out, grads), (expected, expected_grads) = run_both(ours, theirs, torch.randn(rows, 16))
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


def _linear_calls(linear: nn.Module, x: torch.Tensor) -> list[tuple]:
    """The (a, b, bias) each GEMM kernel call of `linear(x)` gets, and its call spec."""
    seen = []

    class Spy(Kernel, GemmInterface):
        devices = {"cpu"}

        @classmethod
        def entry_for(cls, call):
            return call, lambda: cls(call)

        def __init__(self, call):
            self.call = call

        def forward(self, a, b, bias):
            seen.append((a, b, bias, self.call))
            return GemmOp.kernel_types["reference"](self.call.trans_a, self.call.trans_b)(
                a, b, bias
            )

    with isolated_registry():
        register_kernel_type(GemmOp, "spy", Spy)
        tnn._ops._shared_op.cache_clear()  # the shared ops of the isolated registry
        try:
            out = linear(x)
        finally:
            tnn._ops._shared_op.cache_clear()
    torch.testing.assert_close(out, nn.functional.linear(x, linear.weight, linear.bias))
    return seen


@pytest.mark.parametrize("bias", [True, False])
def test_linear_hands_its_weight_and_bias_to_one_nt_gemm_as_they_are(bias):
    """`x @ W^T + b` is GemmOp's NT layout with its bias epilogue: W and b reach the kernel
    untouched (no copy, no transpose), and nothing else runs."""
    linear = tnn.Linear(16, 8, bias=bias)
    ((a, b, b_given, call),) = _linear_calls(linear, torch.randn(2, 5, 16))
    assert b is linear.weight or b.data_ptr() == linear.weight.data_ptr()
    assert b.shape == (8, 16) and a.shape == (10, 16)
    assert (b_given is None) == (not bias) and call.has_bias == bias
    assert (call.layout, call.m, call.n, call.k) == ("NT", 10, 8, 16)


def test_linear_uses_a_column_major_weight_without_copying_it():
    """A weight stored transposed ((out, in) with in-major strides) is read as an NN call."""
    linear = tnn.Linear(16, 8)
    with torch.no_grad():
        linear.weight.set_(linear.weight.t().contiguous().t())  # (out, in), column-major
    ((_, b, _, call),) = _linear_calls(linear, torch.randn(64, 16))
    assert b.data_ptr() == linear.weight.data_ptr() and call.layout == "NN"


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")  # torch's
@pytest.mark.parametrize("shape", [(2, 0), (0,), (4, 5, 0)], ids=str)
def test_linear_of_zero_in_features_gives_the_bias_as_torch(shape):
    ours, theirs = tnn.Linear(0, 3), nn.Linear(0, 3)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(shape)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_under_autocast_matches_torch(bias):
    """The bias is cast with the operands, as F.linear's is: the output is bfloat16."""
    ours, theirs = tnn.Linear(16, 8, bias=bias), nn.Linear(16, 8, bias=bias)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, expected = ours(x), theirs(x)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected)


def test_linear_rejects_an_input_of_the_wrong_width_naming_it():
    with pytest.raises(OpInputError, match="'input' of shape \\[4, 6\\].*in_features=3"):
        tnn.Linear(3, 2)(torch.randn(4, 6))


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # torch's own
@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "batch_norm_2d"])
def test_16_bit_input_with_float32_params_matches_torch(name):
    ours, theirs = pair(name)
    shape = CASES[name][2][-1]
    x = torch.randn(shape).bfloat16()
    out, expected = ours(x), theirs(x)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=1.6e-2, atol=1.6e-2)
    if name == "batch_norm_2d":
        torch.testing.assert_close(ours.running_var, theirs.running_var)


def test_softmax_without_dim_keeps_torchs_implicit_choice_and_warning():
    for shape in [(5,), (2, 5), (2, 3, 5), (2, 3, 4, 5)]:
        x = torch.randn(shape)
        with pytest.warns(UserWarning, match="Implicit dimension choice") as record:
            out = tnn.Softmax()(x)
        assert record[0].filename == __file__  # points at the caller, as torch's does
        with pytest.warns(UserWarning):
            torch.testing.assert_close(out, nn.Softmax()(x))


def test_changing_eps_after_construction_is_honoured():
    ours, theirs = pair("layer_norm")
    ours.eps = theirs.eps = 0.5
    x = torch.randn(2, 6)
    torch.testing.assert_close(ours(x), theirs(x))


# -- BatchNorm's running statistics ----------------------------------------------------------

BATCH_NORM_CONFIGS = {
    "momentum_0.1": {},
    "momentum_none": {"momentum": None},
    "momentum_1.5": {"momentum": 1.5},  # outside the op's [0, 1]: blended by the module
    "no_tracking": {"track_running_stats": False},
    "no_affine": {"affine": False},
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("config", BATCH_NORM_CONFIGS)
def test_batch_norm_train_then_eval_matches_torch(config, dtype):
    kwargs = {"num_features": 3, **BATCH_NORM_CONFIGS[config], "dtype": dtype}
    ours, theirs = tnn.BatchNorm2d(**kwargs), nn.BatchNorm2d(**kwargs)
    for step in range(3):
        x = torch.randn(4, 3, 2, 5, dtype=dtype) * (step + 1) + step
        (out, grads), (expected, expected_grads) = run_both(ours, theirs, x, seed=step)
        torch.testing.assert_close(out, expected)
        for got, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(got, want)
    assert_same_state(ours, theirs)  # running stats and num_batches_tracked
    ours.eval(), theirs.eval()
    x = torch.randn(4, 3, 2, 5, dtype=dtype)
    torch.testing.assert_close(ours(x), theirs(x))


def test_batch_norm_counts_batches_and_uses_the_cumulative_average():
    ours = tnn.BatchNorm1d(2, momentum=None)
    batches = [torch.randn(8, 2) + k for k in range(3)]
    for x in batches:
        ours(x)
    assert ours.num_batches_tracked.item() == 3
    mean = torch.stack([x.mean(0) for x in batches]).mean(0)
    var = torch.stack([x.var(0) for x in batches]).mean(0)
    torch.testing.assert_close(ours.running_mean, mean)
    torch.testing.assert_close(ours.running_var, var)  # the first batch replaces the initial 1


def test_batch_norm_eval_without_running_stats_uses_the_batch():
    kwargs = {"num_features": 3, "track_running_stats": False}
    ours, theirs = tnn.BatchNorm1d(**kwargs), nn.BatchNorm1d(**kwargs)
    ours.eval(), theirs.eval()
    x = torch.randn(6, 3)
    torch.testing.assert_close(ours(x), theirs(x))


def test_batch_norm_train_with_tracking_turned_off_later_leaves_stats_alone():
    ours = tnn.BatchNorm1d(3)
    ours.track_running_stats = False
    ours(torch.randn(6, 3) + 5)
    assert ours.num_batches_tracked.item() == 0
    torch.testing.assert_close(ours.running_mean, torch.zeros(3))


def test_batch_norm_checks_the_input_rank_as_torch():
    with pytest.raises(ValueError, match="expected 4D input"):
        tnn.BatchNorm2d(3)(torch.randn(4, 3))


# -- bad arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: tnn.LayerNorm(4, eps=-1.0), "'eps'"),
        (lambda: tnn.RMSNorm(4, eps=float("nan")), "'eps'"),
        (lambda: tnn.LayerNorm([], elementwise_affine=False), "'normalized_shape'"),
        (lambda: tnn.BatchNorm2d(0), "'num_features'"),
        (lambda: tnn.BatchNorm2d(3, eps=-1e-5), "'eps'"),
        (lambda: tnn.Softmax(dim=1.5), "'dim'"),
        (lambda: tnn.Softmax(dim=2**70), "'dim' must be an int in the int64 range"),
        (
            lambda: tnn.LayerNorm(2**64, elementwise_affine=False, bias=False),
            r"'normalized_shape' must be .*\(at most 2\*\*63 - 1\)",
        ),
        (lambda: tnn.Linear(3, 4, dtype=torch.complex64), "'weight' has dtype complex64"),
    ],
)
def test_bad_constructor_arguments_are_named(make, argument):
    with pytest.raises(OpConfigError, match=argument):
        make()


NUMPY_INTS = {  # a case's integer arguments as numpy ints, which torch's modules accept
    "rms_norm": {"normalized_shape": np.int64(6)},
    "layer_norm_2d": {"normalized_shape": [np.int64(4), np.int32(6)], "eps": 1e-3},
    "softmax_dim1": {"dim": np.int64(1)},
    "batch_norm_1d": {"num_features": np.int64(3)},
    "linear": {"in_features": np.int64(6), "out_features": np.int64(5)},
}


@pytest.mark.parametrize("name", NUMPY_INTS)
def test_numpy_integer_arguments_work_as_in_torch(name):
    torch_type, _, shapes = CASES[name]
    theirs = torch_type(**NUMPY_INTS[name])
    ours = ours_of(torch_type)(**NUMPY_INTS[name])
    ours.load_state_dict(theirs.state_dict())
    (out, grads), (expected, expected_grads) = run_both(ours, theirs, torch.randn(shapes[-1]))
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)
    assert_same_state(ours, theirs)


def test_batch_norm_eps_zero_fails_only_when_training_as_torch():
    module = tnn.BatchNorm1d(3, eps=0.0)
    with pytest.raises(ValueError, match="'eps'"):
        module(torch.randn(4, 3))
    module.eval()
    assert module(torch.randn(4, 3)).shape == (4, 3)
