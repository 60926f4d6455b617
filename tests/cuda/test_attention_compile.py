"""Every TileLang attention kernel compiles to a cubin (no GPU) for each arch it declares among
sm_80 and sm_90, in each configuration: head_dim 64 and 128, causal or not, float16 and
bfloat16, a sliding window; the forward on sm_90 with TMA and wgmma, the rest with cp.async and
mma.sync; decode as its two kernels (the slices, their combination)."""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest
import torch
from cuda_grid import SIMULATED

from tileops.ops import AttentionCall, AttentionDecodeCall
from tileops.testing import simulate_device
from tileops_cuda.attention import kernels

CONFIGS = list(itertools.product((64, 128), (False, True), (torch.float16, torch.bfloat16)))
FORWARDS = [(kernels.TileLangFlashFwd, 80), (kernels.TileLangFlashFwdSm90, 90)]
# The two decode classes differ in where the lengths come from: every configuration of the one
# with per-sequence lengths, one of the other per arch.
DECODES = [(kernels.TileLangCacheDecode, 80), (kernels.TileLangCacheDecode, 90)]
UNIFORM_DECODES = [(kernels.TileLangFlashDecode, 80), (kernels.TileLangFlashDecode, 90)]


def call_for(cls, dim: int, causal: bool, dtype: torch.dtype, window: int | None = None):
    prefill = (kernels.TileLangFlashFwd, kernels.TileLangFlashFwdSm90, kernels.TileLangFlashBwd)
    q_len = 1024 if issubclass(cls, prefill) else 2
    fields = dict(
        device=torch.device("cuda:0"), batch=2, heads=16, kv_heads=4, q_len=q_len,
        head_dim=dim, v_dim=dim, causal=causal, scale=dim**-0.5, dtype=dtype, window=window,
    )  # fmt: skip
    if cls is kernels.TileLangCacheDecode:
        return AttentionDecodeCall(capacity=4096, **fields)
    return AttentionCall(kv_len=4096, **fields)


def build(cls, call, arch: int):
    with simulate_device("cuda:0", arch=arch, **SIMULATED[arch]):
        assert cls.refusal(call) is None, cls.refusal(call)
        identity, make = cls.entry_for(call)
        return identity, make()


def sources(kernel) -> list[str]:
    return [compiled.get_kernel_source() for compiled in kernel.compiled]


@pytest.mark.parametrize(
    "cls, arch", FORWARDS + DECODES, ids=lambda v: getattr(v, "__name__", str(v))
)
@pytest.mark.parametrize("dim, causal, dtype", CONFIGS, ids=str)
def test_each_configuration_compiles_to_cubin(cls, arch, dim, causal, dtype, tilelang_cache):
    identity, kernel = build(cls, call_for(cls, dim, causal, dtype), arch)
    assert identity[0] == arch
    assert len(kernel.compiled) == (2 if issubclass(cls, kernels.SplitDecode) else 1)
    for compiled in kernel.compiled:
        assert compiled.target.attrs["arch"] == f"sm_{arch}{cls.features}"
        assert "__global__" in compiled.get_kernel_source()
        assert tilelang_cache in compiled._tilelang_cache_path


@pytest.mark.parametrize(
    "cls, arch", FORWARDS + UNIFORM_DECODES, ids=lambda v: getattr(v, "__name__", str(v))
)
def test_a_sliding_window_compiles(cls, arch, tilelang_cache):
    _, kernel = build(cls, call_for(cls, 128, True, torch.bfloat16, window=512), arch)
    assert "__global__" in sources(kernel)[0]


def test_the_sm_90_forward_loads_by_tma_and_multiplies_by_wgmma(tilelang_cache):
    call = call_for(kernels.TileLangFlashFwdSm90, 128, True, torch.bfloat16)
    _, kernel = build(kernels.TileLangFlashFwdSm90, call, 90)
    (source,) = sources(kernel)
    assert "tl::tma_load" in source and "wgmma" in source


def test_the_sm_80_forward_and_decode_stay_on_cp_async_and_mma_sync(tilelang_cache):
    for cls, arch in ((kernels.TileLangFlashFwd, 80), (kernels.TileLangFlashDecode, 90)):
        _, kernel = build(cls, call_for(cls, 64, False, torch.float16), arch)
        source = sources(kernel)[0]
        assert "mma" in source and "cp_async" in source
        assert "wgmma" not in source and "tma_load" not in source


BACKWARDS = [  # arch, head_dim, causal, window, dtype
    (80, 128, True, None, torch.bfloat16),
    (90, 64, False, None, torch.bfloat16),
    (90, 128, True, 100, torch.float16),
]


@pytest.mark.parametrize("arch, dim, causal, window, dtype", BACKWARDS, ids=str)
def test_the_backward_compiles_to_mma_sync_with_float32_atomics_for_dq(
    arch, dim, causal, window, dtype, tilelang_cache
):
    """TileLangFlashBwd (`bwd_program`): one program, loads by cp.async and mma.sync on sm_80
    and sm_90 alike, dQ added to its float32 buffer by atomics; lengths symbolic."""
    cls = kernels.TileLangFlashBwd
    identity, kernel = build(cls, call_for(cls, dim, causal, dtype, window), arch)
    assert identity[0] == arch and kernel.plan_.block_n == {64: 64, 128: 32}[dim]
    (source,) = sources(kernel)
    assert "tl::mma_sync" in source and "cp_async" in source and "wgmma" not in source
    assert re.search(r"AtomicAdd(x2|x4)?\(\(&\(dQ\[", source)  # vectorized where it can be
    assert not cls.deterministic  # the atomics' order varies: use_deterministic_algorithms skips it


def test_one_forward_build_serves_every_length(tilelang_cache):
    """q_len, kv_len and batch are symbolic: calls of other lengths share the entry."""
    cls = kernels.TileLangFlashFwdSm90
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        first, _ = cls.entry_for(call_for(cls, 128, True, torch.bfloat16))
        other = AttentionCall(
            device=torch.device("cuda:0"), batch=7, heads=16, kv_heads=4, q_len=333, kv_len=999,
            head_dim=128, v_dim=128, causal=True, scale=128**-0.5, dtype=torch.bfloat16,
        )  # fmt: skip
        assert cls.entry_for(other)[0] == first


def test_decode_splits_the_keys_until_the_grid_fills_the_sms():
    call = call_for(kernels.TileLangFlashDecode, 128, False, torch.bfloat16)
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        plan = kernels.TileLangFlashDecode.plan(call)  # 2 sequences x 4 kv heads = 8 blocks
    assert plan.splits == -(-132 * 2 // 8) and plan.rows == 8 and plan.block_h == 16


def test_the_decodes_tma_plan_compiles_warp_specialized_for_sm_90a(tilelang_cache):
    """The plan option the decode sweep measures (TUNING.md#decode-split): K and V through
    TMA, three tiles in flight, a producer warpgroup beside the consumers."""
    from tileops_cuda.attention.plans import decode_plan

    class TmaDecode(kernels.TileLangFlashDecode):
        features, pass_configs = "a", None

        @classmethod
        def plan(cls, call):
            return decode_plan(call, call.batch, call.kv_heads, tma_stages=3)

    call = call_for(TmaDecode, 128, False, torch.bfloat16)
    _, kernel = build(TmaDecode, call, 90)
    assert (kernel.plan_.threads, kernel.plan_.tma) == (128, True)
    split = sources(kernel)[0]
    assert "tl::tma_load" in split and "cp_async" not in split
    assert "__launch_bounds__(256" in split  # 128 producer threads beside the 128 consumers


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("block_size", [8, 16, 64, 256])
def test_the_paged_decode_compiles_for_each_block_layout(arch, block_size, tilelang_cache):
    """Blocks smaller than a key tile are loaded whole, several a tile; larger ones a slice."""
    from tileops.ops import AttentionPagedDecodeCall

    call = AttentionPagedDecodeCall(
        device=torch.device("cuda:0"), batch=2, heads=32, kv_heads=8, q_len=1, num_blocks=512,
        block_size=block_size, max_blocks=64, head_dim=128, v_dim=128, causal=False,
        scale=128**-0.5, dtype=torch.bfloat16,
    )  # fmt: skip
    identity, kernel = build(kernels.TileLangPagedDecode, call, arch)
    assert kernel.plan_.block_size == block_size and kernel.plan_ in identity
    split = sources(kernel)[0]
    assert "Table" in split and "cp_async" in split


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, 512)], ids=str)
def test_the_sm_90_forward_overlaps_the_softmax_with_p_v(causal, window, tilelang_cache):
    """fwd_ws_program: a producer warpgroup loads K and V by TMA beside two consumer
    warpgroups, which wait for the older of two wgmma groups (Q K^T) and run the softmax while
    the other (P V) is still in flight."""
    cls = kernels.TileLangFlashFwdSm90
    _, kernel = build(cls, call_for(cls, 128, causal, torch.bfloat16, window), 90)
    (source,) = sources(kernel)
    assert kernel.plan_.overlap
    assert "__launch_bounds__(384" in source and "tl::tma_load" in source
    assert "wait_wgmma<1>" in source and "wgmma_rs" in source
    assert "named_barrier_arrive" not in source  # no turns unless the plan ping-pongs


def sm_90_variant(**changes):
    """The sm_90a forward with `changes` to its plan (what the prefill sweep measures)."""

    class Variant(kernels.TileLangFlashFwdSm90):
        @classmethod
        def plan(cls, call):
            return dataclasses.replace(super().plan(call), **changes)

    return Variant


def test_the_ping_pong_plan_issues_each_warpgroups_mmas_in_turns(tilelang_cache):
    """FwdPlan.pingpong: each consumer warpgroup syncs on its own named barrier (8 + its
    index) before issuing its wgmma and arrives at the other's after."""
    cls = sm_90_variant(pingpong=True)
    _, kernel = build(cls, call_for(cls, 128, True, torch.bfloat16), 90)
    (source,) = sources(kernel)
    turn = r"__sync_thread_partial\(\(+int\)threadIdx\.x\) >> 7\) \+ 8\), 256\)"
    assert re.search(turn, source)  # barrier 8 + the warpgroup's index, both warpgroups' threads
    assert "__named_barrier_arrive(8, 256)" in source  # the second warpgroup's first turn given
    assert "wait_wgmma<1>" in source


@pytest.mark.parametrize("causal", [True, False])
def test_the_heavy_first_plan_launches_the_last_query_blocks_first(causal, tilelang_cache):
    """FwdPlan.heavy_first: on a causal call the query blocks are the grid's slowest axis,
    the last (the most keys) first; a call without the mask keeps the plain grid."""
    cls = sm_90_variant(heavy_first=True)
    _, kernel = build(cls, call_for(cls, 128, causal, torch.bfloat16), 90)
    (source,) = sources(kernel)
    last_first = r"\(\(q_len \+ 127\) >> 7\) \* 128\) - \(\(\(int\)blockIdx\.z\) \* 128\)"
    assert bool(re.search(last_first, source)) == causal
    assert ("(((int)blockIdx.x) * 128)" in source) != causal
    assert "void __launch_bounds__(384, 1) main_kernel(" in source  # the entry Launch calls


def test_the_persistent_plan_walks_query_blocks_a_grid_apart(tilelang_cache):
    """FwdPlan.workers: one-dimensional grid of `workers` blocks, each walking its items
    `workers` apart; the producer loads an item's Q once the consumers free the previous one,
    the key tiles continue the ring where the block's last item left it, and the output is
    staged in a tile of its own (stored by TMA)."""
    cls = sm_90_variant(workers=132)
    _, kernel = build(cls, call_for(cls, 128, True, torch.bfloat16), 90)
    (source,) = sources(kernel)
    assert "blockIdx.y" not in source and "blockIdx.z" not in source
    assert "(i * 132) + ((int)blockIdx.x)" in source  # items 132 apart
    assert "q_free[0].wait(((i & 1) ^ 1));" in source  # the previous item's Q released
    assert "k_full[(done & 1)].wait(((done >> 1) & 1));" in source  # the ring carried over
    assert re.search(r"tma_store\(Out_desc, \(&\(\(\(bfloat16_t\*\)o_tile\)", source)
