"""BatchNorm and GEMM kernels against the torch reference kernels on a real GPU (skipped
without CUDA): each kernel on calls of its region, then the dispatched ops on a shape grid
that includes ResNet-50's BatchNorm layers at batch 32 and 256 and decode-sized GEMMs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cuda_grid import GEMM_LAYOUTS, bn_call, gemm_call

from tileops.ops import BatchNormFwdOp, GemmOp
from tileops.ops.norm.batch_norm import BatchNormInferReference, BatchNormTrainReference
from tileops_cuda.batch_norm import kernels as batch_norm
from tileops_cuda.gemm import kernels as gemm

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_kernels_only")]

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
# ResNet-50's BatchNorm layers (channels, height * width) in torchvision's layout.
RESNET50 = [(64, 12544), (64, 3136), (256, 3136), (128, 3136), (128, 784), (512, 784),
            (256, 784), (256, 196), (1024, 196), (512, 196), (512, 49), (2048, 49)]  # fmt: skip
BN_SHAPES = [(b, c, s) for b in (32, 256) for c, s in RESNET50] + [
    (4, 128, 1024 * 1024),
    (64, 4096, 1),  # BatchNorm1d after a linear layer
    (3, 5, 7),
    (2, 3, 16385),  # odd spatial: vectors of one element
]
# Per kernel: calls inside its region on an H200 (132 SMs).
BN_REGIONS = {
    batch_norm.BatchNormThreadChannel: [(16, 1000, 2), (3, 70, 1), (1, 5, 32)],
    # registers (up to 8192 values) and shared memory (256 x 49, 5 x 1999)
    batch_norm.BatchNormBlockChannel: [(32, 64, 196), (5, 7, 9), (256, 2048, 49), (5, 3, 1999)],
    batch_norm.BatchNormSmemChannel: [(32, 256, 784), (256, 1024, 196), (3, 300, 6001)],
    batch_norm.BatchNormClusterChannel: [(32, 64, 3136), (2, 3, 16385), (256, 128, 784)],
    # 1024 blocks over the 264 an H200 holds at once: channels wait on blocks still to start;
    # (2, 3, 200001) is the group's in float32 only, (2, 3, 300001) in 16-bit dtypes only.
    batch_norm.BatchNormGroupChannel: [
        (256, 64, 3136),
        (2, 3, 200001),
        (2, 3, 300001),
        (1, 2, 917504),
    ],
    batch_norm.BatchNormSplitChannel: [(32, 64, 3136), (2, 3, 16385), (4, 128, 1 << 20)],
    batch_norm.BatchNormTiled: [(256, 1024, 196), (3, 300, 6001), (32, 2048, 49)],
}


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


def bn_inputs(shape, dtype, pdtype=None, mean=0.5, affine=True, stats=True):
    """x with a non-zero mean (large means check the variance is not E[x^2] - E[x]^2)."""
    b, c, s = shape
    pdtype = pdtype or dtype
    x = (torch.randn(shape, device="cuda") * 2 + mean).to(dtype)
    w, bias = (torch.randn(c, device="cuda").to(pdtype) if affine else None for _ in range(2))
    rm = torch.randn(c, device="cuda").to(pdtype) if stats else None
    rv = (torch.rand(c, device="cuda") + 0.5).to(pdtype) if stats else None
    return x, w, bias, rm, rv


def _clone(args):
    return [None if t is None else t.clone() for t in args]


def _check_train(kernel, args, dtype, tolerance=None) -> None:
    ours, theirs = _clone(args), _clone(args)
    got, *kept = kernel(*ours)  # y, and the batch mean and invstd kept for the backward
    want = BatchNormTrainReference(1e-5, 0.1, False)(*theirs)
    assert got.shape == args[0].shape and got.dtype == args[0].dtype and got.is_contiguous()
    assert _rel_err(got, want) < (tolerance or TOLERANCE[dtype])
    x = args[0].double()
    var, mean = torch.var_mean(x, (0, 2), correction=0)
    for name, k, w in zip(("mean", "invstd"), kept, (mean, torch.rsqrt(var + 1e-5)), strict=True):
        assert k.dtype == torch.float32 and k.shape == (x.shape[1],), name
        assert (k.double() - w).abs().max() <= (tolerance or 1e-5) * w.abs().max() + 1e-6, name
    for a, b in zip(ours[3:], theirs[3:], strict=True):
        if a is not None:
            assert _rel_err(a, b) < TOLERANCE[a.dtype]


@pytest.mark.parametrize(
    "cls,shape",
    [(cls, shape) for cls, shapes in BN_REGIONS.items() for shape in shapes],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_training_kernel_matches_reference(cls, shape, dtype):
    call = bn_call(*shape, dtype)
    if cls.refusal(call) is not None:
        pytest.skip(f"not this kernel's region on this device: {cls.refusal(call)}")
    _check_train(cls.entry_for(call)[1](), bn_inputs(shape, dtype), dtype)


@pytest.mark.parametrize("cls", list(BN_REGIONS), ids=lambda c: c.__name__)
@pytest.mark.parametrize("affine,stats", [(False, False), (True, False), (False, True)])
def test_training_kernel_optional_tensors(cls, affine, stats):
    shape = BN_REGIONS[cls][0]
    call = bn_call(*shape, torch.float32, has_weight=affine, has_bias=affine,
                   has_running_stats=stats)  # fmt: skip
    if cls.refusal(call) is not None:
        pytest.skip(cls.refusal(call))
    args = bn_inputs(shape, torch.float32, affine=affine, stats=stats)
    _check_train(cls.entry_for(call)[1](), args, torch.float32)


@pytest.mark.parametrize("cls", list(BN_REGIONS), ids=lambda c: c.__name__)
def test_training_variance_survives_a_large_mean(cls):
    """mean 1000, std 2: E[x^2] - E[x]^2 would lose the variance in float32 (errors near 1e-2);
    Welford keeps it. x - mean is only as exact as float32 at 1000 (6e-5 apart), so the error
    bound grows by mean / std = 500 over the plain float32 one: 1e-4 (measured: 2.3e-5)."""
    shape = BN_REGIONS[cls][0]
    call = bn_call(*shape, torch.float32)
    if cls.refusal(call) is not None:
        pytest.skip(cls.refusal(call))
    args = bn_inputs(shape, torch.float32, mean=1000.0)
    _check_train(cls.entry_for(call)[1](), args, torch.float32, tolerance=1e-4)


@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("training", [True, False])
def test_dispatched_batch_norm_matches_torch(shape, dtype, training):
    args = bn_inputs(shape, dtype)
    op = BatchNormFwdOp(shape[1], training=training)
    ours, theirs = _clone(args), _clone(args)
    got = op(*ours)
    x, w, b, rm, rv = theirs
    rm, rv = rm.float().clone(), rv.float().clone()  # torch updates these float32 copies
    want = F.batch_norm(x.float(), rm, rv, w.float(), b.float(), training)
    assert _rel_err(got, want) < TOLERANCE[dtype]
    if training:
        assert _rel_err(ours[3], rm) < TOLERANCE[dtype]
        assert _rel_err(ours[4], rv) < TOLERANCE[dtype]
    interface = "batch_norm_fwd_train" if training else "batch_norm_fwd_infer"
    assert op.key_for(interface, bn_call(*shape, dtype)).startswith("tilelang_bn_")


@pytest.mark.parametrize("shape", [(32, 64, 3136), (256, 2048, 49), (64, 4096, 1)], ids=str)
@pytest.mark.parametrize("training", [True, False])
def test_mixed_precision_batch_norm_matches_torch(shape, training):
    """bfloat16 x, float32 weight, bias and running stats (autocast's layout)."""
    args = bn_inputs(shape, torch.bfloat16, torch.float32)
    op = BatchNormFwdOp(shape[1], training=training)
    ours, theirs = _clone(args), _clone(args)
    got = op(*ours)
    want = F.batch_norm(theirs[0], theirs[3], theirs[4], theirs[1], theirs[2], training)
    assert got.dtype == torch.bfloat16 and ours[3].dtype == torch.float32
    assert _rel_err(got, want) < TOLERANCE[torch.bfloat16]
    if training:
        assert _rel_err(ours[4], theirs[4]) < 1e-5


@pytest.mark.parametrize("shape", [(32, 256, 3136), (5, 7, 9), (64, 4096, 1)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_inference_kernel_matches_reference(shape, dtype):
    call = bn_call(*shape, dtype)
    args = bn_inputs(shape, dtype)
    got = batch_norm.BatchNormInfer.entry_for(call)[1]()(*args)
    assert _rel_err(got, BatchNormInferReference(1e-5, False)(*args)) < TOLERANCE[dtype]


# -- GEMM ------------------------------------------------------------------------------------

GEMM_SHAPES = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (65, 4096, 4096),
    (1000, 1001, 999),  # misaligned n and k: padded for the Hopper kernel
    (4096, 4095, 4096),
    (7, 13, 5),
    (1, 4096, 4096),  # decode: skinny
    (16, 4096, 11008),
    (33, 11008, 4096),
    (64, 14336, 4096),
    (64, 4095, 4097),
    (48, 4096, 4096),  # the Hopper kernel's decode tile: rows past m out of TMA's bounds
    (57, 8192, 8192),
    (50, 24, 8),  # one k tile, columns past n
]
GEMM_KERNELS = {
    gemm.GemmGeneral: GEMM_SHAPES,
    gemm.GemmHopper: GEMM_SHAPES,
    gemm.GemmSkinny: [s for s in GEMM_SHAPES if s[0] <= 64],
}


def runs_here(cls) -> bool:
    major, minor = torch.cuda.get_device_capability()
    return 10 * major + minor in cls.supported_archs


def _gemm_inputs(m, n, k, dtype):
    return torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda",
                                                                      dtype=dtype)  # fmt: skip


@pytest.mark.parametrize(
    "cls,shape",
    [(cls, s) for cls, shapes in GEMM_KERNELS.items() for s in shapes],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemm_kernel_matches_reference(cls, shape, dtype):
    call = gemm_call(*shape, dtype)
    if cls.refusal(call) is not None or not runs_here(cls):
        pytest.skip("not this kernel's region or arch on this device")
    a, b = _gemm_inputs(*shape, dtype)
    got = cls.entry_for(call)[1]()(a, b, None)
    want = a.double() @ b.double()
    assert got.shape == want.shape and got.dtype == dtype and got.is_contiguous()
    assert _rel_err(got, want) < TOLERANCE[dtype]


# Every layout on each kernel's calls: aligned, misaligned (the Hopper kernel pads m, n and k as
# they are stored), tiny, decode (split k with its fixup and its reduce kernel), the Hopper
# decode tile and a misaligned m that TMA cannot read transposed. A bias on half of them.
LAYOUT_SHAPES = [(4096, 4096, 4096), (1000, 1001, 999), (4100, 4095, 4100), (7, 13, 5),
                 (1, 4096, 4096), (16, 4096, 4096), (48, 4096, 4096), (57, 8192, 8192)]  # fmt: skip
LAYOUT_VARIANTS = [("NT", True), ("NT", False), ("TN", False), ("TT", True), ("NN", True)]


def stored(t: torch.Tensor, trans: bool) -> torch.Tensor:
    return t.t().contiguous() if trans else t


@pytest.mark.parametrize("layout,bias", LAYOUT_VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize(
    "cls,shape",
    [(cls, s) for cls in GEMM_KERNELS for s in LAYOUT_SHAPES],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_gemm_kernel_reads_every_layout(cls, shape, layout, bias):
    """Against the float64 product (plus bias) of the same values, read as stored."""
    call = gemm_call(*shape, torch.bfloat16, layout, bias)
    if cls.refusal(call) is not None or not runs_here(cls):
        pytest.skip("not this kernel's region or arch on this device")
    trans_a, trans_b = GEMM_LAYOUTS[layout]
    a, b = _gemm_inputs(*shape, torch.bfloat16)
    given = torch.randn(shape[1], device="cuda", dtype=torch.bfloat16) if bias else None
    got = cls.entry_for(call)[1]()(stored(a, trans_a), stored(b, trans_b), given)
    want = a.double() @ b.double() + (0 if given is None else given.double())
    assert got.shape == want.shape and got.is_contiguous()
    assert _rel_err(got, want) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("layout", ["NN", "NT"])
@pytest.mark.parametrize(
    "cls,m",
    [
        (gemm.GemmGeneral, 100),
        (gemm.GemmHopper, 128),
        (gemm.GemmHopper, 48),
        (gemm.GemmSkinny, 1),
        (gemm.GemmSkinny, 16),
    ],  # fmt: skip
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_gemm_kernel_adds_the_bias_before_the_one_rounding(cls, m, layout):
    """257 ones (then zeros) along k sum to 257, which bfloat16 rounds to 256; plus a bias of
    1 it is exactly 258, as F.linear gives: the bias joins the float32 sum (unsplit, in the
    skinny fixup at m = 1 and in its reduce kernel at m = 16), not the rounded product."""
    call = gemm_call(m, 4096, 4096, torch.bfloat16, layout, has_bias=True)
    if cls.refusal(call) is not None or not runs_here(cls):
        pytest.skip("not this kernel's region or arch on this device")
    a = torch.zeros(m, 4096, device="cuda", dtype=torch.bfloat16)
    a[:, :257] = 1
    b = torch.ones(4096, 4096, device="cuda", dtype=torch.bfloat16)
    bias = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    got = cls.entry_for(call)[1]()(a, b, bias)  # b is square: stored either way
    assert got.eq(258).all()
    assert F.linear(a, b, bias).eq(258).all()


@pytest.mark.parametrize("shape", GEMM_SHAPES + [(128, 64, 0), (3, 5, 0)], ids=str)
def test_dispatched_gemm_matches_torch(shape):
    a, b = _gemm_inputs(*shape, torch.bfloat16)
    got = GemmOp()(a, b)
    want = a.float() @ b.float()
    if shape[2] == 0:
        assert not got.any()
    else:
        assert _rel_err(got, want) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize(
    "shape", [(1, 4096, 4096), (48, 4096, 4096), (300, 1001, 999), (2048, 4096, 4096)], ids=str
)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_f_linear(shape, bias):
    """tnn.Linear, as dispatched: one NT GEMM over its (out, in) weight, the bias its epilogue."""
    import tileops.nn as tnn

    m, n, k = shape
    linear = tnn.Linear(k, n, bias=bias, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    got = linear(x)
    bias_ = None if linear.bias is None else linear.bias.double()
    want = F.linear(x.double(), linear.weight.double(), bias_)
    assert got.dtype == torch.bfloat16 and _rel_err(got, want) < TOLERANCE[torch.bfloat16]
    call = gemm_call(m, n, k, torch.bfloat16, "NT", bias)
    assert GemmOp(trans_b=True).key_for("gemm", call).startswith("tilelang_gemm")


@pytest.mark.parametrize("cls", list(GEMM_KERNELS), ids=lambda c: c.__name__)
@pytest.mark.parametrize("m", [16, 4096])
def test_gemm_takes_an_unaligned_view(cls, m):
    """A view starting off a 16-byte boundary is copied before vector or TMA reads."""
    a, b = _gemm_inputs(m + 1, 4096, 4096, torch.bfloat16)
    a = a.view(-1)[3 : 3 + m * 4096].view(m, 4096)
    call = gemm_call(m, 4096, 4096, torch.bfloat16)
    if cls.refusal(call) is not None or not runs_here(cls):
        pytest.skip("not this kernel's region or arch on this device")
    got = cls.entry_for(call)[1]()(a, b, None)
    assert _rel_err(got, a.float() @ b.float()) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_takes_an_unaligned_view(training):
    """x starting 2 bytes past an aligned address is copied before the vector reads."""
    shape = (32, 64, 3136)
    buffer = torch.randn(32 * 64 * 3136 + 1, device="cuda", dtype=torch.bfloat16)
    x = buffer[1:].view(shape)
    _, w, bias, rm, rv = bn_inputs(shape, torch.bfloat16)
    want = F.batch_norm(x.float(), rm.float(), rv.float(), w.float(), bias.float(), training)
    got = BatchNormFwdOp(shape[1], training=training)(x, w, bias, rm, rv)
    assert _rel_err(got, want) < TOLERANCE[torch.bfloat16]


def _fixup_kernel(call) -> gemm.GemmSkinny:
    """GemmSkinny with SkinnyPlan.fixup set (the tile sweep's option): one launch, the last
    block of each column tile sums the partials."""
    from dataclasses import replace

    from tileops_cuda._common.compile import build_program

    plan = replace(gemm.skinny_plan(call), fixup=True)
    assert plan.splits > 1
    program = build_program(f"test/fixup/{plan}", lambda: gemm.skinny_program(call, plan),
                            call.arch, pass_configs=gemm.MMA_SYNC_ONLY)  # fmt: skip
    kernel = gemm.GemmSkinny(call, [program])
    kernel.plan_ = plan
    return kernel


@pytest.mark.parametrize("shape", [(1, 4096, 4096), (13, 1001, 999), (64, 8192, 8192)], ids=str)
def test_skinny_gemm_fixup_sums_every_split_and_resets_its_counters(shape):
    call = gemm_call(*shape, torch.bfloat16)
    kernel = _fixup_kernel(call)
    for _ in range(3):  # counters left at zero: the next call counts from scratch
        a, b = _gemm_inputs(*shape, torch.bfloat16)
        assert _rel_err(kernel(a, b, None), a.float() @ b.float()) < TOLERANCE[torch.bfloat16]
    assert all(not counters.any() for _, counters in kernel._scratch.values())


def test_skinny_gemm_fixup_keeps_one_set_of_counters_per_stream():
    """Two streams' calls could interleave their arrivals and partials on shared scratch."""
    shape = (1, 4096, 4096)
    kernel = _fixup_kernel(gemm_call(*shape, torch.bfloat16))
    inputs = [_gemm_inputs(*shape, torch.bfloat16) for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    outputs = []
    for stream, (a, b) in zip(streams, inputs, strict=True):
        with torch.cuda.stream(stream):
            outputs.append([kernel(a, b, None) for _ in range(20)][-1])
    torch.cuda.synchronize()
    assert len(kernel._scratch) == 2
    for got, (a, b) in zip(outputs, inputs, strict=True):
        assert _rel_err(got, a.float() @ b.float()) < TOLERANCE[torch.bfloat16]
