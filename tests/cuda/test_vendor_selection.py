"""cuBLAS, cuDNN and ATen's norms as candidates on simulated devices (no GPU needed): the vendor
kernel serves everywhere except the regions where a TileLang kernel measured faster on the H200, the
explanations cite the figure and its result file, and GemmOp's backward GEMMs select by the
same table. The kernels' view logic is checked on CPU tensors against the references."""

from __future__ import annotations

import pytest
import torch
from cuda_grid import INTERFACES, SIMULATED, bn_call, gemm_call, make_call

import tileops_cuda
from tileops.backward import BackwardCall
from tileops.ops import BatchNormFwdOp, GemmOp, LayerNormFwdOp, RMSNormFwdOp, gemm_gradient_calls
from tileops.testing import simulate_device
from tileops_cuda.batch_norm import vendor as bn_vendor
from tileops_cuda.gemm import vendor as gemm_vendor
from tileops_cuda.rows import vendor as row_vendor

H200 = SIMULATED[90]
H100 = {**H200, "calibration": "NVIDIA H100 80GB HBM3"}
BF16 = torch.bfloat16
TRAIN, INFER = "batch_norm_fwd_train", "batch_norm_fwd_infer"


def gemm_explain(call, arch=90, facts=H200):
    with simulate_device("cuda:0", arch=arch, **facts):
        return GemmOp().explain("gemm", call)


def bn_explain(call, training=True, arch=90, facts=H200):
    with simulate_device("cuda:0", arch=arch, **facts):
        op = BatchNormFwdOp(call.channels, training=training)
        return op.explain(TRAIN if training else INFER, call)


# (m, n, k), layout, dtype -> key on a simulated H200
GEMM_KEYS = [
    ((1, 4096, 4096), "NT", BF16, "tilelang_gemm_skinny"),  # Linear at decode
    ((16, 4096, 4096), "NN", BF16, "tilelang_gemm_skinny"),
    ((17, 4096, 4096), "NN", BF16, "cublas"),  # past the measured m
    ((64, 4096, 4096), "NT", BF16, "cublas"),  # Hopper decode tile: 0.93x cuBLAS
    ((1, 11008, 4096), "NN", BF16, "tilelang_gemm_skinny"),
    ((1, 8192, 8192), "NN", BF16, "cublas"),  # 0.98x by kernel time: not faster
    ((1, 4096, 2048), "NN", BF16, "cublas"),  # a weight smaller than any measured
    ((1, 4096, 4096), "TN", BF16, "cublas"),  # layout never measured
    ((1, 4096, 4096), "NT", torch.float16, "cublas"),  # dtype never measured
    ((8192, 4096, 4096), "NT", BF16, "cublas"),  # Linear at prefill: kernel 0.95-0.97x
    ((8192, 4096, 14336), "NT", BF16, "cublas"),  # 0.97-0.98x
    ((4096, 4096, 4096), "NN", BF16, "cublas"),  # 0.92x
    ((4096, 4095, 4096), "NN", BF16, "tilelang_gemm_hopper"),  # padded: 3.5x
    ((4096, 4096, 4100), "NN", BF16, "tilelang_gemm_hopper"),
    ((2048, 4095, 4096), "NN", BF16, "cublas"),  # below 2^36 flops: not padded
    ((1000, 1001, 999), "NN", BF16, "cublas"),  # tilelang_gemm 0.74x
    ((4096, 4095, 4096), "NT", BF16, "cublas"),
    ((64, 64, 64), "NN", torch.float32, "cublas"),
    ((64, 64, 64), "NN", torch.float64, "cublas"),
    ((128, 64, 0), "NN", BF16, "cublas"),  # k == 0
]


@pytest.mark.parametrize("shape,layout,dtype,key", GEMM_KEYS)
def test_gemm_key_per_region_on_the_h200(shape, layout, dtype, key):
    assert gemm_explain(gemm_call(*shape, dtype, layout)).chosen == key


@pytest.mark.parametrize("arch,facts", [(90, H100), (80, SIMULATED[80]), (86, SIMULATED[86])])
def test_cublas_serves_every_gemm_on_boards_never_measured(arch, facts):
    for shape, layout, dtype, _ in GEMM_KEYS:
        assert gemm_explain(gemm_call(*shape, dtype, layout), arch, facts).chosen == "cublas"


def test_cublas_steps_aside_citing_the_figure_and_its_source():
    explanation = gemm_explain(gemm_call(1, 4096, 4096, BF16, "NT"))
    assert explanation.verdicts()["cublas"] == (
        "refused: tilelang_gemm_skinny measured faster than cuBLAS here on NVIDIA H200: the "
        "split-K kernel alone 1.08x F.linear at 1x4096x4096 NT; by kernel time 1.09x "
        "torch.matmul at 1x4096x4096 and 16x4096x4096, 1.06x at 1x11008x4096 "
        "(benchmarks/results/gemm/linear_nvidia_h200.md, commit 752246a; "
        "benchmarks/results/gemm/gemm_decode_nvidia_h200.md, commit 5694f51); cuBLAS steps aside"
    )
    padded = gemm_explain(gemm_call(4096, 4095, 4096, BF16)).verdicts()["cublas"]
    assert "tilelang_gemm_hopper measured faster than cuBLAS" in padded
    assert "3.5x torch.matmul at 4096x4095x4096" in padded
    assert "batchnorm_gemm_nvidia_h200.md, commit e58885f" in padded
    outside = gemm_explain(gemm_call(8192, 4096, 4096, BF16, "NT"))
    assert outside.verdicts()["cublas"].startswith("chosen: ")
    assert outside.verdicts()["tilelang_gemm_hopper"] == "outranked: cublas preferred over it"


def test_a_region_defers_only_to_a_key_that_serves_the_call():
    """A region covers a call only where it was measured (no flops at k == 0), and cuBLAS
    steps aside only where the region's key serves the call (the Hopper kernel: sm_90)."""
    region = gemm_vendor.GEMM_FASTER[1]
    call = gemm_call(1 << 20, 4095, 0, BF16)
    with simulate_device("cuda:0", arch=90, **H200):
        assert not region.covers(call)  # 0 flops
        padded = gemm_call(4096, 4095, 4096, BF16)
        assert region.covers(padded)
        assert gemm_vendor.CublasGemm.refusal(padded) is not None
    with simulate_device("cuda:0", arch=80, **{**SIMULATED[80], "calibration": "NVIDIA H200"}):
        assert gemm_vendor.CublasGemm.refusal(padded) is None  # the Hopper key cannot run here


def test_cublas_refuses_what_torch_cannot_multiply():
    with simulate_device("cuda:0", arch=90, **H200):
        assert gemm_vendor.CublasGemm.refusal(gemm_call(4, 4, 4, torch.int32)) == (
            "torch.int32 is not served (torch's CUDA matmul takes float types)"
        )


def test_gemm_vendor_declarations():
    tilelang = set(tileops_cuda.KERNELS[GemmOp])
    cublas = tileops_cuda.VENDOR_KERNELS[GemmOp]["cublas"]
    assert cublas.preferred_over == tilelang == gemm_vendor.TILELANG_KEYS
    assert cublas.supported_archs is None and not cublas.general
    assert all(set(r.keys) <= tilelang for r in gemm_vendor.GEMM_FASTER)


# -- GemmOp's backward on a simulated H200 ---------------------------------------------------

# Llama's projections as tnn.Linear calls them (forward NT: tokens x out x in), and which key
# serves the forward, dX (NN: tokens x in x out) and dW (TN: out x in x tokens).
LINEAR_BACKWARD = [
    ((8192, 4096, 4096), ("cublas", "cublas", "cublas")),
    ((8192, 4096, 14336), ("cublas", "cublas", "cublas")),
    ((8192, 14336, 4096), ("cublas", "cublas", "cublas")),
    ((1, 4096, 4096), ("tilelang_gemm_skinny", "tilelang_gemm_skinny", "cublas")),
    ((16, 11008, 4096), ("tilelang_gemm_skinny", "tilelang_gemm_skinny", "cublas")),  # in the box
]


@pytest.mark.parametrize("shape,keys", LINEAR_BACKWARD)
def test_linear_backward_gemms_select_by_the_table(shape, keys):
    forward = gemm_call(*shape, BF16, "NT", True)
    dx, dw = gemm_gradient_calls(forward)
    assert (dx.layout, dx.m, dx.n, dx.k) == ("NN", shape[0], shape[2], shape[1])
    assert (dw.layout, dw.m, dw.n, dw.k) == ("TN", shape[1], shape[2], shape[0])
    chosen = tuple(gemm_explain(call).chosen for call in (forward, dx, dw))
    assert chosen == keys


def test_the_gemm_backward_serves_cuda_calls():
    call = BackwardCall(device=torch.device("cuda:0"), op=GemmOp.op_name,
                        params=(("trans_a", False), ("trans_b", True)), dtypes=(BF16,) * 3,
                        needs=(True, True, True))  # fmt: skip
    with simulate_device("cuda:0", arch=90, **H200):
        for create_graph in (False, True):
            served = type(call)(**{**call.__dict__, "create_graph": create_graph})
            explanation = GemmOp(trans_b=True).explain("backward", served)
            assert explanation.chosen == "reference_backward"
            assert GemmOp.kernel_types["reference_backward"].__name__ == "GemmBackward"


# -- BatchNorm -------------------------------------------------------------------------------

BN_KEYS = [
    ((32, 64, 3136), {}, True, "tilelang_bn_cluster_channel"),  # ResNet-50 layer1
    ((256, 2048, 49), {}, True, "tilelang_bn_block_channel"),
    ((4, 128, 1 << 20), {}, True, "tilelang_bn_split_channel"),
    ((256, 512, 196), {"param_dtype": torch.float32}, True, "tilelang_bn_cluster_channel"),
    ((32, 64, 3136), {"channels_last": True}, True, "cudnn"),
    ((32, 64, 3136), {"dtype": torch.float16}, True, "cudnn"),
    ((32, 64, 3136), {"dtype": torch.float32}, True, "cudnn"),
    ((8, 16, 12), {}, True, "cudnn"),  # far below the measured layers
    ((64, 4096, 1), {}, True, "cudnn"),  # BatchNorm1d of 4096 features: never measured
    ((8, 4096, 1 << 20), {}, True, "cudnn"),  # 8M values a channel: past the measured 4M
    ((256, 512, 196), {}, False, "tilelang_bn_infer"),
    ((32, 256, 196), {}, False, "tilelang_bn_infer"),
    ((32, 256, 196), {"channels_last": True}, False, "cudnn_infer"),
    ((32, 256, 196), {"dtype": torch.float32}, False, "cudnn_infer"),
]


@pytest.mark.parametrize("shape,flags,training,key", BN_KEYS)
def test_batch_norm_key_per_region_on_the_h200(shape, flags, training, key):
    flags = dict(flags)
    dtype = flags.pop("dtype", BF16)
    call = bn_call(*shape, dtype, **flags)
    assert bn_explain(call, training).chosen == key


@pytest.mark.parametrize("training", [True, False], ids=["train", "infer"])
def test_cudnn_serves_batch_norm_on_boards_never_measured(training):
    for shape, flags, _, _ in BN_KEYS:
        call = bn_call(
            *shape, flags.get("dtype", BF16), channels_last=bool(flags.get("channels_last"))
        )
        chosen = bn_explain(call, training, 80, SIMULATED[80]).chosen
        assert chosen == ("cudnn" if training else "cudnn_infer")


def test_cudnn_steps_aside_citing_the_figure_and_its_source():
    train = bn_explain(bn_call(256, 2048, 49, BF16)).verdicts()["cudnn"]
    assert train.startswith("refused: tilelang_bn_block_channel, tilelang_bn_tiled measured "
                            "faster than cuDNN here on NVIDIA H200: 2.4-8.8x")  # fmt: skip
    assert "batchnorm_gemm_nvidia_h200.md, commit 9bf5cd2); cuDNN steps aside" in train
    infer = bn_explain(bn_call(32, 256, 196, BF16), training=False).verdicts()["cudnn_infer"]
    assert "tilelang_bn_infer measured faster than cuDNN here" in infer
    assert "1.75x at 32x256x14x14" in infer and "commit 4f1e7e2" in infer
    last = bn_explain(bn_call(32, 64, 3136, BF16, channels_last=True))
    assert last.verdicts()["cudnn"].startswith("chosen: ")
    assert "x is channels_last" in last.verdicts()["tilelang_bn_tiled"]


def test_batch_norm_vendor_declarations():
    keys = tileops_cuda.KERNELS[BatchNormFwdOp]
    train = {k for k, cls in keys.items() if issubclass(cls, BatchNormFwdOp.interfaces[TRAIN])}
    infer = {k for k, cls in keys.items() if issubclass(cls, BatchNormFwdOp.interfaces[INFER])}
    vendor = dict(tileops_cuda.VENDOR_KERNELS[BatchNormFwdOp])
    assert issubclass(vendor.pop("aten_bn_backward"), BatchNormFwdOp.interfaces["backward"])
    assert vendor["cudnn"].preferred_over == train == set(bn_vendor.TRAIN_KEYS)
    assert vendor["cudnn_infer"].preferred_over == infer == set(bn_vendor.INFER_KEYS)
    assert all(cls.channels_last and cls.supported_archs is None for cls in vendor.values())


# -- the vendor kernels' view logic, on CPU tensors ------------------------------------------


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layout", [(False, False), (False, True), (True, False), (True, True)])
def test_cublas_reads_every_layout_as_the_reference(layout, bias):
    a = torch.randn((6, 5) if layout[0] else (5, 6), dtype=torch.float64)
    b = torch.randn((7, 6) if layout[1] else (6, 7), dtype=torch.float64)
    c = torch.randn(7, dtype=torch.float64) if bias else None
    got = gemm_vendor.CublasGemm(*layout)(a, b, c)
    assert got.is_contiguous() and got.shape == (5, 7)
    torch.testing.assert_close(
        got, GemmOp.kernel_types["reference"](*layout)(a, b, c), rtol=0, atol=0
    )


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("training", [True, False])
def test_cudnn_kernels_read_both_layouts_as_the_reference(training, channels_last):
    x = torch.randn(4, 6, 5, dtype=torch.float64) * 2 + 3
    if channels_last:
        x = x.transpose(1, 2).contiguous()  # (batch, spatial, channels), as the op passes it
    params = [torch.randn(6, dtype=torch.float64) for _ in range(2)]
    stats = [torch.randn(6, dtype=torch.float64), torch.rand(6, dtype=torch.float64) + 0.5]
    theirs = [t.clone() for t in stats]
    if training:
        ours = bn_vendor.CudnnBatchNormTrain(1e-5, 0.1, channels_last)
        reference = BatchNormFwdOp.kernel_types["reference"](1e-5, 0.1, channels_last)
    else:
        ours = bn_vendor.CudnnBatchNormInfer(1e-5, 0.0, channels_last)
        reference = BatchNormFwdOp.kernel_types["reference_infer"](1e-5, channels_last)
    got = ours(x, *params, *stats)
    assert got.is_contiguous() and got.shape == x.shape
    torch.testing.assert_close(got, reference(x, *params, *theirs), rtol=1e-12, atol=1e-12)
    for mine, want in zip(stats, theirs, strict=True):  # updated in place when training
        torch.testing.assert_close(mine, want, rtol=1e-12, atol=1e-12)


# -- ATen's LayerNorm / RMSNorm: autograd calls only ----------------------------------------


def row_explain(op_name, n, dtype=BF16, arch=90, facts=H200, **flags):
    op = {"LayerNormFwdOp": LayerNormFwdOp, "RMSNormFwdOp": RMSNormFwdOp}[op_name](n)
    with simulate_device("cuda:0", arch=arch, **facts):
        return op.explain(INTERFACES[op_name], make_call(op_name, n, dtype, **flags))


# op, n, rows of a grad call (None: a plain call), dtype -> key on a simulated H200
ROW_KEYS = [
    ("LayerNormFwdOp", 1024, None, BF16, "tilelang_warp_rows"),  # plain calls: TileLang's
    ("LayerNormFwdOp", 1024, 4096, BF16, "aten_layer_norm"),  # the encoder's: 0.43-0.50x
    ("LayerNormFwdOp", 8192, 8192, BF16, "aten_layer_norm"),  # 0.90x
    ("LayerNormFwdOp", 65536, 1 << 20, BF16, "aten_layer_norm"),  # never measured
    ("RMSNormFwdOp", 4096, 2048, BF16, "aten_rms_norm"),  # Llama training's: 0.48x
    ("RMSNormFwdOp", 16384, 8192, BF16, "tilelang_block_row"),  # 1.29x
    ("RMSNormFwdOp", 16384, 1 << 16, BF16, "tilelang_block_row"),
    ("RMSNormFwdOp", 16384, 4096, BF16, "aten_rms_norm"),  # below the measured rows
    ("RMSNormFwdOp", 8192, 8192, BF16, "aten_rms_norm"),  # 0.90x
    ("RMSNormFwdOp", 16384, 8192, torch.float32, "aten_rms_norm"),  # dtype never measured
    ("RMSNormFwdOp", 16384, None, torch.float32, "tilelang_block_row"),
]


@pytest.mark.parametrize("op_name,n,rows,dtype,key", ROW_KEYS)
def test_row_norm_key_per_region_on_the_h200(op_name, n, rows, dtype, key):
    flags = {} if rows is None else {"grad": True, "rows": rows}
    assert row_explain(op_name, n, dtype, **flags).chosen == key


@pytest.mark.parametrize("arch,facts", [(90, H100), (80, SIMULATED[80])])
def test_aten_serves_every_autograd_norm_call_on_boards_never_measured(arch, facts):
    for op_name, n, rows, dtype, _key in ROW_KEYS:
        flags = {} if rows is None else {"grad": True, "rows": rows}
        chosen = row_explain(op_name, n, dtype, arch, facts, **flags).chosen
        assert chosen.startswith("aten") == (rows is not None), (op_name, n, rows, chosen)


def test_aten_norms_state_why_they_refuse():
    verdicts = row_explain("RMSNormFwdOp", 16384, grad=True, rows=8192).verdicts()
    assert verdicts["aten_rms_norm"] == (
        "refused: tilelang_block_row measured faster than torch's rms_norm here on NVIDIA H200: "
        "the op's node (TileLang forward and backward) 1.29x torch's rms_norm as called, "
        "forward + backward, at 8192 x 16384 (716 against 923 us) "
        "(benchmarks/results/norms/norm_calls_node_nvidia_h200.md, commit 1f442f4); "
        "torch's rms_norm steps aside"
    )
    plain = row_explain("LayerNormFwdOp", 1024).verdicts()["aten_layer_norm"]
    assert plain.startswith("refused: a plain call is left to the tileops kernels")
    mixed = row_explain("LayerNormFwdOp", 1024, grad=True, rows=64, param_dtype=torch.float32)
    assert mixed.verdicts()["aten_layer_norm"] == (
        "refused: torch.float32 params beside torch.bfloat16 x are not served (mixed)"
    )
    assert mixed.chosen == "tilelang_warp_rows"


@pytest.mark.parametrize("affine", [False, True])
def test_aten_norms_compute_torch_functions(affine):
    x, w, b = torch.randn(6, 40), torch.randn(40), torch.randn(40)
    w, b = (w, b) if affine else (None, None)
    got = row_vendor.AtenLayerNorm(1e-5).forward(x, w, b)
    torch.testing.assert_close(got, torch.nn.functional.layer_norm(x, (40,), w, b, 1e-5))
    got = row_vendor.AtenRMSNorm(1e-6).forward(x, w)
    torch.testing.assert_close(got, torch.nn.functional.rms_norm(x, (40,), w, 1e-6))
