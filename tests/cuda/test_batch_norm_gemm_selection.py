"""Which BatchNorm and GEMM key serves which call, on simulated sm_80, sm_86 and sm_90 devices
(no GPU needed): region edges, every accepted call served, and no ambiguity beside Triton."""

from __future__ import annotations

import itertools

import pytest
import torch
from cuda_grid import GEMM_LAYOUTS, SIMULATED, bn_call, gemm_call

import tileops_cuda
from tileops.ops import BatchNormFwdOp, GemmOp
from tileops.testing import simulate_device
from tileops_cuda._common.lanes import plan_smem_bytes
from tileops_cuda.batch_norm import kernels as batch_norm
from tileops_cuda.batch_norm import plans as bn_plans
from tileops_cuda.gemm import kernels as gemm
from tileops_cuda.gemm import tiles as gemm_tiles
from tileops_cuda.gemm import vendor as gemm_vendor

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TRAIN, INFER = "batch_norm_fwd_train", "batch_norm_fwd_infer"


def bn_key(call, arch: int, training: bool = True) -> str:
    with simulate_device("cuda:0", arch=arch, **SIMULATED[arch]):
        op = BatchNormFwdOp(call.channels, training=training)
        return op.key_for(TRAIN if training else INFER, call)


def gemm_key(call, arch: int) -> str:
    with simulate_device("cuda:0", arch=arch, **SIMULATED[arch]):
        return GemmOp().key_for("gemm", call)


# (batch, channels, spatial, arch) -> key at every edge. On sm_90 a cluster (cluster_channel) or
# 16 blocks meeting in L2 (group_channel) hold every ResNet-50 channel; split/tiled, which turn at
# 1.9 x SMs channels (and at half of them for channels shorter than 2^17 values), serve there
# only what 16 blocks do not hold.
BN_EDGES = [
    ((8, 4096, 4), 90, "tilelang_bn_thread_channel"),  # n = 32
    ((1, 3, 1), 80, "tilelang_bn_thread_channel"),
    ((3, 5, 11), 90, "tilelang_bn_block_channel"),  # n = 33
    ((32, 64, 512), 90, "tilelang_bn_block_channel"),  # n = 16384
    ((32, 2048, 49), 80, "tilelang_bn_block_channel"),  # ResNet-50 layer4 at batch 32
    ((1, 8, 16385), 90, "tilelang_bn_cluster_channel"),
    ((32, 64, 3136), 90, "tilelang_bn_cluster_channel"),  # ResNet-50 layer1
    ((32, 64, 3136), 80, "tilelang_bn_tiled"),  # 64 >= 108 / 2, n < 2^17
    ((4, 128, 1 << 20), 80, "tilelang_bn_split_channel"),
    ((4, 128, 1 << 20), 90, "tilelang_bn_split_channel"),  # 4M values: no cluster holds them
    ((256, 512, 196), 90, "tilelang_bn_cluster_channel"),  # ResNet-50 layer3 at batch 256
    ((256, 205, 1024), 80, "tilelang_bn_split_channel"),  # 205 < 1.9 x 108, n = 2^18
    ((256, 206, 1024), 80, "tilelang_bn_tiled"),
    ((256, 2048, 49), 90, "tilelang_bn_block_channel"),  # ResNet-50 layer4, batch 256
]

# split_channel's own edges on sm_90 (132 SMs): (shape, whether it serves).
SPLIT_EDGES_SM90 = [
    ((1, 8, 16385), True),
    ((256, 250, 784), True),  # 250 < 1.9 x 132, n = 200704
    ((256, 251, 784), False),  # tiled
    ((32, 65, 4096), True),  # 65 < 132 / 2, n = 2^17
    ((32, 66, 4095), False),  # n = 2^17 - 32: tiled
    ((32, 66, 4096), True),  # n = 2^17
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,serves", SPLIT_EDGES_SM90)
def test_split_channel_edges_on_sm_90(shape, serves, dtype):
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        refusal = batch_norm.BatchNormSplitChannel.refusal(bn_call(*shape, dtype))
    assert (refusal is None) == serves, refusal


# cluster_channel: parts of at most 64 KB (three blocks per SM) on the smallest cluster, else
# parts of half the budget on 16 blocks (bf16, 8-element vectors, 512 lanes, 1 KB scratch);
# 16 parts of more than 64 KB go to group_channel. (shape, parts, part bytes, key)
CLUSTER = "tilelang_bn_cluster_channel"
GROUP = "tilelang_bn_group_channel"
CLUSTER_EDGES = [
    ((1, 1, 57344), 2, 58368, CLUSTER),  # 7 x 4096 values a part: 57344 + 1024 B
    ((1, 1, 57352), 4, 33792, CLUSTER),  # 4 x 4096 values a part
    ((1, 1, 229376), 8, 58368, CLUSTER),
    ((1, 1, 229384), 16, 33792, CLUSTER),  # 16 parts of 64 KB or less: a cluster
    ((1, 1, 458752), 16, 58368, CLUSTER),
    ((1, 1, 458760), 16, 66560, GROUP),  # 8 x 4096 values a part
    ((1, 2, 917504), 16, 115712, GROUP),  # 14 x 4096 values a part: 115712 B of 116224
    ((1, 2, 917512), None, None, "tilelang_bn_split_channel"),
]


@pytest.mark.usefixtures("cuda_kernels_only")
@pytest.mark.parametrize("shape,parts,part_bytes,key", CLUSTER_EDGES)
def test_cluster_and_group_channel_plan_edges(shape, parts, part_bytes, key):
    call = bn_call(*shape, torch.bfloat16)
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        plan = bn_plans.cluster_channel_plan(call)
        cluster = batch_norm.BatchNormClusterChannel.refusal(call)
        group = batch_norm.BatchNormGroupChannel.refusal(call)
    assert (plan and plan.cluster) == parts
    assert (plan and plan_smem_bytes(plan, torch.bfloat16)) == part_bytes
    n = shape[0] * shape[2]
    if key == CLUSTER:
        assert cluster is None
        assert group == (
            f"a channel in {parts} parts of {part_bytes} bytes: cluster_channel serves it"
        )
    elif key == GROUP:
        assert group is None
        assert cluster == "a channel in 16 parts of more than 64 KB: group_channel serves it"
    else:
        assert (
            cluster
            == group.replace("group", "cluster")
            == (
                f"a channel of {n} values does not fit 16 blocks' shared memory: split_channel or "
                "tiled serves it"
            )
        )
    assert bn_key(call, 90) == key
    assert bn_key(call, 80) not in (CLUSTER, GROUP)


def test_group_channel_takes_1024_threads_where_they_fit_half_the_budget():
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        wide = bn_plans.group_channel_plan(bn_call(256, 256, 3136, torch.bfloat16))
    assert (wide.cluster, wide.lanes, wide.chunks, wide.blocks_per_sm) == (16, 1024, 7, 2)
    # half of this budget holds 13 chunks of 512 vectors (106496 + 1024 B), but not 7 of 1024
    facts = {**SIMULATED[90], "smem_budget": 215040}
    with simulate_device("cuda:0", arch=90, **facts):
        narrow = bn_plans.group_channel_plan(bn_call(1, 1, 16 * 13 * 4096, torch.bfloat16))
    assert (narrow.cluster, narrow.lanes, narrow.chunks) == (16, 512, 13)


def test_group_channel_refuses_devices_that_cannot_run_a_channels_parts_together():
    call = bn_call(256, 256, 3136, torch.bfloat16)
    for sm_count, served in ((8, True), (7, False)):  # two blocks per SM: 16 or 14 at once
        with simulate_device("cuda:0", arch=90, **{**SIMULATED[90], "sm_count": sm_count}):
            refusal = batch_norm.BatchNormGroupChannel.refusal(call)
        assert (refusal is None) == served
    assert (
        refusal
        == "7 multiprocessors hold 14 of its blocks at once, fewer than a channel's 16 parts"
    )


# block_channel: 4 warps up to 1024 values, then 8 warps of up to 32 values a lane in
# registers; longer channels wait in shared memory for 16 warps.
BLOCK_EDGES = [
    ((1, 1, 1024), "registers", 128, 1),
    ((1, 1, 1032), "registers", 256, 1),  # 8 values a vector, 129 vectors
    ((32, 1, 196), "registers", 256, 7),  # 1568 vectors of 4: ResNet-50 layer3 at batch 32
    ((1, 1, 8192), "registers", 256, 4),
    ((1, 1, 8200), "shared", 512, 3),
    ((256, 1, 49), "shared", 512, 25),  # ResNet-50 layer4 at batch 256: vectors of 1
]


@pytest.mark.parametrize("shape,hold,lanes,chunks", BLOCK_EDGES)
def test_block_channel_plan_edges(shape, hold, lanes, chunks):
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        plan = bn_plans.block_channel_plan(bn_call(*shape, torch.bfloat16))
    assert (plan.hold, plan.lanes, plan.chunks) == (hold, lanes, chunks)


def test_cluster_channel_refuses_register_sized_channels():
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        refusal = batch_norm.BatchNormClusterChannel.refusal(bn_call(32, 64, 512))
    assert refusal == "cluster_channel serves channels of more than 16384 values, not 16384"


# smem_channel: a channel in one block's shared memory (its slice padded to 512 lanes of
# vectors, plus 1 KB of scratch), on at least half as many channels as SMs. Byte edges per
# dtype; on sm_90 the key is its own region's verdict (cluster_channel is preferred there).
SMEM_CHANNEL_EDGES = [
    ((256, 1024, 196), 90, torch.bfloat16, "tilelang_bn_smem_channel"),  # 103424 B
    ((256, 1024, 196), 90, torch.float32, "tilelang_bn_smem_channel"),  # 205824 of 232448 B
    ((256, 1024, 196), 80, torch.float32, "tilelang_bn_tiled"),  # over 166912 B
    ((32, 256, 784), 86, torch.bfloat16, "tilelang_bn_smem_channel"),  # ResNet-50 layer2, b 32
    ((32, 256, 784), 86, torch.float32, "tilelang_bn_tiled"),  # 107520 over 101376 B
    ((32, 256, 3136), 90, torch.bfloat16, "tilelang_bn_smem_channel"),  # layer1, 201728 B
    ((32, 128, 3136), 90, torch.float32, "tilelang_bn_tiled"),  # 402432 B
    ((32, 66, 784), 90, torch.bfloat16, "tilelang_bn_smem_channel"),  # 2 x 66 channels >= 132
    ((32, 65, 784), 90, torch.bfloat16, "tilelang_bn_split_channel"),
    ((115712, 300, 1), 90, torch.bfloat16, "tilelang_bn_smem_channel"),  # 226 x 512 values
    ((115713, 300, 1), 90, torch.bfloat16, "tilelang_bn_tiled"),  # 227 x 512 x 2 + 1024 B
]


@pytest.mark.usefixtures("cuda_kernels_only")
@pytest.mark.parametrize("shape,arch,dtype,key", SMEM_CHANNEL_EDGES)
def test_batch_norm_smem_channel_edges(shape, arch, dtype, key):
    call = bn_call(*shape, dtype)
    with simulate_device("cuda:0", arch=arch, **SIMULATED[arch]):
        serves = batch_norm.BatchNormSmemChannel.refusal(call) is None
    assert serves == (key == "tilelang_bn_smem_channel")
    if arch == 90:  # a cluster or a group of 16 blocks holds every channel here
        with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
            parts = bn_plans.cluster_channel_plan(call).cluster
        key = "tilelang_bn_group_channel" if parts == 16 else "tilelang_bn_cluster_channel"
    assert bn_key(call, arch) == key


def test_smem_channel_refusals_name_the_bytes_and_the_channels():
    with simulate_device("cuda:0", arch=80, **SIMULATED[80]):
        wide = batch_norm.BatchNormSmemChannel.refusal(bn_call(256, 1024, 196, torch.float32))
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        few = batch_norm.BatchNormSmemChannel.refusal(bn_call(32, 65, 784, torch.bfloat16))
    assert wide == (
        "a channel of 50176 values needs 205824 bytes of shared memory, over this device's "
        "166912 per block: tiled or split_channel serves it"
    )
    assert few == (
        "65 channels leave most of the 132 multiprocessors idle: cluster_channel (sm_90) or "
        "split_channel serves it"
    )


@pytest.mark.usefixtures("cuda_kernels_only")
@pytest.mark.parametrize(
    "dtype,key",
    [
        (torch.bfloat16, "tilelang_bn_group_channel"),  # 16 parts of 98 KB
        (torch.float16, "tilelang_bn_group_channel"),
        (torch.float32, "tilelang_bn_tiled"),  # 3.2 MB: over 16 blocks' shared memory
    ],
)
def test_resnet50_layer1_at_batch_256_by_dtype(dtype, key):
    assert bn_key(bn_call(256, 256, 3136, dtype), 90) == key
    assert bn_key(bn_call(256, 256, 3136, dtype), 80) == "tilelang_bn_tiled"


@pytest.mark.usefixtures("cuda_kernels_only")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,arch,key", BN_EDGES)
def test_batch_norm_region_edges(shape, arch, key, dtype):
    assert bn_key(bn_call(*shape, dtype), arch) == key
    assert bn_key(bn_call(*shape, dtype), arch, training=False) == "tilelang_bn_infer"


def _bn_grid():
    batches, channels, spatials = (1, 2, 7, 32, 256), (1, 3, 64, 300, 2048), (1, 5, 49, 3136)
    return [s for s in itertools.product(batches, channels, spatials) if s[0] * s[2] >= 2]


@pytest.mark.usefixtures("cuda_kernels_only")
@pytest.mark.parametrize("arch", [80, 86, 90])
def test_every_batch_norm_call_is_served(arch):
    flags = [
        {},
        {"has_weight": False, "has_bias": False, "has_running_stats": False},
        {"has_bias": False, "param_dtype": torch.float32},
    ]
    for shape, dtype, extra in itertools.product(_bn_grid(), DTYPES, flags):
        if extra.get("param_dtype") == torch.float32 and dtype == torch.float32:
            continue
        call = bn_call(*shape, dtype, **extra)
        assert bn_key(call, arch).startswith("tilelang_bn_"), (shape, dtype, extra)
        assert bn_key(call, arch, training=False) == "tilelang_bn_infer"


@pytest.mark.usefixtures("cuda_kernels_only")
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_float64_is_left_to_the_reference(training):
    call = bn_call(32, 64, 196, torch.float64)
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        op = BatchNormFwdOp(64, training=training)
        explanation = op.explain(TRAIN if training else INFER, call)
    assert explanation.chosen == ("reference" if training else "reference_infer")
    for cls in tileops_cuda.KERNELS[BatchNormFwdOp].values():
        assert "float64" in cls.refusal(call)


def test_batch_norm_declarations():
    keys = tileops_cuda.KERNELS[BatchNormFwdOp]
    for key, cls in keys.items():
        cluster = key in ("tilelang_bn_cluster_channel", "tilelang_bn_group_channel")
        assert cls.supported_archs == ({90} if cluster else {80, 86, 89, 90})
        assert cls.devices == {"cuda"} and not cls.general
        expected = (
            set() if key in ("tilelang_bn_tiled", "tilelang_bn_infer") else {"tilelang_bn_tiled"}
        )
        if cluster:
            expected |= {"tilelang_bn_smem_channel", "tilelang_bn_split_channel"}
        assert cls.preferred_over == expected
        if key != "tilelang_bn_infer":
            assert key == f"tilelang_bn_{cls.layout}"


def test_batch_norm_identities_hold_what_changes_the_code():
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        tiled, block = batch_norm.BatchNormTiled, batch_norm.BatchNormBlockChannel
        base = bn_call(256, 1024, 196)
        # tiled: batch is symbolic; channels, spatial, eps, flags and dtypes are baked in.
        assert tiled.entry_for(bn_call(255, 1024, 196))[0] == tiled.entry_for(base)[0]
        changes = [
            bn_call(256, 1024, 197),
            bn_call(256, 1000, 196),
            bn_call(256, 1024, 196, torch.float16),
            bn_call(256, 1024, 196, has_bias=False),
            bn_call(256, 1024, 196, param_dtype=torch.float32),
            type(base)(**{**base.__dict__, "eps": 1e-3}),
            type(base)(**{**base.__dict__, "momentum": 0.2}),
        ]
        for other in changes:
            assert tiled.entry_for(other)[0] != tiled.entry_for(base)[0]
        # block_channel sizes its registers by n: the batch is part of its identity.
        assert block.entry_for(bn_call(32, 64, 196))[0] != block.entry_for(bn_call(31, 64, 196))[0]
        # inference ignores momentum and whether a training call would update stats.
        infer = batch_norm.BatchNormInfer
        moved = type(base)(**{**base.__dict__, "momentum": 0.5})
        assert infer.entry_for(moved)[0] == infer.entry_for(base)[0]


def test_split_chunks_bucket_batch_sizes():
    """Batch sizes within a factor of two share the split layout's build."""
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        split = batch_norm.BatchNormSplitChannel
        identities = {split.entry_for(bn_call(b, 64, 3136))[0] for b in (17, 24, 32)}
        assert len(identities) == 1


# -- GEMM ------------------------------------------------------------------------------------

GEMM_EDGES = [
    ((1, 4096, 4096), 90, "tilelang_gemm_skinny"),
    ((47, 4096, 4096), 90, "tilelang_gemm_skinny"),
    ((48, 4096, 4096), 90, "tilelang_gemm_hopper"),  # decode tile: unsplit, faster from m = 48
    ((64, 4096, 4096), 90, "tilelang_gemm_hopper"),
    ((64, 4096, 4096), 80, "tilelang_gemm_skinny"),
    ((64, 4095, 4097), 90, "tilelang_gemm_skinny"),  # misaligned: skinny has no TMA
    ((64, 4095, 4097), 80, "tilelang_gemm_skinny"),
    ((65, 4096, 4096), 90, "tilelang_gemm_hopper"),
    ((4096, 4096, 4096), 90, "tilelang_gemm_hopper"),
    ((4096, 4104, 8), 90, "tilelang_gemm_hopper"),
    ((4096, 4095, 4096), 90, "tilelang_gemm_hopper"),  # n padded to a multiple of 8
    ((4096, 4096, 4100), 90, "tilelang_gemm_hopper"),  # k padded
    ((4096, 4095, 4096), 80, "tilelang_gemm"),
    ((2048, 4095, 4096), 90, "tilelang_gemm"),  # below 2^36 flops: not worth padding
    ((1000, 1001, 999), 90, "tilelang_gemm"),
    ((65, 4096, 4096), 80, "tilelang_gemm"),
    ((4096, 4096, 4096), 86, "tilelang_gemm"),
    ((128, 64, 0), 90, "tilelang_gemm"),  # k == 0: zeros
    ((1, 64, 0), 80, "tilelang_gemm"),
]


@pytest.mark.usefixtures("cuda_kernels_only")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape,arch,key", GEMM_EDGES)
def test_gemm_region_edges(shape, arch, key, dtype):
    assert gemm_key(gemm_call(*shape, dtype), arch) == key


# Layouts whose regions differ from NN's: a transposed a's rows are m long, so TMA needs m
# aligned too (padded from 2^36 flops); a bias changes no region.
GEMM_LAYOUT_EDGES = [
    ((1, 4096, 4096), "NT", 90, "tilelang_gemm_skinny"),  # Linear at decode
    ((48, 4096, 4096), "NT", 90, "tilelang_gemm_hopper"),
    ((8192, 4096, 4096), "NT", 90, "tilelang_gemm_hopper"),  # Linear at prefill
    ((8192, 4096, 4096), "NT", 80, "tilelang_gemm"),
    ((4096, 4096, 4096), "TN", 90, "tilelang_gemm_hopper"),
    ((4100, 4096, 4096), "TN", 90, "tilelang_gemm_hopper"),  # m padded to 4104
    ((2044, 4096, 4096), "TN", 90, "tilelang_gemm"),  # below 2^36 flops: not worth padding
    ((2044, 4096, 4096), "NN", 90, "tilelang_gemm_hopper"),  # m is no row pitch in NN
    ((2044, 4096, 4096), "NT", 90, "tilelang_gemm_hopper"),
    ((2044, 4096, 4096), "TT", 90, "tilelang_gemm"),
    ((48, 4096, 4096), "TN", 90, "tilelang_gemm_hopper"),
    ((57, 4096, 4096), "TN", 90, "tilelang_gemm_skinny"),  # m misaligned: TMA cannot read a
    ((57, 4096, 4096), "NN", 90, "tilelang_gemm_hopper"),
    ((64, 4096, 4096), "TT", 80, "tilelang_gemm_skinny"),
    ((128, 64, 0), "TT", 90, "tilelang_gemm"),  # k == 0: the bias, or zeros
]


@pytest.mark.usefixtures("cuda_kernels_only")
@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("shape,layout,arch,key", GEMM_LAYOUT_EDGES)
def test_gemm_layout_region_edges(shape, layout, arch, key, has_bias):
    assert gemm_key(gemm_call(*shape, torch.bfloat16, layout, has_bias), arch) == key


GEMM_GRID = list(
    itertools.product((1, 16, 63, 64, 65, 127, 4096), (1, 7, 8, 4095, 4096), (0, 1, 8, 4100))
)


@pytest.mark.usefixtures("cuda_kernels_only")
@pytest.mark.parametrize("arch", [80, 86, 90])
def test_every_gemm_call_is_served(arch):
    """16-bit calls in every layout, with a bias or without, by a TileLang key; float32 (tf32
    refused) by the reference."""
    variants = itertools.product(GEMM_GRID, DTYPES, GEMM_LAYOUTS, (False, True))
    for (m, n, k), dtype, layout, has_bias in variants:
        key = gemm_key(gemm_call(m, n, k, dtype, layout, has_bias), arch)
        assert key == "reference" if dtype == torch.float32 else key.startswith("tilelang_gemm")


def test_gemm_refusals_say_why():
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        assert "k == 0" in gemm.GemmHopper.refusal(gemm_call(4096, 4095, 0))
        assert gemm.GemmHopper.refusal(gemm_call(2048, 4095, 4096)) == (
            "TMA needs 16-byte aligned rows: n=4095 is not a multiple of 8 (NN), and below "
            "68719476736 flops padding costs more than it saves; tilelang_gemm serves it"
        )
        assert "rows: m=2044 and k=4100 are not multiples of 8 (TN)" in gemm.GemmHopper.refusal(
            gemm_call(2044, 4096, 4100, layout="TN")
        )
        assert "tf32" in gemm.GemmGeneral.refusal(gemm_call(64, 64, 64, torch.float32))
        assert "m <= 64" in gemm.GemmSkinny.refusal(gemm_call(65, 64, 64))
        assert "m=48 >= 48 on sm_90: tilelang_gemm_hopper streams the weight faster" in (
            gemm.GemmSkinny.refusal(gemm_call(48, 64, 64))
        )
        assert "float64" in gemm.GemmGeneral.refusal(gemm_call(64, 64, 64, torch.float64))


def test_gemm_declarations():
    keys = tileops_cuda.KERNELS[GemmOp]
    assert keys["tilelang_gemm_hopper"].supported_archs == {90}
    assert keys["tilelang_gemm"].supported_archs == {80, 86, 89, 90}
    assert keys["tilelang_gemm_skinny"].supported_archs == {80, 86, 89, 90}
    assert keys["tilelang_gemm"].preferred_over == set()
    assert keys["tilelang_gemm_hopper"].preferred_over == {"tilelang_gemm"}
    assert keys["tilelang_gemm_skinny"].preferred_over == {"tilelang_gemm", "tilelang_gemm_hopper"}
    assert not any(cls.general for cls in keys.values())


def test_gemm_identities_bake_n_and_k_and_bucket_m():
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        hopper, skinny = gemm.GemmHopper, gemm.GemmSkinny
        base = hopper.entry_for(gemm_call(4096, 4096, 4096))[0]
        assert hopper.entry_for(gemm_call(8192, 4096, 4096))[0] == base  # same tiles: m free
        assert hopper.entry_for(gemm_call(4096, 4096, 4104))[0] != base
        assert hopper.entry_for(gemm_call(4096, 4104, 4096))[0] != base
        assert hopper.entry_for(gemm_call(4096, 4096, 4096, torch.float16))[0] != base
        # misaligned layers build their padded shape: 4095 pads to 4096
        assert hopper.entry_for(gemm_call(4096, 4095, 4089))[0] == base
        # each layout and the bias are builds of their own; m stays free in every layout
        variants = [(layout, bias) for layout in GEMM_LAYOUTS for bias in (False, True)]
        built = {hopper.entry_for(gemm_call(4096, 4096, 4096, layout=v[0], has_bias=v[1]))[0]
                 for v in variants}  # fmt: skip
        assert len(built) == len(variants) and base in built
        tn = hopper.entry_for(gemm_call(4096, 4096, 4096, layout="TN"))[0]
        assert hopper.entry_for(gemm_call(8192, 4096, 4096, layout="TN"))[0] == tn
        buckets = {skinny.entry_for(gemm_call(m, 4096, 4096))[0] for m in range(1, 65)}
        assert len(buckets) == 4  # row tiles of 16 (m = 1 apart: its fixup), 32 and 64
        decode = {hopper.entry_for(gemm_call(m, 4096, 4096))[0] for m in range(1, 65)}
        assert len(decode) == 1 and hopper.entry_for(gemm_call(65, 4096, 4096))[0] not in decode


def test_tile_rules_follow_the_device():
    """More multiprocessors than tiles pick a smaller tile; a smaller budget fewer stages."""
    with simulate_device("cuda:0", arch=90, **SIMULATED[90]):
        large = gemm.GemmHopper.plan(gemm_call(4096, 4096, 4096))
        small = gemm.GemmHopper.plan(gemm_call(256, 1024, 4096))
    assert (large.block_m, large.block_n) == (128, 256)
    assert (small.block_m, small.block_n) == (64, 128)
    with simulate_device("cuda:0", arch=86, **SIMULATED[86]):
        ampere = gemm.GemmGeneral.plan(gemm_call(4096, 4096, 4096))
    with simulate_device("cuda:0", arch=80, **SIMULATED[80]):
        a100 = gemm.GemmGeneral.plan(gemm_call(4096, 4096, 4096))
    for tile, budget in ((ampere, 101376), (a100, 166912)):
        assert tile.stages * tile.stage_bytes(2) <= budget - gemm_tiles.SMEM_RESERVE
    assert ampere.stages < a100.stages or ampere.stages == gemm_tiles.MAX_STAGES


def test_decode_tile_takes_the_narrowest_columns_that_fit_one_wave():
    """m <= 64 on the Hopper kernel: 64 rows, n in as many column tiles as one wave holds."""
    facts = SIMULATED[90]
    with simulate_device("cuda:0", arch=90, **facts):
        tiles = {n: gemm.GemmHopper.plan(gemm_call(64, n, 4096)) for n in (4096, 8192, 11008)}
    with simulate_device("cuda:0", arch=90, **{**facts, "sm_count": 60}):
        few = gemm.GemmHopper.plan(gemm_call(64, 4096, 4096))
    with simulate_device("cuda:0", arch=90, **{**facts, "smem_budget": 101376}):
        small = gemm.GemmHopper.plan(gemm_call(64, 4096, 4096))
    shapes = {n: (t.block_m, t.block_n, t.block_k, t.stages) for n, t in tiles.items()}
    assert shapes == {4096: (64, 64, 128, 6), 8192: (64, 64, 128, 6), 11008: (64, 128, 128, 4)}
    assert few.block_n == 128  # 64 tiles of 64 columns would leave a second wave
    assert small.stages == 3  # as many 32 KB stages as 99 KB hold


# -- beside the Triton backend (installed in this environment) -------------------------------

BESIDE_TRITON = {**SIMULATED, 75: {"sm_count": 40, "calibration": "Tesla T4", "smem_budget": 65536}}


@pytest.mark.parametrize("arch", sorted(BESIDE_TRITON))
def test_no_call_is_ambiguous_beside_triton(arch):
    """Triton steps aside wherever tileops-cuda serves: cuBLAS everywhere, except the regions
    where a TileLang GEMM measured faster on the H200, which its TileLang key serves."""
    pytest.importorskip("tileops_triton")
    with simulate_device("cuda:0", arch=arch, **BESIDE_TRITON[arch]):
        op = GemmOp()
        for (m, n, k), dtype in itertools.product(GEMM_GRID, DTYPES):
            call = gemm_call(m, n, k, dtype)
            explanation = op.explain("gemm", call)
            assert explanation.chosen is not None, explanation.text
            faster = [r for r in gemm_vendor.GEMM_FASTER if r.covers(call)]
            measured = arch == 90 and any(explanation.chosen in r.keys for r in faster)
            assert explanation.chosen == "cublas" or measured, explanation.text
        for shape, dtype in itertools.product(_bn_grid()[::7], DTYPES):
            for training, interface in ((True, TRAIN), (False, INFER)):
                chosen = BatchNormFwdOp(shape[1], training=training).explain(
                    interface, bn_call(*shape, dtype)
                )
                assert chosen.chosen is not None


@pytest.mark.parametrize("layout", GEMM_LAYOUTS)
@pytest.mark.parametrize("m,n,k", [(5, 13, 11), (5, 16, 11), (5, 13, 16), (3, 8, 8), (8, 8, 8)])
def test_hopper_forward_pads_misaligned_operands_with_zeros(m, n, k, layout):
    """The compiled kernel sees 16-byte aligned rows, each operand padded as it is stored (m too
    where a is transposed), the bias with n; the caller gets exactly (m, n)."""
    seen = []
    trans_a, trans_b = GEMM_LAYOUTS[layout]

    def compiled(a, b, c, bias):
        seen.append((tuple(a.shape), tuple(b.shape), tuple(c.shape), tuple(bias.shape)))
        product = (a.t() if trans_a else a).float() @ (b.t() if trans_b else b).float()
        c.copy_(product + bias.float())

    a = torch.randn(m, k, dtype=torch.bfloat16)
    b = torch.randn(k, n, dtype=torch.bfloat16)
    bias = torch.randn(n, dtype=torch.bfloat16)
    kernel = gemm.GemmHopper(gemm_call(m, n, k, layout=layout, has_bias=True), [compiled])
    got = kernel(a.t().contiguous() if trans_a else a, b.t().contiguous() if trans_b else b, bias)
    mp, kp, np_ = (-(-size // 8) * 8 for size in (m, k, n))
    mp = mp if trans_a else m
    a_shape, b_shape = (kp, mp) if trans_a else (mp, kp), (np_, kp) if trans_b else (kp, np_)
    assert seen == [(a_shape, b_shape, (mp, np_), (np_,))]
    assert got.shape == (m, n) and got.is_contiguous()
    torch.testing.assert_close(got, (a.float() @ b.float() + bias.float()).bfloat16())


@pytest.mark.parametrize("training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("arch", [80, 90])
def test_every_batch_norm_kernel_refuses_channels_last_and_cudnn_serves(arch, training):
    """They read x as (batch, channels, spatial): a channels_last call, x as (batch, spatial,
    channels), must never reach them (BatchNormCall.channels_last); cuDNN reads it in place."""
    for shape, _, _ in BN_EDGES:
        call = bn_call(*shape, channels_last=True)
        assert bn_key(call, arch, training) == ("cudnn" if training else "cudnn_infer")
    interface = BatchNormFwdOp.interfaces[TRAIN if training else INFER]
    ours = [
        cls
        for cls in vars(batch_norm).values()
        if isinstance(cls, type)
        and issubclass(cls, interface)
        and cls.__module__ == batch_norm.__name__
    ]
    assert ours and all(not cls.channels_last for cls in ours)
    assert all(
        "x is channels_last" in cls.refusal(bn_call(8, 64, 49, channels_last=True)) for cls in ours
    )
