"""`register_module_semantics` and kernelize on declared classes: norm classes written here in the
styles model libraries use (not torch.nn types), declared, swapped and checked against their own
forward; bad declarations and instances that do not fit are refused with reasons."""

from __future__ import annotations

import copy
import pickle
import re

import pytest
import torch
from torch import nn

import tileops.nn as tnn
from tileops import ArgumentError
from tileops.nn import semantics


class LlamaStyleNorm(nn.Module):
    """RMSNorm in float32, rounded to x's dtype, then scaled (transformers' LlamaRMSNorm)."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        h = hidden_states.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


class GemmaStyleNorm(nn.Module):
    """RMSNorm scaled by (1 + weight) in float32, rounded once (transformers' GemmaRMSNorm)."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class AffineLayerNorm(nn.Module):
    """LayerNorm with weight and bias applied in float32, rounded once."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(size))
        self.shift = nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.layer_norm(x.float(), x.shape[-1:], eps=1e-5)
        return (y * self.scale.float() + self.shift.float()).to(x.dtype)


DECLARATIONS = {
    LlamaStyleNorm: {
        "kind": "rms_norm",
        "eps": "variance_epsilon",
        "weight": "weight",
        "order": "cast_then_scale",
    },
    GemmaStyleNorm: {
        "kind": "rms_norm",
        "eps": "eps",
        "weight": "weight",
        "weight_offset": 1.0,
        "order": "scale_then_cast",
    },
    AffineLayerNorm: {
        "kind": "layer_norm",
        "eps": 1e-5,
        "weight": "scale",
        "bias": "shift",
        "order": "scale_then_cast",
    },
}


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    """Each test declares into a copy of the registry: declarations do not leak out."""
    monkeypatch.setattr(semantics, "_DECLARED", dict(semantics._DECLARED))
    for cls, declaration in DECLARATIONS.items():
        tnn.register_module_semantics(cls, **declaration)


def _randomized(module: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn_like(param) * 0.5 + 0.5)
    return module


class Wrapper(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x))


@pytest.mark.parametrize(
    ("x_dtype", "param_dtype"),
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),
        (torch.float64, torch.float64),
    ],
    ids=["float32", "bfloat16", "bfloat16_float32_params", "float64"],
)
@pytest.mark.parametrize("cls", DECLARATIONS, ids=lambda c: c.__name__)
def test_a_declared_class_is_swapped_in_place_and_computes_as_its_forward(
    cls, x_dtype, param_dtype
):
    theirs = _randomized(Wrapper(cls(16))).to(param_dtype)
    ours = copy.deepcopy(theirs)
    norm, params = ours.norm, list(ours.norm.parameters())
    calls = []
    norm.register_forward_hook(lambda *_: calls.append("hook"))

    report = tnn.kernelize(ours)

    assert [(s.name, s.source) for s in report.swapped] == [("proj", nn.Linear), ("norm", cls)]
    assert report.swapped[1].semantics == tnn.declared_semantics(cls)
    assert ours.norm is norm and isinstance(norm, cls) and type(norm).__name__ == cls.__name__
    assert all(p is q for p, q in zip(norm.parameters(), params, strict=True))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = torch.randn(3, 5, 16, dtype=torch.float64).to(x_dtype)
    out, expected = ours.norm(x), theirs.norm(x)
    assert calls == ["hook"] and out.dtype == expected.dtype
    if x_dtype == torch.float64:  # computed in float64; the class upcasts only to float32
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    else:  # one unit in the last place at most (a Llama-style norm rounds twice, the op once)
        torch.testing.assert_close(out, expected, rtol=torch.finfo(out.dtype).eps, atol=1e-5)


def test_gradients_flow_to_the_declared_parameters():
    theirs = _randomized(GemmaStyleNorm(16))
    ours = copy.deepcopy(theirs)
    tnn.kernelize(ours)
    x = torch.randn(4, 16)
    for module in (ours, theirs):
        module(x).square().sum().backward()
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad)


def test_attributes_are_read_per_call():
    theirs = _randomized(LlamaStyleNorm(16))
    ours = copy.deepcopy(theirs)
    tnn.kernelize(ours)
    ours.variance_epsilon = theirs.variance_epsilon = 0.5
    x = torch.randn(4, 16)
    torch.testing.assert_close(ours(x), theirs(x))


def test_the_input_passes_by_the_forward_s_own_keyword():
    norm = _randomized(LlamaStyleNorm(16))
    tnn.kernelize(norm)
    x = torch.randn(2, 16)
    torch.testing.assert_close(norm(hidden_states=x), norm(x))
    with pytest.raises(ArgumentError, match=r"forward\(\) takes one tensor, 'hidden_states'"):
        norm(x=x)
    with pytest.raises(ArgumentError, match=r"got 2 positional argument\(s\)"):
        norm(x, x)


def test_a_swapped_declared_module_copies_pickles_and_compiles():
    norm = _randomized(GemmaStyleNorm(16))
    tnn.kernelize(norm)
    x = torch.randn(2, 16)
    for clone in (copy.deepcopy(norm), pickle.loads(pickle.dumps(norm))):
        assert type(clone) is type(norm) and clone.weight is not norm.weight
        torch.testing.assert_close(clone(x), norm(x))
    torch.testing.assert_close(torch.compile(norm, fullgraph=True)(x), norm(x))


class SelfPickling(LlamaStyleNorm):
    """Pickles as a call of its own: a swapped instance keeps that way (and comes back as
    the declared class, unswapped)."""

    def __reduce__(self) -> tuple:
        return (SelfPickling, (self.weight.shape[0], self.variance_epsilon))


def test_a_class_that_pickles_its_own_way_keeps_it():
    tnn.register_module_semantics(SelfPickling, **DECLARATIONS[LlamaStyleNorm])
    norm = SelfPickling(4, eps=0.5)
    tnn.kernelize(norm)
    clone = pickle.loads(pickle.dumps(norm))
    assert type(clone) is SelfPickling and clone.variance_epsilon == 0.5


def test_the_report_says_how_a_declared_class_is_served():
    text = str(tnn.kernelize(Wrapper(GemmaStyleNorm(16))))
    assert "test_module_semantics.GemmaStyleNorm" in text
    assert "rms_norm(eps=.eps, weight=.weight, weight_offset=1, scale_then_cast)" in text


def test_a_class_can_be_declared_by_its_dotted_path():
    class Late(LlamaStyleNorm):
        pass

    tnn.register_module_semantics(f"{__name__}.{Late.__qualname__}", **DECLARATIONS[LlamaStyleNorm])
    assert tnn.declared_semantics(Late) == tnn.declared_semantics(LlamaStyleNorm)
    assert [s.source for s in tnn.kernelize(Late(4)).swapped] == [Late]


def test_a_later_declaration_replaces_the_earlier_one():
    tnn.register_module_semantics(LlamaStyleNorm, "rms_norm", eps=0.25)
    norm = _randomized(LlamaStyleNorm(16))
    tnn.kernelize(norm)
    x = torch.randn(3, 16)
    torch.testing.assert_close(norm(x), nn.functional.rms_norm(x, (16,), eps=0.25))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"kind": "batch_norm", "eps": 1e-5}, "argument 'kind' must be one of 'rms_norm'"),
        ({"kind": "rms_norm", "eps": -1.0}, "argument 'eps' takes the name of the attribute"),
        ({"kind": "rms_norm", "eps": "not a name"}, "argument 'eps' takes"),
        ({"kind": "rms_norm", "eps": True}, "argument 'eps' takes"),
        ({"kind": "rms_norm", "eps": 1e-5, "weight": 3}, "argument 'weight' takes the name"),
        (
            {"kind": "rms_norm", "eps": 1e-5, "bias": "b", "order": "scale_then_cast"},
            "argument 'bias' is for kind='layer_norm'",
        ),
        ({"kind": "rms_norm", "eps": 1e-5, "weight_offset": 1.0}, "'weight_offset' needs"),
        ({"kind": "rms_norm", "eps": 1e-5, "weight_offset": float("inf")}, "finite number"),
        ({"kind": "rms_norm", "eps": 1e-5, "weight": "w"}, "argument 'order' is required"),
        (
            {"kind": "rms_norm", "eps": 1e-5, "weight": "w", "order": "cast"},
            "argument 'order' must be one of 'cast_then_scale', 'scale_then_cast'",
        ),
    ],
)
def test_bad_declarations_are_refused_naming_the_argument(arguments, message):
    class Norm(nn.Module):
        pass

    with pytest.raises(ArgumentError, match=rf"^register_module_semantics\(\): .*{message}"):
        tnn.register_module_semantics(Norm, **arguments)
    assert tnn.declared_semantics(Norm) is None


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (nn.RMSNorm, "a torch or tileops.nn class"),
        (tnn.LayerNorm, "a torch or tileops.nn class"),
        (3, "takes a torch.nn.Module subclass or its dotted path"),
        ("NoModule", "takes a torch.nn.Module subclass or its dotted path"),
        (dict, "takes a torch.nn.Module subclass"),
    ],
)
def test_declaring_other_than_a_foreign_module_class_is_refused(cls, message):
    with pytest.raises(ArgumentError, match=rf"argument 'cls' .*{message}"):
        tnn.register_module_semantics(cls, "rms_norm", eps=1e-6)


class TwoInputNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return x * gate


def test_instances_that_do_not_fit_their_declaration_are_skipped_with_reasons():
    tnn.register_module_semantics(TwoInputNorm, "rms_norm", eps=1e-6)
    no_weight, flat, bad_eps, none_eps = (LlamaStyleNorm(4) for _ in range(4))
    del no_weight.weight
    flat.weight = nn.Parameter(torch.ones(2, 4))
    bad_eps.variance_epsilon = -1.0
    none_eps.variance_epsilon = None
    model = nn.ModuleDict(
        {"no_weight": no_weight, "flat": flat, "bad_eps": bad_eps, "none_eps": none_eps}
    )
    model["gated"] = TwoInputNorm()
    model["bf"] = AffineLayerNorm(4).to(torch.float8_e4m3fn)
    report = tnn.kernelize(model)
    reasons = {s.name: s.reason for s in report.skipped}
    assert report.swapped == [] and set(reasons) == set(model.keys())
    assert "no attribute 'weight', declared as its weight" in reasons["no_weight"]
    assert "its weight 'weight' is [2, 4], not a 1-D tensor" in reasons["flat"]
    assert "'eps'" in reasons["bad_eps"]
    assert "no eps in attribute 'variance_epsilon'" in reasons["none_eps"]
    assert "does not take exactly one input" in reasons["gated"]
    assert "float8_e4m3fn" in reasons["bf"]
    assert all(type(m) in (LlamaStyleNorm, TwoInputNorm, AffineLayerNorm) for m in model.values())


def test_an_attribute_set_to_none_means_no_parameter():
    norm = LlamaStyleNorm(4)
    norm.weight = None
    tnn.kernelize(norm)
    x = torch.randn(3, 4)
    torch.testing.assert_close(norm(x), nn.functional.rms_norm(x, (4,), eps=1e-6))


def test_a_subclass_of_a_declared_class_is_skipped():
    class Custom(LlamaStyleNorm):
        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return super().forward(hidden_states) * 2

    report = tnn.kernelize(nn.Sequential(Custom(4)))
    assert report.swapped == []
    assert "a subclass of test_module_semantics.LlamaStyleNorm" in report.skipped[0].reason


class HubNamedNorm(LlamaStyleNorm):
    """As kernels' `use_kernel_forward_from_hub("RMSNorm")` leaves a transformers class."""

    kernel_layer_name = "RMSNorm"


def test_a_hub_named_norm_without_a_declaration_is_reported():
    model = nn.Sequential(HubNamedNorm(4), nn.Linear(4, 4))
    semantics._DECLARED.pop(LlamaStyleNorm)  # the fixture's copy: HubNamedNorm's base undeclared
    report = tnn.kernelize(model)
    assert [s.name for s in report.swapped] == ["1"]
    (skipped,) = report.skipped
    assert skipped.name == "0" and "hub kernel layer 'RMSNorm'" in skipped.reason
    assert "tileops.nn.register_module_semantics" in skipped.reason
    tnn.register_module_semantics(HubNamedNorm, **DECLARATIONS[LlamaStyleNorm])
    assert [s.name for s in tnn.kernelize(model).swapped] == ["0"]


def test_modules_selects_declared_classes_too():
    model = nn.Sequential(LlamaStyleNorm(16), GemmaStyleNorm(16), nn.Linear(16, 16))
    report = tnn.kernelize(model, modules=[GemmaStyleNorm])
    assert [s.name for s in report.swapped] == ["1"] and report.skipped == []
    assert type(model[0]) is LlamaStyleNorm and type(model[2]) is nn.Linear


def test_modules_naming_an_undeclared_class_says_how_to_declare_it():
    with pytest.raises(ValueError, match="argument 'modules'.*TwoInputNorm.*register_module"):
        tnn.kernelize(nn.Linear(2, 2), modules=[TwoInputNorm])


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"order": "scale_then_cast"}, "returns torch.float32 for a torch.bfloat16 input where"),
        ({"eps": 0.5}, "differs from .* on a probe input by up to"),
        ({"weight_offset": 1.0}, "differs from .* on a probe input by up to"),
    ],
)
def test_a_class_that_does_not_compute_its_declaration_is_skipped_with_the_reason(
    declared, message
):
    """A declaration can outlive what its class computes (a library changed it between
    versions): kernelize probes the class first and leaves it alone, saying why."""

    class Drifted(LlamaStyleNorm):
        pass

    tnn.register_module_semantics(Drifted, **{**DECLARATIONS[LlamaStyleNorm], **declared})
    model = nn.Sequential(Drifted(16))
    report = tnn.kernelize(model)
    assert report.swapped == [] and type(model[0]) is Drifted
    [skipped] = report.skipped
    assert re.search(message, skipped.reason), skipped.reason
    assert "no longer computes what is declared for it" in skipped.reason
