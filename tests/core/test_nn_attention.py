"""tileops.nn.MultiheadAttention against torch.nn.MultiheadAttention with the same weights:
the calls the op serves (through it), the calls torch's forward keeps (weights, padding masks,
dropout while training), construction refusals, kernelize and compile."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tileops.nn as tnn
from tileops import OpConfigError
from tileops.ops.attention import prefill


@pytest.fixture
def op_calls(monkeypatch):
    """The (q_len, kv_len, causal) of every AttentionFwdOp call its reference kernel serves
    (the op's own kernel on the CPU; a layout's later calls reach it by the op's lane)."""
    seen: list[tuple[int, int, bool]] = []
    attend = prefill.attend

    def counting(q, k, v, **options):
        seen.append((q.shape[2], k.shape[2], options["causal"]))
        return attend(q, k, v, **options)

    monkeypatch.setattr(prefill, "attend", counting)
    return seen


def pair(**config) -> tuple[nn.MultiheadAttention, tnn.MultiheadAttention]:
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(32, 4, **config)
    ours = tnn.MultiheadAttention(32, 4, **config)
    ours.load_state_dict(theirs.state_dict())
    return theirs.eval(), ours.eval()


def inputs(batch_first: bool, length: int = 6, source: int = 6, kdim: int = 32, vdim: int = 32):
    torch.manual_seed(1)
    shape = (lambda n, e: (3, n, e)) if batch_first else (lambda n, e: (n, 3, e))
    return (
        torch.randn(shape(length, 32)),
        torch.randn(shape(source, kdim)),
        torch.randn(shape(source, vdim)),
    )


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_self_and_cross_attention_match_torch_through_the_op(batch_first, bias, op_calls):
    theirs, ours = pair(batch_first=batch_first, bias=bias)
    q, k, v = inputs(batch_first, length=5, source=9)
    for args in ((q, q, q), (q, k, v)):
        want, _ = theirs(*args, need_weights=False)
        got, weights = ours(*args, need_weights=False)
        torch.testing.assert_close(got, want)
        assert weights is None
    assert op_calls == [(5, 5, False), (5, 9, False)]


def test_separate_key_and_value_dims(op_calls):
    theirs, ours = pair(kdim=12, vdim=20, batch_first=True)
    q, k, v = inputs(True, kdim=12, vdim=20)
    torch.testing.assert_close(
        ours(q, k, v, need_weights=False)[0], theirs(q, k, v, need_weights=False)[0]
    )
    assert len(op_calls) == 1


def test_an_unbatched_call(op_calls):
    theirs, ours = pair()
    x = torch.randn(7, 32)
    torch.testing.assert_close(
        ours(x, x, x, need_weights=False)[0], theirs(x, x, x, need_weights=False)[0]
    )
    assert op_calls == [(7, 7, False)]


def test_the_causal_hint_runs_the_causal_op(op_calls):
    theirs, ours = pair(batch_first=True)
    x, _, _ = inputs(True)
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    want, _ = theirs(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)
    got, _ = ours(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)
    torch.testing.assert_close(got, want)
    assert op_calls == [(6, 6, True)]


def test_calls_with_other_semantics_run_torch_s_own_forward(op_calls):
    theirs, ours = pair(batch_first=True, dropout=0.5)
    q, k, v = inputs(True, source=9)
    padding = torch.zeros(3, 9, dtype=torch.bool)
    padding[0, -2:] = True
    for kwargs in ({}, {"key_padding_mask": padding, "need_weights": False}):
        want, want_weights = theirs(q, k, v, **kwargs)
        got, got_weights = ours(q, k, v, **kwargs)
        torch.testing.assert_close(got, want)
        assert (got_weights is None) == (want_weights is None)
    ours.train()
    torch.manual_seed(3)
    ours(q, k, v, need_weights=False)  # dropout while training
    mask = torch.ones(6, 9, dtype=torch.bool).tril(3)  # a causal hint, top left, q shorter
    ours.eval()(q, k, v, attn_mask=mask, need_weights=False, is_causal=True)
    assert op_calls == []


def test_gradients_match_torch():
    theirs, ours = pair(batch_first=True)
    q, k, v = inputs(True, source=8)
    for module in (theirs, ours):
        module.train()
        module(q, k, v, need_weights=False)[0].square().sum().backward()
    for (name, want), got in zip(theirs.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, msg=name)


@pytest.mark.parametrize("config", [{"add_bias_kv": True}, {"add_zero_attn": True}])
def test_extra_key_rows_are_refused_at_construction(config):
    name = next(iter(config))
    with pytest.raises(OpConfigError, match=rf"MultiheadAttention: {name}=True appends key/value"):
        tnn.MultiheadAttention(32, 4, **config)


def test_a_torch_module_becomes_one_by_its_class_and_keeps_its_state():
    """What kernelize does to the modules it swaps; it leaves nn.MultiheadAttention alone (its
    owners, such as nn.TransformerEncoderLayer, bypass its forward on their fast path)."""
    theirs, _ = pair(batch_first=True)
    x, _, _ = inputs(True)
    want, _ = theirs(x, x, x, need_weights=False)
    theirs.__class__ = tnn.MultiheadAttention
    torch.testing.assert_close(theirs(x, x, x, need_weights=False)[0], want)
    assert tnn.MultiheadAttention.refusal(theirs) is None
    assert nn.MultiheadAttention not in tnn.KERNELIZED


def test_compiles_fullgraph():
    _, ours = pair(batch_first=True)
    x, _, _ = inputs(True)
    compiled = torch.compile(
        lambda x: ours(x, x, x, need_weights=False)[0], fullgraph=True, backend="aot_eager"
    )
    torch.testing.assert_close(compiled(x), ours(x, x, x, need_weights=False)[0])
