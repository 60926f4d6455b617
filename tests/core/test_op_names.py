"""Every op has a unique name: a downstream library's op of the same class name is another op."""

from __future__ import annotations

import pytest
import torch
from dispatch_kit import INTERFACE, Unary, call, kernel, make_op

import tileops
from tileops import Op, OpDefinitionError, RMSNormFwdOp
from tileops.backend import register_kernel_type
from tileops.errors import UnknownOpError
from tileops.ops import RMSNormCall
from tileops.ops.norm.rms_norm import RMSNormReference
from tileops.registry import REGISTRY


@pytest.fixture
def downstream_rms_norm():
    """A downstream library's own `RMSNormFwdOp`, in its own module."""
    cls = type(
        "RMSNormFwdOp",
        (Op,),
        {"__module__": "mylib.layers", "interfaces": {INTERFACE: Unary}, "kernel_types": {}},
    )
    yield cls
    del REGISTRY.known_ops[cls.op_name]


def test_catalogue_ops_live_in_the_tileops_namespace():
    assert RMSNormFwdOp.op_name == "tileops::RMSNormFwdOp"
    assert tileops.GemmOp.op_name == "tileops::GemmOp"
    assert REGISTRY.known_ops["tileops::RMSNormFwdOp"] is RMSNormFwdOp


def test_an_op_without_a_namespace_is_named_by_its_module(downstream_rms_norm):
    assert downstream_rms_norm.op_name == "mylib.layers::RMSNormFwdOp"


def test_a_namespace_is_not_inherited():
    class MyNorm(RMSNormFwdOp):
        pass

    try:
        assert MyNorm.op_name == f"{__name__}::test_a_namespace_is_not_inherited.<locals>.MyNorm"
    finally:
        del REGISTRY.known_ops[MyNorm.op_name]


def test_a_downstream_op_of_the_same_name_does_not_replace_tileops_op(
    downstream_rms_norm, tileops_registry
):
    class Plugged(RMSNormReference):
        general = False

    register_kernel_type(RMSNormFwdOp, "plugged", Plugged)
    cpu = RMSNormCall(
        device=torch.device("cpu"), n=4, eps=1e-6, dtype=torch.float32, has_weight=False
    )
    assert RMSNormFwdOp(4).key_for("rms_norm", cpu) == "plugged"
    downstream_rms_norm()  # still constructs: tileops' registration is not bound to it
    assert REGISTRY.kernel_types(downstream_rms_norm) == {}


def test_registration_binds_to_exactly_the_class(downstream_rms_norm, tileops_registry, sm80):
    register_kernel_type(downstream_rms_norm, "mine", kernel("Mine"))
    assert downstream_rms_norm().key_for(INTERFACE, call()) == "mine"
    assert "mine" not in REGISTRY.kernel_types(RMSNormFwdOp)


def test_a_short_name_resolves_only_when_unambiguous(downstream_rms_norm):
    assert REGISTRY.op_class("SoftmaxFwdOp") is tileops.SoftmaxFwdOp
    assert REGISTRY.op_class("mylib.layers::RMSNormFwdOp") is downstream_rms_norm
    assert REGISTRY.op_class("tileops::RMSNormFwdOp") is RMSNormFwdOp
    with pytest.raises(
        UnknownOpError,
        match=r"op name 'RMSNormFwdOp' is ambiguous: it could be mylib.layers::RMSNormFwdOp, "
        r"tileops::RMSNormFwdOp; use the full name or pass the op class",
    ):
        register_kernel_type("RMSNormFwdOp", "k", kernel("K"))


def test_a_class_that_is_not_a_known_op_is_refused():
    with pytest.raises(UnknownOpError, match="is not a known op class"):
        register_kernel_type(int, "k", kernel("K"))


def test_another_module_taking_an_op_name_is_refused():
    with pytest.raises(
        OpDefinitionError,
        match=r"op name 'tileops::GemmOp' of elsewhere.GemmOp is already taken by "
        r"tileops.ops.gemm.gemm.GemmOp; declare another `namespace`",
    ):
        type("GemmOp", (Op,), {"__module__": "elsewhere", "namespace": "tileops"})
    assert REGISTRY.known_ops["tileops::GemmOp"] is tileops.GemmOp


def test_redefining_an_op_in_its_module_replaces_it():
    first = make_op({}, name="RedefinedOp")
    second = make_op({}, name="RedefinedOp")
    assert REGISTRY.known_ops["dispatch_kit::RedefinedOp"] is second is not first


def test_messages_name_the_unique_name(sm80):
    op = make_op({"a": kernel("A"), "b": kernel("B")}, name="NamedOp")()
    with pytest.raises(tileops.AmbiguousDispatchError, match=r"^dispatch_kit::NamedOp\.unary: "):
        op.kernel_for(INTERFACE, call())
