"""The Triton kernels' numbers against the torch reference kernels.

Interpreter tests (TRITON_INTERPRET=1, CPU tensors) run the real kernel code through the ops
and through the launchers with chosen plans, so both program shapes (fused, looped) and the
GEMM's split-K and ragged-K paths run with small sizes. `gpu` tests repeat a grid on CUDA.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_kit import TOLERANCE, interpreted, rel_error

from tileops.ops import GemmOp, LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp
from tileops_triton import compile
from tileops_triton.declare import INTERPRETING
from tileops_triton.gemm.configs import GemmConfig, candidates
from tileops_triton.gemm.launch import gemm
from tileops_triton.rows.launch import layer_norm, rms_norm, softmax
from tileops_triton.rows.plans import RowPlan

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
GPU_DTYPES = (torch.bfloat16, torch.float32)  # float16 takes bfloat16's paths; compiles cost
# 3000: float32 RMSNorm loops over two masked 2048-element slices (plans.FLOAT32_LOOPED); 9000: a
# masked 16384-wide block
ROWS = [(1, 1), (3, 7), (5, 64), (4, 1000), (2, 3000), (2, 9000)]
compiled = pytest.mark.skipif(INTERPRETING, reason="GPU tests run compiled, not interpreted")


def inputs(shape, dtype, device, *, offset: float = 0.0):
    return (torch.randn(shape, device=device) * 3 + offset).to(dtype)


def check_layer_norm(op: LayerNormFwdOp, x, w, b, dtype) -> None:
    n = x.shape[-1]
    ref = F.layer_norm(x.double(), (n,), None if w is None else w.double(),
                       None if b is None else b.double(), op.eps)  # fmt: skip
    assert rel_error(op(x, w, b), ref) < TOLERANCE[dtype]


def check_rows(device: str, rows: int, n: int, dtype: torch.dtype) -> None:
    x = inputs((rows, n), dtype, device, offset=5.0)
    w, b = inputs((n,), dtype, device), inputs((n,), dtype, device)
    for op in (LayerNormFwdOp(n), LayerNormFwdOp(n, eps=1e-3)):
        check_layer_norm(op, x, w, b, dtype)
    check_layer_norm(LayerNormFwdOp(n), x, None, None, dtype)
    rms = RMSNormFwdOp(n)(x, w)
    assert rel_error(rms, F.rms_norm(x.double(), (n,), w.double())) < TOLERANCE[dtype]
    got = SoftmaxFwdOp()(x)
    assert rel_error(got, torch.softmax(x.double(), -1)) < TOLERANCE[dtype]


LAYOUTS = {"NN": (False, False), "NT": (False, True), "TN": (True, False), "TT": (True, True)}


def stored(t: torch.Tensor, trans: bool) -> torch.Tensor:
    """`t` as a transposed operand is stored: its transpose, contiguous."""
    return t.t().contiguous() if trans else t


def check_gemm(
    device: str, m: int, n: int, k: int, dtype: torch.dtype, layout: str = "NN", bias=False
) -> None:
    """GemmOp in `layout` (with a bias) against the float64 product of the same values."""
    trans_a, trans_b = LAYOUTS[layout]
    a, b = inputs((m, k), dtype, device), inputs((k, n), dtype, device)
    b_ = inputs((n,), dtype, device) if bias else None
    got = GemmOp(trans_a, trans_b)(stored(a, trans_a), stored(b, trans_b), b_)
    want = a.double() @ b.double() + (0 if b_ is None else b_.double())
    if k == 0:
        assert torch.equal(got, want.to(dtype).expand_as(got))
        return
    assert rel_error(got, want) < TOLERANCE[dtype]


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "n"), ROWS)
def test_row_ops_match_torch_in_the_interpreter(rows, n, dtype) -> None:
    check_rows("cpu", rows, n, dtype)


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "plan",
    [
        RowPlan(True, 64, 4, 1),
        RowPlan(True, 64, 4, 1, cached=False),
        RowPlan(False, 16, 1, 1),
        RowPlan(False, 32, 1, 2),
    ],
    ids=["fused-4-rows", "fused-uncached", "looped-16", "looped-32"],
)
def test_both_program_shapes_match_torch(plan, dtype) -> None:
    rows, n = 6, 50
    x = inputs((rows, n), dtype, "cpu", offset=100.0)  # far from 0: the looped sums shift
    w, b = inputs((n,), dtype, "cpu"), inputs((n,), dtype, "cpu")
    out = torch.full_like(x, float("nan"))
    layer_norm(plan, x, w, b, 1e-5, out)
    ref = F.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    assert rel_error(out, ref) < TOLERANCE[dtype]
    rms_norm(plan, x, None, 1e-6, out)
    assert rel_error(out, F.rms_norm(x.double(), (n,), eps=1e-6)) < TOLERANCE[dtype]
    softmax(plan, x, out)
    assert rel_error(out, torch.softmax(x.double(), -1)) < TOLERANCE[dtype]


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0.0, 300.0])
def test_held_norm_rows_match_torch(monkeypatch, dtype, offset) -> None:
    """RowPlan.held: the row kept as loaded, widened per use (an integer shift for bfloat16),
    LayerNorm's one-pass sums shifted by the row's first element (rows far from 0)."""
    from tileops_triton.rows import norm_programs

    for fused in ("layer_norm_fused", "rms_norm_fused"):  # a held plan runs the held programs
        monkeypatch.setattr(norm_programs, fused, None)
    plan = RowPlan(True, 64, 1, 1, held=True, maxnreg=32)
    rows, n = 5, 50
    x = inputs((rows, n), dtype, "cpu", offset=offset)
    w, b = inputs((n,), dtype, "cpu"), inputs((n,), torch.float32, "cpu")
    out = torch.full_like(x, float("nan"))
    layer_norm(plan, x, w, b, 1e-5, out)
    ref = F.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5)
    assert rel_error(out, ref) < TOLERANCE[dtype]
    layer_norm(plan, x, None, None, 1e-5, out)
    assert rel_error(out, F.layer_norm(x.double(), (n,), eps=1e-5)) < TOLERANCE[dtype]
    rms_norm(plan, x, w, 1e-6, out)
    assert rel_error(out, F.rms_norm(x.double(), (n,), w.double(), eps=1e-6)) < TOLERANCE[dtype]


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 50, 64])
def test_held_softmax_rows_match_torch(monkeypatch, dtype, n) -> None:
    """The held softmax: each lane's vector reduced in place, the (max, sum) pairs merged in
    one reduction; rows far from 0 and rows with -inf (masked logits) among their values."""
    from tileops_triton.rows import softmax_programs

    monkeypatch.setattr(softmax_programs, "softmax_fused", None)  # the held program runs
    plan = RowPlan(True, 64, 1, 1, held=True)
    x = inputs((4, n), dtype, "cpu", offset=100.0)
    x[1, 1::3] = -float("inf")
    out = torch.full_like(x, float("nan"))
    softmax(plan, x, out)
    assert rel_error(out, torch.softmax(x.double(), -1)) < TOLERANCE[dtype]


@interpreted
@pytest.mark.parametrize(
    "plan", [RowPlan(True, 8, 2, 1), RowPlan(False, 4, 1, 1), RowPlan(True, 8, 1, 1, held=True)]
)
def test_softmax_of_infinities_matches_torch(plan) -> None:
    x = torch.tensor([[0.0, -float("inf"), 1.0, 2.0, -float("inf")], [-float("inf")] * 5])
    out = torch.empty_like(x)
    softmax(plan, x, out)
    torch.testing.assert_close(out, torch.softmax(x, -1), equal_nan=True)


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("m", "n", "k"), [(1, 7, 5), (16, 64, 300), (70, 33, 100), (130, 140, 64), (3, 4, 0)]
)
def test_gemm_matches_torch_in_the_interpreter(m, n, k, dtype) -> None:
    check_gemm("cpu", m, n, k, dtype)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 7, 5), (70, 33, 100), (3, 4, 0)])
def test_every_layout_matches_torch_in_the_interpreter(m, n, k, layout, bias, dtype) -> None:
    check_gemm("cpu", m, n, k, dtype, layout, bias)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "config",
    [
        GemmConfig(16, 32, 32, split_k=4, group_m=1),
        GemmConfig(32, 16, 16, group_m=2),
        GemmConfig(16, 16, 64, split_k=2),
    ],  # fmt: skip
    ids=["split-k-4", "grouped", "split-k-ragged"],
)
def test_gemm_configs_match_torch(config, dtype) -> None:
    a, b = inputs((40, 100), dtype, "cpu"), inputs((100, 50), dtype, "cpu")
    out = torch.full((40, 50), float("nan"), dtype=dtype)
    gemm(config, a, b, out)
    assert rel_error(out, a.double() @ b.double()) < TOLERANCE[dtype]
    bias = inputs((50,), dtype, "cpu")
    for layout, (trans_a, trans_b) in LAYOUTS.items():  # split partials and ragged k, stored
        out.fill_(float("nan"))
        gemm(config, stored(a, trans_a), stored(b, trans_b), out, bias,
             trans_a=trans_a, trans_b=trans_b)  # fmt: skip
        want = a.double() @ b.double() + bias.double()
        assert rel_error(out, want) < TOLERANCE[dtype], layout


@interpreted
@pytest.mark.parametrize(
    "config", [GemmConfig(16, 16, 64), GemmConfig(16, 16, 64, split_k=4)], ids=["", "split-k"]
)
def test_gemm_adds_the_bias_before_the_one_rounding(config) -> None:
    """257 ones sum to 257, which bfloat16 rounds to 256; plus a bias of 1 it is exactly 258."""
    a, b = torch.ones(3, 257, dtype=torch.bfloat16), torch.ones(257, 4, dtype=torch.bfloat16)
    out = torch.empty(3, 4, dtype=torch.bfloat16)
    gemm(config, a, b, out, torch.ones(4, dtype=torch.bfloat16))
    assert out.eq(258).all()


def test_gemm_candidates_fit_the_shared_memory_budget() -> None:
    for m in (1, 64, 4096):
        for dtype in DTYPES:
            configs = candidates(m, 4096, 4096, dtype, sm_count=132, smem_budget=101376)
            size = torch.empty((), dtype=dtype).element_size()
            assert configs and all(c.smem(size) <= 101376 for c in configs)
    skinny = candidates(1, 4096, 4096, torch.bfloat16, sm_count=132, smem_budget=232448)
    assert all(c.block_m == 16 for c in skinny) and skinny[0].split_k > 1


@pytest.mark.gpu
@compiled
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize(
    ("rows", "n"), [(3, 7), (4, 1000), (2, 3000), (2, 9000), (8, 20000), (64, 40000)]
)
def test_row_ops_match_torch_on_the_gpu(rows, n, dtype) -> None:
    check_rows("cuda", rows, n, dtype)


@pytest.mark.gpu
@compiled
@pytest.mark.parametrize("warps,maxnreg", [(32, None), (16, 64)])
def test_held_softmax_matches_torch_on_the_gpu(warps, maxnreg) -> None:
    """The held softmax (a plan-sweep candidate) compiled, on masked 32K-wide rows."""
    x = inputs((8, 20000), torch.bfloat16, "cuda", offset=5.0)
    x[1, 1::3] = -float("inf")
    out = torch.empty_like(x)
    softmax(RowPlan(True, 32768, 1, warps, held=True, maxnreg=maxnreg), x, out)
    assert rel_error(out, torch.softmax(x.double(), -1)) < TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
@compiled
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize(
    ("m", "n", "k"), [(1, 4096, 4096), (300, 200, 130), (1024, 1024, 1024), (5, 5, 0)]
)
def test_gemm_matches_torch_on_the_gpu(monkeypatch, m, n, k, dtype) -> None:
    monkeypatch.setattr(compile, "AUTOTUNE", (m, dtype) == (1024, torch.bfloat16))  # one tuning
    check_gemm("cuda", m, n, k, dtype)


@pytest.mark.gpu
@compiled
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 4096, 4096), (300, 200, 130), (5, 5, 0)])
def test_every_layout_with_a_bias_matches_torch_on_the_gpu(monkeypatch, m, n, k, layout):
    monkeypatch.setattr(compile, "AUTOTUNE", False)
    check_gemm("cuda", m, n, k, torch.float32, layout, bias=True)


@pytest.mark.gpu
@compiled
@pytest.mark.parametrize("m", [16])
def test_every_gemm_candidate_matches_torch_on_the_gpu(m) -> None:
    a, b = inputs((m, 1000), torch.bfloat16, "cuda"), inputs((1000, 520), torch.bfloat16, "cuda")
    for config in candidates(m, 520, 1000, torch.bfloat16, sm_count=132, smem_budget=232448):
        out = torch.full((m, 520), float("nan"), dtype=torch.bfloat16, device="cuda")
        gemm(config, a, b, out)
        assert rel_error(out, a.double() @ b.double()) < TOLERANCE[torch.bfloat16], config


@interpreted
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mixed_precision_norms_read_float32_weights(dtype):
    """16-bit rows with float32 parameters (autocast's layout): the kernels load them as they
    are, with no cast kernel in between, and return the rows' dtype."""
    x = inputs((3, 100), dtype, "cpu", offset=2.0)
    w, b = inputs((100,), torch.float32, "cpu"), inputs((100,), torch.float32, "cpu")
    norm = LayerNormFwdOp(100)
    assert norm.key_for("layer_norm", norm.call_for(x, w, b)) == "triton"
    got = norm(x, w, b)
    assert got.dtype == dtype
    assert (
        rel_error(got, F.layer_norm(x.double(), (100,), w.double(), b.double())) < TOLERANCE[dtype]
    )
    rms = RMSNormFwdOp(100)(x, w)
    assert rms.dtype == dtype
    assert rel_error(rms, F.rms_norm(x.double(), (100,), w.double())) < TOLERANCE[dtype]
