"""The fused training ops' Triton kernels, forward and backward, against float64 torch.

Interpreter tests (TRITON_INTERPRET=1, CPU tensors) run the real kernel code through the ops,
with odd sizes in every dtype Triton serves; `gpu` tests repeat them on CUDA at model sizes.
"""

from __future__ import annotations

import pytest
import torch
from triton_kit import TOLERANCE, interpreted, rel_error

import tileops
from tileops.ops import AddRMSNormFwdOp, GLUFwdOp, RotaryFwdOp
from tileops.ops.fused.add_rms_norm import add_rms_norm
from tileops.ops.fused.glu import glu
from tileops.ops.fused.rotary import rotary_pair
from tileops_triton.declare import INTERPRETING

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
compiled = pytest.mark.skipif(INTERPRETING, reason="GPU tests run compiled, not interpreted")
# Backward tolerance: gradients sum over a row (16-bit inputs rounded before the sum).
GRAD_TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def randn(*shape, dtype=torch.float32, device="cpu", seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(device=device, dtype=dtype)


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def grads_of(outputs, inputs, seed=7):
    """Gradients of `inputs` for seeded random output gradients, each as float64."""
    cotangents = [randn(*o.shape, dtype=o.dtype, device=o.device, seed=seed + k)
                  for k, o in enumerate(outputs)]  # fmt: skip
    wanted = [t for t in inputs if t is not None]
    found = torch.autograd.grad(outputs, wanted, cotangents)
    return [g.double() for g in found], cotangents


def expected_grads(fn, inputs, cotangents):
    """float64 gradients of the torch definition `fn` for the given output gradients."""
    doubles = leaves(*[None if t is None else t.double() for t in inputs])
    outputs = fn(*doubles)
    wanted = [t for t in doubles if t is not None]
    return torch.autograd.grad(outputs, wanted, [c.double() for c in cotangents])


def served_keys(record) -> dict[tuple[str, str], str]:
    return {(s.op.split("::")[-1], s.interface): s.key for s in record.counts}


def check_add_rms_norm(shape, dtype, device, weight=True, eps=1e-6):
    n = shape[-1]
    x, residual = (
        randn(*shape, dtype=dtype, device=device),
        randn(*shape, dtype=dtype, device=device, seed=1),
    )
    w = randn(n, dtype=dtype, device=device, seed=2) if weight else None
    op = AddRMSNormFwdOp(n, eps)
    xs = leaves(x, residual, w)
    with tileops.record() as record:
        out, h = op(*xs)
        got, cotangents = grads_of((out, h), xs)
    keys = served_keys(record)
    assert keys[("AddRMSNormFwdOp", "add_rms_norm")] == "triton"
    assert keys[("AddRMSNormFwdOp", "backward")] == "triton_backward"
    h64 = (x + residual).double()  # the sum as rounded in dtype, then normalized in float64
    y64 = torch.nn.functional.rms_norm(h64, (n,), None if w is None else w.double(), eps)
    # The sum rounded once to dtype: exactly torch's on the GPU; the interpreter's 16-bit
    # conversion may truncate instead, one unit in the last place.
    if INTERPRETING:
        torch.testing.assert_close(h, x + residual)
    else:
        assert torch.equal(h, x + residual)
    assert rel_error(out, y64) < TOLERANCE[dtype]

    def definition(a, b, c):
        return add_rms_norm(a, b, c, (n,), eps)

    for g, e in zip(got, expected_grads(definition, (x, residual, w), cotangents), strict=True):
        assert rel_error(g, e) < GRAD_TOLERANCE[dtype]


def check_glu(shape, dtype, device, act, packed=False):
    n = shape[-1]
    if packed:  # the halves of one (…, 2n) tensor: views with row stride 2n
        both = randn(*shape[:-1], 2 * n, dtype=dtype, device=device).requires_grad_()
        gate, up = both[..., :n], both[..., n:]
        inputs = [both]
    else:
        gate, up = leaves(
            randn(*shape, dtype=dtype, device=device),
            randn(*shape, dtype=dtype, device=device, seed=1),
        )
        inputs = [gate, up]
    with tileops.record() as record:
        out = GLUFwdOp(act)(gate, up)
        got, cotangents = grads_of((out,), inputs)
    keys = served_keys(record)
    assert keys[("GLUFwdOp", "glu")] == "triton"
    assert keys[("GLUFwdOp", "backward")] == "triton_backward"
    assert rel_error(out, glu(act, gate.detach().double(), up.detach().double())) < TOLERANCE[dtype]
    if packed:
        expected = expected_grads(
            lambda t: glu(act, t[..., :n], t[..., n:]), [both.detach()], cotangents
        )
    else:
        expected = expected_grads(
            lambda a, b: glu(act, a, b), [gate.detach(), up.detach()], cotangents
        )
    for g, e in zip(got, expected, strict=True):
        assert rel_error(g, e) < GRAD_TOLERANCE[dtype]


def check_rotary(batch, q_heads, k_heads, seq, head_dim, rot, dtype, device, unsqueeze_dim=1,
                 table_batch=None, strided=False):  # fmt: skip
    def heads(h, seed):
        if unsqueeze_dim == 1 and strided:  # transformers' q: a transposed (batch, seq, h, d)
            t = randn(batch, seq, h, head_dim, dtype=dtype, device=device, seed=seed)
            return t.transpose(1, 2)
        if unsqueeze_dim == 1:
            return randn(batch, h, seq, head_dim, dtype=dtype, device=device, seed=seed)
        return randn(batch, seq, h, head_dim, dtype=dtype, device=device, seed=seed)

    q, k = leaves(heads(q_heads, 0), heads(k_heads, 1))
    assert q.shape[unsqueeze_dim] == q_heads and k.shape[unsqueeze_dim] == k_heads
    tb = batch if table_batch is None else table_batch
    cos = randn(tb, seq, rot, dtype=dtype, device=device, seed=3)
    sin = randn(tb, seq, rot, dtype=dtype, device=device, seed=4)
    with tileops.record() as record:
        q_out, k_out = RotaryFwdOp(unsqueeze_dim)(q, k, cos, sin)
        got, cotangents = grads_of((q_out, k_out), (q, k))
    keys = served_keys(record)
    assert keys[("RotaryFwdOp", "rotary")] == "triton"
    assert keys[("RotaryFwdOp", "backward")] == "triton_backward"
    args = [t.detach().double() for t in (q, k, cos, sin)]
    for out, ref in zip((q_out, k_out), rotary_pair(*args, unsqueeze_dim), strict=True):
        assert out.is_contiguous() and rel_error(out, ref) < TOLERANCE[dtype]

    def definition(a, b):
        return rotary_pair(a, b, cos.double(), sin.double(), unsqueeze_dim)

    for g, e in zip(
        got, expected_grads(definition, (q.detach(), k.detach()), cotangents), strict=True
    ):
        assert rel_error(g, e) < GRAD_TOLERANCE[dtype]


ROWS = [(1, 1), (3, 7), (2, 5, 33), (4, 130), (2, 1000)]


@interpreted
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", ROWS, ids=str)
def test_add_rms_norm_forward_and_backward(shape, dtype):
    check_add_rms_norm(shape, dtype, "cpu")


@interpreted
def test_add_rms_norm_without_weight_and_with_a_float32_weight():
    check_add_rms_norm((3, 40), torch.float32, "cpu", weight=False)
    n = 24
    x, residual = randn(5, n, dtype=torch.bfloat16), randn(5, n, dtype=torch.bfloat16, seed=1)
    w = randn(n, seed=2).requires_grad_()
    out, _ = AddRMSNormFwdOp(n, 1e-5)(x, residual, w)
    expected = torch.nn.functional.rms_norm((x + residual).double(), (n,), w.double(), 1e-5)
    assert rel_error(out, expected) < TOLERANCE[torch.bfloat16]
    (dw,) = torch.autograd.grad(out, [w], torch.ones_like(out))
    assert dw.dtype == torch.float32


@interpreted
def test_add_rms_norm_weight_gradient_is_deterministic():
    """Two-stage sums (per-program partial rows, then a fixed-order sum): bitwise repeatable."""
    n = 50
    x, residual = randn(37, n), randn(37, n, seed=1)
    w = randn(n, seed=2).requires_grad_()
    op = AddRMSNormFwdOp(n, 1e-6)
    runs = []
    for _ in range(2):
        out, h = op(x, residual, w)
        runs.append(
            torch.autograd.grad((out, h), [w], (torch.ones_like(out), torch.ones_like(h)))[0]
        )
    assert torch.equal(runs[0], runs[1])


@interpreted
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 33), (4, 1500)], ids=str)
def test_glu_forward_and_backward(shape, act, dtype):
    check_glu(shape, dtype, "cpu", act)


@interpreted
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_glu_of_a_packed_input_reads_its_halves_in_place(act):
    check_glu((3, 5, 24), torch.bfloat16, "cpu", act, packed=True)


@interpreted
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "dims",
    [(2, 4, 2, 5, 8, 8), (1, 3, 1, 7, 12, 12), (2, 4, 4, 3, 10, 6), (1, 2, 1, 1, 16, 2)],
    ids=["gqa", "mqa odd seq", "partial rotary", "seq 1, rot 2"],
)
def test_rotary_forward_and_backward(dims, dtype):
    check_rotary(*dims, dtype, "cpu")


@interpreted
def test_rotary_heads_on_dim_two_strided_q_and_tables_shared_over_the_batch():
    check_rotary(2, 4, 2, 5, 8, 8, torch.float32, "cpu", unsqueeze_dim=2)
    check_rotary(3, 4, 2, 5, 12, 8, torch.bfloat16, "cpu", strided=True, table_batch=1)


@interpreted
def test_rotary_backward_leaves_table_gradients_to_the_reference():
    q, k = randn(1, 2, 3, 8), randn(1, 1, 3, 8, seed=1)
    cos, sin = leaves(randn(1, 3, 8, seed=2), randn(1, 3, 8, seed=3))
    with tileops.record() as record:
        q_out, _ = RotaryFwdOp()(q, k, cos, sin)
        got = torch.autograd.grad(q_out.sum(), [cos, sin])
    assert served_keys(record)[("RotaryFwdOp", "backward")] == "reference_backward"
    expected = torch.autograd.grad(rotary_pair(q, k, cos, sin, 1)[0].sum(), [cos, sin])
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


# -- GPU: model sizes, compiled -------------------------------------------------------------


@pytest.mark.gpu
@compiled
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("n", [1000, 4096, 8192])
def test_add_rms_norm_on_the_gpu(n, dtype):
    check_add_rms_norm((2, 257, n), dtype, "cuda")


@pytest.mark.gpu
@compiled
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
def test_glu_on_the_gpu(act, dtype):
    check_glu((2, 257, 14336), dtype, "cuda", act)
    check_glu((3, 1000), dtype, "cuda", act, packed=True)


@pytest.mark.gpu
@compiled
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_rotary_on_the_gpu(dtype):
    check_rotary(2, 32, 8, 513, 128, 128, dtype, "cuda", strided=True)
    check_rotary(2, 32, 8, 100, 128, 64, dtype, "cuda", unsqueeze_dim=2, table_batch=1)


@interpreted
def test_add_rms_norm_gradients_of_x_and_residual_do_not_alias():
    """The backward returns one tensor for both inputs' gradients: autograd must not hand it
    to two leaves as one buffer, nor lose a sum where both inputs are one tensor."""
    n = 16
    a, b, w = leaves(randn(4, n), randn(4, n, seed=1), randn(n, seed=2))
    out, _ = AddRMSNormFwdOp(n, 1e-6)(a, b, w)
    out.sum().backward()
    kept = a.grad.clone()
    b.grad.add_(1)
    assert torch.equal(a.grad, kept)
    x, x64 = leaves(randn(4, n, seed=3), randn(4, n, seed=3).double())
    out, h = AddRMSNormFwdOp(n, 1e-6)(x, x, w)
    (out.sum() + 2 * h.sum()).backward()
    out64, h64 = add_rms_norm(x64, x64, w.detach().double(), (n,), 1e-6)
    (out64.sum() + 2 * h64.sum()).backward()
    assert rel_error(x.grad, x64.grad) < 1e-5


def test_calls_a_program_cannot_hold_stay_with_the_references():
    from tileops.ops import AddRMSNormCall, BackwardCall, GLUCall
    from tileops_triton.fused import kernels, launch

    cpu = torch.device("cpu")
    call = AddRMSNormCall(device=cpu, n=launch.MAX_ROW + 1, eps=1e-6, dtype=torch.float32)
    assert f"exceed the {launch.MAX_ROW} one program holds" in kernels.TritonAddRMSNorm.refusal(
        call
    )

    def backward(op, params, dtypes, needs):
        return BackwardCall(device=cpu, op=op.op_name, params=params, dtypes=dtypes, needs=needs)

    n = launch.BACKWARD_MAX_ROW + 1
    call = backward(AddRMSNormFwdOp, (("normalized_shape", (n,)), ("eps", None)),
                    (torch.bfloat16,) * 3, (True,) * 3)  # fmt: skip
    reason = kernels.TritonAddRMSNormBackward.refusal(call)
    assert f"exceed the {launch.BACKWARD_MAX_ROW} one program holds" in reason
    call = GLUCall(device=cpu, act="silu", dtype=torch.float64)
    assert "serve float16, bfloat16 and float32, not torch.float64" in kernels.TritonGLU.refusal(
        call
    )
    call = backward(GLUFwdOp, (("act", "silu"),), (torch.float64,) * 2, (True, True))
    assert "not torch.float64" in kernels.TritonGLUBackward.refusal(call)
    call = backward(RotaryFwdOp, (("unsqueeze_dim", 1),), (torch.float32,) * 4,
                    (True, True, False, True))  # fmt: skip
    assert "no gradient for cos and sin" in kernels.TritonRotaryBackward.refusal(call)


@interpreted
def test_a_kernelized_llama_trains_on_the_triton_kernels_as_eager():
    """transformers' own layouts reach the kernels: q and k as transposed views, the MLP's
    gate and up from two projections, cos/sin from the rotary embedding."""
    import copy

    transformers = pytest.importorskip("transformers")
    import tileops.nn as tnn

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config)
    model = copy.deepcopy(reference)
    tnn.kernelize(model)
    batch = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    with tileops.record() as record:
        loss = model(batch, labels=batch).loss
        loss.backward()
    expected = reference(batch, labels=batch).loss
    expected.backward()
    keys = served_keys(record)
    for op, forward in (("GLUFwdOp", "glu"), ("RotaryFwdOp", "rotary")):
        assert keys[(op, forward)] == "triton" and keys[(op, "backward")] == "triton_backward"
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
