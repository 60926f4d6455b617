"""Call specs: frozen, keyword-built, hashable; a field that cannot key a cache is named."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from dispatch_kit import INTERFACE, ShapeCall, call, kernel, make_op

from tileops import CallSpec, CallSpecFieldError


class TaggedCall(CallSpec):
    n: int
    tag: object = None


def tagged(tag: object) -> TaggedCall:
    return TaggedCall(device=torch.device("cuda:0"), n=1, tag=tag)


@pytest.fixture
def op(sm80):
    return make_op({"k": kernel("k")})()


@pytest.mark.parametrize(
    "tag",
    [[1, 2], {"a": 1}, torch.ones(2), (1, [2]), ((torch.ones(1),),)],
    ids=["list", "dict", "tensor", "tuple-of-list", "nested-tensor"],
)
@pytest.mark.parametrize("method", ["kernel_for", "key_for", "explain"])
def test_a_field_that_cannot_key_a_cache_is_named(op, tag, method):
    with pytest.raises(CallSpecFieldError, match=r"TaggedCall\.tag is a \w+, which cannot key"):
        getattr(op, method)(INTERFACE, tagged(tag))
    assert issubclass(CallSpecFieldError, TypeError)


def test_hashable_fields_are_fine(op):
    assert op.key_for(INTERFACE, tagged((1, "a", torch.float16, torch.device("cpu")))) == "k"


def test_the_call_must_be_a_call_spec(op):
    with pytest.raises(CallSpecFieldError, match="expected a CallSpec instance"):
        op.kernel_for(INTERFACE, {"device": "cuda:0"})


def test_call_specs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        call().n = 2


def test_call_specs_are_built_with_keywords():
    with pytest.raises(TypeError):
        ShapeCall(torch.device("cuda:0"), 1)


def test_equal_call_specs_are_equal_keys():
    assert call(n=3) == call(n=3) and hash(call(n=3)) == hash(call(n=3))
    assert call(n=3) != call(n=4)
    assert call("cuda:0") != call("cuda:1")


def test_subclasses_of_call_specs_add_fields():
    class DtypeCall(ShapeCall):
        dtype: torch.dtype = torch.float32

    spec = DtypeCall(device=torch.device("cpu"), n=2, dtype=torch.float16)
    assert [f.name for f in dataclasses.fields(spec)] == ["device", "n", "dtype"]
    assert spec != ShapeCall(device=torch.device("cpu"), n=2)


@dataclasses.dataclass(frozen=True)
class DecoratedCall(CallSpec):
    """Written as the spec says: a frozen dataclass subclass of CallSpec."""

    n: int
    eps: float = 1e-5


class BareCall(CallSpec):
    n: int
    eps: float = 1e-5


@pytest.mark.parametrize("cls", [DecoratedCall, BareCall])
def test_decorated_and_bare_call_specs_behave_alike(cls):
    a, b = cls(device=torch.device("cpu"), n=3), cls(device=torch.device("cpu"), n=3)
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a != cls(device=torch.device("cpu"), n=3, eps=1e-6)
    assert dataclasses.replace(a, n=4).n == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.n = 5
    with pytest.raises(TypeError):
        cls(torch.device("cpu"), 3)  # keyword-only, like every call spec


@pytest.mark.parametrize("cls", [DecoratedCall, BareCall])
def test_decorated_and_bare_call_specs_keep_the_fast_init(cls):
    """The decorator must not put back dataclass's slower frozen `__init__`."""
    assert "__dict__" in cls.__init__.__code__.co_names


def test_a_decorated_call_spec_keys_dispatch(sm80):
    op = make_op({"k": kernel("k")})()
    spec = DecoratedCall(device=torch.device("cuda:0"), n=3)
    assert op.key_for(INTERFACE, spec) == "k" and op.kernel_for(INTERFACE, spec) is not None
