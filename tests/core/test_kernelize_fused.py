"""kernelize's fused swaps in transformers models (gated MLPs through GLUFwdOp, the attention's
rotary call through RotaryFwdOp): each declaration against transformers' source, a tiny Llama
computing and training as eager, 50 training steps on the fused ops, and gradient accumulation."""

from __future__ import annotations

import copy
import importlib
import inspect
import pickle
import re
import warnings

import pytest
import torch
from op_helpers import Capture
from torch import nn

import tileops
import tileops.nn as tnn
from tileops.nn._transformers import GATED_MLPS, ROTARY_FUNCTIONS
from tileops.nn.fused_layers import _tileops_rotary, plain_function

transformers = pytest.importorskip("transformers")
modeling_llama = importlib.import_module("transformers.models.llama.modeling_llama")
modeling_phi3 = importlib.import_module("transformers.models.phi3.modeling_phi3")

TINY = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
FUSED_OPS = {"tileops::GLUFwdOp", "tileops::RotaryFwdOp"}


def build(device: str = "cpu", dtype: torch.dtype = torch.float32, **overrides) -> nn.Module:
    config = transformers.LlamaConfig(**{**TINY, **overrides})
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(device, dtype)


def tokens(seed: int = 0, device: str = "cpu", batch: int = 2) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, TINY["vocab_size"], (batch, 12), generator=generator).to(device)


def source_lines(obj: object) -> list[str]:
    """`obj`'s source without docstrings, comments, decorators and blank lines."""
    text = re.sub(r'"""(.|\n)*?"""', "", inspect.getsource(obj))
    lines = [line.strip() for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "@"))]


def resolve(path: str) -> object:
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


# -- declarations ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(GATED_MLPS), ids=lambda p: p.rsplit(".", 1)[-1])
def test_each_declared_gated_mlp_computes_llamas_forward(path):
    cls = resolve(path)
    expected = source_lines(modeling_llama.LlamaMLP.forward)
    assert source_lines(cls.forward)[1:] == expected[1:]  # the body; the parameter may differ
    assert list(inspect.signature(cls.forward).parameters) == ["self", "x"]


@pytest.mark.parametrize("path", sorted(ROTARY_FUNCTIONS), ids=lambda p: p.split(".")[2])
def test_each_declared_rotary_function_is_llamas_or_phi3s(path):
    module = importlib.import_module(path.rsplit(".", 1)[0])
    reference = modeling_phi3 if ROTARY_FUNCTIONS[path] else modeling_llama
    ours, theirs = (plain_function(m.apply_rotary_pos_emb) for m in (module, reference))
    assert source_lines(ours) == source_lines(theirs)
    assert source_lines(module.rotate_half) == source_lines(modeling_llama.rotate_half)


def test_a_function_behind_a_hub_kernel_wrapper_module_is_found():
    """transformers 5.25 makes the functions it marks for hub kernels (`apply_rotary_pos_emb`)
    modules of the kernels package, each calling the function held in its forward's closure."""

    def rotate(q):
        return q

    def wrapped(func):
        class Func(nn.Module):
            def forward(self, *args):
                return func(*args)

        return Func()

    assert plain_function(wrapped(rotate)) is rotate
    assert plain_function(rotate) is rotate
    assert plain_function(torch.nn.Linear(2, 2)) is None and plain_function(None) is None


# -- a tiny Llama ------------------------------------------------------------------------------


def test_kernelize_reports_the_fused_mlps_and_attentions_and_patches_no_module():
    model = build()
    original = modeling_llama.apply_rotary_pos_emb
    report = tnn.kernelize(model)
    layers = range(TINY["num_hidden_layers"])
    expected = {f"model.layers.{i}.{part}" for i in layers for part in ("mlp", "self_attn")}
    assert {s.name for s in report.fused} == expected
    assert all(isinstance(model.get_submodule(s.name), s.source) for s in report.fused)
    assert "fused 4" in str(report) and "through GLUFwdOp" in str(report)
    assert "apply_rotary_pos_emb through RotaryFwdOp" in str(report)
    assert modeling_llama.apply_rotary_pos_emb is original
    with torch.no_grad(), tileops.record() as record:
        build()(tokens())  # a model not kernelized runs no fused op
    assert not FUSED_OPS & {served.op for served in record.counts}


def test_fused_false_leaves_mlps_and_attention_alone():
    model = build()
    report = tnn.kernelize(model, fused=False)
    assert report.fused == []
    with torch.no_grad(), tileops.record() as record:
        model(tokens())
    assert not FUSED_OPS & {served.op for served in record.counts}


def _loss_and_grads(model: nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, list]:
    model.zero_grad()
    out = model(batch, labels=batch)
    out.loss.backward()
    return out.logits.detach(), [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_a_kernelized_llama_computes_and_differentiates_as_eager(dtype, device):
    reference = build(device, dtype)
    model = copy.deepcopy(reference)
    tnn.kernelize(model)
    with tileops.record() as record:
        logits, grads = _loss_and_grads(model, tokens(device=device))
    expected_logits, expected_grads = _loss_and_grads(reference, tokens(device=device))
    ran = {(served.op, served.interface) for served in record.counts}
    assert {(op, i) for op in FUSED_OPS for i in ("backward",)} <= ran
    assert {("tileops::GLUFwdOp", "glu"), ("tileops::RotaryFwdOp", "rotary")} <= ran
    # bfloat16: the fused ops round once where eager rounds after every step
    tolerance = {"rtol": 3e-2, "atol": 3e-2} if dtype == torch.bfloat16 else {}
    if device == "cuda" and dtype == torch.float32:
        tolerance = {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(logits, expected_logits, **tolerance)
    for k, (g, e) in enumerate(zip(grads, expected_grads, strict=True)):
        scale = e.float().abs().max().clamp_min(1e-6)
        assert ((g.float() - e.float()).abs().max() / scale).item() < (
            5e-2 if dtype == torch.bfloat16 else 1e-4
        ), f"parameter {k}"


def test_an_mlp_whose_activation_is_no_glu_is_skipped_and_one_changed_later_runs_its_own():
    model = build()
    model.model.layers[0].mlp.act_fn = nn.ReLU()
    report = tnn.kernelize(model)
    skipped = {s.name: s.reason for s in report.skipped}
    assert (
        "its act_fn is ReLU, which is none of the GLU activations" in skipped["model.layers.0.mlp"]
    )
    mlp = model.model.layers[1].mlp
    assert type(mlp).__module__ == "tileops.nn.fused_layers"
    mlp.act_fn = nn.Tanh()
    x = torch.randn(2, 3, TINY["hidden_size"])
    with torch.no_grad():
        expected = mlp.down_proj(torch.tanh(mlp.gate_proj(x)) * mlp.up_proj(x))
        torch.testing.assert_close(mlp(x), expected)


@pytest.mark.parametrize(
    ("act", "fused"),
    [
        ("silu", "silu"),
        ("gelu", "gelu"),
        ("gelu_pytorch_tanh", "gelu_tanh"),
        ("gelu_new", "gelu_tanh"),
    ],
)
def test_each_activation_maps_to_its_glu(act, fused):
    model = build(hidden_act=act)
    tnn.kernelize(model)
    with torch.no_grad(), tileops.record() as record:
        model(tokens())
    acts = {served.call.act for served in record.counts if served.op == "tileops::GLUFwdOp"}
    assert acts == {fused}


def test_the_rotary_call_falls_back_to_transformers_where_the_op_does_not_serve_it():
    rotary = _tileops_rotary(modeling_llama.apply_rotary_pos_emb, partial=False)
    q, k = (
        torch.randn(1, 2, 3, 8, dtype=torch.bfloat16),
        torch.randn(1, 2, 3, 8, dtype=torch.bfloat16),
    )
    cos, sin = torch.randn(1, 3, 8), torch.randn(1, 3, 8)  # float32 tables: eager promotes
    with tileops.record() as record:
        got = rotary(q, k, cos, sin)
    assert not record.counts
    for g, e in zip(got, modeling_llama.apply_rotary_pos_emb(q, k, cos, sin), strict=True):
        assert g.dtype == torch.float32 and torch.equal(g, e)
    with pytest.raises(RuntimeError):  # Llama's rotates full width: narrower tables fail there
        rotary(q.float(), k.float(), cos[..., :4], sin[..., :4])
    partial = _tileops_rotary(modeling_phi3.apply_rotary_pos_emb, partial=True)
    with tileops.record() as record:
        partial(q.float(), k.float(), cos[..., :4], sin[..., :4])
    assert {served.op for served in record.counts} == {"tileops::RotaryFwdOp"}


def test_a_fused_model_pickles_and_deep_copies():
    model = build()
    tnn.kernelize(model)
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert type(clone.model.layers[0].mlp) is type(model.model.layers[0].mlp)
        assert type(clone.model.layers[0].self_attn) is type(model.model.layers[0].self_attn)
        with torch.no_grad():
            torch.testing.assert_close(clone(tokens()).logits, model(tokens()).logits)
        assert tnn.kernelize(clone).fused == []


# -- training --------------------------------------------------------------------------------------


@pytest.fixture
def one_thread():
    """Tiny matrices: one CPU thread is fastest, and immune to a busy machine's other work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _losses(model: nn.Module, steps: int, device: str) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        batch = tokens(step % 5, device)  # five batches, seen ten times: the loss must fall
        loss = model(batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize(
    ("device", "dtype"),
    [("cpu", torch.float32), pytest.param("cuda", torch.bfloat16, marks=pytest.mark.gpu)],
    ids=["cpu-float32", "cuda-bfloat16"],
)
def test_fifty_training_steps_converge_as_eager(device, dtype, one_thread):
    reference = build(device, dtype)
    model = copy.deepcopy(reference)
    tnn.kernelize(model)
    with tileops.record() as record:
        losses = _losses(model, 50, device)
    expected = _losses(reference, 50, device)
    assert FUSED_OPS <= {served.op for served in record.counts}
    assert losses[-1] < 0.8 * losses[0]
    tolerance = (
        {"rtol": 5e-2, "atol": 5e-2} if dtype == torch.bfloat16 else {"rtol": 1e-3, "atol": 1e-4}
    )
    torch.testing.assert_close(losses, expected, **tolerance)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_accumulation_over_four_micro_batches_matches_one_batch(device, one_thread):
    model = build(device)
    tnn.kernelize(model)
    batch = tokens(0, device, batch=8)
    model.zero_grad()
    loss = model(batch, labels=batch).loss
    loss.backward()
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for micro in batch.chunk(4):
        (model(micro, labels=micro).loss / 4).backward()
    tolerance = {} if device == "cpu" else {"rtol": 1e-4, "atol": 1e-5}
    for k, (g, e) in enumerate(zip((p.grad for p in model.parameters()), whole, strict=True)):
        torch.testing.assert_close(
            g, e, msg=f"parameter {k}", **{"rtol": 1e-5, "atol": 1e-6, **tolerance}
        )


def test_a_fused_llama_compiles_without_graph_breaks_and_trains_as_eager():
    """Dynamo traces the rebound attention forward (its own globals) and the ops' operators."""
    import torch._dynamo

    reference = build(num_hidden_layers=1)
    model = copy.deepcopy(reference)
    tnn.kernelize(model)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    capture = Capture()
    compiled = torch.compile(model, backend=capture)
    batch = tokens()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = compiled(batch, labels=batch).loss
    loss.backward()
    expected = reference(batch, labels=batch).loss
    expected.backward()
    assert not torch._dynamo.utils.counters["graph_break"]
    assert not [w for w in caught if "lru_cache" in str(w.message)]  # nothing of ours to warn
    # the Linears torch's kernel serves trace as torch's; the fused ops stay operator nodes
    assert "tileops.GemmOp.default" not in capture.ops() and "aten.mm.default" in capture.ops()
    assert {"tileops.GLUFwdOp.default", "tileops.RotaryFwdOp.default"} <= capture.tileops()
    torch.testing.assert_close(loss, expected)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)


def _attention_class(decorate):
    """An attention-like class whose forward calls Llama's `apply_rotary_pos_emb` by its
    global name, under `decorate`."""
    scope = {"apply_rotary_pos_emb": modeling_llama.apply_rotary_pos_emb, "nn": nn}
    exec(  # a module of its own: the forward's globals are this scope
        "class Attention(nn.Module):\n"
        "    def forward(self, q, k, cos, sin):\n"
        "        return apply_rotary_pos_emb(q, k, cos, sin)\n",
        scope,
    )
    cls = scope["Attention"]
    cls.forward = decorate(cls.forward)
    return cls


def test_decorated_forwards_are_rebound_through_closures_or_left_alone():
    import functools

    from tileops.nn.fused_layers import fused_class

    def closure(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            return func(*args, **kwargs)

        return wrapper

    class Calls:  # where the wrapper below holds the function: not in a closure cell
        held = None

    def opaque(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            return Calls.held(*args, **kwargs)

        Calls.held = func
        return wrapper

    served = _attention_class(closure)
    generated = fused_class(served)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    cos, sin = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    module = served()
    module.__class__ = generated
    with tileops.record() as record:
        got = module(q, k, cos, sin)
    assert {s.op for s in record.counts} == {"tileops::RotaryFwdOp"}
    for g, e in zip(got, modeling_llama.apply_rotary_pos_emb(q, k, cos, sin), strict=True):
        torch.testing.assert_close(g, e)
    assert fused_class(_attention_class(opaque)) is None


def test_a_declared_class_or_function_that_computes_something_else_is_skipped(monkeypatch):
    """A library may change what a declared class computes: a probe catches it before the
    swap (here the MLP's gate and up trade places, the rotary function turns the other way)."""
    from tileops.nn import fused_layers

    def swapped_mlp(self, x):
        return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))

    def turned(q, k, cos, sin, unsqueeze_dim=1):
        return modeling_llama.apply_rotary_pos_emb(q, k, cos, -sin, unsqueeze_dim)

    turned.__module__, turned.__qualname__ = modeling_llama.__name__, "apply_rotary_pos_emb"
    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", swapped_mlp)
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", turned)
    monkeypatch.setattr(fused_layers, "_MLP_PROBES", {})
    fused_layers._rotary_probe.cache_clear()
    try:
        report = tnn.kernelize(build())
    finally:
        fused_layers._rotary_probe.cache_clear()
    skipped = {s.name: s.reason for s in report.skipped}
    assert report.fused == []
    assert (
        "differs from down_proj(act_fn(gate_proj(x)) * up_proj(x))" in skipped["model.layers.0.mlp"]
    )
    reason = skipped["model.layers.0.self_attn"]
    assert "modeling_llama.apply_rotary_pos_emb differs from the op on a probe input" in reason


def test_a_rebound_forward_compiles_where_its_librarys_global_is_a_module(monkeypatch):
    """torch.compile guards a rebound forward's globals through the module they name; the
    library's own module may hold something else under the rebound name (transformers 5.25: a
    hub-kernel wrapper module with no `__defaults__`), so the globals are a module of their own."""
    import sys
    import types

    import torch._dynamo

    from tileops.nn.fused_layers import _rebound

    library = types.ModuleType("library_with_a_wrapped_global")
    exec("def forward(x):\n    return helper(x) + 1\n", library.__dict__)
    library.helper = nn.Identity()  # a module instance where a function was
    monkeypatch.setitem(sys.modules, library.__name__, library)

    def doubled(x, scale=2):
        return x * scale

    rebound = _rebound(library.forward, "helper", doubled)

    def model(x):  # the forward inlined into a compiled caller, as a layer's is
        return rebound(x) * 1

    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))
    assert library.helper.__class__ is nn.Identity  # the library's module is left as it was
