"""On a real GPU: every op captured in a CUDA graph and replayed with new inputs, and a small
transformer block of tileops modules under torch.compile(mode="reduce-overhead")."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tileops
import tileops.nn

pytestmark = pytest.mark.gpu

DTYPE = torch.bfloat16


def _cases():
    def t(*shape):
        return torch.randn(shape, device="cuda", dtype=DTYPE)

    def stats():
        return torch.zeros(8, device="cuda", dtype=DTYPE), torch.ones(8, device="cuda", dtype=DTYPE)

    return {
        "rms_norm": (
            tileops.RMSNormFwdOp(4096),
            (t(4, 4096), t(4096)),
            lambda x, w: F.rms_norm(x, (4096,), w),
        ),
        "layer_norm": (
            tileops.LayerNormFwdOp(4096),
            (t(4, 4096), t(4096), t(4096)),
            lambda x, w, b: F.layer_norm(x, (4096,), w, b),
        ),
        "softmax": (tileops.SoftmaxFwdOp(), (t(4, 4096),), lambda x: torch.softmax(x, -1)),
        "gemm": (tileops.GemmOp(), (t(64, 256), t(256, 128)), lambda a, b: a @ b),
        # decode: split k summed in-kernel behind arrival counters, which replays must find zero
        "gemm_decode": (tileops.GemmOp(), (t(1, 4096), t(4096, 4096)), lambda a, b: a @ b),
        "batch_norm_infer": (
            tileops.BatchNormFwdOp(8, training=False),
            (t(4, 8, 16), t(8), t(8), *stats()),
            lambda x, w, b, m, v: F.batch_norm(x, m, v, w, b, False),
        ),
    }


@pytest.mark.parametrize(
    "name", ["rms_norm", "layer_norm", "softmax", "gemm", "gemm_decode", "batch_norm_infer"]
)
def test_an_op_captured_in_a_cuda_graph_replays_with_new_inputs(name):
    op, inputs, reference = _cases()[name]
    static = [t.clone() for t in inputs]
    op(*static)  # warm-up: selection, compilation, first launch
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(*static)
    for seed in range(2):
        torch.manual_seed(seed)
        for t in static[:1]:
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, reference(*static), rtol=2e-2, atol=2e-2)


class Block(torch.nn.Module):
    """RMSNorm -> attention-like mixing (Linear, Softmax) -> residual -> LayerNorm -> MLP."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.norm1 = tileops.nn.RMSNorm(width)
        self.qk = tileops.nn.Linear(width, width)
        self.softmax = tileops.nn.Softmax(dim=-1)
        self.norm2 = tileops.nn.LayerNorm(width)
        self.mlp = tileops.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.softmax(self.qk(self.norm1(x)))
        return x + self.mlp(self.norm2(x + h))


def test_a_transformer_block_of_tileops_modules_compiles_with_reduce_overhead():
    torch.manual_seed(0)
    block = Block().to("cuda", DTYPE).eval()
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for step in range(4):
            x = torch.randn(8, 256, device="cuda", dtype=DTYPE)
            torch.testing.assert_close(
                compiled(x), block(x), rtol=3e-2, atol=3e-2, msg=f"step {step}"
            )
