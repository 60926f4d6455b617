"""Declarations of the Triton kernel classes on simulated devices: Triton alone serves every
call on any CUDA arch; beside tileops-cuda it steps aside wherever a TileLang kernel serves,
except in measured regions; float64 is refused with a reason."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from triton_kit import STAND_IN_REGIONS, TRITON, measured_faster

from tileops.ops import (
    GemmCall,
    GemmOp,
    LayerNormCall,
    LayerNormFwdOp,
    RMSNormCall,
    RMSNormFwdOp,
    SoftmaxCall,
    SoftmaxFwdOp,
)
from tileops.testing import simulate_device
from tileops_triton.declare import CUDA_GEMM_KEYS, CUDA_ROW_KEYS, FasterRegion
from tileops_triton.rows.kernels import TritonLayerNorm

H200 = {"arch": 90, "sm_count": 132, "calibration": "NVIDIA H200", "smem_budget": 232448}
T4 = {"arch": 75, "sm_count": 40, "calibration": "Tesla T4", "smem_budget": 65536}
BLACKWELL = {"arch": 120, "sm_count": 84, "calibration": "RTX 5090", "smem_budget": 101376}
DEVICES = {"sm_90": H200, "sm_75": T4, "sm_120": BLACKWELL}
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ROW_LENGTHS = (1, 7, 1024, 1025, 4096, 16384, 16385, 65536, 1 << 20)
CUDA = torch.device("cuda:0")


def row_calls(n: int, dtype: torch.dtype, device: torch.device = CUDA) -> dict:
    """(op, interface, call) for each row-wise op at row length n."""
    return {
        LayerNormFwdOp: ("layer_norm", LayerNormCall(
            device=device, n=n, eps=1e-5, dtype=dtype, has_weight=True, has_bias=False)),
        RMSNormFwdOp: ("rms_norm", RMSNormCall(
            device=device, n=n, eps=1e-6, dtype=dtype, has_weight=True)),
        SoftmaxFwdOp: ("softmax", SoftmaxCall(device=device, n=n, dtype=dtype)),
    }  # fmt: skip


def gemm_call(m: int, n: int, k: int, dtype: torch.dtype) -> tuple:
    return "gemm", GemmCall(device=CUDA, m=m, n=n, k=k, dtype=dtype)


def new_op(op_cls: type):
    return op_cls() if op_cls in (SoftmaxFwdOp, GemmOp) else op_cls(8)


@pytest.mark.parametrize("facts", DEVICES.values(), ids=DEVICES.keys())
@pytest.mark.parametrize("dtype", DTYPES)
def test_alone_triton_serves_every_row_call_on_every_arch(triton_alone, facts, dtype) -> None:
    with simulate_device(CUDA, **facts):
        for n in ROW_LENGTHS:
            for op_cls, (interface, call) in row_calls(n, dtype).items():
                assert new_op(op_cls).key_for(interface, call) == "triton"


@pytest.mark.parametrize("facts", DEVICES.values(), ids=DEVICES.keys())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 4096, 4096), (4096, 4096, 4096), (3, 5, 0), (65, 1, 7)])
def test_alone_triton_serves_every_gemm(triton_alone, facts, dtype, shape) -> None:
    with simulate_device(CUDA, **facts):
        assert GemmOp().key_for(*gemm_call(*shape, dtype)) == "triton"


@pytest.mark.parametrize("op_cls", list(TRITON))
def test_float64_is_refused_and_left_to_the_reference(triton_alone, op_cls) -> None:
    if op_cls is GemmOp:
        interface, call = gemm_call(8, 8, 8, torch.float64)
    else:
        interface, call = row_calls(64, torch.float64)[op_cls]
    with simulate_device(CUDA, **H200):
        explanation = new_op(op_cls).explain(interface, call)
        assert explanation.verdict("triton") == "refused"
        assert "not torch.float64" in explanation.text
        assert "reference kernels serve it" in explanation.text
        assert new_op(op_cls).key_for(interface, call) == "reference"


@pytest.mark.parametrize("dtype", DTYPES)
def test_beside_tileops_cuda_tilelang_serves_its_archs(with_cuda_stand_ins, dtype) -> None:
    with simulate_device(CUDA, **H200):
        for n in ROW_LENGTHS:
            for op_cls, (interface, call) in row_calls(n, dtype).items():
                op, explanation = new_op(op_cls), new_op(op_cls).explain(interface, call)
                if measured_faster(op_cls, call):
                    assert op.key_for(interface, call) == "triton"
                    statuses = {v.status for v in explanation.judgement.verdicts}
                    assert "outranked" in statuses and "tied" not in statuses
                else:
                    assert op.key_for(interface, call) in STAND_IN_REGIONS
                    assert explanation.verdict("triton") == "refused"
                    assert "Triton steps aside" in explanation.text


@pytest.mark.parametrize("n", [256, 512])
def test_triton_wins_where_it_measured_faster_on_the_h200_only(with_cuda_stand_ins, n):
    interface, call = row_calls(n, torch.bfloat16)[SoftmaxFwdOp]
    with simulate_device(CUDA, **H200):
        assert new_op(SoftmaxFwdOp).key_for(interface, call) == "triton"
    with simulate_device(CUDA, **{**H200, "calibration": "NVIDIA H100 80GB HBM3"}):
        assert new_op(SoftmaxFwdOp).key_for(interface, call) in STAND_IN_REGIONS
    interface, call = row_calls(n, torch.float32)[SoftmaxFwdOp]
    with simulate_device(CUDA, **H200):
        assert new_op(SoftmaxFwdOp).key_for(interface, call) in STAND_IN_REGIONS


@pytest.mark.parametrize(
    ("op_cls", "n", "dtype"),
    [
        (LayerNormFwdOp, 16384, torch.bfloat16),  # Triton led here until block_row's 8 vectors
        (RMSNormFwdOp, 12000, torch.bfloat16),
        (SoftmaxFwdOp, 1024, torch.bfloat16),
        (SoftmaxFwdOp, 16384, torch.float32),
    ],
)
def test_triton_steps_aside_where_tilelang_measured_faster(with_cuda_stand_ins, op_cls, n, dtype):
    interface, call = row_calls(n, dtype)[op_cls]
    with simulate_device(CUDA, **H200):
        explanation = new_op(op_cls).explain(interface, call)
        assert new_op(op_cls).key_for(interface, call) in STAND_IN_REGIONS
    assert "Triton steps aside" in explanation.text


@pytest.mark.parametrize("facts", [T4, BLACKWELL], ids=["sm_75", "sm_120"])
def test_beside_tileops_cuda_triton_serves_archs_tilelang_lacks(with_cuda_stand_ins, facts):
    with simulate_device(CUDA, **facts):
        for n in ROW_LENGTHS:
            for op_cls, (interface, call) in row_calls(n, torch.bfloat16).items():
                assert new_op(op_cls).key_for(interface, call) == "triton"


def test_beside_tileops_cuda_triton_keeps_gemm(with_cuda_stand_ins) -> None:
    with simulate_device(CUDA, **H200):
        assert GemmOp().key_for(*gemm_call(64, 64, 64, torch.bfloat16)) == "triton"


def test_a_measured_region_makes_triton_win_on_the_h200_only(with_cuda_stand_ins, monkeypatch):
    region = FasterRegion(torch.bfloat16, 2048, 4096)
    monkeypatch.setattr(TritonLayerNorm, "faster", (region,))
    op = LayerNormFwdOp(8)
    inside, outside = (row_calls(n, torch.bfloat16)[LayerNormFwdOp] for n in (3000, 8192))
    with simulate_device(CUDA, **H200):
        assert op.key_for(*inside) == "triton"
        assert op.key_for(*outside) == "tilelang_block_row"
    with simulate_device(CUDA, **{**H200, "calibration": "NVIDIA A100-SXM4-80GB", "arch": 80}):
        assert op.key_for(*inside) == "tilelang_block_row"


def test_triton_names_every_tileops_cuda_row_key() -> None:
    for op_cls in (LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp):
        assert CUDA_ROW_KEYS <= TRITON[op_cls][1].preferred_over


@pytest.mark.skipif(
    importlib.util.find_spec("tileops_cuda") is None, reason="tileops-cuda is not installed"
)
@pytest.mark.parametrize("facts", DEVICES.values(), ids=DEVICES.keys())
@pytest.mark.parametrize("dtype", DTYPES)
def test_with_the_real_tileops_cuda_dispatch_is_never_ambiguous(facts, dtype) -> None:
    import tileops_cuda  # noqa: F401  (registers its kernels if the loader has not)

    with simulate_device(CUDA, **facts):
        for n in ROW_LENGTHS:
            for op_cls, (interface, call) in row_calls(n, dtype).items():
                key = new_op(op_cls).key_for(interface, call)
                cuda_arch = facts["arch"] in (80, 86, 89, 90)
                expected_cuda = cuda_arch and not measured_faster(op_cls, call)
                assert (key in CUDA_ROW_KEYS) == expected_cuda, (op_cls, n, key)


@pytest.mark.skipif(
    importlib.util.find_spec("tileops_cuda") is None, reason="tileops-cuda is not installed"
)
@pytest.mark.parametrize("facts", DEVICES.values(), ids=DEVICES.keys())
@pytest.mark.parametrize("dtype", DTYPES)
def test_with_the_real_tileops_cuda_gemm_is_never_ambiguous(facts, dtype) -> None:
    """Triton steps aside wherever a tileops-cuda GEMM serves (no measured region yet): cuBLAS
    serves every float GEMM on every CUDA arch, so Triton serves none beside tileops-cuda."""
    import tileops_cuda  # noqa: F401  (registers its kernels if the loader has not)

    with simulate_device(CUDA, **facts):
        for shape in [(1, 4096, 4096), (4096, 4096, 4096), (3, 5, 0), (65, 1, 7)]:
            explanation = GemmOp().explain(*gemm_call(*shape, dtype))
            assert explanation.chosen in CUDA_GEMM_KEYS, (shape, explanation.chosen)
            assert explanation.verdict("triton") == "refused"
            if not (facts["arch"] in (80, 86, 89, 90) and dtype != torch.float32):
                assert explanation.chosen == "cublas", (shape, explanation.chosen)


def test_cpu_is_served_only_under_the_interpreter(triton_alone) -> None:
    from tileops_triton.declare import INTERPRETING

    interface, call = row_calls(64, torch.float32, torch.device("cpu"))[SoftmaxFwdOp]
    assert SoftmaxFwdOp().key_for(interface, call) == ("triton" if INTERPRETING else "reference")


def test_row_plan_fuses_rows_up_to_32k_with_the_measured_warps() -> None:
    """The H200 sweep's launch table: a whole 32K row in one 32-warp program, longer rows
    looped; at 16K RMSNorm takes 8 warps (read evict_first) and softmax 32, at 8K softmax 16."""
    from tileops_triton.rows.plans import LOOP_CHUNK, RowPlan, row_plan

    f32, f16 = torch.float32, torch.float16
    assert row_plan(32768, "softmax", f16) == RowPlan(True, 32768, 1, 32)
    assert row_plan(20000, "layer_norm", f32) == RowPlan(True, 32768, 1, 32)
    assert row_plan(32769, "rms_norm", torch.bfloat16) == RowPlan(False, LOOP_CHUNK, 1, 16)
    assert row_plan(16384, "rms_norm", f16).warps == 8
    assert not row_plan(16384, "rms_norm", f16).cached  # evict_first, as swept
    assert row_plan(8192, "rms_norm", f32).cached and row_plan(16384, "layer_norm", f32).cached
    # float32 RMSNorm rows of 2K-4K loop in 2048-element slices (rows.FLOAT32_LOOPED)
    assert row_plan(4096, "rms_norm", f32) == row_plan(3000, "rms_norm", f32)
    assert row_plan(4096, "rms_norm", f32) == RowPlan(False, 2048, 1, 16)
    assert row_plan(4096, "layer_norm", f32).fused and row_plan(4096, "rms_norm", f16).fused
    assert row_plan(16384, "layer_norm", f32).warps == 16
    assert row_plan(16384, "softmax", f32).warps == 32
    assert (row_plan(8192, "layer_norm", f32).warps, row_plan(8192, "softmax", f32).warps) == (
        4,
        16,
    )


@pytest.mark.parametrize(
    "family,n,warps,maxnreg",
    [("layer_norm", 16384, 8, 80), ("layer_norm", 20000, 32, 32), ("rms_norm", 9000, 8, 80),
     ("rms_norm", 4096, 8, 80), ("rms_norm", 32768, 32, 32), ("softmax", 20000, 32, 32),
     ("softmax", 32768, 32, 32)],
)  # fmt: skip
def test_bfloat16_rows_are_held_with_capped_registers_where_measured(family, n, warps, maxnreg):
    """Measured on the H200 (rows/TUNING.md): norms at 16K and 32K (RMSNorm from 4K), softmax
    at 32K; other dtypes, shorter rows and softmax's 16K are not held."""
    from tileops_triton.rows.plans import RowPlan, row_plan

    plan = row_plan(n, family, torch.bfloat16)
    assert (plan.held, plan.rows, plan.warps, plan.maxnreg) == (True, 1, warps, maxnreg)
    assert not row_plan(n, family, torch.float16).held
    assert not row_plan(16384, "softmax", torch.bfloat16).held
    assert not row_plan(2048, family, torch.bfloat16).held
    assert row_plan(8192, "layer_norm", torch.bfloat16) == RowPlan(True, 8192, 1, 4)
