"""`attn_implementation="tileops"` on transformers models nobody here wrote (tiny configs,
random weights, no downloads): forward, generate with a KV cache, a training step and padded
batches match `"sdpa"`; prefill, training and decode run through AttentionFwdOp; kernelize
sets it on request."""

from __future__ import annotations

import pytest
import torch

import tileops.nn as tnn
from tileops.nn import hf_attention
from tileops.ops.attention import prefill, varlen

transformers = pytest.importorskip("transformers")

TINY = {
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
MODELS = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}


def build(name: str = "llama", attention: str = "sdpa") -> torch.nn.Module:
    prefix = MODELS[name]
    config = getattr(transformers, f"{prefix}Config")(**TINY)
    torch.manual_seed(0)
    model = getattr(transformers, f"{prefix}ForCausalLM")(config)
    model.set_attn_implementation(attention)
    return model.eval()


def pair(name: str = "llama") -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same model (same weights) on "sdpa" and on "tileops"."""
    tnn.register_transformers_attention()
    return build(name), build(name, "tileops")


def tokens(batch: int = 2, length: int = 11, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, TINY["vocab_size"], (batch, length), generator=generator)


@pytest.fixture
def attention_calls(monkeypatch):
    """The (q_len, kv_len) of every AttentionFwdOp call its reference kernel serves (the op's
    own kernel on the CPU; a layout's later calls reach it by the op's lane, not `forward`)."""
    seen: list[tuple[int, int]] = []
    attend = prefill.attend

    def counting(q, k, v, **options):
        seen.append((q.shape[2], k.shape[2]))
        return attend(q, k, v, **options)

    monkeypatch.setattr(prefill, "attend", counting)
    return seen


@pytest.mark.parametrize("name", MODELS)
def test_forward_matches_sdpa_through_the_op(name, attention_calls):
    sdpa, ours = pair(name)
    ids = tokens()
    with torch.no_grad():
        want, got = sdpa(ids).logits, ours(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert attention_calls == [(11, 11)] * TINY["num_hidden_layers"]


def test_generate_with_a_kv_cache_matches_sdpa_and_decodes_through_the_op(attention_calls):
    sdpa, ours = pair()
    ids = tokens(length=7)
    options = {"max_new_tokens": 6, "do_sample": False, "return_dict_in_generate": True}
    want = sdpa.generate(ids, output_logits=True, **options)
    got = ours.generate(ids, output_logits=True, **options)
    assert torch.equal(got.sequences, want.sequences)
    for g, w in zip(got.logits, want.logits, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    decode_steps = [(q, k) for q, k in attention_calls if q == 1]
    assert decode_steps[:2] == [(1, 8), (1, 8)] and len(decode_steps) == 5 * 2  # 2 layers


def test_a_training_step_matches_sdpa():
    sdpa, ours = pair()
    sdpa.train(), ours.train()
    ids = tokens()
    for model in (sdpa, ours):
        model(ids, labels=ids).loss.backward()
    for (name, want), got in zip(sdpa.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_padded_batches_come_with_a_mask_and_run_through_sdpa(attention_calls):
    sdpa, ours = pair()
    ids = tokens()
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    with torch.no_grad():
        want = sdpa(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert attention_calls == []  # the masked calls went to transformers' SDPA function


def packed_row(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Sequences of `lengths` packed into one row, as DataCollatorWithFlattening packs them:
    ids, position ids restarting per sequence, and the flash-attention keywords."""
    ids = torch.cat([tokens(1, n, seed=i)[0] for i, n in enumerate(lengths)]).unsqueeze(0)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    offsets = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    flash = {"cu_seq_lens_q": offsets, "cu_seq_lens_k": offsets}
    flash |= {"max_length_q": max(lengths), "max_length_k": max(lengths)}
    return ids, positions, flash


def test_packed_sequences_run_through_the_varlen_op_as_each_sequence_alone(monkeypatch):
    seen = []
    attend_varlen = varlen.attend_varlen

    def counting(q, *args, **options):
        seen.append(q.shape[0])
        return attend_varlen(q, *args, **options)

    monkeypatch.setattr(varlen, "attend_varlen", counting)
    sdpa, ours = pair()
    lengths = [5, 9, 3]
    ids, positions, flash = packed_row(lengths)
    with torch.no_grad():
        got = ours(ids, position_ids=positions, **flash).logits[0]
        alone = [sdpa(tokens(1, n, seed=i)).logits[0] for i, n in enumerate(lengths)]
    torch.testing.assert_close(got, torch.cat(alone), rtol=1e-5, atol=1e-5)
    assert seen == [sum(lengths)] * TINY["num_hidden_layers"]


def test_a_packed_training_step_has_the_gradients_of_each_sequence_alone():
    sdpa, ours = pair()
    sdpa.train(), ours.train()
    lengths = [6, 4, 8]
    ids, positions, flash = packed_row(lengths)
    probe = torch.randn(
        sum(lengths), TINY["vocab_size"], generator=torch.Generator().manual_seed(3)
    )
    (ours(ids, position_ids=positions, **flash).logits[0] * probe).sum().backward()
    alone = [sdpa(tokens(1, n, seed=i)).logits[0] for i, n in enumerate(lengths)]
    (torch.cat(alone) * probe).sum().backward()
    for (name, want), got in zip(sdpa.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_calls_the_op_cannot_serve_fall_back_to_sdpa(attention_calls):
    q, k, v = (torch.randn(1, 4, 5, 8) for _ in range(3))
    module = torch.nn.Module()
    module.is_causal = True
    got, _ = hf_attention.attention_function(module, q, k, v, None, dropout=0.0, softcap=None)
    assert attention_calls == [(5, 5)]
    torch.manual_seed(0)
    dropped, _ = hf_attention.attention_function(module, q, k, v, None, dropout=0.5)
    assert attention_calls == [(5, 5)] and dropped.shape == got.shape  # dropout: SDPA's


def test_an_empty_static_cache_prefill_slices_the_empty_slots():
    """No mask with more keys than queries: SDPA's causal mask (top left) never reaches the
    slots past the queries; the op gets them sliced away."""
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8)
    k[:, :, 3:], v[:, :, 3:] = float("nan"), float("nan")  # empty slots
    module = torch.nn.Module()
    got, _ = hf_attention.attention_function(module, q, k, v, None, is_causal=True)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k[:, :, :3], v[:, :, :3], is_causal=True, enable_gqa=True
    )
    torch.testing.assert_close(got, want.transpose(1, 2))


def test_kernelize_sets_the_attention_on_request():
    tnn.register_transformers_attention()
    model = build()
    assert tnn.kernelize(model).attention == []  # not unless asked
    report = tnn.kernelize(model, attention=True)
    assert report.attention == ["(root)"]
    assert model.config._attn_implementation == "tileops"
    assert "attn_implementation 'tileops': (root)" in str(report)
    wrapper = torch.nn.Sequential(build())
    assert tnn.kernelize(wrapper, attention=True).attention == ["0"]


@pytest.fixture
def op_calls(monkeypatch):
    """The (q_len, kv_len) of every AttentionFwdOp call, whichever kernel serves it (on a GPU
    the reference kernel's `attend` serves none)."""
    seen: list[tuple[int, int]] = []
    call = prefill.AttentionFwdOp.__call__

    def counting(self, q, k, *rest, **kwargs):
        seen.append((q.shape[2], k.shape[2]))
        return call(self, q, k, *rest, **kwargs)

    monkeypatch.setattr(prefill.AttentionFwdOp, "__call__", counting)
    return seen


@pytest.mark.gpu
def test_on_the_gpu_prefill_and_decode_match_sdpa(op_calls):
    """bfloat16 on the GPU: the SDPA kernels and TileLang's serve the op's calls."""
    sdpa, ours = (m.to("cuda", torch.bfloat16) for m in pair())
    ids = tokens(length=40).cuda()
    with torch.no_grad():
        want, got = sdpa(ids).logits.float(), ours(ids).logits.float()
        assert float((got - want).norm() / want.norm()) < 2e-2
        options = {"max_new_tokens": 8, "do_sample": False}
        assert ours.generate(ids, **options).shape == sdpa.generate(ids, **options).shape
    assert (1, 41) in op_calls  # a decode step through the op
