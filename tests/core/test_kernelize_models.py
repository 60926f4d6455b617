"""`kernelize` on models nobody here wrote: transformers' causal LMs from tiny configs (random
weights, no downloads). Their own norm classes are swapped through the built-in declarations,
their nn.Linear layers by type, and the result computes and trains as the eager model does."""

from __future__ import annotations

import copy
import importlib
import io
import pickle
import subprocess
import sys

import pytest
import torch
from torch import nn

import tileops
import tileops.nn as tnn
from tileops import RMSNormFwdOp
from tileops.nn._transformers import BUILTIN

transformers = pytest.importorskip("transformers")

TINY = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# model -> (config class, model class, its norm class's name, config overrides)
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaRMSNorm", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "Qwen2RMSNorm", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", "MistralRMSNorm", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "Qwen3RMSNorm", {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", "Phi3RMSNorm", {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", "Olmo2RMSNorm", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", "GemmaRMSNorm", {}),  # scales by 1 + weight
    "cohere": ("CohereConfig", "CohereForCausalLM", "CohereLayerNorm", {"use_qk_norm": True}),
}
TRAINED = ["llama", "qwen2", "mistral", "gemma"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def build(name: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> nn.Module:
    """The tiny model `name` with random weights, norm weights included: transformers sets
    them to 1 (0 for Gemma), where a Llama-style norm's two roundings cannot differ."""
    config_name, model_name, _, overrides = MODELS[name]
    config = getattr(transformers, config_name)(**{**TINY, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "norm" in param_name:
                param.add_(torch.randn_like(param) * 0.3)
    return model.to(device, dtype)


def tokens(seed: int = 0, device: str = "cpu") -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, TINY["vocab_size"], (2, 12), generator=generator).to(device)


def norm_class(name: str) -> type[nn.Module]:
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    return getattr(module, MODELS[name][2])


# -- each built-in declaration against its class ----------------------------------------------


def declared_classes() -> list:
    params = []
    for path in BUILTIN:
        module, name = path.rsplit(".", 1)
        params.append(pytest.param(module, name, id=name))
    return params


CASES = {  # input dtype, parameter dtype
    "float32": (torch.float32, torch.float32),
    "bfloat16": (torch.bfloat16, torch.bfloat16),
    "float16": (torch.float16, torch.float16),
    "bfloat16_float32_params": (torch.bfloat16, torch.float32),
    "float32_bfloat16_params": (torch.float32, torch.bfloat16),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("module", "name"), declared_classes())
def test_each_builtin_declaration_computes_what_its_class_computes(module, name, case, device):
    """Same dtype out, and the same values: within one unit in the last place of a 16-bit
    dtype (a Llama-style norm rounds twice, the op once), float32's tolerance otherwise."""
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        pytest.skip(f"{name} is not in transformers {transformers.__version__}")
    x_dtype, param_dtype = CASES[case]
    torch.manual_seed(0)
    theirs = cls(64).to(device, param_dtype)
    with torch.no_grad():
        for param in theirs.parameters():
            param.copy_(torch.randn_like(param) * 0.5 + 1)
    ours = copy.deepcopy(theirs)
    report = tnn.kernelize(ours)
    if report.skipped:  # this transformers computes otherwise: the probe must have said so
        [skipped] = report.skipped
        assert "no longer computes what is declared for it" in skipped.reason
        pytest.skip(f"{name} in transformers {transformers.__version__}: {skipped.reason}")
    assert [s.source for s in report.swapped] == [cls]
    x = torch.randn(8, 64, dtype=torch.float64).mul(2).to(device, x_dtype)
    (out, grads), (expected, expected_grads) = (_run(m, x) for m in (ours, theirs))
    assert out.dtype == expected.dtype
    one_ulp = {"rtol": torch.finfo(out.dtype).eps, "atol": 1e-5}
    tolerance = one_ulp if out.dtype in (torch.float16, torch.bfloat16) else {}
    torch.testing.assert_close(out, expected, **tolerance)
    for got, want in zip(grads, expected_grads, strict=True):
        # 16-bit gradients sum over a row: bounded by a unit in the last place of the largest
        scale = torch.finfo(x_dtype).eps * want.abs().max().item()
        torch.testing.assert_close(
            got, want, **({} if x_dtype == torch.float32 else {"rtol": 0, "atol": 2 * scale})
        )


def _run(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaf = x.detach().clone().requires_grad_()
    out = module(leaf)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    grads = torch.autograd.grad(out, [leaf, *module.parameters()], grad)
    return out, [g.float() for g in grads]


# -- whole models ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_every_norm_and_linear_of_a_model_is_swapped_and_runs_through_the_ops(name):
    model = build(name)
    norms = [n for n, m in model.named_modules() if type(m) is norm_class(name)]
    linears = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    params = list(model.parameters())

    report = tnn.kernelize(model)

    swapped = {s.name: s for s in report.swapped}
    skipped = {s.name: s.reason for s in report.skipped}
    served_norms = [n for n in norms if n not in skipped]
    assert set(swapped) == {*served_norms, *linears}
    assert all(
        swapped[n].semantics == tnn.declared_semantics(norm_class(name)) for n in served_norms
    )
    assert all(isinstance(model.get_submodule(n), norm_class(name)) for n in norms)
    assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
    with torch.no_grad(), tileops.record() as record:
        model(tokens())
    ran = {served.op for served in record.counts}
    norm_op = "tileops::LayerNormFwdOp" if name == "cohere" else "tileops::RMSNormFwdOp"
    assert {norm_op, "tileops::GemmOp"} <= ran
    if name == "cohere":  # q/k norms: a (heads, head_dim) weight broadcast over the heads
        assert skipped and all("not a 1-D tensor" in reason for reason in skipped.values())
        assert all(n.endswith(("q_norm", "k_norm")) for n in skipped)
    else:
        assert skipped == {}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", MODELS)
def test_forward_matches_eager(name, dtype, device):
    reference = build(name, dtype, device)
    model = copy.deepcopy(reference)
    tnn.kernelize(model)
    with torch.no_grad():
        batch = tokens(device=device)
        out, expected = model(batch).logits, reference(batch).logits
    assert out.dtype == expected.dtype == dtype
    # bfloat16: a Llama-style norm may differ by one unit in the last place, carried on
    tolerance = {"rtol": 2e-2, "atol": 1e-2} if dtype == torch.bfloat16 else _fp32(device)
    torch.testing.assert_close(out, expected, **tolerance)


def _fp32(device: str) -> dict:
    """float32 tolerance: torch's own on the CPU (same functions); on the GPU the kernels sum
    in another order than cuBLAS and torch's norms, and three SGD steps carry it on."""
    return {} if device == "cpu" else {"rtol": 1e-4, "atol": 1e-5}


def _train(model: nn.Module, steps: int = 3) -> tuple[list[float], list[list[torch.Tensor]]]:
    """Losses and gradients of `steps` SGD steps on fixed batches."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    losses, grads = [], []
    model.train()
    for step in range(steps):
        optimizer.zero_grad()
        batch = tokens(step, next(model.parameters()).device.type)
        loss = model(batch, labels=batch).loss
        loss.backward()
        losses.append(loss.item())
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
    return losses, grads


def _assert_same_training(got: tuple, expected: tuple, device: str = "cpu") -> None:
    (losses, grads), (expected_losses, expected_grads) = got, expected
    torch.testing.assert_close(losses, expected_losses, **_fp32(device))
    for step, (mine, theirs) in enumerate(zip(grads, expected_grads, strict=True)):
        for k, (g, e) in enumerate(zip(mine, theirs, strict=True)):
            torch.testing.assert_close(g, e, msg=f"step {step}, parameter {k}", **_fp32(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", TRAINED)
def test_training_steps_match_eager(name, device):
    reference = build(name, device=device)
    model = copy.deepcopy(reference)
    tnn.kernelize(model)
    _assert_same_training(_train(model), _train(reference), device)


def _train_counting_norms(model: nn.Module, monkeypatch) -> tuple[tuple, int]:
    """Two training steps of `model`, and the RMSNormFwdOp calls they made, in any thread: on
    GPUs autograd recomputes a checkpointed layer in a thread of its own, outside the
    caller's context (where `tileops.record` counts)."""
    calls, call = [], RMSNormFwdOp.__call__

    def counted(self, *args, **kwargs):
        calls.append(None)
        return call(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(RMSNormFwdOp, "__call__", counted)
        trained = _train(model, steps=2)
    return trained, len(calls)


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_gradient_checkpointing_through_a_kernelized_model(reentrant, device, monkeypatch):
    """torch.utils.checkpoint, as transformers applies it per decoder layer: the layers' norms
    run again in the backward pass, through the op, and the training is the eager one."""
    reference = build("llama", device=device)
    model, plain = copy.deepcopy(reference), copy.deepcopy(reference)
    tnn.kernelize(model), tnn.kernelize(plain)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    if reentrant:  # a reentrant checkpoint needs an input that requires grad
        model.enable_input_require_grads()
    (trained, calls), (_, plain_calls) = (
        _train_counting_norms(m, monkeypatch) for m in (model, plain)
    )
    assert calls == plain_calls + 2 * 2 * TINY["num_hidden_layers"]  # 2 steps, 2 norms a layer
    _assert_same_training(trained, _train(reference, steps=2), device)


@pytest.mark.parametrize(
    "copier",
    [
        copy.deepcopy,
        lambda m: pickle.loads(pickle.dumps(m)),
        lambda m: _torch_load(m),
    ],
    ids=["deepcopy", "pickle", "torch_save"],
)
def test_a_kernelized_model_copies_pickles_and_saves(copier):
    model = build("llama")
    reference_keys = list(model.state_dict())
    tnn.kernelize(model)
    clone = copier(model)
    kinds = {type(m) for m in clone.modules()} & {type(m) for m in model.modules()}
    assert type(clone.model.norm) is type(model.model.norm) and tnn.Linear in kinds
    assert list(clone.state_dict()) == reference_keys
    with torch.no_grad():
        torch.testing.assert_close(clone(tokens()).logits, model(tokens()).logits)
    assert tnn.kernelize(clone).swapped == []


def _torch_load(model: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_a_saved_kernelized_model_loads_in_a_fresh_process(tmp_path):
    """The generated classes are rebuilt on load: no kernelize, no declaration needed there."""
    model = build("gemma")
    tnn.kernelize(model)
    with torch.no_grad():
        torch.save({"model": model, "logits": model(tokens()).logits}, tmp_path / "model.pt")
    code = f"""
import torch
saved = torch.load({str(tmp_path / "model.pt")!r}, weights_only=False)
model, batch = saved["model"], torch.tensor({tokens().tolist()})
assert type(model.model.norm).__module__ == "tileops.nn.declared", type(model.model.norm)
with torch.no_grad():
    torch.testing.assert_close(model(batch).logits, saved["logits"])
"""
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_state_dict_loads_between_eager_and_kernelized_models():
    eager, kernelized = build("llama"), build("llama")
    tnn.kernelize(kernelized)
    with torch.no_grad():
        for p in eager.parameters():
            p.mul_(1.5)
    kernelized.load_state_dict(eager.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(kernelized(tokens()).logits, eager(tokens()).logits)
