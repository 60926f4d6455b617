"""Which key serves which rows, on simulated sm_80, sm_86 and sm_90 devices (no GPU needed)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from cuda_grid import DTYPES, ROW_OPS, SIMULATED, make_call

import tileops_cuda
from tileops.backend import register_kernel_type
from tileops.ops import LayerNormFwdOp, RMSNormFwdOp, SoftmaxFwdOp
from tileops.registry import REGISTRY
from tileops.testing import isolated_registry, simulate_device
from tileops_cuda.rows import kernels as row_kernels

pytestmark = pytest.mark.usefixtures("cuda_kernels_only")

DEVICES = SIMULATED
OPS = {"LayerNormFwdOp": LayerNormFwdOp, "RMSNormFwdOp": RMSNormFwdOp, "SoftmaxFwdOp": SoftmaxFwdOp}
INTERFACE = {"LayerNormFwdOp": "layer_norm", "RMSNormFwdOp": "rms_norm", "SoftmaxFwdOp": "softmax"}


def _op(name: str):
    return SoftmaxFwdOp(-1) if name == "SoftmaxFwdOp" else OPS[name](8)


def key_for(name: str, n: int, dtype: torch.dtype, arch: int) -> str:
    with simulate_device("cuda:0", arch=arch, **DEVICES[arch]):
        return _op(name).key_for(INTERFACE[name], make_call(name, n, dtype))


# (n, dtype, arch) -> key, at every region edge.
EXPECTED = [
    (1, torch.float32, 90, "tilelang_warp_rows"),
    (1024, torch.bfloat16, 80, "tilelang_warp_rows"),
    (1025, torch.bfloat16, 80, "tilelang_block_row"),
    (16384, torch.bfloat16, 90, "tilelang_block_row"),
    (16385, torch.bfloat16, 90, "tilelang_smem_row"),
    (32768, torch.bfloat16, 90, "tilelang_smem_row"),  # 64 KB: SMEM_ROW_OVER_CLUSTER_BYTES
    (32768, torch.float32, 90, "tilelang_block_row"),  # 32-bit rows: WIDE_REGISTER_ROW_MAX
    (32769, torch.float32, 90, "tilelang_cluster_row"),
    (57000, torch.float32, 80, "tilelang_stream_row"),  # 228000 bytes of 166912
    (57000, torch.float32, 90, "tilelang_cluster_row"),  # would fit smem_row: 228000 bytes
    (65536, torch.bfloat16, 80, "tilelang_smem_row"),
    (65536, torch.bfloat16, 86, "tilelang_stream_row"),  # 99 KB budget
    (81920, torch.float16, 80, "tilelang_smem_row"),  # 160 KB of 163 KB
    (90000, torch.float16, 80, "tilelang_stream_row"),
    (32768, torch.float32, 80, "tilelang_block_row"),
    (32769, torch.float32, 80, "tilelang_smem_row"),
    (65536, torch.float32, 90, "tilelang_cluster_row"),  # 256 KB
    (262144, torch.bfloat16, 90, "tilelang_cluster_row"),
    (262144, torch.float32, 90, "tilelang_cluster_row"),  # 8 slices of 128 KB
    (8 * 60000, torch.float32, 90, "tilelang_stream_row"),  # 8 slices of 240 KB
]


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("n,dtype,arch,key", EXPECTED)
def test_region_edges(name, n, dtype, arch, key):
    assert key_for(name, n, dtype, arch) == key


@pytest.mark.parametrize("name", sorted(OPS))
def test_rms_norm_keeps_rows_of_up_to_128_kb_on_smem_row(name):
    """RMSNorm's lone smem_row block per SM beat its cluster at 64K bfloat16; the others'
    clusters start beyond 64 KB."""
    cluster_from = 65537 if name == "RMSNormFwdOp" else 32769
    assert key_for(name, cluster_from - 1, torch.bfloat16, 90) == "tilelang_smem_row"
    assert key_for(name, cluster_from, torch.bfloat16, 90) == "tilelang_cluster_row"


def _log_grid() -> list[int]:
    """1 .. 262144 log-spaced, with the odd neighbours of every power of two."""
    lengths = set()
    for power in range(19):
        lengths.update({2**power - 1, 2**power, 2**power + 1, 3 * 2**power // 2})
    return sorted(n for n in lengths if 1 <= n <= 262144)


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("name", sorted(OPS))
def test_every_length_is_served(name, arch):
    with simulate_device("cuda:0", arch=arch, **DEVICES[arch]):
        op = _op(name)
        for dtype in DTYPES:
            for n in _log_grid():
                assert op.key_for(INTERFACE[name], make_call(name, n, dtype)).startswith("tilelang")


def test_declarations():
    # Preferences only where regions overlap: smem_row and cluster_row (sm_90 only) inside
    # stream_row's, cluster_row over smem_row on the rows beyond 64 KB (128 KB) both serve.
    preferred = {
        "smem_row": {"tilelang_stream_row"},
        "cluster_row": {"tilelang_stream_row", "tilelang_smem_row"},
    }
    for op in ROW_OPS:
        for key, cls in tileops_cuda.KERNELS[op].items():
            archs = {90} if cls.layout == "cluster_row" else {80, 86, 89, 90}
            assert cls.supported_archs == archs
            assert cls.devices == {"cuda"}
            assert not cls.general
            assert cls.preferred_over == preferred.get(cls.layout, set())
            assert key == f"tilelang_{cls.layout}"


@pytest.mark.parametrize(
    "name,layout,n,dtype,lanes,chunks",
    [
        ("RMSNormFwdOp", "block_row", 16384, torch.bfloat16, 256, 8),  # 8 vectors, 2 blocks/SM
        ("LayerNormFwdOp", "block_row", 16384, torch.float32, 512, 8),
        ("RMSNormFwdOp", "block_row", 8192, torch.bfloat16, 256, 4),  # never fewer than 8 warps
        ("RMSNormFwdOp", "block_row", 2048, torch.bfloat16, 256, 1),
        ("RMSNormFwdOp", "block_row", 4096, torch.float32, 128, 8),  # 32-bit: as few as 4 warps
        ("RMSNormFwdOp", "block_row", 2048, torch.float32, 128, 4),
        ("RMSNormFwdOp", "block_row", 16383, torch.float16, 1024, 16),  # odd: 1-element vectors
        ("RMSNormFwdOp", "smem_row", 32768, torch.bfloat16, 256, 16),  # 64 KB: 3 blocks per SM
        ("RMSNormFwdOp", "smem_row", 65536, torch.bfloat16, 1024, 8),  # 128 KB: 1 block per SM
        ("RMSNormFwdOp", "block_row", 32768, torch.float32, 512, 16),  # beyond 16K: 16 vectors
        # RMSNorm's 32-bit rows of 8K and 16K take a whole block (full_block_32bit)
        ("RMSNormFwdOp", "block_row", 8192, torch.float32, 1024, 2),
        ("RMSNormFwdOp", "block_row", 16384, torch.float32, 1024, 4),
        ("LayerNormFwdOp", "block_row", 8192, torch.float32, 256, 8),
    ],
)
def test_single_block_plans(name, layout, n, dtype, lanes, chunks):
    cls = tileops_cuda.KERNELS[OPS[name]][f"tilelang_{layout}"]
    with simulate_device("cuda:0", arch=90, **DEVICES[90]):
        plan = cls.plan(make_call(name, n, dtype))
    assert (plan.lanes, plan.chunks) == (lanes, chunks)


@pytest.mark.parametrize(
    "name,n,dtype,cluster,lanes,chunks",
    [
        ("RMSNormFwdOp", 16385, torch.bfloat16, 2, 512, 17),  # odd: vectors of one element
        ("RMSNormFwdOp", 65536, torch.bfloat16, 2, 512, 8),  # 64 KB slices
        ("RMSNormFwdOp", 65537, torch.bfloat16, 4, 512, 33),
        ("RMSNormFwdOp", 262144, torch.bfloat16, 8, 512, 8),
        ("RMSNormFwdOp", 65536, torch.float32, 8, 256, 8),  # TMA's 32 KB slices
        ("RMSNormFwdOp", 65540, torch.float32, 8, 512, 5),  # over 256 KB: up to 64 KB slices
        ("RMSNormFwdOp", 262144, torch.float32, 16, 512, 8),  # 16 blocks: a non-portable size
        ("RMSNormFwdOp", 262148, torch.float32, 8, 1024, 9),  # 144 KB slices, one block per SM
        ("LayerNormFwdOp", 262144, torch.bfloat16, 8, 256, 16),  # LayerNorm's 16-bit threads
        ("LayerNormFwdOp", 65536, torch.float32, 8, 256, 8),
        ("LayerNormFwdOp", 57000, torch.float32, 4, 512, 7),  # TMA would pass the row's end
        ("SoftmaxFwdOp", 65536, torch.float32, 4, 256, 16),  # softmax measured slower with TMA
    ],
)
def test_cluster_row_slices(name, n, dtype, cluster, lanes, chunks):
    """The smallest cluster (up to 16 blocks) whose slices fit 64 KB, else 8 blocks of 1024
    threads while the budget holds."""
    cls = tileops_cuda.KERNELS[OPS[name]]["tilelang_cluster_row"]
    with simulate_device("cuda:0", arch=90, **DEVICES[90]):
        plan = cls.plan(make_call(name, n, dtype))
    assert (plan.cluster, plan.lanes, plan.chunks, plan.hold) == (cluster, lanes, chunks, "shared")
    assert plan.padded >= n > plan.padded - plan.cluster * plan.lanes * plan.vec


@pytest.mark.parametrize(
    "name,n,dtype,bulk",
    [
        ("LayerNormFwdOp", 65536, torch.float32, True),
        ("RMSNormFwdOp", 40960, torch.float32, True),  # 5 x 8192: whole slices
        ("LayerNormFwdOp", 57000, torch.float32, False),  # a slice would pass the row's end
        ("LayerNormFwdOp", 131072, torch.float32, False),  # over BULK_ROW_BYTES
        ("LayerNormFwdOp", 131072, torch.bfloat16, False),  # 16-bit rows: slower with TMA
        ("SoftmaxFwdOp", 65536, torch.float32, False),
    ],
)
def test_cluster_row_takes_tma_slices_where_measured_faster(name, n, dtype, bulk):
    """32-bit norm rows of up to 256 KB whose slices TMA can bring whole; LayerNorm's one-pass
    statistics only where the lanes load."""
    cls = tileops_cuda.KERNELS[OPS[name]]["tilelang_cluster_row"]
    with simulate_device("cuda:0", arch=90, **DEVICES[90]):
        plan = cls.plan(make_call(name, n, dtype))
    assert plan.bulk == bulk
    assert plan.padded == n or not bulk
    if bulk:
        assert (plan.lanes, plan.one_pass) == (256, False) and plan.slice * 4 <= 32768
    else:
        assert plan.one_pass == (name == "LayerNormFwdOp")


@pytest.mark.parametrize(
    "name,n,dtype,arch,bulk",
    [
        ("RMSNormFwdOp", 32768, torch.bfloat16, 90, True),  # 64 KB rows
        ("SoftmaxFwdOp", 32768, torch.float16, 90, True),
        ("SoftmaxFwdOp", 32768, torch.bfloat16, 80, False),  # no TMA before sm_90
        ("LayerNormFwdOp", 32768, torch.bfloat16, 90, False),  # measured slower
        ("RMSNormFwdOp", 65536, torch.bfloat16, 90, False),  # 128 KB: one block per SM
        ("RMSNormFwdOp", 20000, torch.bfloat16, 90, False),  # whole chunks would pass its end
    ],
)
def test_smem_row_takes_tma_rows_where_measured_faster(name, n, dtype, arch, bulk):
    cls = tileops_cuda.KERNELS[OPS[name]]["tilelang_smem_row"]
    with simulate_device("cuda:0", arch=arch, **DEVICES[arch]):
        call = make_call(name, n, dtype)
        assert cls.refusal(call) is None
        assert cls.plan(call).bulk == bulk


@pytest.mark.parametrize(
    "key,n,dtype,arch,scaled,lanes",
    [
        ("tilelang_smem_row", 32768, torch.bfloat16, 90, True, 256),
        ("tilelang_smem_row", 65536, torch.float16, 80, True, 1024),
        ("tilelang_smem_row", 40000, torch.float32, 90, False, 1024),
        ("tilelang_cluster_row", 65536, torch.bfloat16, 90, True, 256),
        ("tilelang_cluster_row", 262144, torch.float16, 90, True, 256),
        ("tilelang_cluster_row", 131072, torch.float32, 90, False, 256),
        ("tilelang_block_row", 16384, torch.bfloat16, 90, False, 256),  # registers: not measured
        ("tilelang_stream_row", 65536, torch.bfloat16, 90, False, 1024),  # online: no held max
    ],
)
def test_softmax_scaled_exponents_where_measured_faster(key, n, dtype, arch, scaled, lanes):
    """16-bit softmax rows held in shared memory take scaled exponents; cluster blocks have 256
    threads (row_plans_softmax_scaled_exp, row_plans_cluster_row_dsmem)."""
    cls = tileops_cuda.KERNELS[SoftmaxFwdOp][key]
    with simulate_device("cuda:0", arch=arch, **DEVICES[arch]):
        call = make_call("SoftmaxFwdOp", n, dtype)
        assert cls.refusal(call) is None
        plan = cls.plan(call)
    assert (plan.scaled_exp, plan.lanes) == (scaled, lanes)


def test_cluster_row_refuses_rows_no_cluster_holds_and_rows_smem_row_serves_faster():
    with simulate_device("cuda:0", arch=90, **DEVICES[90]):
        cls = row_kernels.SoftmaxClusterRow
        too_long = make_call("SoftmaxFwdOp", 8 * 60000, torch.float32)  # 240 KB slices
        assert "stream_row serves it" in cls.refusal(too_long)
        assert "fits in registers" in cls.refusal(make_call("SoftmaxFwdOp", 16384, torch.float32))
        short = make_call("SoftmaxFwdOp", 32768, torch.bfloat16)
        assert "smem_row measured faster on n=32768 bfloat16" in cls.refusal(short)
        long = make_call("SoftmaxFwdOp", 32769, torch.bfloat16)
        assert cls.refusal(long) is None
        explanation = _op("SoftmaxFwdOp").explain(INTERFACE["SoftmaxFwdOp"], long)
        assert explanation.verdict("tilelang_smem_row") == "outranked"


@pytest.mark.parametrize("name", sorted(OPS))
def test_smem_row_serves_long_rows_it_holds_when_cluster_row_is_absent(name):
    """Denied or withdrawn, cluster_row leaves the rows smem_row holds to it, not stream_row."""
    op_cls = OPS[name]
    with isolated_registry():
        REGISTRY.withdraw_kernel_types(op_cls)
        for key, cls in tileops_cuda.KERNELS[op_cls].items():
            if key != "tilelang_cluster_row":
                register_kernel_type(op_cls, key, cls)
        assert key_for(name, 65536, torch.bfloat16, 90) == "tilelang_smem_row"
        assert key_for(name, 262144, torch.bfloat16, 90) == "tilelang_stream_row"


def test_cluster_row_workspace_holds_each_blocks_partials_where_shared_memory_does_not():
    """Clusters of up to DSMEM_CLUSTER_MAX blocks, or of 256-thread blocks, reading through the
    lanes exchange partials in shared memory; 16 blocks of 512 threads and TMA-loaded slices
    through a (rows, cluster, 2) workspace."""
    cls = row_kernels.LayerNormClusterRow
    shapes = ((262144, torch.bfloat16), (262144, torch.float32), (65536, torch.float32))
    with simulate_device("cuda:0", arch=90, **DEVICES[90]):
        eight, sixteen, bulk = (cls.plan(make_call("LayerNormFwdOp", *s)) for s in shapes)
    assert (eight.cluster, eight.dsmem) == (8, True)
    assert (sixteen.cluster, sixteen.dsmem) == (16, False)
    assert bulk.bulk and not bulk.dsmem
    with simulate_device("cuda:0", arch=90, **DEVICES[90]):
        softmax = row_kernels.SoftmaxClusterRow.plan(
            make_call("SoftmaxFwdOp", 262144, torch.float32)
        )
    assert (softmax.cluster, softmax.lanes, softmax.dsmem) == (16, 256, True)
    (workspace,) = cls(compiled=None, plan=sixteen).workspace(torch.empty(5, 262144))
    assert workspace.shape == (5, 16, 2) and workspace.dtype == torch.float32
    assert cls(None, eight).workspace(torch.empty(5, 8)) == ()
    unclustered = row_kernels.LayerNormSmemRow(None, dataclasses.replace(eight, cluster=1))
    assert unclustered.workspace(torch.empty(5, 10)) == ()


@pytest.mark.parametrize("name", sorted(OPS))
def test_float64_is_refused_with_a_reason(name):
    call = make_call(name, 4096, torch.float64)
    with simulate_device("cuda:0", arch=90, **DEVICES[90]):
        for cls in tileops_cuda.KERNELS[OPS[name]].values():
            assert "float64" in cls.refusal(call)


def test_build_identity_holds_what_changes_the_code():
    with simulate_device("cuda:0", arch=90, **DEVICES[90]):
        cls = row_kernels.LayerNormBlockRow
        base = make_call("LayerNormFwdOp", 4096, torch.bfloat16)
        identity = cls.entry_for(base)[0]
        assert identity[:3] == (90, "bfloat16", 4096)
        for change in ({"n": 4097}, {"eps": 1e-6}, {"has_bias": False}, {"dtype": torch.float16}):
            fields = {"n": 4096, "dtype": torch.bfloat16, **change}
            other = make_call("LayerNormFwdOp", fields.pop("n"), fields.pop("dtype"))
            other = type(other)(**{**other.__dict__, **fields})
            assert cls.entry_for(other)[0] != identity
        # The row count is not part of the call: one entry serves every row count.
        assert cls.entry_for(make_call("LayerNormFwdOp", 4096, torch.bfloat16))[0] == identity


def test_entry_for_does_not_compile():
    with simulate_device("cuda:0", arch=80, **DEVICES[80]):
        row_kernels.SoftmaxStreamRow.entry_for(make_call("SoftmaxFwdOp", 99999, torch.float16))
    if "tilelang" not in sys.modules:  # other tests of the session may have compiled already
        assert "tilelang" not in sys.modules
