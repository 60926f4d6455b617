"""`tileops.nn.kernelize_loss` on transformers causal LMs (tiny configs, random weights, no
downloads): the training loss and every gradient match eager, the logits are never built, and
what cannot be served is skipped with its reason."""

from __future__ import annotations

import pytest
import torch

import tileops.nn as tnn
from tileops import ArgumentError

transformers = pytest.importorskip("transformers")

VOCAB = 97


def tiny_llama(seed: int = 0, **config):
    torch.manual_seed(seed)
    settings = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    settings.update(config)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings))
    return model.train()


def batch(seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, 12), generator=generator)
    labels = ids.clone()
    labels[0, :4] = -100
    return ids, labels


def loss_and_grads(model, ids, labels, **kwargs):
    model.zero_grad()
    out = model(ids, labels=labels, **kwargs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same(got, want) -> None:
    torch.testing.assert_close(got[0].loss, want[0].loss, rtol=1e-6, atol=1e-6)
    for name, grad in want[1].items():
        torch.testing.assert_close(got[1][name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_llama_loss_and_every_gradient_match_eager_without_logits(monkeypatch):
    model = tiny_llama()
    ids, labels = batch()
    want = loss_and_grads(model, ids, labels)
    report = tnn.kernelize_loss(model)
    assert [(s.name, s.source) for s in report.swapped] == [
        ("LlamaForCausalLM", transformers.LlamaForCausalLM)
    ]
    assert isinstance(model, transformers.LlamaForCausalLM) and "LinearCrossEntropy" in str(report)
    monkeypatch.setattr(  # the lm_head never runs: no logits
        torch.nn.Linear, "forward", _forbidden_head(model.lm_head, torch.nn.Linear.forward)
    )
    got = loss_and_grads(model, ids, labels)
    assert got[0].logits is None
    assert_same(got, want)


def _forbidden_head(head, forward):
    def guarded(self, x):
        assert self is not head, "lm_head ran: the logits were built"
        return forward(self, x)

    return guarded


def test_num_items_in_batch_shift_labels_and_logits_to_keep_as_transformers():
    ids, labels = batch()
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    count = (shifted != -100).sum() + 5  # a bigger accumulated batch
    cases = [
        {"num_items_in_batch": count},
        {"shift_labels": shifted.flip(1)},
        {"logits_to_keep": 6, "labels_slice": slice(6, None)},
    ]
    for kwargs in cases:
        cut = kwargs.pop("labels_slice", slice(None))
        eager = tiny_llama()
        want = loss_and_grads(eager, ids, labels[:, cut], **kwargs)
        fused = tiny_llama()
        tnn.kernelize_loss(fused)
        assert_same(loss_and_grads(fused, ids, labels[:, cut], **kwargs), want)


def test_micro_batches_with_num_items_in_batch_add_up_to_the_big_batch():
    """Gradient accumulation as transformers' Trainer does it (Liger-Kernel#802)."""
    ids = torch.randint(0, VOCAB, (4, 10), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[0, :7] = -100
    labels[2, :] = -100  # a micro-batch of padding only
    big = tiny_llama()
    tnn.kernelize_loss(big)
    want = loss_and_grads(big, ids, labels)
    small = tiny_llama()
    tnn.kernelize_loss(small)
    count = (labels[:, 1:] != -100).sum()
    small.zero_grad()
    total = 0.0
    for row in range(4):
        loss = small(
            ids[row : row + 1], labels=labels[row : row + 1], num_items_in_batch=count
        ).loss
        assert loss.isfinite()
        loss.backward()
        total = total + loss.detach()
    torch.testing.assert_close(total, want[0].loss.detach(), rtol=1e-6, atol=1e-6)
    for name, p in small.named_parameters():
        torch.testing.assert_close(p.grad, want[1][name], rtol=1e-5, atol=1e-6, msg=name)


def test_eval_mode_and_calls_without_labels_keep_the_original_forward():
    model = tiny_llama()
    tnn.kernelize_loss(model)
    ids, labels = batch()
    assert model(ids).logits.shape == (2, 12, VOCAB)
    model.eval()
    out = model(ids, labels=labels)
    assert out.logits.shape == (2, 12, VOCAB) and out.loss.isfinite()
    model.train()
    as_tuple = model(ids, labels=labels, return_dict=False)
    assert isinstance(as_tuple, tuple) and as_tuple[0].ndim == 0


def test_compiled_fullgraph_training_step_matches_eager():
    torch._dynamo.reset()
    model = tiny_llama()
    ids, labels = batch()
    want = loss_and_grads(model, ids, labels)
    tnn.kernelize_loss(model)
    compiled = torch.compile(model, backend="aot_eager")
    compiled(ids, labels=labels).loss.backward()  # warm-up: compiled once
    got = loss_and_grads(compiled, ids, labels)
    assert got[0].logits is None
    assert_same((got[0], {k.removeprefix("_orig_mod."): g for k, g in got[1].items()}), want)


def test_what_cannot_be_served_is_skipped_with_its_reason():
    capped = tiny_llama(final_logit_softcapping=30.0)
    custom = tiny_llama()
    custom.loss_function = lambda logits, labels, vocab_size, **kw: logits.sum()
    report = tnn.kernelize_loss(torch.nn.ModuleDict({"capped": capped, "custom": custom}))
    reasons = {s.name: s.reason for s in report.skipped}
    assert reasons["capped"] == (
        "its config sets final_logit_softcapping=30.0: the forward transforms the logits"
    )
    assert reasons["custom"].startswith("its loss_function is <lambda>, not transformers'")
    assert report.swapped == [] and type(capped) is transformers.LlamaForCausalLM
    again = tiny_llama()
    assert len(tnn.kernelize_loss(again).swapped) == 1
    assert tnn.kernelize_loss(again).swapped == []  # swapped once
    with pytest.raises(ArgumentError, match=r"kernelize_loss: expected an nn.Module, got str"):
        tnn.kernelize_loss("model")
