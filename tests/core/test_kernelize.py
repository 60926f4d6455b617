"""`tileops.nn.kernelize` on small models: same outputs, gradients and optimizer steps as before,
the same parameter objects, and a report of what was swapped and what was skipped."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tileops.nn as tnn
from tileops import ArgumentError

D, HEADS, VOCAB = 16, 2, 50


class Block(nn.Module):
    """embedding -> RMSNorm -> attention (nn.Linear projections, nn.Softmax) -> LayerNorm -> MLP,
    with the output projection tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.norm1 = nn.RMSNorm(D, eps=1e-6)
        self.qkv = nn.Linear(D, 3 * D)
        self.softmax = nn.Softmax(dim=-1)
        self.proj = nn.Linear(D, D, bias=False)
        self.norm2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        q, k, v = self.qkv(self.norm1(h)).chunk(3, dim=-1)
        split = (*tokens.shape, HEADS, D // HEADS)
        q, k, v = (t.reshape(split).transpose(1, 2) for t in (q, k, v))
        attn = self.softmax(q @ k.transpose(-1, -2) / (D // HEADS) ** 0.5) @ v
        h = h + self.proj(attn.transpose(1, 2).reshape(*tokens.shape, D))
        h = h + self.mlp(self.norm2(h))
        return self.head(h)


class ResBlock(nn.Module):
    """conv -> BatchNorm2d -> relu -> conv -> BatchNorm2d, plus the residual."""

    def __init__(self, channels: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels, momentum=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))


def _images() -> torch.Tensor:
    return torch.randn(3, 4, 6, 6, generator=torch.Generator().manual_seed(0))


MODELS = {"transformer": (Block, _tokens), "resnet": (ResBlock, _images)}
SWAPPED = {
    "transformer": {
        "norm1": nn.RMSNorm,
        "qkv": nn.Linear,
        "softmax": nn.Softmax,
        "proj": nn.Linear,
        "norm2": nn.LayerNorm,
        "mlp.0": nn.Linear,
        "mlp.2": nn.Linear,
        "head": nn.Linear,
    },
    "resnet": {"bn1": nn.BatchNorm2d, "bn2": nn.BatchNorm2d},
}


def _models(name: str) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    make, inputs = MODELS[name]
    torch.manual_seed(0)
    model = make()
    return model, copy.deepcopy(model), inputs()


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
    optimizer.zero_grad()
    out = model(x)
    out.square().mean().backward()
    optimizer.step()
    return out.detach()


def _assert_same(model: nn.Module, reference: nn.Module) -> None:
    mine, expected = model.state_dict(), reference.state_dict()
    assert list(mine) == list(expected)
    for name, value in mine.items():
        torch.testing.assert_close(value, expected[name], msg=name)


@pytest.mark.parametrize("name", MODELS)
def test_kernelize_keeps_results_gradients_and_optimizer_steps(name):
    model, reference, x = _models(name)
    params = list(model.parameters())
    buffers = list(model.buffers())
    # SGD, not Adam: Adam turns the rounding noise of a zero gradient (the key bias, which
    # softmax cancels) into a full step, so two exact implementations would drift apart.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # made before the swap
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)

    report = tnn.kernelize(model)

    assert {s.name: s.source for s in report.swapped} == SWAPPED[name]
    assert all(s.target is tnn.KERNELIZED[s.source] for s in report.swapped)
    assert report.skipped == []
    assert all(p is q for p, q in zip(model.parameters(), params, strict=True))
    assert all(b is c for b, c in zip(model.buffers(), buffers, strict=True))
    for _ in range(2):  # train: outputs, gradients, optimizer steps and running stats agree
        expected = _step(reference, reference_optimizer, x)
        torch.testing.assert_close(_step(model, optimizer, x), expected)
        _assert_same(model, reference)
    model.eval(), reference.eval()
    torch.testing.assert_close(model(x), reference(x))


def test_tied_weights_stay_tied():
    model, _, _ = _models("transformer")
    tnn.kernelize(model)
    assert model.head.weight is model.embed.weight
    assert isinstance(model.head, tnn.Linear)


def test_mode_device_dtype_and_hooks_are_kept():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).double().eval()
    calls = []
    model[0].register_forward_hook(lambda *_: calls.append("hook"))
    tnn.kernelize(model)
    assert not model.training and not model[1].training
    assert all(p.dtype == torch.float64 and p.device.type == "cpu" for p in model.parameters())
    model(torch.randn(3, 4, dtype=torch.float64))
    assert calls == ["hook"]


def test_a_shared_module_is_swapped_once_and_the_root_too():
    shared = nn.LayerNorm(4)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    report = tnn.kernelize(model)
    assert [s.name for s in report.swapped] == ["0"] and type(model[2]) is tnn.LayerNorm
    root = nn.Linear(3, 2)
    assert [s.name for s in tnn.kernelize(root).swapped] == ["(root)"]
    assert type(root) is tnn.Linear


def test_modules_restricts_the_types_swapped():
    model, _, _ = _models("transformer")
    report = tnn.kernelize(model, modules=[nn.LayerNorm, nn.RMSNorm])
    assert sorted(s.name for s in report.swapped) == ["norm1", "norm2"]
    assert type(model.qkv) is nn.Linear


def test_modules_naming_an_unsupported_type_is_an_error():
    with pytest.raises(ValueError, match="argument 'modules'.*Conv2d"):
        tnn.kernelize(nn.Linear(2, 2), modules=[nn.Conv2d])


def test_kernelize_twice_swaps_nothing_more():
    model, _, _ = _models("resnet")
    tnn.kernelize(model)
    again = tnn.kernelize(model)
    assert again.swapped == [] and again.skipped == []


class MyNorm(nn.LayerNorm):
    pass


def test_subclasses_unsupported_configs_and_replaced_forwards_are_skipped_with_reasons():
    hooked = nn.Linear(4, 4)
    hooked.forward = lambda x: x  # as accelerate's hooks do
    model = nn.ModuleDict(
        {
            "sub": MyNorm(4),
            "bad_eps": nn.RMSNorm(4, eps=-1.0),  # torch accepts it; the op does not
            "half_ok": nn.LayerNorm(4, elementwise_affine=False, bias=False),
            "hooked": hooked,
            "attn": nn.MultiheadAttention(4, 2),  # its out_proj is a Linear subclass
        }
    )
    report = tnn.kernelize(model)
    assert [s.name for s in report.swapped] == ["half_ok"]
    reasons = {s.name: s.reason for s in report.skipped}
    assert set(reasons) == {"sub", "bad_eps", "hooked", "attn.out_proj"}
    assert "only exact types" in reasons["sub"] and "only exact types" in reasons["attn.out_proj"]
    assert "'eps'" in reasons["bad_eps"]
    assert "forward is replaced" in reasons["hooked"]
    assert type(model["sub"]) is MyNorm and type(model["bad_eps"]) is nn.RMSNorm


def test_report_prints_as_tables():
    model = nn.Sequential(nn.Linear(2, 2), MyNorm(2))
    text = str(tnn.kernelize(model))
    assert "swapped 1 module(s)" in text and "torch.nn.Linear" in text
    assert "tileops.nn.Linear" in text and "skipped 1" in text
    assert "test_kernelize.MyNorm" in text


def test_modules_takes_a_single_class():
    model, _, _ = _models("transformer")
    report = tnn.kernelize(model, modules=nn.LayerNorm)
    assert [s.name for s in report.swapped] == ["norm2"]
    assert type(model.norm1) is nn.RMSNorm


@pytest.mark.parametrize("modules", ["LayerNorm", b"LayerNorm"])
def test_modules_as_a_string_is_refused_naming_the_argument(modules):
    with pytest.raises(ArgumentError, match=r"^kernelize\(\): argument 'modules' takes a torch"):
        tnn.kernelize(nn.LayerNorm(2), modules=modules)


@pytest.mark.parametrize("modules", [[nn.LayerNorm(2)], [nn.LayerNorm, "Linear"], 3])
def test_modules_holding_other_than_classes_is_refused_naming_what(modules):
    with pytest.raises(ArgumentError, match=r"^kernelize\(\): argument 'modules' takes a torch"):
        tnn.kernelize(nn.LayerNorm(2), modules=modules)
