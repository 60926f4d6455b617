"""tileops.nn modules under torch.autocast give what their torch.nn counterparts give: output
dtype and values, gradients of the input and of every parameter, running stats."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from op_helpers import assert_trains_as_eager, randn
from torch import nn

import tileops
import tileops.nn as tnn

# name: (torch module factory, input shape)
MODULES = {
    "Linear": (lambda: nn.Linear(8, 6), (4, 3, 8)),
    "Linear_no_bias": (lambda: nn.Linear(8, 6, bias=False), (4, 8)),
    "LayerNorm": (lambda: nn.LayerNorm(8), (4, 3, 8)),
    "RMSNorm": (lambda: nn.RMSNorm(8), (4, 3, 8)),
    "Softmax": (lambda: nn.Softmax(dim=-1), (4, 3, 8)),
    "BatchNorm1d": (lambda: nn.BatchNorm1d(8), (4, 8)),
    "BatchNorm2d": (lambda: nn.BatchNorm2d(3), (2, 3, 4, 4)),
    "BatchNorm3d": (lambda: nn.BatchNorm3d(3), (2, 3, 2, 2, 2)),
}
TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}


def _pair(name: str, training: bool) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    theirs = MODULES[name][0]().train(training)
    for p in theirs.parameters():  # not the default ones and zeros: a mix-up would show
        p.data.copy_(torch.randn_like(p) * 0.5 + 1.0)
    ours = copy.deepcopy(theirs)
    assert len(tnn.kernelize(ours).swapped) == 1
    return theirs, ours


def _run(module: nn.Module, x: torch.Tensor, dtype: torch.dtype):
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=dtype), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own mixed rms_norm path warns
        y = module(x)
    (y.float() * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
    grads = {n: p.grad for n, p in module.named_parameters()}
    return y, x.grad, grads, dict(module.named_buffers())


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=["x_f32", "x_bf16"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(MODULES))
def test_under_cpu_autocast_each_module_behaves_as_torchs(name, training, x_dtype, autocast_dtype):
    theirs, ours = _pair(name, training)
    x = randn(*MODULES[name][1], dtype=x_dtype)
    want, got = _run(theirs, x, autocast_dtype), _run(ours, x, autocast_dtype)
    y, x_grad, grads, buffers = got
    assert y.dtype == want[0].dtype and x_grad.dtype == want[1].dtype
    torch.testing.assert_close(y, want[0], **TOLERANCE)
    torch.testing.assert_close(x_grad, want[1], **TOLERANCE)
    assert {n: g.dtype for n, g in grads.items()} == {n: g.dtype for n, g in want[2].items()}
    torch.testing.assert_close(grads, want[2], **TOLERANCE)
    torch.testing.assert_close(buffers, want[3], **TOLERANCE)


def _small_resnet() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 16),
        nn.LayerNorm(16),
        nn.Linear(16, 5),
    )


def test_a_small_convnet_trains_under_autocast_as_torchs():
    """The failure users met: under autocast tnn.Linear returned float32 and the next GEMM
    refused its bfloat16 weight cast; BatchNorm took bfloat16 x beside float32 stats."""
    torch.manual_seed(0)
    x, labels = randn(8, 3, 8, 8, seed=3), torch.arange(8) % 5
    assert_trains_as_eager(
        _small_resnet(), x, labels, swapped=5, autocast=torch.bfloat16, lr=0.05, tolerance=2e-2
    )


# -- CUDA's policy, shown on the CPU ------------------------------------------------------------
# CUDA's autocast runs layer_norm and softmax in float32 (its lists; the CPU's leave them
# alone). The ops learn that by probing their torch definition under the current autocast, which
# needs a CUDA device; here the probe's verdict is set to float32, and the modules must follow it
# as torch's do under CUDA's autocast: every floating input cast to float32, a float32 result.

FLOAT32_OPS = {
    "LayerNorm": tileops.LayerNormFwdOp,
    "RMSNorm": tileops.RMSNormFwdOp,
    "Softmax": tileops.SoftmaxFwdOp,
}


@pytest.fixture
def float32_policy(monkeypatch):
    """Autocast's verdict for the norms and softmax: run in float32 (CUDA's lists)."""
    real = tileops.autocast._policy

    def policy(op, tensors, lower, dtypes):
        return (
            torch.float32 if type(op) in FLOAT32_OPS.values() else real(op, tensors, lower, dtypes)
        )

    monkeypatch.setattr(tileops.autocast, "_policies", {})
    monkeypatch.setattr(tileops.autocast, "_policy", policy)


@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(FLOAT32_OPS))
def test_under_a_float32_policy_modules_return_float32_as_torchs_do_on_cuda(
    float32_policy, name, param_dtype
):
    theirs, ours = _pair(name, training=True)
    theirs.float(), ours.to(param_dtype)
    x = randn(*MODULES[name][1], dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = ours(x)
    want = theirs(x.float())  # what CUDA's autocast hands torch's layer_norm and softmax
    assert got.dtype == torch.float32
    tolerance = TOLERANCE if param_dtype == torch.bfloat16 else {}
    torch.testing.assert_close(got, want, **tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16], ids=["x_f32", "x_bf16"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(MODULES))
def test_under_cuda_autocast_each_module_behaves_as_torchs(name, training, x_dtype):
    theirs, ours = (m.cuda() for m in _pair(name, training))
    x = randn(*MODULES[name][1], dtype=x_dtype).cuda()
    results = []
    for module in (theirs, ours):
        xx = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = module(xx)
        y.float().sum().backward()
        results.append((y, xx.grad, {n: p.grad for n, p in module.named_parameters()}))
    (y_t, g_t, p_t), (y_o, g_o, p_o) = results
    assert y_o.dtype == y_t.dtype and g_o.dtype == g_t.dtype
    torch.testing.assert_close(y_o, y_t, **TOLERANCE)
    torch.testing.assert_close(g_o, g_t, **TOLERANCE)
    torch.testing.assert_close(p_o, p_t, **TOLERANCE)
