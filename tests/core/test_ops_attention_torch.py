"""The attention ops inside PyTorch's stack, as every op of the catalogue: torch.library
operators that opcheck accepts, torch.compile without graph breaks, export, autograd (through
out only: lse is not differentiable), gradcheck and double backward, and autocast as
`F.scaled_dot_product_attention` has it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from op_helpers import randn
from test_ops_attention import mask, qkv

import tileops
from tileops import library

F64 = torch.float64


def cases(grad: bool = False, dtype: torch.dtype = torch.float32) -> dict:
    """(op factory, inputs) for each attention op; the integer inputs never require grad."""
    q, k, v = (t.to(dtype).requires_grad_(grad) for t in qkv(2, 4, 2, 5, 7, 8))
    packed = [t.detach()[0].transpose(0, 1).contiguous().requires_grad_(grad) for t in (q, k, v)]
    grad_out = randn(2, 4, 5, 8, dtype=dtype, seed=9).requires_grad_(grad)
    lens = torch.tensor([3, 7], dtype=torch.int32)
    table = torch.tensor([[1, 0], [3, 2]], dtype=torch.int32)  # blocks of 2 slots, shuffled
    blocks = [
        t.detach()[:, :, :4].reshape(2, 2, 2, 2, 8).transpose(1, 2).reshape(4, 2, 2, 8)
        for t in (k, v)
    ]
    blocks = [b[[1, 0, 3, 2]].contiguous().requires_grad_(grad) for b in blocks]
    offsets = torch.tensor([0, 2, 5]), torch.tensor([0, 3, 7], dtype=torch.int32)
    packed_grad = grad_out.detach()[0].transpose(0, 1).contiguous().requires_grad_(grad)
    with torch.no_grad():  # the forward's out and lse, as its backward hands them on
        saved = tileops.AttentionFwdOp(causal=True)(q, k, v)
        packed_saved = tileops.AttentionVarlenFwdOp(causal=True)(*packed, *offsets)
    return {
        "forward": (lambda: tileops.AttentionFwdOp(causal=True), (q, k, v)),
        "forward, window": (lambda: tileops.AttentionFwdOp(True, 0.5, 3), (q, k, v)),
        "backward": (lambda: tileops.AttentionBwdOp(causal=True), (grad_out, q, k, v, *saved)),
        "decode": (
            lambda: tileops.AttentionDecodeOp(causal=True),
            (q[:, :, -2:], k, v, lens, None),
        ),
        "paged decode": (
            lambda: tileops.AttentionDecodeOp(causal=True),
            (q[:, :, -1:], *blocks, torch.tensor([3, 4]), table),
        ),
        "varlen": (lambda: tileops.AttentionVarlenFwdOp(causal=True), (*packed, *offsets)),
        "varlen backward": (
            lambda: tileops.AttentionVarlenBwdOp(causal=True),
            (packed_grad, *packed, *offsets, *packed_saved),
        ),
    }


NAMES = list(cases())


def first(result):
    return result[0] if isinstance(result, tuple) else result


@pytest.mark.parametrize("name", NAMES)
def test_each_attention_op_is_a_torch_library_operator_that_opcheck_accepts(name):
    make, inputs = cases(grad=True)[name]
    op = make()
    operator = library.operator(type(op)).default
    assert str(operator).startswith(f"tileops.{type(op).__name__}")
    torch.library.opcheck(operator, (*inputs, *op.params().values()))


@pytest.mark.parametrize("name", NAMES)
def test_each_attention_op_compiles_fullgraph_without_graph_breaks(name):
    make, inputs = cases()[name]
    op = make()  # fresh: never called, so never settled

    def model(*args):
        return first(op(*args)) * 2

    explanation = torch._dynamo.explain(model)(*inputs)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*inputs), first(make()(*inputs)) * 2)


def test_a_compiled_training_step_has_sdpa_gradients():
    q, k, v = (t.float().requires_grad_() for t in qkv(2, 4, 2, 6, 6, 8))
    op = tileops.AttentionFwdOp(causal=True)
    compiled = torch.compile(lambda q, k, v: op(q, k, v)[0].square().sum(), fullgraph=True)
    compiled(q, k, v).backward()
    refs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*refs, is_causal=True, enable_gqa=True).square().sum().backward()
    for got, want in zip((q, k, v), refs, strict=True):
        torch.testing.assert_close(got.grad, want.grad)


EXPORT = """
import sys, torch, tileops
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = tileops.AttentionFwdOp(causal=True)
    def forward(self, q, k, v):
        return self.attention(q, k, v)[0]
torch.manual_seed(0)
block, args = Block(), (torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8))
program = torch.export.export(block, args)
nodes = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
assert nodes.count("tileops.AttentionFwdOp.default") == 1, nodes
torch.export.save(program, sys.argv[1])
torch.save((args, block(*args)), sys.argv[1] + ".expected")
"""

LOAD = """
import sys, torch, tileops
program = torch.export.load(sys.argv[1])
args, expected = torch.load(sys.argv[1] + ".expected")
torch.testing.assert_close(program.module()(*args), expected)
print("loaded")
"""


def test_an_exported_program_holds_one_attention_node_and_runs_after_load(tmp_path):
    path = str(tmp_path / "attention.pt2")
    for script in (EXPORT, LOAD):  # load in a fresh process, as users do
        done = subprocess.run(
            [sys.executable, "-c", script, path], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded"


def test_gradients_flow_through_out_and_match_sdpa():
    q, k, v = (t.requires_grad_() for t in qkv(2, 6, 3, 5, 8, 8))
    out, lse = tileops.AttentionFwdOp(causal=True)(q, k, v)
    assert out.requires_grad and not lse.requires_grad  # as torch's own attention kernels
    grad = randn(*out.shape, dtype=F64, seed=4)
    got = torch.autograd.grad(out, (q, k, v), grad)
    seen = mask(5, 8, True)
    want_out = F.scaled_dot_product_attention(q, k, v, attn_mask=seen, enable_gqa=True)
    want = torch.autograd.grad(want_out, (q, k, v), grad)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("name", [n for n in NAMES if not n.endswith("backward")])
def test_gradcheck_in_float64(name):
    make, inputs = cases(grad=True, dtype=F64)[name]
    op = make()
    grads = [t for t in inputs if t is not None and t.requires_grad]
    rest = {i: t for i, t in enumerate(inputs) if t is None or not t.requires_grad}

    def f(*differentiable):
        it = iter(differentiable)
        return first(op(*[rest[i] if i in rest else next(it) for i in range(len(inputs))]))

    assert torch.autograd.gradcheck(f, grads)


def test_double_backward_of_the_forward_op():
    q, k, v = (t.requires_grad_() for t in qkv(1, 4, 2, 3, 4, 4))
    op = tileops.AttentionFwdOp(causal=True, window=2)
    assert torch.autograd.gradgradcheck(lambda *t: op(*t)[0], (q, k, v))


def test_double_backward_of_the_varlen_op():
    q, k, v = (t[0].transpose(0, 1).contiguous().requires_grad_() for t in qkv(1, 4, 2, 3, 4, 4))
    offsets = torch.tensor([0, 1, 3]), torch.tensor([0, 2, 4])
    op = tileops.AttentionVarlenFwdOp(causal=True, window=2)
    assert torch.autograd.gradgradcheck(lambda *t: op(*t, *offsets)[0], (q, k, v))


@pytest.mark.parametrize("name", ["backward", "varlen backward"])
def test_gradcheck_of_the_backward_ops(name):
    make, inputs = cases(grad=True, dtype=F64)[name]
    op = make()
    grads = [t for t in inputs if t.requires_grad]
    rest = {i: t for i, t in enumerate(inputs) if not t.requires_grad}

    def f(*differentiable):
        it = iter(differentiable)
        return op(*[rest[i] if i in rest else next(it) for i in range(len(inputs))])[0]

    assert torch.autograd.gradcheck(f, grads)


def test_autocast_casts_as_for_sdpa():
    q, k, v = (t.float() for t in qkv(1, 2, 2, 4, 4, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, lse = tileops.AttentionFwdOp()(q, k, v)
        want = F.scaled_dot_product_attention(q, k, v)
    assert out.dtype == want.dtype == torch.bfloat16 and lse.dtype == torch.float32
    torch.testing.assert_close(out, want, rtol=1.6e-2, atol=1.6e-2)
    lens = torch.tensor([2], dtype=torch.int32)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the lengths are never cast
        out, _ = tileops.AttentionDecodeOp()(q[:, :, :1], k, v, lens)
    assert out.dtype == torch.bfloat16
