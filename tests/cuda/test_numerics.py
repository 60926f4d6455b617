"""Every kernel against the torch reference kernels on a real GPU (skipped without CUDA)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing

import pytest
import torch
from cuda_grid import ROW_OPS, kernel_cases, make_call

import tileops_cuda
from tileops.ops import LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp
from tileops.ops.norm.layer_norm import LayerNormReference
from tileops.ops.norm.rms_norm import RMSNormReference
from tileops.ops.softmax import SoftmaxReference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_kernels_only")]

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
ROWS = 37  # no multiple of any block's row count: the last block is partly empty
CASES = list(kernel_cases())


def _prebuild(case: tuple) -> None:
    op, _, cls, n, dtype = case
    call = make_call(op, n, dtype)
    if cls.refusal(call) is None:
        cls.entry_for(call)[1]()


@pytest.fixture(scope="module", autouse=True)
def warm_cache():
    """Compile the grid in parallel processes first: the tests then load from the disk cache."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(8, mp_context=context) as pool:
        list(pool.map(_prebuild, CASES))


def _inputs(op: str, n: int, dtype: torch.dtype):
    x = torch.randn(ROWS, n, device="cuda", dtype=dtype) * 3 + 1
    params = [torch.randn(n, device="cuda", dtype=dtype) for _ in range(2)]
    if op == "LayerNormFwdOp":
        return (x, *params), LayerNormReference(1e-5)
    if op == "RMSNormFwdOp":
        return (x, params[0]), RMSNormReference(1e-6)
    return (x,), SoftmaxReference()


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


@pytest.mark.parametrize(
    "op,key,cls,n,dtype", CASES, ids=lambda v: getattr(v, "__name__", str(v).replace("torch.", ""))
)
def test_kernel_matches_reference(op, key, cls, n, dtype):
    call = make_call(op, n, dtype)
    if cls.refusal(call) is not None:
        pytest.skip(f"not this kernel's region on this device: {cls.refusal(call)}")
    args, reference = _inputs(op, n, dtype)
    kernel = cls.entry_for(call)[1]()
    got = kernel(*args)
    assert got.shape == args[0].shape and got.dtype == dtype and got.is_contiguous()
    assert torch.isfinite(got).all()
    assert _rel_err(got, reference(*args)) < TOLERANCE[dtype]


@pytest.mark.parametrize("has_weight,has_bias", [(False, False), (True, False), (False, True)])
def test_layer_norm_without_affine(has_weight, has_bias):
    x = torch.randn(5, 3000, device="cuda")
    w = torch.randn(3000, device="cuda") if has_weight else None
    b = torch.randn(3000, device="cuda") if has_bias else None
    got = LayerNormFwdOp(3000)(x, w, b)
    assert _rel_err(got, torch.nn.functional.layer_norm(x, (3000,), w, b)) < 1e-5


def test_rms_norm_without_weight():
    x = torch.randn(5, 300, device="cuda", dtype=torch.bfloat16)
    got = RMSNormFwdOp(300, 1e-6)(x, None)
    assert _rel_err(got, torch.nn.functional.rms_norm(x.float(), (300,), None, 1e-6)) < 1e-2


@pytest.mark.parametrize("n", [100, 4096, 40000, 300000])
def test_softmax_infinities_match_torch(n):
    x = torch.randn(4, n, device="cuda")
    x[0, : n // 2] = float("-inf")  # some -inf: zeros there
    x[1] = float("-inf")  # all -inf: NaN, as torch
    x[2, -1] = float("-inf")
    got = SoftmaxFwdOp(-1)(x)
    torch.testing.assert_close(got, torch.softmax(x, -1), equal_nan=True, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("n", [100, 4096, 40000, 65536, 300000])
def test_softmax_of_large_logits_keeps_float32_precision(n):
    """Logits near 1000: a max rounded to log2 units (ulp 1.2e-4 there) would be off by up
    to 4e-5 relative unless the sums and the output subtract the same rounded value."""
    x = torch.randn(4, n, device="cuda") * 5 + 1000
    got = SoftmaxFwdOp(-1)(x)
    assert _rel_err(got, torch.softmax(x.double(), -1)) < 3e-6


@pytest.mark.parametrize("shape", [(1, 1), (3, 5, 64), (1000, 1024), (2, 262144)])
def test_dispatched_ops_on_cuda(shape):
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    n = shape[-1]
    w, b = (
        torch.randn(n, device="cuda", dtype=x.dtype),
        torch.randn(n, device="cuda", dtype=x.dtype),
    )
    ref = torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float())
    assert _rel_err(LayerNormFwdOp(n)(x, w, b), ref) < 1e-2
    assert (
        _rel_err(RMSNormFwdOp(n)(x, w), torch.nn.functional.rms_norm(x.float(), (n,), w.float()))
        < 1e-2
    )
    assert _rel_err(SoftmaxFwdOp(-1)(x), torch.softmax(x.float(), -1)) < 1e-2


@pytest.mark.parametrize("op_cls", [LayerNormFwdOp, RMSNormFwdOp])
@pytest.mark.parametrize("n", [1000, 4096, 40000])
def test_mixed_precision_ops_match_torch(op_cls, n):
    """bfloat16 rows with float32 weights (autocast's layout), served by a TileLang kernel."""
    op = op_cls(n)
    x = torch.randn(ROWS, n, device="cuda", dtype=torch.bfloat16)
    params = [torch.randn(n, device="cuda") for _ in range(2 if op_cls is LayerNormFwdOp else 1)]
    got = op(x, *params)
    want = op.reference_forward(x.float(), *params).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16
    call = op.call_for(x, *params)
    assert op.key_for(op.interface_name, call).startswith("tilelang_")
    assert _rel_err(got, want) < TOLERANCE[torch.bfloat16]


def _kernel_with(op_cls: type, key: str, n: int, dtype: torch.dtype, **fields):
    """The kernel of `key` for rows of n with the served plan's `fields` replaced (options the
    plan sweep tries where they are not served)."""
    import dataclasses

    cls = tileops_cuda.KERNELS[op_cls][key]
    call = make_call(op_cls.__name__, n, dtype)
    plan = dataclasses.replace(cls.plan(call), **fields)
    return cls.build(plan, call, f"test/{op_cls.__name__}/{key}/{n}/{plan}")


def _one_pass_layer_norm(key: str, n: int, dtype: torch.dtype):
    """LayerNorm's kernel of `key` with RowPlan.one_pass set (stream_row and cluster_row gather
    their statistics while loading anyway; smem_row only in the sweep)."""
    return _kernel_with(LayerNormFwdOp, key, n, dtype, one_pass=True)


ONE_PASS_LAYOUTS = [
    ("tilelang_smem_row", 32768),
    ("tilelang_stream_row", 65536),
    ("tilelang_cluster_row", 131072),
]


# float32 rows near 1000 hold x to 6e-5, 2e-5 of their spread (3): kernel and reference each
# round y that finely, while cancelled sums or a lost variance miss by 1e-3 and more.
FAR_FROM_ZERO_TOLERANCE = 5e-5


@pytest.mark.parametrize("key,n", ONE_PASS_LAYOUTS)
@pytest.mark.parametrize(
    "dtype,offset,tolerance",
    [
        (torch.bfloat16, 1.0, TOLERANCE[torch.bfloat16]),
        (torch.float32, 1000.0, FAR_FROM_ZERO_TOLERANCE),
    ],
)
def test_layer_norm_one_pass_statistics(key, n, dtype, offset, tolerance):
    """Shifted sums far from zero too (rows around 1000 in float32, where unshifted sums
    would cancel)."""
    kernel = _one_pass_layer_norm(key, n, dtype)
    (x, w, b), reference = _inputs("LayerNormFwdOp", n, dtype)
    x = x + offset
    assert _rel_err(kernel(x, w, b), reference(x, w, b)) < tolerance


@pytest.mark.parametrize("key,n", ONE_PASS_LAYOUTS)
def test_layer_norm_one_pass_statistics_survive_an_outlier_first(key, n):
    """Each lane shifts by its own first element: with the row's first element as the one
    shift, x[0] = 1000 among unit values cancelled 0.5% of the variance away in float32
    (1.5e-3 relative error in y)."""
    kernel = _one_pass_layer_norm(key, n, torch.float32)
    (x, w, b), reference = _inputs("LayerNormFwdOp", n, torch.float32)
    x[:, 0] = 1000.0
    assert _rel_err(kernel(x, w, b), reference(x, w, b)) < FAR_FROM_ZERO_TOLERANCE


@pytest.mark.parametrize("n", [1000, 8192, 40000, 65536])
def test_row_ops_take_views_off_a_16_byte_boundary(n):
    """Rows and parameters starting 2 bytes past an aligned address (views into a larger
    buffer) are copied before the kernels' 16-byte vector reads, not read misaligned."""
    buffer = torch.randn(ROWS * n + 1, device="cuda", dtype=torch.float16)
    x = buffer[1:].view(ROWS, n)
    w, b = buffer[1 : 1 + n], buffer[3 : 3 + n]
    assert x.data_ptr() % 16 and w.data_ptr() % 16
    F = torch.nn.functional
    xf, wf, bf = x.float(), w.float(), b.float()
    assert _rel_err(LayerNormFwdOp(n)(x, w, b), F.layer_norm(xf, (n,), wf, bf)) < 2e-3
    assert _rel_err(RMSNormFwdOp(n)(x, w), F.rms_norm(xf, (n,), wf)) < 2e-3
    assert _rel_err(SoftmaxFwdOp(-1)(x), torch.softmax(xf, -1)) < 2e-3


SCALED_EXP_LAYOUTS = [
    ("tilelang_warp_rows", 100),
    ("tilelang_block_row", 16384),
    ("tilelang_smem_row", 32768),
    ("tilelang_cluster_row", 65536),
    ("tilelang_cluster_row", 262147),
]


@pytest.mark.parametrize("key,n", SCALED_EXP_LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_scaled_exponents(key, n, dtype):
    """RowPlan.scaled_exp on every layout that holds the row: logits near 1000 keep float32
    precision, since the sums and the output subtract one rounded max; -inf entries, slices and
    rows behave as torch's."""
    kernel = _kernel_with(SoftmaxFwdOp, key, n, dtype, scaled_exp=True)
    x = (torch.randn(4, n, device="cuda") * 5 + 1000).to(dtype)
    limit = 3e-6 if dtype == torch.float32 else TOLERANCE[dtype]
    assert _rel_err(kernel(x), torch.softmax(x.double(), -1)) < limit
    x[0, : n // 2] = float("-inf")
    x[1] = float("-inf")
    want = torch.softmax(x.float(), -1)
    torch.testing.assert_close(kernel(x).float(), want, equal_nan=True, atol=1e-6, rtol=1e-2)


@pytest.mark.parametrize("op_cls", ROW_OPS, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("n", [65536, 262147])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cluster_row_partials_in_shared_memory(op_cls, n, dtype):
    """RowPlan.dsmem (served up to DSMEM_CLUSTER_MAX blocks, forced here on 16 too): partials
    written into every block's shared memory give the reference's rows, whole and odd-length,
    run after run (a block's buffers must not be reused while other blocks' writes may land)."""
    op = op_cls.__name__
    kernel = _kernel_with(op_cls, "tilelang_cluster_row", n, dtype, dsmem=True)
    args, reference = _inputs(op, n, dtype)
    want = reference(*args)
    for _ in range(20):
        got = kernel(*args)
        assert torch.isfinite(got).all()
        assert _rel_err(got, want) < TOLERANCE[dtype]
