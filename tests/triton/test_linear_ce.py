"""Triton's fused linear + cross-entropy: the row step and both kernels against float64 torch
on the full logits (interpreter on CPU tensors), selection, and a GPU grid at LLM sizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_kit import interpreted, rel_error

import tileops.nn as tnn
from tileops.ops import LinearCrossEntropyFwdOp, LinearCrossEntropyGradOp
from tileops.ops.linear_cross_entropy import _math
from tileops_triton.linear_ce.kernels import LINEAR_CE_KEY, triton_step

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def problem(tokens, hidden, vocab, dtype, device, *, bias=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=generator).to(device, dtype)
    w = (torch.randn(vocab, hidden, generator=generator) / hidden**0.5).to(device, dtype)
    b = torch.randn(vocab, generator=generator).to(device, dtype) if bias else None
    labels = torch.randint(0, vocab, (tokens,), generator=generator)
    labels[::3] = -100
    return h, w, labels.to(device), b


def float64_reference(grad, h, w, labels, b, reduction, smoothing):
    """Loss and gradients from the full logits in float64 (the inputs' values as given)."""
    leaves = [None if t is None else t.double().requires_grad_() for t in (h, w, b)]
    loss = F.cross_entropy(
        F.linear(leaves[0], leaves[1], leaves[2]), labels, reduction=reduction,
        label_smoothing=smoothing,
    )  # fmt: skip
    wanted = [t for t in leaves if t is not None]
    return loss.detach(), torch.autograd.grad(loss, wanted, grad.double())


def check_grad_op(tokens, hidden, vocab, dtype, device, reduction, smoothing, bias, chunk=None):
    h, w, labels, b = problem(tokens, hidden, vocab, dtype, device, bias=bias)
    op = LinearCrossEntropyGradOp(reduction=reduction, label_smoothing=smoothing, chunk_rows=chunk)
    assert op.explain("linear_cross_entropy_grad", op.call_for(h, w, b)).chosen == LINEAR_CE_KEY
    shape = (tokens,) if reduction == "none" else ()
    grad = torch.rand(shape, device=device) + 0.5
    loss, gh, gw, gb = op(grad, h, w, labels, b)
    want, grads = float64_reference(grad, h, w, labels, b, reduction, smoothing)
    assert loss.dtype == torch.float32 and gh.dtype == dtype and gw.dtype == dtype
    assert rel_error(loss, want) < TOLERANCE[dtype]
    for got, ref in zip((gh, gw, gb) if bias else (gh, gw), grads, strict=True):
        assert rel_error(got, ref) < TOLERANCE[dtype]


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_grad_op_matches_float64_torch(dtype, reduction, smoothing):
    check_grad_op(9, 16, 300, dtype, "cpu", reduction, smoothing, bias=reduction != "sum", chunk=4)


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_op_matches_float64_torch(dtype):
    h, w, labels, b = problem(9, 16, 300, dtype, "cpu")
    op = LinearCrossEntropyFwdOp(label_smoothing=0.1, chunk_rows=4)
    assert op.explain("linear_cross_entropy", op.call_for(h, w, b)).chosen == LINEAR_CE_KEY
    want, _ = float64_reference(torch.ones(()), h, w, labels, b, "mean", 0.1)
    assert rel_error(op(h, w, labels, b), want) < TOLERANCE[dtype]


@interpreted
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_the_row_step_over_several_blocks_matches_the_torch_step(smoothing):
    """A block narrower than the row: the online pass and the writing pass loop, the last
    block masked (40 = 2 x 16 + 8)."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 40, generator=generator) * 4
    labels = torch.tensor([0, 39, -100, 17, 16, 3])
    scales = torch.tensor([1.0, 0.5, 0.0, 2.0, 1.0, 1.0])
    got_losses, want_losses = torch.empty(6), torch.empty(6, dtype=torch.float64)
    got, want = logits.clone(), logits.double()
    triton_step(-100, smoothing, block=16)(got, labels, scales, got_losses)
    _math.torch_step(-100, smoothing)(want, labels, scales.double(), want_losses)
    torch.testing.assert_close(got_losses.double(), want_losses, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    only_loss = logits.clone()
    triton_step(-100, smoothing, block=16)(only_loss, labels, None, got_losses)
    assert torch.equal(only_loss, logits)  # no gradient pass: the block is left as it was


@interpreted
def test_a_label_out_of_range_gives_nan_not_a_number():
    logits, losses = torch.randn(2, 10), torch.empty(2)
    triton_step(-100, 0.0)(logits, torch.tensor([3, 12]), torch.ones(2), losses)
    assert losses[0].isfinite() and losses[1].isnan() and logits[1].isnan().all()


@interpreted
def test_float64_stays_with_the_reference():
    h, w, labels, b = problem(4, 8, 20, torch.float64, "cpu")
    op = LinearCrossEntropyGradOp()
    explanation = op.explain("linear_cross_entropy_grad", op.call_for(h, w, b))
    assert explanation.chosen == "reference"
    assert "serve float16, bfloat16 and float32" in str(explanation)


@interpreted
def test_the_nn_path_trains_through_the_triton_kernels():
    h, w, labels, b = problem(9, 16, 300, torch.float32, "cpu")
    h.requires_grad_()
    loss = tnn.linear_cross_entropy(h, w, labels, b, chunk_rows=4)
    loss.backward()
    want, (grad_h, *_) = float64_reference(torch.ones(()), h.detach(), w, labels, b, "mean", 0.0)
    assert rel_error(loss, want) < 1e-5 and rel_error(h.grad, grad_h) < 1e-5


# -- on the GPU ----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_grad_op_matches_float64_torch_on_the_gpu(dtype, reduction, smoothing):
    check_grad_op(1000, 256, 32000, dtype, "cuda", reduction, smoothing, bias=True)


@pytest.mark.gpu
def test_training_at_llama3_vocab_holds_less_than_the_logits_on_the_gpu():
    """4096 tokens x 128256 classes: the bf16 logits alone are 1 GiB (2 GiB in float32 for the
    loss); the fused loss adds at most a chunk's block and the gradients' own size."""
    h, w, labels, _ = problem(4096, 1024, 128256, torch.bfloat16, "cuda", bias=False)
    h.requires_grad_()
    w.requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = tnn.linear_cross_entropy(h, w, labels)
    loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    gradients = h.numel() * 2 + w.numel() * 2
    assert extra < gradients + _math.CHUNK_BYTES + 32 * 2**20, extra
    want, grads = float64_reference(torch.ones((), device="cuda"), h.detach(), w.detach(),
                                    labels, None, "mean", 0.0)  # fmt: skip
    assert rel_error(loss, want) < 1e-3
    assert rel_error(h.grad, grads[0]) < 2e-2 and rel_error(w.grad, grads[1]) < 2e-2


@interpreted
def test_a_call_settled_on_the_triton_target_runs_the_kernels():
    h, w, labels, b = problem(9, 16, 300, torch.float32, "cpu")
    op = LinearCrossEntropyGradOp(chunk_rows=4, target="triton")
    loss, gh, gw, gb = op(torch.ones(()), h, w, labels, b)
    assert op.settled_target == "triton"
    want, grads = float64_reference(torch.ones(()), h, w, labels, b, "mean", 0.0)
    assert rel_error(loss, want) < 1e-5
    for got, ref in zip((gh, gw, gb), grads, strict=True):
        assert rel_error(got, ref) < 1e-5


@pytest.mark.gpu
def test_kernelize_loss_trains_a_bfloat16_llama_as_eager_on_the_gpu():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).train()
    fused = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).train()
    fused.load_state_dict(eager.state_dict())
    assert len(tnn.kernelize_loss(fused).swapped) == 1
    ids = torch.randint(0, 32000, (2, 256), device="cuda")
    labels = ids.clone()
    labels[:, :16] = -100
    losses = []
    for model in (eager, fused):
        out = model(ids, labels=labels)
        out.loss.backward()
        losses.append(out.loss.float())
    assert abs(losses[0] - losses[1]).item() < 1e-2
    for (name, p), q in zip(eager.named_parameters(), fused.parameters(), strict=True):
        assert rel_error(q.grad, p.grad) < 3e-2, name
