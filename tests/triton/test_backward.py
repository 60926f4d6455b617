"""Triton's row-wise backward kernels: numerics under the interpreter against float64 torch
(through the ops, and through the launchers with looped plans and few programs, so partial rows
add up over several rows per program), and their declarations on simulated devices."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_kit import TOLERANCE, interpreted, rel_error

from tileops import Kernel
from tileops.backend import register_kernel_type
from tileops.backward import backward_call
from tileops.ops import (
    LayerNormBackwardCall,
    LayerNormBackwardInterface,
    LayerNormFwdOp,
    RMSNormBackwardCall,
    RMSNormBackwardInterface,
    RMSNormFwdOp,
    SoftmaxBackwardCall,
    SoftmaxBackwardInterface,
    SoftmaxFwdOp,
)
from tileops.registry import REGISTRY
from tileops.testing import isolated_registry, simulate_device
from tileops_triton.declare import INTERPRETING
from tileops_triton.rows import backward_kernels as bk
from tileops_triton.rows.backward_launch import BackwardPlan, norm_backward, softmax_backward

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# 1: a single column; 7, 1000, 3000: masked blocks; 64: a packed tile of 32 rows
SHAPES = [(1, 1), (3, 7), (40, 64), (4, 1000), (2, 3000)]
H200 = {"arch": 90, "sm_count": 132, "calibration": "NVIDIA H200", "smem_budget": 232448}
CUDA = torch.device("cuda:0")
BACKWARD = {
    LayerNormFwdOp: bk.TritonLayerNormBackward,
    RMSNormFwdOp: bk.TritonRMSNormBackward,
    SoftmaxFwdOp: bk.TritonSoftmaxBackward,
}


@pytest.fixture
def backward_alone():
    """The Triton backward kernels beside the reference only (no forward kernels but theirs)."""
    with isolated_registry():
        for op, cls in BACKWARD.items():
            REGISTRY.withdraw_kernel_types(op)
            register_kernel_type(op, bk.BACKWARD_KEY, cls)
        yield


def _inputs(rows, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, n, generator=g) * 3 + 2).to(dtype)
    w, b = (torch.randn(n, generator=g) for _ in range(2))
    dy = torch.randn(rows, n, generator=g).to(dtype)
    return x, w.to(dtype), b.to(dtype), dy


def _grads(fn, tensors, needs, dy):
    """Gradients of fn(*tensors) for the tensors `needs` marks (None elsewhere)."""
    leaves = [None if t is None else t.detach().requires_grad_(need)
              for t, need in zip(tensors, needs, strict=True)]  # fmt: skip
    out = fn(*leaves)
    wanted = [t for t in leaves if t is not None and t.requires_grad]
    found = iter(torch.autograd.grad(out, wanted, dy.to(out.dtype)))
    return [next(found) if t is not None and t.requires_grad else None for t in leaves]


def _check(got, want, dtype):
    """Relative error, against a floor: LayerNorm's dx over rows of one element is 0."""
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            assert g.dtype == dtype or g.dtype == torch.float32  # float32 params stay float32
            assert g.shape == w.shape
            error = (g.double() - w).norm() / max(w.norm().item(), 1e-3 * w.numel() ** 0.5)
            assert error < TOLERANCE[dtype], error


def _double(tensors):
    return [None if t is None else t.double() for t in tensors]


NORM_NEEDS = {"all": (True, True, True), "dx": (True, False, False), "params": (False, True, True)}


@interpreted
@pytest.mark.parametrize("needs", NORM_NEEDS)
@pytest.mark.parametrize("affine", ["weight_bias", "weight", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_layer_norm_backward_matches_float64(backward_alone, shape, dtype, affine, needs):
    rows, n = shape
    if n == 1:
        pytest.skip("one column goes to the reference (tests/cuda/test_row_backward.py)")
    x, w, b, dy = _inputs(rows, n, dtype)
    w, b = (w if affine != "none" else None), (b if affine == "weight_bias" else None)
    needs = tuple(
        need and t is not None for need, t in zip(NORM_NEEDS[needs], (x, w, b), strict=True)
    )
    if not any(needs):
        pytest.skip("nothing requires grad")
    op = LayerNormFwdOp(n)
    got = _grads(op, (x, w, b), needs, dy)
    want = _grads(lambda *t: F.layer_norm(t[0], (n,), *t[1:]), _double((x, w, b)), needs, dy)
    _check(got, want, dtype)


@interpreted
@pytest.mark.parametrize("needs", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_backward_matches_float64(backward_alone, shape, dtype, weighted, needs):
    rows, n = shape
    x, w, _, dy = _inputs(rows, n, dtype)
    w = w if weighted else None
    needs = (needs[0], needs[1] and weighted)
    if not any(needs):
        pytest.skip("nothing requires grad")
    op = RMSNormFwdOp(n, eps=1e-6)
    got = _grads(op, (x, w), needs, dy)
    want = _grads(lambda *t: F.rms_norm(t[0], (n,), t[1], 1e-6), _double((x, w)), needs, dy)
    _check(got, want, dtype)


@interpreted
@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_backward_matches_float64(backward_alone, shape, dtype, dim):
    x, _, _, dy = _inputs(*shape, dtype)
    got = _grads(SoftmaxFwdOp(dim), (x,), (True,), dy)
    want = _grads(lambda t: torch.softmax(t, dim), (x.double(),), (True,), dy)
    _check(got, want, dtype)


@interpreted
def test_float32_params_beside_16_bit_x_get_float32_gradients(backward_alone):
    x, w, b, dy = _inputs(6, 100, torch.bfloat16)
    w, b = w.float(), b.float()
    got = _grads(LayerNormFwdOp(100), (x, w, b), (True, True, True), dy)
    want = _grads(
        lambda *t: F.layer_norm(t[0], (100,), *t[1:]), _double((x, w, b)), (True,) * 3, dy
    )
    assert [g.dtype for g in got] == [torch.bfloat16, torch.float32, torch.float32]
    _check(got, want, torch.bfloat16)


@interpreted
def test_strided_inputs_and_several_normalized_dims(backward_alone):
    x = torch.randn(6, 3, 40).transpose(0, 1)  # (3, 6, 40), not contiguous
    w, b, dy = torch.randn(40), torch.randn(40), torch.randn(3, 6, 40)
    got = _grads(LayerNormFwdOp(40), (x, w, b), (True,) * 3, dy)
    want = _grads(lambda *t: F.layer_norm(t[0], (40,), *t[1:]), _double((x, w, b)), (True,) * 3, dy)
    _check(got, want, torch.float32)
    x = torch.randn(2, 5, 3, 4)
    w = torch.randn(3, 4)
    got = _grads(RMSNormFwdOp((3, 4)), (x, w), (True, True), torch.randn(2, 5, 3, 4))
    assert got[0].shape == x.shape and got[1].shape == w.shape


# -- launchers: looped rows, several rows per program ----------------------------------------


def _looped(chunk: int, programs: int) -> BackwardPlan:
    return BackwardPlan(fused=False, block=chunk, rows=1, warps=4, programs=programs)


@interpreted
@pytest.mark.parametrize("center", [True, False], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("plan", [_looped(64, 3), _looped(128, 1),
                                  BackwardPlan(True, 256, 2, 4, programs=2)])  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_launcher_plans(center, plan, dtype):
    """n = 200: 64-wide slices end in a partial one; 10 rows over 1-3 programs."""
    x, w, b, dy = _inputs(10, 200, dtype, seed=3)
    dx, dw, db = norm_backward(plan, x, dy, w, 1e-5, center, (True, True, center), dtype)
    fn = (lambda *t: F.layer_norm(t[0], (200,), *t[1:], eps=1e-5)) if center else (
        lambda *t: F.rms_norm(t[0], (200,), t[1], eps=1e-5))  # fmt: skip
    tensors = (x, w, b) if center else (x, w)
    want = _grads(fn, _double(tensors), (True,) * len(tensors), dy)
    _check([dx, dw, db][: len(tensors)], want, dtype)
    if not center:
        assert db is None


@interpreted
def test_norm_launcher_with_no_rows_gives_zero_parameter_gradients():
    x = torch.empty(0, 50)
    dx, dw, db = norm_backward(_looped(64, 3), x, x, torch.ones(50), 1e-5, True,
                               (True, True, True), torch.float32)  # fmt: skip
    assert dx.shape == (0, 50)
    assert torch.equal(dw, torch.zeros(50)) and torch.equal(db, torch.zeros(50))


@interpreted
@pytest.mark.parametrize("plan", [_looped(64, 1), BackwardPlan(True, 256, 4, 4, 1)])
def test_softmax_launcher_plans(plan):
    y = torch.softmax(torch.randn(9, 200, dtype=torch.float64), -1)
    dy = torch.randn(9, 200, dtype=torch.float64)
    dx = softmax_backward(plan, y.float(), dy.float())
    want = y * (dy - (y * dy).sum(-1, keepdim=True))
    assert rel_error(dx, want) < TOLERANCE[torch.float32]


# -- declarations on simulated devices --------------------------------------------------------


def _calls(n: int, dtype: torch.dtype, **extra) -> dict:
    """(op, backward call) of each row op at row length n."""
    common = {"device": CUDA, "create_graph": extra.pop("create_graph", False)}
    return {
        RMSNormFwdOp: RMSNormBackwardCall(
            **common, op=RMSNormFwdOp.op_name, params=(("normalized_shape", (n,)), ("eps", None)),
            dtypes=(dtype, dtype), needs=(True, True), n=n, eps=1e-6, dtype=dtype,
            param_dtype=extra.get("param_dtype", dtype), contiguous=True),
        LayerNormFwdOp: LayerNormBackwardCall(
            **common, op=LayerNormFwdOp.op_name, params=(("normalized_shape", (n,)), ("eps", 1e-5)),
            dtypes=(dtype, dtype, dtype), needs=(True, True, True), n=n, eps=1e-5, dtype=dtype,
            param_dtype=extra.get("param_dtype", dtype), contiguous=False),
        SoftmaxFwdOp: SoftmaxBackwardCall(
            **common, op=SoftmaxFwdOp.op_name, params=(("dim", -1),), dtypes=(dtype,),
            needs=(True,), n=n, dtype=dtype, has_output=extra.get("has_output", True),
            contiguous=True),
    }  # fmt: skip


def _op(op_cls):
    return op_cls() if op_cls is SoftmaxFwdOp else op_cls(8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 1000, 1025, 16384, 65536, 1 << 20])
def test_triton_serves_every_row_length_on_cuda(backward_alone, n, dtype):
    with simulate_device(CUDA, **H200):
        for op_cls, call in _calls(n, dtype).items():
            one_column = op_cls is LayerNormFwdOp and n == 1  # dx exactly 0: the reference
            want = "reference_backward" if one_column else bk.BACKWARD_KEY
            assert _op(op_cls).key_for("backward", call) == want


REFUSED = {
    "float64": ({"dtype": torch.float64}, "serve float16, bfloat16 and float32"),
    "double_backward": ({"create_graph": True}, "does not declare differentiable = True"),
    "empty_rows": ({"n": 0}, "rows of length 0"),
}


@pytest.mark.parametrize("case", REFUSED)
@pytest.mark.parametrize("op_cls", list(BACKWARD))
def test_refusals_leave_the_call_to_the_reference(backward_alone, op_cls, case):
    extra, reason = dict(REFUSED[case][0]), REFUSED[case][1]
    n, dtype = extra.pop("n", 64), extra.pop("dtype", torch.float32)
    with simulate_device(CUDA, **H200):
        explanation = _op(op_cls).explain("backward", _calls(n, dtype, **extra)[op_cls])
    assert explanation.chosen == "reference_backward"
    assert explanation.verdict(bk.BACKWARD_KEY) == "refused"
    assert reason in str(explanation)


def test_softmax_without_y_is_refused(backward_alone):
    call = _calls(64, torch.bfloat16, has_output=False)[SoftmaxFwdOp]
    with simulate_device(CUDA, **H200):
        explanation = SoftmaxFwdOp().explain("backward", call)
    assert explanation.chosen == "reference_backward"
    assert "modified in place since the forward" in str(explanation)


def test_float64_params_beside_float32_x_are_refused(backward_alone):
    call = _calls(64, torch.float32, param_dtype=torch.float64)[LayerNormFwdOp]
    with simulate_device(CUDA, **H200):
        explanation = LayerNormFwdOp(8).explain("backward", call)
    assert "parameters of torch.float64 beside x of torch.float32" in str(explanation)


class _CudaBackward(Kernel):
    """Declared like tileops-cuda's backward kernels: sm_80..sm_90, rows up to 16384."""

    supported_archs = frozenset({80, 90})

    @classmethod
    def refusal(cls, call):
        return None if call.n <= 16384 else "the row does not fit on chip"


@pytest.mark.parametrize("op_cls", list(BACKWARD))
def test_triton_steps_aside_where_tileops_cuda_serves(backward_alone, op_cls):
    interface = {LayerNormFwdOp: LayerNormBackwardInterface, RMSNormFwdOp: RMSNormBackwardInterface,
                 SoftmaxFwdOp: SoftmaxBackwardInterface}[op_cls]  # fmt: skip
    stand_in = type("StandIn", (_CudaBackward, interface), {"forward": interface.forward})
    key = next(iter(bk.CUDA_BACKWARD_KEYS))
    register_kernel_type(op_cls, key, stand_in)
    with simulate_device(CUDA, **H200):
        assert _op(op_cls).key_for("backward", _calls(4096, torch.bfloat16)[op_cls]) == key
        assert _op(op_cls).key_for("backward", _calls(32768, torch.bfloat16)[op_cls]) == (
            bk.BACKWARD_KEY
        )
    sm_75 = {**H200, "arch": 75, "calibration": "Tesla T4"}
    with simulate_device(CUDA, **sm_75):  # tileops-cuda does not run there
        call = _calls(4096, torch.bfloat16)[op_cls]
        assert _op(op_cls).key_for("backward", call) == bk.BACKWARD_KEY


# -- GPU numerics (compiled Triton) -----------------------------------------------------------

compiled = pytest.mark.skipif(INTERPRETING, reason="GPU tests run compiled, not interpreted")
GPU_SHAPES = [(37, 7), (300, 1000), (64, 4096), (9, 16384), (5, 32768), (3, 65536), (2, 100003)]


@pytest.mark.gpu
@compiled
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_gpu_gradients_match_float64(backward_alone, shape, dtype):
    """Fused rows up to 16K, looped ones beyond (and an odd 100003)."""
    rows, n = shape
    x, w, b, dy = (t.cuda() for t in _inputs(rows, n, dtype))
    cases = {
        "rms": (RMSNormFwdOp(n, 1e-6), lambda *t: F.rms_norm(t[0], (n,), t[1], 1e-6), (x, w)),
        "layer": (LayerNormFwdOp(n), lambda *t: F.layer_norm(t[0], (n,), *t[1:]), (x, w, b)),
        "softmax": (SoftmaxFwdOp(-1), lambda t: torch.softmax(t, -1), (x,)),
    }
    for op, fn, tensors in cases.values():
        needs = (True,) * len(tensors)
        kept = (fn(*tensors),) if type(op).saves_outputs else ()  # softmax's y
        call = backward_call(op, (dy,), tensors, kept, needs, False)
        assert op.key_for("backward", call) == bk.BACKWARD_KEY
        got = _grads(op, tensors, needs, dy)
        _check(got, _grads(fn, _double(tensors), needs, dy), dtype)
