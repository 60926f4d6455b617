"""Every kernel, for a representative call of its region, compiles for each arch it declares.

The compiled kernels go to a session-wide TileLang cache (TILELANG_CACHE_DIR), so each
configuration compiles once per session; no GPU is needed to produce sm_80 / sm_90 cubin.
"""

from __future__ import annotations

import pytest
import torch
from cuda_grid import ROW_OPS, make_call

import tileops_cuda
from tileops.ops import LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp
from tileops.testing import simulate_device
from tileops_cuda.rows import kernels as row_kernels

# One call per region (the longest row of each, odd lengths where the region allows them).
REPRESENTATIVE = {
    "warp_rows": (1000, torch.bfloat16),
    "block_row": (16383, torch.float16),
    "smem_row": (40001, torch.float32),
    "stream_row": (262144, torch.bfloat16),
    "cluster_row": (262147, torch.float32),
}
OPS = {"LayerNormFwdOp": LayerNormFwdOp, "RMSNormFwdOp": RMSNormFwdOp, "SoftmaxFwdOp": SoftmaxFwdOp}
SMEM_BUDGET = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
CASES = [
    (op, key, cls, arch)
    for op in ROW_OPS
    for key, cls in tileops_cuda.KERNELS[op].items()
    for arch in (80, 90)
    if arch in cls.supported_archs
]


@pytest.mark.parametrize("op,key,cls,arch", CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_kernel_compiles_to_cubin(op, key, cls, arch, tilelang_cache):
    n, dtype = REPRESENTATIVE[cls.layout]
    call = make_call(op.__name__, n, dtype)
    with simulate_device("cuda:0", arch=arch, sm_count=100, smem_budget=SMEM_BUDGET[arch]):
        assert cls.refusal(call) is None
        identity, build = cls.entry_for(call)
        kernel = build()
    assert identity[0] == arch
    compiled = kernel.compiled
    assert compiled.target.attrs["arch"] == f"sm_{arch}"
    assert "__global__" in compiled.get_kernel_source()
    assert tilelang_cache in compiled._tilelang_cache_path


@pytest.mark.parametrize("flags", [{"has_weight": False, "has_bias": False}, {"has_bias": False}])
def test_layer_norm_affine_variants_compile(flags, tilelang_cache):
    call = make_call("LayerNormFwdOp", 300, torch.float32, **flags)
    with simulate_device("cuda:0", arch=90, sm_count=132, smem_budget=SMEM_BUDGET[90]):
        kernel = row_kernels.LayerNormWarpRows.entry_for(call)[1]()
    assert "__global__" in kernel.compiled.get_kernel_source()


def test_rms_norm_without_weight_compiles(tilelang_cache):
    call = make_call("RMSNormFwdOp", 2048, torch.bfloat16, has_weight=False)
    with simulate_device("cuda:0", arch=80, sm_count=108, smem_budget=SMEM_BUDGET[80]):
        kernel = row_kernels.RMSNormBlockRow.entry_for(call)[1]()
    assert "__global__" in kernel.compiled.get_kernel_source()


@pytest.mark.parametrize(
    "op,cls",
    [
        ("LayerNormFwdOp", row_kernels.LayerNormBlockRow),
        ("RMSNormFwdOp", row_kernels.RMSNormWarpRows),
    ],
)
def test_mixed_precision_norms_read_float32_weights(op, cls, tilelang_cache):
    """Under autocast the parameters stay float32 beside 16-bit rows: read them as they are."""
    call = make_call(op, 2048, torch.bfloat16, param_dtype=torch.float32)
    with simulate_device("cuda:0", arch=90, sm_count=132, smem_budget=SMEM_BUDGET[90]):
        identity, build = cls.entry_for(call)
        source = build().compiled.get_kernel_source()
    assert torch.float32 in identity
    assert "float* __restrict__" in source and "bfloat16_t* __restrict__" in source


def test_wide_block_row_keeps_64_float32_values_a_lane(tilelang_cache):
    """32-bit rows of 16K-32K elements stay in registers: 512 lanes of 16 vectors."""
    call = make_call("SoftmaxFwdOp", 32768, torch.float32)
    with simulate_device("cuda:0", arch=80, sm_count=108, smem_budget=SMEM_BUDGET[80]):
        cls = row_kernels.SoftmaxBlockRow
        assert cls.refusal(call) is None
        kernel = cls.entry_for(call)[1]()
    assert "__launch_bounds__(512, 1)" in kernel.compiled.get_kernel_source()


@pytest.mark.parametrize("n,dtype", [(49152, torch.float32), (65535, torch.bfloat16)])
def test_streamed_layer_norm_lengths_tilelang_once_rejected_compile(n, dtype, tilelang_cache):
    """Lengths where TileLang 0.1.15's StorageRewrite failed ("Can't fetch the lanes of a
    scalable vector"): sm_80 streams them (they exceed its shared memory or are odd)."""
    call = make_call("LayerNormFwdOp", n, dtype)
    with simulate_device("cuda:0", arch=80, sm_count=108, smem_budget=SMEM_BUDGET[80]):
        cls = row_kernels.LayerNormStreamRow
        assert cls.refusal(call) is None
        kernel = cls.entry_for(call)[1]()
    assert "__global__" in kernel.compiled.get_kernel_source()


@pytest.mark.parametrize("layout,n", [("smem_row", 32768), ("cluster_row", 131072)])
def test_one_pass_statistics_compile(layout, n, tilelang_cache):
    """RowPlan.one_pass drops LayerNorm's pass over shared memory for the variance: two walks
    over the row instead of three. cluster_row takes it by default, smem_row only in the
    plan sweep."""
    import dataclasses

    cls = tileops_cuda.KERNELS[LayerNormFwdOp][f"tilelang_{layout}"]
    call = make_call("LayerNormFwdOp", n, torch.bfloat16)
    walks = {}
    with simulate_device("cuda:0", arch=90, sm_count=132, smem_budget=SMEM_BUDGET[90]):
        plan = cls.plan(call)
        for one_pass in (False, True):
            variant = dataclasses.replace(plan, one_pass=one_pass)
            kernel = cls.build(variant, call, f"test/LayerNorm/{layout}/{variant}")
            walks[one_pass] = kernel.compiled.get_kernel_source().count("for (int k")
    assert plan.one_pass == (layout == "cluster_row")
    assert walks == {False: 3, True: 2}


@pytest.mark.parametrize("op", ["RMSNormFwdOp", "SoftmaxFwdOp"])
def test_smem_row_tma_rows_compile(op, tilelang_cache):
    """RowPlan.bulk on smem_row: the 64 KB row arrives by one TMA transfer per block."""
    cls = tileops_cuda.KERNELS[OPS[op]]["tilelang_smem_row"]
    call = make_call(op, 32768, torch.bfloat16)
    with simulate_device("cuda:0", arch=90, sm_count=132, smem_budget=SMEM_BUDGET[90]):
        source = cls.entry_for(call)[1]().compiled.get_kernel_source()
    assert "tma_load" in source and "expect_transaction(65536)" in source


@pytest.mark.parametrize("op", ["LayerNormFwdOp", "RMSNormFwdOp"])
def test_cluster_row_tma_slices_compile(op, tilelang_cache):
    """RowPlan.bulk: one TMA transfer per block brings its slice (the lanes read only shared
    memory), where the same row in bfloat16 loads through the lanes."""
    cls = tileops_cuda.KERNELS[OPS[op]]["tilelang_cluster_row"]
    sources = {}
    for dtype in (torch.float32, torch.bfloat16):
        call = make_call(op, 65536, dtype)
        with simulate_device("cuda:0", arch=90, sm_count=132, smem_budget=SMEM_BUDGET[90]):
            kernel = cls.entry_for(call)[1]()
        sources[dtype] = kernel.compiled.get_kernel_source()
    assert "tma_load" in sources[torch.float32]
    assert "expect_transaction(32768)" in sources[torch.float32]  # the 32 KB slice
    assert "tma_load" not in sources[torch.bfloat16]


@pytest.mark.parametrize("op", sorted(OPS))
def test_cluster_row_partials_in_shared_memory_compile(op, tilelang_cache):
    """RowPlan.dsmem: each block writes its partials into every block of its cluster after all
    announced they run, takes no workspace, and keeps each shared buffer in a region of its own
    (other blocks' writes land while it still reduces: reuse would put them over live data)."""
    import dataclasses
    import re

    cls = tileops_cuda.KERNELS[OPS[op]]["tilelang_cluster_row"]
    call = make_call(op, 131072, torch.bfloat16)
    with simulate_device("cuda:0", arch=90, sm_count=132, smem_budget=SMEM_BUDGET[90]):
        plan = dataclasses.replace(cls.plan(call), dsmem=True)
        kernel = cls.build(plan, call, f"test/dsmem/{op}/{plan}")
    source = kernel.compiled.get_kernel_source()
    assert "map_shared_rank" in source and "cluster_arrive_relaxed" in source
    assert kernel.workspace(torch.empty(3, 131072)) == ()
    assert len(kernel.compiled.params) == {"LayerNormFwdOp": 4, "RMSNormFwdOp": 3}.get(op, 2)
    offsets = re.findall(r"void\* \w+ = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)", source)
    assert len(offsets) == 4 and len(set(offsets)) == 4  # mine, partials, scratch, the slice


@pytest.mark.parametrize(
    "layout,n,dtype",
    [("warp_rows", 100, torch.float32), ("block_row", 16384, torch.bfloat16),
     ("smem_row", 32768, torch.bfloat16), ("cluster_row", 262147, torch.float32)],
)  # fmt: skip
def test_softmax_scaled_exponents_compile(layout, n, dtype, tilelang_cache):
    """RowPlan.scaled_exp: every exponential of the held rows is one fused multiply-add from
    the max in log2 units, the output still stored as vectors."""
    import dataclasses

    cls = tileops_cuda.KERNELS[SoftmaxFwdOp][f"tilelang_{layout}"]
    call = make_call("SoftmaxFwdOp", n, dtype)
    with simulate_device("cuda:0", arch=90, sm_count=132, smem_budget=SMEM_BUDGET[90]):
        plan = dataclasses.replace(cls.plan(call), scaled_exp=True)
        source = cls.build(plan, call, f"test/scaled/{plan}").compiled.get_kernel_source()
    assert "__fmaf_rn" in source and "__fmul_rn" in source
    assert "* 0x1.71547652b82fep+0f" not in source  # no separate multiply by log2 e
