"""On a real GPU (skipped without CUDA): the cuBLAS and cuDNN kernels against float64, the
dispatched ops where they serve (channels_last BatchNorm), and GemmOp's backward, whose
GEMMs run on whichever kernel the table picks, against float64 gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from cuda_grid import GEMM_LAYOUTS, bn_call, gemm_call

import tileops
from tileops import nn as tnn
from tileops.ops import BatchNormFwdOp, GemmOp
from tileops_cuda.batch_norm import vendor as bn_vendor
from tileops_cuda.gemm import vendor as gemm_vendor

pytestmark = pytest.mark.gpu

TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def stored(t: torch.Tensor, trans: bool) -> torch.Tensor:
    return t.t().contiguous() if trans else t


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("layout", list(GEMM_LAYOUTS))
@pytest.mark.parametrize("shape", [(1, 4096, 4096), (1000, 1001, 999), (512, 512, 0)], ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_cublas_matches_float64(shape, layout, dtype, bias):
    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.randn(n, device="cuda", dtype=dtype) if bias else None
    trans_a, trans_b = GEMM_LAYOUTS[layout]
    kernel = gemm_vendor.CublasGemm.entry_for(gemm_call(m, n, k, dtype, layout, bias))[1]()
    got = kernel(stored(a, trans_a), stored(b, trans_b), c)
    want = a.double() @ b.double() + (0 if c is None else c.double())
    assert got.shape == (m, n) and got.dtype == dtype and got.is_contiguous()
    if k == 0 and c is None:
        assert not got.any()
    else:
        tolerance = 1e-3 if dtype == torch.float32 else TOLERANCE[dtype]  # tf32 if allowed
        assert rel_err(got, want) < tolerance


BN_SHAPES = [(32, 64, 56, 56), (256, 2048, 7, 7), (8, 16, 5, 3), (64, 4096, 1, 1)]


def bn_inputs(shape, dtype, pdtype):
    c = shape[1]
    x = (torch.randn(shape, device="cuda") * 2 + 0.5).to(dtype)
    w, b = (torch.randn(c, device="cuda").to(pdtype) for _ in range(2))
    rm, rv = (
        torch.randn(c, device="cuda").to(pdtype),
        (torch.rand(c, device="cuda") + 0.5).to(pdtype),
    )
    return x, w, b, rm, rv


@pytest.mark.parametrize("training", [True, False], ids=["train", "infer"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize(
    "dtype,pdtype",
    [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float32,) * 2],
    ids=["bf16", "bf16-fp32-params", "fp32"],
)
@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
def test_cudnn_batch_norm_matches_float64(shape, dtype, pdtype, channels_last, training):
    """The kernel on the layout the op hands it, against F.batch_norm in float64; the running
    stats updated as torch updates them."""
    x, w, b, rm, rv = bn_inputs(shape, dtype, pdtype)
    batch, channels = shape[:2]
    spatial = shape[2] * shape[3]
    call = bn_call(batch, channels, spatial, dtype, param_dtype=pdtype, channels_last=channels_last)
    cls = bn_vendor.CudnnBatchNormTrain if training else bn_vendor.CudnnBatchNormInfer
    kernel = cls.entry_for(call)[1]()
    if channels_last:
        x3 = (
            x.to(memory_format=torch.channels_last).movedim(1, -1).reshape(batch, spatial, channels)
        )
    else:
        x3 = x.reshape(batch, channels, spatial)
    stats = rm.double(), rv.double()
    want = F.batch_norm(x.double(), *stats, w.double(), b.double(), training, 0.1, 1e-5)
    got = kernel(x3.contiguous(), w, b, rm, rv)
    if isinstance(got, tuple):  # ATen's kernels ran: the batch mean and invstd kept too
        got, *kept = got
        var, mean = torch.var_mean(x.double(), (0, 2, 3), correction=0)
        assert training and rel_err(kept[0], mean) < 1e-5
        assert rel_err(kept[1], torch.rsqrt(var + 1e-5)) < 1e-5
    if channels_last:
        got = got.view(batch, *shape[2:], channels).movedim(-1, 1)
    else:
        got = got.view(shape)
    assert got.dtype == dtype and rel_err(got, want) < TOLERANCE[dtype]
    assert rel_err(rm, stats[0]) < TOLERANCE[pdtype] and rel_err(rv, stats[1]) < TOLERANCE[pdtype]


@pytest.mark.parametrize("training", [True, False], ids=["train", "infer"])
def test_channels_last_batch_norm_dispatches_to_cudnn_and_keeps_its_format(training):
    x, w, b, rm, rv = bn_inputs((32, 64, 56, 56), torch.bfloat16, torch.float32)
    x = x.to(memory_format=torch.channels_last)
    op = BatchNormFwdOp(64, training=training)
    with tileops.record() as record:
        got = op(x, w, b, rm.clone(), rv.clone())
    assert {s.key for s in record.counts} == {"cudnn" if training else "cudnn_infer"}
    assert got.is_contiguous(memory_format=torch.channels_last)
    want = F.batch_norm(x.double(), rm.double(), rv.double(), w.double(), b.double(), training)
    assert rel_err(got, want) < TOLERANCE[torch.bfloat16]


GEMM_LAYOUTS_OF_GRADIENTS = {"NN": ("NT", "TN"), "NT": ("NN", "TN"), "TN": ("NT", "NN"),
                             "TT": ("TT",)}  # fmt: skip


def layouts_of(record) -> set:
    return {(s.interface, s.call.layout) for s in record.counts if s.interface == "gemm"}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layout", list(GEMM_LAYOUTS))
@pytest.mark.parametrize("shape", [(1, 4096, 4096), (16, 4096, 4096), (1000, 1001, 999)], ids=str)
def test_gemm_backward_matches_float64(shape, layout, bias):
    m, n, k = shape
    trans_a, trans_b = GEMM_LAYOUTS[layout]
    a = stored(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), trans_a)
    b = stored(torch.randn(k, n, device="cuda", dtype=torch.bfloat16), trans_b)
    c = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
    leaves = [t.requires_grad_() for t in (a, b, c) if t is not None]
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    with tileops.record() as record:  # the backward's calls count in its forward's block
        out = GemmOp(trans_a, trans_b)(a, b, c)
        got = torch.autograd.grad(out, leaves, dy)
    wide = [t.detach().double().requires_grad_() for t in leaves]
    ref = (wide[0].T if trans_a else wide[0]) @ (wide[1].T if trans_b else wide[1])
    want = torch.autograd.grad(ref + (wide[2] if bias else 0), wide, dy.double())
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.bfloat16 and rel_err(g, w) < TOLERANCE[torch.bfloat16]
    keys = {(s.interface, s.key) for s in record.counts}
    assert ("backward", "reference_backward") in keys  # GemmBackward: GemmOps, no recompute
    assert {layout for (interface, layout) in layouts_of(record)} == {
        layout,
        *GEMM_LAYOUTS_OF_GRADIENTS[layout],
    }


@pytest.mark.parametrize("rows", [(1, 1), (4, 2048)], ids=["decode", "prefill"])
def test_linear_backward_matches_float64(rows):
    """tnn.Linear on (batch, tokens, in): one NT GEMM forward, its NN and TN GEMMs backward."""
    linear = tnn.Linear(4096, 11008, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(*rows, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(*rows, 11008, device="cuda", dtype=torch.bfloat16)
    with tileops.record() as record:  # the backward's calls count in its forward's block
        out = linear(x)
        got = torch.autograd.grad(out, (x, linear.weight, linear.bias), dy)
    wide = [t.detach().double().requires_grad_() for t in (x, linear.weight, linear.bias)]
    want = torch.autograd.grad(F.linear(*wide), wide, dy.double())
    for g, w in zip(got, want, strict=True):
        assert rel_err(g, w) < TOLERANCE[torch.bfloat16]
    layouts = sorted(s.call.layout for s in record.counts if s.interface == "gemm")
    assert layouts == ["NN", "NT", "TN"]  # forward NT, dx NN, dW TN


@pytest.mark.parametrize("autocast", [False, True], ids=["bf16", "autocast"])
def test_channels_last_batch_norm_trains_through_torchs_own_nodes(autocast):
    """cuDNN serves channels_last training: a module's calls run torch.batch_norm under
    torch's autograd (no node of the op's); the steps match torch's module."""
    x = torch.randn(8, 64, 14, 14, device="cuda", dtype=torch.bfloat16) * 2 + 0.5
    x = x.to(memory_format=torch.channels_last)
    ref = torch.nn.BatchNorm2d(64, device="cuda")
    mod = tnn.BatchNorm2d(64, device="cuda")
    if not autocast:
        ref, mod = ref.bfloat16(), mod.bfloat16()
    nodes = []
    for _ in range(3):
        grads = []
        for m in (ref, mod):
            leaf = x.clone().requires_grad_()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                y = m(leaf)
            dy = torch.ones_like(y).mul_(torch.arange(y.numel(), device="cuda").view_as(y) % 7)
            grads.append(torch.autograd.grad(y, (leaf, m.weight, m.bias), dy))
            assert y.is_contiguous(memory_format=torch.channels_last)
        nodes.append(type(y.grad_fn).__name__)
        for got, want in zip(grads[1], grads[0], strict=True):
            assert rel_err(got, want) < TOLERANCE[torch.bfloat16]
    assert "_EagerOpBackward" not in nodes and len(set(nodes)) == 1
    assert rel_err(mod.running_mean, ref.running_mean) < 1e-3
    assert rel_err(mod.running_var, ref.running_var) < 1e-3


def test_linear_trains_through_cublas_nodes():
    linear = tnn.Linear(1024, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    assert type(linear(x).grad_fn).__name__ == "AddmmBackward0"
    dy = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16)
    got = torch.autograd.grad(linear(x), (x, linear.weight, linear.bias), dy)
    wide = [t.detach().double().requires_grad_() for t in (x, linear.weight, linear.bias)]
    want = torch.autograd.grad(F.linear(*wide), wide, dy.double())
    for g, w in zip(got, want, strict=True):
        assert rel_err(g, w) < TOLERANCE[torch.bfloat16]
