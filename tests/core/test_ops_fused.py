"""The fused training ops (add + RMSNorm, GLU, rotary) against their torch definitions:
numerics, float64 gradients through the backward interface, transformers' rotary semantics,
the tileops.nn functions and modules, and the errors for calls they do not serve."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from op_helpers import TOLERANCES, randn

import tileops.nn as tnn
from tileops import AddRMSNormFwdOp, GLUFwdOp, OpConfigError, OpInputError, RotaryFwdOp
from tileops.errors import ArgumentError

llama = pytest.importorskip("transformers.models.llama.modeling_llama")
phi3 = pytest.importorskip("transformers.models.phi3.modeling_phi3")

HALF = (torch.float16, torch.bfloat16)


def leaves(*tensors):
    return tuple(None if t is None else t.detach().clone().requires_grad_() for t in tensors)


# -- add + RMSNorm -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, *HALF, torch.float64], ids=str)
def test_add_rms_norm_is_the_sum_and_its_norm(dtype):
    x, residual, w = (
        randn(3, 5, 33, dtype=dtype),
        randn(3, 5, 33, dtype=dtype, seed=1),
        randn(33, dtype=dtype, seed=2),
    )
    out, h = AddRMSNormFwdOp(33, 1e-5)(x, residual, w)
    assert torch.equal(h, x + residual)  # rounded to dtype once, as `x + residual` is
    expected = F.rms_norm(h.double(), (33,), w.double(), 1e-5).to(dtype)
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])


def test_add_rms_norm_default_eps_is_rms_norms():
    x, residual = randn(4, 16, dtype=torch.bfloat16), randn(4, 16, dtype=torch.bfloat16, seed=1)
    out, h = AddRMSNormFwdOp(16)(x, residual)
    expected = F.rms_norm(h.float(), (16,), None, None).to(torch.bfloat16)
    assert torch.equal(out, expected)


def test_add_rms_norm_gradients_in_float64():
    op = AddRMSNormFwdOp((2, 5), 1e-6)
    f64 = torch.float64
    inputs = leaves(randn(3, 2, 5, dtype=f64), randn(3, 2, 5, dtype=f64, seed=1),
                    randn(2, 5, dtype=f64, seed=2))  # fmt: skip
    assert torch.autograd.gradcheck(op, inputs)
    assert torch.autograd.gradgradcheck(op, inputs, fast_mode=True)


def test_add_rms_norm_refuses_a_residual_of_another_shape():
    with pytest.raises(
        OpInputError, match=r"'residual' has shape \[2, 8\], expected x's shape \[1, 8\]"
    ):
        AddRMSNormFwdOp(8)(randn(1, 8), randn(2, 8), None)
    with pytest.raises(OpInputError, match="'residual' has dtype float16, expected float32"):
        AddRMSNormFwdOp(8)(randn(1, 8), randn(1, 8, dtype=torch.float16), None)
    with pytest.raises(OpConfigError, match="'eps' must be a finite number >= 0"):
        AddRMSNormFwdOp(8, -1.0)


def test_the_add_rms_norm_module_matches_torch_and_trains():
    module = tnn.AddRMSNorm(12, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(randn(12, seed=3))
    x, residual = leaves(randn(2, 3, 12), randn(2, 3, 12, seed=1))
    out, h = module(x, residual)
    x64, r64, w64 = leaves(x.double(), residual.double(), module.weight.double())
    expected = F.rms_norm(x64 + r64, (12,), w64, 1e-6)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)
    (out.sum() + h.square().sum()).backward()
    (expected.sum() + (x64 + r64).square().sum()).backward()
    for got, want in (
        (x.grad, x64.grad),
        (residual.grad, r64.grad),
        (module.weight.grad, w64.grad),
    ):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert "12, eps=1e-06, elementwise_affine=True" in repr(module)


def test_add_rms_norm_with_a_float32_weight_beside_bfloat16_inputs():
    x, residual = randn(2, 8, dtype=torch.bfloat16), randn(2, 8, dtype=torch.bfloat16, seed=1)
    w = randn(8, seed=2)
    out, h = tnn.add_rms_norm(x, residual, w, 1e-6)
    assert out.dtype == h.dtype == torch.bfloat16
    expected = F.rms_norm((x + residual).float(), (8,), w, 1e-6).to(torch.bfloat16)
    torch.testing.assert_close(out, expected, **TOLERANCES[torch.bfloat16])
    with pytest.raises(ArgumentError, match="argument 'x' is 0-d"):
        tnn.add_rms_norm(torch.tensor(1.0), torch.tensor(1.0))


# -- GLU -------------------------------------------------------------------------------------------

ACTS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda g: F.gelu(g, approximate="tanh")}


@pytest.mark.parametrize("dtype", [torch.float32, *HALF, torch.float64], ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_glu_is_the_activation_times_up(act, dtype):
    gate, up = randn(4, 7, 19, dtype=dtype), randn(4, 7, 19, dtype=dtype, seed=1)
    expected = (ACTS[act](gate.double()) * up.double()).to(dtype)
    torch.testing.assert_close(GLUFwdOp(act)(gate, up), expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("act", ACTS)
def test_glu_gradients_in_float64(act):
    op = GLUFwdOp(act)
    inputs = leaves(randn(3, 11, dtype=torch.float64), randn(3, 11, dtype=torch.float64, seed=1))
    assert torch.autograd.gradcheck(op, inputs)
    assert torch.autograd.gradgradcheck(op, inputs, fast_mode=True)


def test_a_packed_glu_input_is_gate_then_up():
    """Phi-3's `gate_up_proj` order: `gate, up = x.chunk(2, dim=-1)`."""
    (x,) = leaves(randn(2, 3, 16, dtype=torch.float64))
    out = tnn.glu(x)
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(out, F.silu(gate) * up)
    assert torch.autograd.gradcheck(lambda t: tnn.SwiGLU("gelu")(t), (x,))
    assert torch.autograd.gradcheck(lambda a, b: tnn.SwiGLU("gelu_tanh")(a, b), leaves(gate, up))


def test_glu_refuses_what_it_cannot_serve():
    with pytest.raises(
        OpConfigError, match="'act' must be one of 'silu', 'gelu', 'gelu_tanh', got 'relu'"
    ):
        GLUFwdOp("relu")
    with pytest.raises(ArgumentError, match="SwiGLU\\(\\): argument 'act' must be one of"):
        tnn.SwiGLU("tanh")
    with pytest.raises(
        OpInputError, match=r"'up' has shape \[2, 4\], expected gate's shape \[2, 5\]"
    ):
        GLUFwdOp()(randn(2, 5), randn(2, 4))
    with pytest.raises(ArgumentError, match=r"shape \[2, 5\] is packed \(gate, then up\).*even"):
        tnn.glu(randn(2, 5))


# -- rotary ----------------------------------------------------------------------------------------


def tables(batch, seq, rot, dtype=torch.float32, seed=5):
    """transformers' tables: cos/sin of position * inverse frequency, the halves repeated."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    positions = torch.arange(seq, dtype=torch.float64)[None, :] + torch.arange(batch)[:, None] * 3
    freqs = positions[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF, torch.float64], ids=str)
@pytest.mark.parametrize("unsqueeze_dim", [1, 2, -3, -2])
def test_rotary_matches_transformers_apply_rotary_pos_emb(unsqueeze_dim, dtype):
    heads_second = unsqueeze_dim in (1, -3)
    q = randn(2, 4, 5, 16, dtype=dtype) if heads_second else randn(2, 5, 4, 16, dtype=dtype)
    k = (
        randn(2, 2, 5, 16, dtype=dtype, seed=1)
        if heads_second
        else randn(2, 5, 2, 16, dtype=dtype, seed=1)
    )
    cos, sin = tables(2, 5, 16, dtype)
    got = RotaryFwdOp(unsqueeze_dim)(q, k, cos, sin)
    expected = llama.apply_rotary_pos_emb(
        q.double(), k.double(), cos.double(), sin.double(), unsqueeze_dim
    )
    for g, e in zip(got, expected, strict=True):
        assert g.is_contiguous() and g.shape == e.shape
        torch.testing.assert_close(g, e.to(dtype), **TOLERANCES[dtype])


def test_rotary_uses_the_tables_as_given_and_broadcasts_them_over_the_batch():
    """Tables whose halves differ (no repeat assumed), one table for the whole batch, and q as
    transformers makes it: a transposed view of (batch, seq, heads, head_dim)."""
    q = randn(3, 5, 4, 8, dtype=torch.float64).transpose(1, 2)
    k = randn(3, 5, 1, 8, dtype=torch.float64, seed=1).transpose(1, 2)
    cos, sin = (
        randn(1, 5, 8, dtype=torch.float64, seed=2),
        randn(1, 5, 8, dtype=torch.float64, seed=3),
    )
    got = RotaryFwdOp()(q, k, cos, sin)
    expected = llama.apply_rotary_pos_emb(q, k, cos, sin)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


def test_partial_rotary_matches_phi3():
    q, k = randn(2, 4, 6, 24, dtype=torch.float64), randn(2, 2, 6, 24, dtype=torch.float64, seed=1)
    cos, sin = tables(2, 6, 10, torch.float64)
    got = RotaryFwdOp()(q, k, cos, sin)
    for g, e in zip(got, phi3.apply_rotary_pos_emb(q, k, cos, sin), strict=True):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)
        assert torch.equal(g[..., 10:], e[..., 10:])


def test_rotary_gradients_in_float64_tables_included():
    q, k = randn(2, 3, 4, 12, dtype=torch.float64), randn(2, 1, 4, 12, dtype=torch.float64, seed=1)
    cos, sin = (
        randn(2, 4, 8, dtype=torch.float64, seed=2),
        randn(2, 4, 8, dtype=torch.float64, seed=3),
    )
    op = RotaryFwdOp()
    assert torch.autograd.gradcheck(op, leaves(q, k, cos, sin))
    assert torch.autograd.gradgradcheck(op, leaves(q, k, cos, sin), fast_mode=True)
    two = RotaryFwdOp(2)
    assert torch.autograd.gradcheck(two, leaves(q.transpose(1, 2), k.transpose(1, 2), cos, sin))


def test_the_rotary_function_is_transformers():
    q, k = randn(1, 2, 3, 8), randn(1, 2, 3, 8, seed=1)
    cos, sin = tables(1, 3, 8)
    for g, e in zip(tnn.apply_rotary_pos_emb(q, k, cos, sin),
                    llama.apply_rotary_pos_emb(q, k, cos, sin), strict=True):  # fmt: skip
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (
            ((2, 3, 8), (2, 3, 8), (2, 3, 8), (2, 3, 8)),
            r"'q' has shape \[2, 3, 8\], expected 4 dims",
        ),
        (
            ((1, 2, 3, 8), (1, 2, 4, 8), (1, 3, 8), (1, 3, 8)),
            r"'k' has shape \[1, 2, 4, 8\], expected q's batch, seq",
        ),
        (
            ((1, 2, 3, 8), (1, 2, 3, 8), (1, 3, 8), (1, 3, 6)),
            r"'cos' and 'sin' have shapes \[1, 3, 8\] and \[1, 3, 6\]",
        ),
        (
            ((1, 2, 3, 8), (1, 2, 3, 8), (3, 8), (3, 8)),
            r"expected one shape \(batch or 1, seq, rot\)",
        ),
        (
            ((2, 2, 3, 8), (2, 2, 3, 8), (3, 3, 8), (3, 3, 8)),
            r"'cos' has shape \[3, 3, 8\], expected \(2 or 1, 3 or 1, rot\)",
        ),
        (
            ((1, 2, 3, 8), (1, 2, 3, 8), (1, 3, 7), (1, 3, 7)),
            "'cos' has 7 rotary dims, expected an even number from 2 to head_dim \\(8\\)",
        ),
        (((1, 2, 3, 8), (1, 2, 3, 8), (1, 3, 10), (1, 3, 10)), "'cos' has 10 rotary dims"),
    ],
    ids=["q rank", "k seq", "sin shape", "cos rank", "cos batch", "odd rot", "rot > head_dim"],
)
def test_rotary_refuses_shapes_transformers_would_not_broadcast(shapes, message):
    tensors = [randn(*s, seed=k) for k, s in enumerate(shapes)]
    with pytest.raises(OpInputError, match=message):
        RotaryFwdOp()(*tensors)


def test_rotary_refuses_other_layouts_and_dtypes():
    with pytest.raises(OpConfigError, match="'unsqueeze_dim' must be 1 .* or 2 .*got 3"):
        RotaryFwdOp(3)
    q = randn(1, 2, 3, 8)
    with pytest.raises(OpInputError, match="'cos' has dtype float64, expected float32"):
        RotaryFwdOp()(
            q, q, randn(1, 3, 8, dtype=torch.float64), randn(1, 3, 8, dtype=torch.float64)
        )


def test_empty_calls_return_empty_outputs():
    out, h = AddRMSNormFwdOp(4)(randn(0, 4), randn(0, 4))
    assert out.shape == h.shape == (0, 4)
    assert GLUFwdOp()(randn(2, 0), randn(2, 0)).shape == (2, 0)
    q, k = RotaryFwdOp()(randn(1, 2, 3, 8), randn(1, 0, 3, 8), randn(1, 3, 8), randn(1, 3, 8))
    assert q.shape == (1, 2, 3, 8) and k.shape == (1, 0, 3, 8)


def test_the_fused_ops_trace_under_torch_compile():
    """One opaque node each, fake outputs of the real shapes and strides (heads on dim 2)."""
    q, k = randn(1, 3, 2, 8).requires_grad_(), randn(1, 3, 1, 8, seed=1)
    cos, sin = tables(1, 3, 8)

    def step(q, k, x, residual):
        q_out, k_out = tnn.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
        out, h = tnn.add_rms_norm(x, residual, None, 1e-6)
        return q_out.sum() + k_out.sum() + tnn.glu(out).sum() + h.sum()

    x, residual = randn(2, 8, seed=2), randn(2, 8, seed=3)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(q, k, x, residual)
    torch.testing.assert_close(got, step(q, k, x, residual))
    (grad,) = torch.autograd.grad(got, [q])
    (expected,) = torch.autograd.grad(step(q, k, x, residual), [q])
    torch.testing.assert_close(grad, expected)


def test_gradients_of_some_inputs_when_an_output_depends_on_none_of_them():
    """Only q requires grad: k_embed takes no part in the recompute's differentiation."""
    (q,) = leaves(randn(1, 2, 3, 8, dtype=torch.float64))
    k = randn(1, 1, 3, 8, dtype=torch.float64, seed=1)
    cos, sin = tables(1, 3, 8, torch.float64)
    q_out, k_out = RotaryFwdOp()(q, k, cos, sin)
    (grad,) = torch.autograd.grad(q_out.sum() + k_out.sum(), [q])
    (q64,) = leaves(q)
    (expected,) = torch.autograd.grad(llama.apply_rotary_pos_emb(q64, k, cos, sin)[0].sum(), [q64])
    torch.testing.assert_close(grad, expected)


def test_a_kernels_own_error_names_the_key_that_raised_it():
    from tileops import Kernel
    from tileops.backend import register_kernel_type
    from tileops.ops import AddRMSNormInterface, GLUInterface, RotaryInterface
    from tileops.testing import isolated_registry

    class Broken(Kernel, RotaryInterface):
        devices = frozenset({"cpu"})

        def forward(self, q, k, cos, sin, q_out, k_out):
            raise RuntimeError("broken on purpose")

    class Wrong(Kernel, GLUInterface):
        devices = frozenset({"cpu"})

        def forward(self, gate, up):
            return gate.t()

    class Single(Kernel, AddRMSNormInterface):
        devices = frozenset({"cpu"})

        def forward(self, x, residual, weight):
            return (x + residual,)

    with isolated_registry():
        register_kernel_type(RotaryFwdOp, "broken", Broken)
        register_kernel_type(AddRMSNormFwdOp, "single", Single)
        register_kernel_type(GLUFwdOp, "wrong", Wrong)
        q = randn(1, 2, 3, 8)
        with pytest.raises(RuntimeError, match="broken on purpose") as info:
            RotaryFwdOp()(q, q, randn(1, 3, 8), randn(1, 3, 8))
        assert any("'broken'" in note for note in info.value.__notes__)
        from tileops.errors import BackendError

        with pytest.raises(BackendError, match="Output of kernel 'wrong'.*is wrong"):
            GLUFwdOp()(randn(2, 3), randn(2, 3))
        expected = r"returned \['a contiguous float32 tensor of shape \[2, 4\] on cpu'\], but .* 2 "
        with pytest.raises(BackendError, match=expected + "contiguous tensors"):
            AddRMSNormFwdOp(4)(randn(2, 4), randn(2, 4))
