"""Every BatchNorm and GEMM kernel, for a representative call of its region, compiles for each
arch it declares among sm_80 and sm_90 (cubin, no GPU), into the session's TileLang cache."""

from __future__ import annotations

import pytest
import torch
from cuda_grid import SIMULATED, bn_call, gemm_call

import tileops_cuda
from tileops.ops import BatchNormFwdOp, GemmOp
from tileops.testing import simulate_device
from tileops_cuda.batch_norm import kernels as batch_norm
from tileops_cuda.gemm import kernels as gemm
from tileops_cuda.gemm import tiles as gemm_tiles

# One call per kernel, inside its region on both simulated devices; dtypes and flags vary so
# that between them every code path of the epilogues compiles.
BN_CALLS = {
    "tilelang_bn_thread_channel": bn_call(16, 1000, 2, torch.bfloat16),
    "tilelang_bn_block_channel": bn_call(32, 64, 196, torch.float16, param_dtype=torch.float32),
    "tilelang_bn_smem_channel": bn_call(32, 256, 784, torch.bfloat16, has_bias=False),
    "tilelang_bn_cluster_channel": bn_call(32, 64, 3136, torch.bfloat16, has_running_stats=False),
    "tilelang_bn_group_channel": bn_call(2, 3, 300001, torch.float16, param_dtype=torch.float32),
    "tilelang_bn_split_channel": bn_call(4, 128, 1 << 20, torch.bfloat16),
    "tilelang_bn_tiled": bn_call(256, 1024, 196, torch.float32),
    "tilelang_bn_infer": bn_call(32, 256, 3136, torch.bfloat16, has_weight=False),
}
GEMM_CALLS = {
    "tilelang_gemm": gemm_call(4096, 1001, 999, torch.float16),  # misaligned n and k
    "tilelang_gemm_hopper": gemm_call(4096, 4096, 4096, torch.bfloat16),
    "tilelang_gemm_skinny": gemm_call(16, 4096, 4096, torch.bfloat16),  # split k: two kernels
}
CALLS = {BatchNormFwdOp: BN_CALLS, GemmOp: GEMM_CALLS}
CASES = [
    (key, cls, arch)
    for op, calls in CALLS.items()
    for key, cls in tileops_cuda.KERNELS[op].items()
    for arch in (80, 90)
    if arch in cls.supported_archs
]


def build(cls, call, arch: int):
    with simulate_device("cuda:0", arch=arch, **SIMULATED[arch]):
        assert cls.refusal(call) is None, cls.refusal(call)
        identity, make = cls.entry_for(call)
        return identity, make()


def sources(kernel) -> list[str]:
    return [compiled.get_kernel_source() for compiled in kernel.compiled]


@pytest.mark.parametrize("key,cls,arch", CASES, ids=lambda v: getattr(v, "__name__", str(v)))
def test_kernel_compiles_to_cubin(key, cls, arch, tilelang_cache):
    call = {**BN_CALLS, **GEMM_CALLS}[key]
    identity, kernel = build(cls, call, arch)
    assert identity[0] == arch
    assert kernel.compiled, "an entry holds at least one kernel"
    for compiled in kernel.compiled:
        assert compiled.target.attrs["arch"] == f"sm_{arch}{cls.__dict__.get('features', '')}"
        assert "__global__" in compiled.get_kernel_source()
        assert tilelang_cache in compiled._tilelang_cache_path


# Beside the NN calls above, each GEMM kernel's calls in the other layouts, with and without a
# bias (NT: tileops.nn.Linear's layout, both ways).
GEMM_VARIANTS = [("NN", True), ("NT", False), ("NT", True), ("TN", False), ("TT", True)]
GEMM_LAYOUT_CASES = [
    (key, cls, arch, layout, bias)
    for key, cls in tileops_cuda.KERNELS[GemmOp].items()
    for arch in (80, 90)
    if arch in cls.supported_archs
    for layout, bias in GEMM_VARIANTS
]
TILELANG_OPS = {  # what each GEMM kernel's sources must hold, in every layout
    "tilelang_gemm": ("cp_async", "mma"),
    "tilelang_gemm_hopper": ("tl::tma_load", "tl::wgmma_ss"),
    "tilelang_gemm_skinny": ("cp_async", "mma"),
}


@pytest.mark.parametrize(
    "key,cls,arch,layout,bias",
    GEMM_LAYOUT_CASES,
    ids=lambda v: getattr(v, "__name__", {True: "bias", False: "-"}.get(v, str(v))),
)
def test_gemm_kernel_compiles_every_layout(key, cls, arch, layout, bias, tilelang_cache):
    """Each operand is copied as it is stored and multiplied transposed where the layout says:
    the same instructions as NN (TMA and wgmma on sm_90a), and a Bias argument where a bias is
    added (the skinny kernel's split-k: in the kernel that sums the partials)."""
    base = GEMM_CALLS[key]
    call = gemm_call(base.m, base.n, base.k, base.dtype, layout, bias)
    identity, kernel = build(cls, call, arch)
    assert identity[0] == arch and (layout, bias) == identity[4:6]
    texts = sources(kernel)
    for compiled, text in zip(kernel.compiled, texts, strict=True):
        assert compiled.target.attrs["arch"] == f"sm_{arch}{cls.__dict__.get('features', '')}"
        assert "__global__" in text
    assert all(op in texts[0] for op in TILELANG_OPS[key])
    assert ("wgmma" in texts[0]) == (key == "tilelang_gemm_hopper")
    assert any("Bias" in text.split("{")[0] for text in texts) == bias


def test_skinny_gemm_fixup_adds_the_bias_in_its_sum(tilelang_cache):
    """m = 1 (decode), NT with a bias: tileops.nn.Linear's call, one kernel."""
    _, kernel = build(gemm.GemmSkinny, gemm_call(1, 4096, 4096, layout="NT", has_bias=True), 80)
    (source,) = sources(kernel)
    assert "bfloat16_t* __restrict__ Bias" in source and "Count[((int)blockIdx.x)] = 0" in source


def test_split_channel_entry_holds_the_partial_and_finish_kernels(tilelang_cache):
    call = BN_CALLS["tilelang_bn_split_channel"]
    _, kernel = build(batch_norm.BatchNormSplitChannel, call, 90)
    partials, finish = sources(kernel)
    assert "float* __restrict__ P" in partials and "Y" not in partials.split("{")[0]
    assert "const float* __restrict__ P" in finish and "bfloat16_t* __restrict__ Y" in finish


def test_group_channel_meets_through_global_memory_without_clusters(tilelang_cache):
    _, kernel = build(batch_norm.BatchNormGroupChannel, BN_CALLS["tilelang_bn_group_channel"], 90)
    (source,) = sources(kernel)
    assert "int* __restrict__ Q" in source  # the arrival counts and the ticket counter
    assert "tileops_take_ticket" in source and "tileops_arrive_and_wait" in source
    assert "ld.acquire.gpu" in source and "tileops_load_l2" in source
    assert "cluster" not in source.split("tileops_load_l2(const")[1]


def test_batch_norm_without_affine_or_stats_compiles(tilelang_cache):
    call = bn_call(64, 512, 784, torch.bfloat16, has_weight=False, has_bias=False,
                   has_running_stats=False)  # fmt: skip
    _, kernel = build(batch_norm.BatchNormTiled, call, 90)
    assert "__global__" in sources(kernel)[0]


def test_mixed_precision_batch_norm_reads_float32_parameters(tilelang_cache):
    _, kernel = build(batch_norm.BatchNormBlockChannel, BN_CALLS["tilelang_bn_block_channel"], 80)
    (source,) = sources(kernel)
    assert "float* __restrict__ RM" in source and "half_t* __restrict__ X" in source


def test_hopper_gemm_uses_tma_and_wgmma(tilelang_cache):
    _, kernel = build(gemm.GemmHopper, GEMM_CALLS["tilelang_gemm_hopper"], 90)
    (source,) = sources(kernel)
    assert "tl::tma_load" in source and "CUtensorMap" in source  # TMA, descriptors by value
    assert "tl::wgmma_ss" in source  # warpgroup MMA from shared memory
    assert "warpgroup_reg_alloc" in source  # producer / consumer warp specialization


def test_hopper_decode_tile_is_one_unsplit_kernel(tilelang_cache):
    """m <= 64 on sm_90: one 64-row warpgroup tile over all of k, the weight by TMA."""
    call = gemm_call(64, 4096, 4096, torch.bfloat16)
    _, kernel = build(gemm.GemmHopper, call, 90)
    (source,) = sources(kernel)
    assert "tl::tma_load" in source and "tl::wgmma_ss" in source
    assert "float* __restrict__" not in source.split("{")[0]  # no float32 partials


def test_hopper_gemm_smem_epilogue_stores_c_with_tma(tilelang_cache):
    """The Hopper tile stages C in shared memory and stores it by TMA (Tile.smem_epilogue);
    its 64 KB C tile takes one of the four pipeline stages' room."""
    from dataclasses import replace

    from tileops_cuda._common.compile import build_program

    call = GEMM_CALLS["tilelang_gemm_hopper"]
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        staged = gemm.GemmHopper.plan(call)
        direct = gemm_tiles._with_stages(replace(staged, smem_epilogue=False), call, 64)
    assert staged.smem_epilogue and (direct.stages, staged.stages) == (4, 3)
    stores = []
    for tile in (direct, staged):
        factory = lambda t=tile: gemm.gemm_program(call, t, True)  # noqa: E731
        program = build_program(f"test/epilogue/{tile}", factory, 90, features="a")
        stores.append("tl::tma_store" in program.get_kernel_source())
    assert stores == [False, True]


def test_skinny_gemm_fixup_is_one_kernel_that_counts_arrivals(tilelang_cache):
    """At m = 1 the split-k sum moves into the skinny kernel (SkinnyPlan.fixup), behind a
    per-column-tile arrival counter, so no reduce kernel is built; from m = 2 it does not."""
    call = gemm_call(1, 4096, 4096, torch.bfloat16)
    with simulate_device("cuda:0", arch=80, **SIMULATED[80]):
        plan = gemm.skinny_plan(call)
        assert not gemm.skinny_plan(gemm_call(2, 4096, 4096, torch.bfloat16)).fixup
    assert plan.fixup and plan.splits > 1
    _, kernel = build(gemm.GemmSkinny, call, 80)
    (source,) = sources(kernel)
    assert "AtomicAddRet" in source and ", 4);" in source  # acq_rel: release P, acquire others'
    assert "Count[((int)blockIdx.x)] = 0" in source  # reset for the next call


def test_general_gemm_on_sm_90_stays_on_mma_sync(tilelang_cache):
    """It serves what TMA cannot take, so TileLang's TMA and wgmma lowerings stay off."""
    _, kernel = build(gemm.GemmGeneral, GEMM_CALLS["tilelang_gemm"], 90)
    (source,) = sources(kernel)
    assert "wgmma" not in source and "tma_load" not in source
    assert "mma" in source and "cp_async" in source


def test_skinny_gemm_splits_k_into_float32_partials(tilelang_cache):
    _, kernel = build(gemm.GemmSkinny, GEMM_CALLS["tilelang_gemm_skinny"], 80)
    partial, reduce = sources(kernel)
    assert "float* __restrict__ C" in partial
    assert "const float* __restrict__ P" in reduce and "bfloat16_t* __restrict__ C" in reduce


def test_gemm_with_k_zero_builds_nothing():
    _, kernel = build(gemm.GemmGeneral, gemm_call(5, 7, 0), 80)
    assert kernel.compiled == []
    zeros = kernel(torch.ones(5, 0, dtype=torch.bfloat16), torch.ones(0, 7, dtype=torch.bfloat16),
                   None)  # fmt: skip
    assert zeros.shape == (5, 7) and not zeros.any()
    _, kernel = build(gemm.GemmGeneral, gemm_call(5, 7, 0, layout="TT", has_bias=True), 80)
    bias = torch.arange(7, dtype=torch.bfloat16)
    given = kernel(torch.ones(0, 5, dtype=torch.bfloat16), torch.ones(7, 0, dtype=torch.bfloat16),
                   bias)  # fmt: skip
    assert kernel.compiled == [] and torch.equal(given, bias.expand(5, 7))


@pytest.mark.parametrize(
    "cls,kept", [(batch_norm.BatchNormTiled, True), (batch_norm.BatchNormInfer, False)]
)
def test_a_training_kernel_hands_its_program_the_statistics_buffer_and_returns_it(cls, kept):
    """The host side, the launch standing in for the program: a training kernel passes a
    (2, channels) float32 buffer after y and returns y with its rows (mean, invstd)."""
    launched = []

    def launch(*buffers):
        launched.append(buffers)
        if kept:
            buffers[-1].copy_(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))

    kernel = object.__new__(cls)
    kernel.launches, kernel.channels, kernel.pdtype, kernel._placeholders = [launch], 3, None, {}
    x = torch.randn(2, 3, 4)
    out = kernel.forward(x, torch.ones(3), torch.zeros(3), torch.zeros(3), torch.ones(3))
    (buffers,) = launched
    if not kept:
        assert isinstance(out, torch.Tensor) and len(buffers) == 6 and buffers[-1] is out
        return
    y, mean, invstd = out
    assert buffers[-2] is y and buffers[-1].shape == (2, 3) and buffers[-1].dtype == torch.float32
    assert mean.tolist() == [1.0, 2.0, 3.0] and invstd.tolist() == [4.0, 5.0, 6.0]
