"""tileops-cuda's row-wise backward kernels: their region and refusals on simulated devices,
cubin compile checks for sm_80 and sm_90 (no GPU needed), and GPU numerics against float64
torch through the ops (skipped without CUDA)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing

import pytest
import torch
import torch.nn.functional as F

import tileops_cuda
from tileops.backend import register_kernel_type
from tileops.backward import backward_call
from tileops.ops import (
    LayerNormBackwardCall,
    LayerNormFwdOp,
    RMSNormBackwardCall,
    RMSNormFwdOp,
    SoftmaxBackwardCall,
    SoftmaxFwdOp,
)
from tileops.registry import REGISTRY
from tileops.testing import isolated_registry, simulate_device
from tileops_cuda.rows import backward_kernels as bk

CUDA = torch.device("cuda:0")
SMEM_BUDGET = {80: 166912, 90: 232448}
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@contextlib.contextmanager
def _backward_only():
    with isolated_registry():
        for op, keys in tileops_cuda.ROW_BACKWARD_KERNELS.items():
            REGISTRY.withdraw_kernel_types(op)
            for key, cls in keys.items():
                register_kernel_type(op, key, cls)
        yield


@pytest.fixture
def backward_only():
    """The row ops' backward served by tileops-cuda's kernels beside the reference only."""
    with _backward_only():
        yield


def _call(op_cls, n, dtype, *, weight=True, bias=True, needs=None, **extra):
    common = {"device": CUDA, "create_graph": False}
    if op_cls is SoftmaxFwdOp:
        return SoftmaxBackwardCall(
            **common,
            op=op_cls.op_name,
            params=(("dim", -1),),
            dtypes=(dtype,),
            needs=(True,),
            n=n,
            dtype=dtype,
            has_output=extra.get("has_output", True),
            contiguous=True,
        )
    param = extra.get("param_dtype", dtype)
    if op_cls is RMSNormFwdOp:
        return RMSNormBackwardCall(
            **common,
            op=op_cls.op_name,
            params=(("normalized_shape", (n,)), ("eps", None)),
            dtypes=(dtype, param if weight else None),
            needs=needs or (True, weight),
            n=n,
            eps=1e-6,
            dtype=dtype,
            param_dtype=param if weight else None,
            contiguous=True,
        )
    return LayerNormBackwardCall(
        **common, op=op_cls.op_name, params=(("normalized_shape", (n,)), ("eps", 1e-5)),
        dtypes=(dtype, param if weight else None, param if bias else None),
        needs=needs or (True, weight, bias), n=n, eps=1e-5, dtype=dtype,
        param_dtype=param if weight or bias else None, contiguous=True)  # fmt: skip


def _op(op_cls):
    return op_cls() if op_cls is SoftmaxFwdOp else op_cls(8)


H100 = {"arch": 90, "sm_count": 132, "calibration": "NVIDIA H200", "smem_budget": 232448}
OPS = (RMSNormFwdOp, LayerNormFwdOp, SoftmaxFwdOp)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n", [1, 7, 1000, 4096, 8192])
@pytest.mark.parametrize("op_cls", OPS)
def test_serves_rows_that_fit_on_sm_80_and_sm_90(backward_only, op_cls, n, dtype):
    if op_cls is LayerNormFwdOp and n == 1:
        pytest.skip("one column goes to the reference: see the test below")
    for arch in (80, 90):
        with simulate_device(CUDA, **{**H100, "arch": arch}):
            assert _op(op_cls).key_for("backward", _call(op_cls, n, dtype)) == bk.BACKWARD_KEY


@pytest.mark.parametrize("op_cls", OPS)
def test_rows_past_the_registers_are_refused_with_the_reason(backward_only, op_cls):
    n = 1 << 20  # the norms' largest cluster's slices too
    with simulate_device(CUDA, **H100):
        explanation = _op(op_cls).explain("backward", _call(op_cls, n, torch.bfloat16))
    assert explanation.chosen == "reference_backward"
    assert f"a row of {n} does not fit one block (" in str(explanation)


def test_norm_rows_past_one_block_take_a_cluster_on_sm_90_only(backward_only):
    """64K bf16 LayerNorm rows: four blocks of 16K columns share each row (sm_90); sm_80 has
    no clusters and leaves them to Triton's looped kernel or the reference."""
    budget = H100["smem_budget"]
    plan = bk.norm_backward_plan(65536, torch.bfloat16, 2, 132, budget, clusters=True)
    assert (plan.cluster, plan.padded, plan.hold, plan.stages) == (4, 16384, "shared", 2)
    assert plan.programs == 33  # clusters: one block per SM
    assert bk.norm_backward_plan(32768, torch.bfloat16, 2, 132, budget, clusters=True).cluster == 2
    # a block would keep one stage of 32K RMSNorm rows: a cluster keeps two
    assert bk.norm_backward_plan(32768, torch.bfloat16, 1, 132, budget).stages == 1
    assert bk.norm_backward_plan(32768, torch.bfloat16, 1, 132, budget, clusters=True).cluster == 2
    call = _call(LayerNormFwdOp, 65536, torch.bfloat16)
    with simulate_device(CUDA, **H100):
        assert LayerNormFwdOp(8).key_for("backward", call) == bk.BACKWARD_KEY
    with simulate_device(CUDA, **{**H100, "arch": 80}):
        assert LayerNormFwdOp(8).key_for("backward", call) == "reference_backward"


def test_norm_rows_past_the_registers_are_read_from_shared_memory(backward_only):
    """x and dy held in registers beside the partials up to 8K bf16; longer rows keep only the
    partials there (16K LayerNorm with both, 32K RMSNorm with dweight); beyond, sm_80 (no
    clusters) refuses; softmax has no staging."""
    budget = H100["smem_budget"]
    assert bk.norm_backward_plan(8192, torch.bfloat16, 2, 132, budget).hold == "registers"
    assert bk.norm_backward_plan(16384, torch.bfloat16, 2, 132, budget).hold == "shared"
    assert bk.norm_backward_plan(32768, torch.bfloat16, 2, 132, budget) is None
    with simulate_device(CUDA, **H100):
        rms = _call(RMSNormFwdOp, 32768, torch.bfloat16)
        assert RMSNormFwdOp(8).key_for("backward", rms) == bk.BACKWARD_KEY
        softmax = _call(SoftmaxFwdOp, 32768, torch.bfloat16)
        assert SoftmaxFwdOp().key_for("backward", softmax) == "reference_backward"
    with simulate_device(CUDA, **{**H100, "arch": 80}):
        layer = _call(LayerNormFwdOp, 32768, torch.bfloat16)
        explanation = str(LayerNormFwdOp(8).explain("backward", layer))
        assert "2 float32 register values per element for the parameter gradients'" in explanation


def test_norms_stage_two_rows_where_shared_memory_allows_and_one_where_not():
    """x and dy of the next row copy in while this one computes (two stages); a row whose two
    stages would pass the block's shared memory keeps one."""
    budget = H100["smem_budget"]
    bf16 = bk.norm_backward_plan(4096, torch.bfloat16, 1, 132, budget)
    assert bf16.stages == 2 and bf16.blocks_per_sm == 2 and bf16.programs == 264
    wide = bk.norm_backward_plan(16384, torch.float32, 0, 132, budget)  # 128 KiB per stage
    assert wide.stages == 1 and wide.blocks_per_sm == 1
    assert bk.backward_plan(4096, torch.bfloat16, 2, 132).stages == 0  # softmax: no staging


def test_short_rows_keep_at_most_the_resident_block_limit():
    plan = bk.norm_backward_plan(7, torch.float32, 1, 132, H100["smem_budget"])
    assert plan.lanes == 32 and plan.blocks_per_sm == 32 and plan.programs == 32 * 132


REFUSALS = {
    "float64": ({"dtype": torch.float64}, "torch.float64 is not served"),
    "empty_rows": ({"n": 0}, "rows of length 0"),
}


@pytest.mark.parametrize("case", REFUSALS)
@pytest.mark.parametrize("op_cls", OPS)
def test_refusals(backward_only, op_cls, case):
    fields, reason = REFUSALS[case]
    call = _call(op_cls, fields.get("n", 64), fields.get("dtype", torch.float32))
    with simulate_device(CUDA, **H100):
        explanation = _op(op_cls).explain("backward", call)
    assert explanation.verdict(bk.BACKWARD_KEY) == "refused"
    assert reason in str(explanation)


def test_softmax_without_y_and_float64_params_are_refused(backward_only):
    with simulate_device(CUDA, **H100):
        call = _call(SoftmaxFwdOp, 64, torch.bfloat16, has_output=False)
        assert "modified in place since the forward" in str(
            SoftmaxFwdOp().explain("backward", call)
        )
        call = _call(LayerNormFwdOp, 64, torch.float32, param_dtype=torch.float64)
        explanation = LayerNormFwdOp(8).explain("backward", call)
        assert "parameters of torch.float64 beside x of torch.float32" in str(explanation)


def test_layer_norm_over_one_column_goes_to_the_reference():
    """Its dx is exactly 0; the kernels' fused multiply-adds leave rounding there (GPU check)."""
    with simulate_device(CUDA, **H100):
        call = _call(LayerNormFwdOp, 1, torch.bfloat16)
        explanation = LayerNormFwdOp(1).explain("backward", call)
    assert explanation.chosen == "reference_backward"
    assert str(explanation).count("a row of one column has dx exactly 0") == 2


def test_sm_75_is_left_to_others(backward_only):
    with simulate_device(CUDA, **{**H100, "arch": 75}):
        call = _call(RMSNormFwdOp, 1024, torch.bfloat16)
        assert RMSNormFwdOp(8).key_for("backward", call) == "reference_backward"


# -- cubin compile checks ---------------------------------------------------------------------

COMPILED = [
    (RMSNormFwdOp, 4096, torch.bfloat16, {}),
    (RMSNormFwdOp, 1000, torch.float16, {"weight": False}),
    (LayerNormFwdOp, 1001, torch.float32, {}),
    (LayerNormFwdOp, 8192, torch.bfloat16, {"param_dtype": torch.float32}),
    (LayerNormFwdOp, 16384, torch.float16, {"weight": False, "bias": False}),
    (LayerNormFwdOp, 16384, torch.bfloat16, {}),  # x and dy read from shared memory
    (RMSNormFwdOp, 32768, torch.bfloat16, {}),  # one stage
    (SoftmaxFwdOp, 16384, torch.bfloat16, {}),
    (SoftmaxFwdOp, 7, torch.float32, {}),
]


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("case", COMPILED, ids=lambda c: f"{c[0].__name__}-{c[1]}-{c[2]}")
def test_kernel_compiles_to_cubin(case, arch, tilelang_cache):
    op_cls, n, dtype, extra = case
    call = _call(op_cls, n, dtype, **extra)
    cls = tileops_cuda.ROW_BACKWARD_KERNELS[op_cls][bk.BACKWARD_KEY]
    with simulate_device(CUDA, arch=arch, sm_count=100, smem_budget=SMEM_BUDGET[arch]):
        assert cls.refusal(call) is None
        identity, build = cls.entry_for(call)
        kernel = build()
    assert identity[0] == arch
    assert kernel.compiled.target.attrs["arch"] == f"sm_{arch}"
    assert "__global__" in kernel.compiled.get_kernel_source()


def test_a_cluster_exchanges_each_sum_through_its_blocks_shared_memory(tilelang_cache):
    """RMSNorm's 64K rows over a cluster of 4 (x and dy read from shared memory): each of the
    row's two sums crosses the cluster once."""
    call = _call(RMSNormFwdOp, 65536, torch.bfloat16)
    with simulate_device(CUDA, arch=90, sm_count=132, smem_budget=SMEM_BUDGET[90]):
        identity, build = bk.TileLangRMSNormBackward.entry_for(call)
        kernel = build()
    assert identity[-1].cluster == 4 and identity[-1].hold == "shared"
    source = kernel.compiled.get_kernel_source()
    assert source.count("tl::cluster_sync()") == 2
    assert source.count("map_shared_rank") == 2
    assert "tl::cluster_arrive_relaxed()" in source and "tl::cluster_wait()" in source


def test_norm_backward_copies_the_next_row_while_this_one_computes(tilelang_cache):
    """cp.async into the other stage, then a wait that leaves that copy in flight; the
    launch bounds hold the plan's residency."""
    call = _call(RMSNormFwdOp, 4096, torch.bfloat16)
    with simulate_device(CUDA, arch=90, sm_count=132, smem_budget=SMEM_BUDGET[90]):
        kernel = bk.TileLangRMSNormBackward.entry_for(call)[1]()
    source = kernel.compiled.get_kernel_source()
    assert "__launch_bounds__(512, 2)" in source
    assert source.count("cp_async_gs<16>") == 4  # x and dy: the first row, then the next
    assert "cp_async_wait<1>" in source
    assert source.count("__syncthreads()") == 3  # two reductions, the row's end: no others


# -- GPU numerics -----------------------------------------------------------------------------

# (1000, 4096) and (300, 16384): several rows per persistent block, through both stages
GPU_SHAPES = [(37, 1), (37, 7), (300, 1000), (64, 4096), (1000, 4096), (33, 8192), (9, 16384),
              (300, 16384), (5, 32768), (70, 65536)]  # fmt: skip


def _grads(fn, tensors, dy):
    leaves = [None if t is None else t.detach().requires_grad_() for t in tensors]
    out = fn(*leaves)
    wanted = [t for t in leaves if t is not None]
    found = iter(torch.autograd.grad(out, wanted, dy.to(out.dtype)))
    return [None if t is None else next(found) for t in leaves]


def _error(got, want):
    # floor: one-element rows have a (near) zero dx, whose rounding noise is all there is
    return (got.double() - want).norm() / max(want.norm().item(), 1e-2 * want.numel() ** 0.5)


def _close(got, want, torchs, dtype):
    """Within the dtype's tolerance, or no further from float64 than twice torch's own
    gradient in the same dtype (a one-element row's dx is pure cancellation)."""
    for g, w, t in zip(got, want, torchs, strict=True):
        if g is not None:
            error = _error(g, w)
            assert error < max(TOLERANCE[dtype], 2 * _error(t, w)), error


GPU_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _gpu_cases(rows: int, n: int, dtype: torch.dtype) -> tuple[dict, torch.Tensor]:
    """Per op (op, torch's function, inputs) on rows x n, and dy."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(rows, n, device="cuda", generator=g) * 3 + 2).to(dtype)
    w, b = (torch.randn(n, device="cuda", generator=g).to(dtype) for _ in range(2))
    dy = torch.randn(rows, n, device="cuda", generator=g).to(dtype)
    cases = {
        "rms": (RMSNormFwdOp(n, 1e-6), lambda *t: F.rms_norm(t[0], (n,), t[1], 1e-6), (x, w)),
        "layer": (LayerNormFwdOp(n), lambda *t: F.layer_norm(t[0], (n,), *t[1:]), (x, w, b)),
        "softmax": (SoftmaxFwdOp(-1), lambda t: torch.softmax(t, -1), (x,)),
    }
    return cases, dy


def _warm(job: tuple) -> None:
    """In a worker: every kernel one GPU case runs, compiled into the disk cache."""
    (rows, n), dtype = job
    with _backward_only():
        cases, dy = _gpu_cases(rows, n, dtype)
        for op, _, tensors in cases.values():
            _grads(op, tensors, dy)


@pytest.fixture(scope="module")
def warm_cache():
    """Compile the GPU cases' kernels in parallel processes first (one at a time they take
    minutes): the tests then load them from the disk cache."""
    jobs = [(shape, dtype) for shape in GPU_SHAPES for dtype in GPU_DTYPES]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(8, mp_context=context) as pool:
        list(pool.map(_warm, jobs))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_gpu_gradients_match_float64(warm_cache, backward_only, shape, dtype):
    rows, n = shape
    cases, dy = _gpu_cases(rows, n, dtype)
    for op, fn, tensors in cases.values():
        kept = (fn(*tensors),) if type(op).saves_outputs else ()  # softmax's y
        call = backward_call(op, (dy,), tensors, kept, (True,) * len(tensors), False)
        norm = op is not cases["softmax"][0]
        if n <= 16384 or norm:  # longer norm rows: a cluster of blocks (sm_90)
            assert op.key_for("backward", call) == bk.BACKWARD_KEY
        got = _grads(op, tensors, dy)
        want = _grads(fn, [t.double() for t in tensors], dy.double())
        _close(got, want, _grads(fn, tensors, dy), dtype)


@pytest.mark.parametrize("rows", [6, 0])
@pytest.mark.parametrize(
    "cls,inputs,wanted",
    [
        (bk.TileLangLayerNormBackward, ("x", "w", "b"), (True, True, True)),
        (bk.TileLangLayerNormBackward, ("x", "w", None), (False, True, False)),
        (bk.TileLangLayerNormBackward, ("x", None, "b"), (True, False, True)),
        (bk.TileLangRMSNormBackward, ("x", "w"), (True, True, False)),
    ],
)
def test_the_blocks_partials_become_each_parameters_gradient(cls, inputs, wanted, rows):
    """The host side, with the launch standing in for the program: each parameter's partials
    (one row per block) are summed over the blocks into its gradient, in its dtype and shape;
    rows == 0 gives zeros."""
    plan, n = bk.BackwardPlan(32, 1, 1, programs=5), 8
    kernel = object.__new__(cls)
    kernel.plan, kernel.n, kernel.wanted = plan, n, wanted

    def launch(x, dy, *buffers):  # (weight when given), (dx when wanted), the partials
        buffers = buffers[inputs[1] is not None :]
        dx, *parts = buffers if wanted[0] else (None, *buffers)
        if dx is not None:
            dx.fill_(3.0)
        for k, part in enumerate(parts):  # block p writes p + 10 k in every column
            assert part.shape == (5, n) and part.is_contiguous()
            part.copy_((torch.arange(5.0) + 10 * k)[:, None].expand(5, n))

    kernel.launch = launch
    made = {"x": torch.randn(rows, 2, n), "w": torch.randn(n, dtype=torch.bfloat16)}
    made["b"] = torch.randn(n, dtype=torch.bfloat16)
    tensors = tuple(None if name is None else made[name] for name in inputs)
    dx, *params = kernel.forward((torch.randn(rows, 2, n),), tensors)
    assert (dx is None) == (not wanted[0]) and (dx is None or (dx == 3).all())
    expected = iter([10.0, 60.0] if rows else [0.0, 0.0])  # sums of p (+ 10 k) over 5 blocks
    for got, given, want in zip(params, tensors[1:], wanted[1:], strict=False):
        if not want:
            assert got is None
            continue
        assert got.dtype == given.dtype and got.shape == given.shape
        assert (got == next(expected)).all()
