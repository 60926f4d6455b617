"""Errors carry what they are about as fields (op, interface, call, key, source, target,
verdicts), so code reads them instead of parsing messages; the messages stay as they were."""

from __future__ import annotations

import pickle

import pytest
import torch
from dispatch_kit import INTERFACE, call, kernel, make_op

from tileops import (
    AmbiguousDispatchError,
    BackendError,
    ControlError,
    Kernel,
    KernelDeclarationError,
    NoImplementationError,
    OpNotAvailableError,
    SoftmaxFwdOp,
    TileOpsError,
    pinned,
    prefer,
)
from tileops.backend import (
    AmbiguousTargetError,
    UnknownTargetError,
    register_detector,
    register_kernel_builder,
    register_kernel_type,
    set_default_target,
)
from tileops.ops import SoftmaxInterface

OWN = "module dispatch_kit"  # the source of make_op's own kernels
HERE = "module test_error_fields"  # the source of what this module registers


def statuses(error: TileOpsError) -> dict[str, str]:
    return {v.key: v.status for v in error.verdicts}


def test_a_call_no_key_serves_names_op_interface_call_and_every_verdict(sm80):
    op_cls = make_op(
        {"big": kernel("big", refuse=lambda c: "too small"), "host": kernel("h", devices={"cpu"})}
    )
    with pytest.raises(NoImplementationError, match="no implementation serves") as caught:
        op_cls().kernel_for(INTERFACE, call(n=8))
    error = caught.value
    assert (error.op, error.interface, error.call) == (op_cls.op_name, INTERFACE, call(n=8))
    assert statuses(error) == {"big": "refused", "host": "unavailable"}
    assert error.verdicts[0].reason == "too small" and error.verdicts[0].source == OWN
    assert error.key is None and error.source is None and error.target is None


def test_an_ambiguous_call_names_the_tied_keys_in_its_verdicts(sm80):
    op_cls = make_op({"a": kernel("a"), "b": kernel("b")})
    with pytest.raises(AmbiguousDispatchError) as caught:
        op_cls().kernel_for(INTERFACE, call())
    assert statuses(caught.value) == {"a": "tied", "b": "tied"}
    assert caught.value.call == call() and caught.value.op == op_cls.op_name


def test_no_kernel_on_the_device_type_is_op_not_available_with_fields():
    op_cls = make_op({"a": kernel("a")})
    with pytest.raises(OpNotAvailableError, match="do not run on 'cpu'") as caught:
        op_cls().kernel_for(INTERFACE, call("cpu"))
    assert caught.value.interface == INTERFACE and statuses(caught.value) == {"a": "unavailable"}


def test_a_strict_refusal_of_the_fallback_names_the_fallback(sm80, monkeypatch):
    monkeypatch.setenv("TILEOPS_STRICT", "1")
    op_cls = make_op(
        {"fast": kernel("fast", refuse=lambda c: "no"), "slow": kernel("slow", general=True)}
    )
    with pytest.raises(NoImplementationError, match="TILEOPS_STRICT is on") as caught:
        op_cls().kernel_for(INTERFACE, call())
    assert (caught.value.key, caught.value.source) == ("slow", OWN)
    assert statuses(caught.value) == {"fast": "refused", "slow": "chosen"}


def test_a_raising_refusal_names_the_key_and_its_source(sm80):
    op_cls = make_op({"bad": kernel("bad", refuse=lambda c: 1 / 0)})
    with pytest.raises(BackendError, match="refusal\\(\\) of kernel 'bad'") as caught:
        op_cls().kernel_for(INTERFACE, call())
    error = caught.value
    assert (error.op, error.interface, error.key, error.source) == (
        op_cls.op_name,
        INTERFACE,
        "bad",
        OWN,
    )


class Transposing(Kernel, SoftmaxInterface):
    devices = {"cpu"}

    def forward(self, x):
        return x.t().contiguous()


def test_a_wrong_output_names_the_key_that_returned_it(tileops_registry):
    register_kernel_type(SoftmaxFwdOp, "transposing", Transposing)
    with pytest.raises(BackendError, match="Output of kernel 'transposing'") as caught:
        SoftmaxFwdOp()(torch.randn(2, 8))
    error = caught.value
    assert (error.op, error.interface, error.key, error.source) == (
        "tileops::SoftmaxFwdOp",
        "softmax",
        "transposing",
        HERE,
    )
    assert error.call.n == 8


def test_a_registration_clash_names_op_key_and_the_late_registrant(tileops_registry):
    register_kernel_type(SoftmaxFwdOp, "mine", Transposing)
    with pytest.raises(BackendError, match="registered twice") as caught:
        register_kernel_type(SoftmaxFwdOp, "mine", Transposing)
    assert (caught.value.op, caught.value.key, caught.value.source) == (
        "tileops::SoftmaxFwdOp",
        "mine",
        HERE,
    )


def test_reusing_an_ops_own_key_is_a_declaration_error_with_fields(tileops_registry):
    with pytest.raises(KernelDeclarationError, match="cannot reuse keys") as caught:
        register_kernel_type(SoftmaxFwdOp, "reference", Transposing)
    assert (caught.value.op, caught.value.key) == ("tileops::SoftmaxFwdOp", "reference")


def test_target_errors_name_op_and_target(tileops_registry):
    with pytest.raises(UnknownTargetError) as caught:
        SoftmaxFwdOp(target="nowhere")(torch.randn(2, 3))
    assert (caught.value.op, caught.value.target) == ("tileops::SoftmaxFwdOp", "nowhere")
    with pytest.raises(UnknownTargetError) as caught:
        set_default_target("nowhere")
    assert caught.value.target == "nowhere"
    register_detector("first", lambda device: True)
    register_detector("second", lambda device: True)
    with pytest.raises(AmbiguousTargetError) as caught:
        SoftmaxFwdOp()(torch.randn(2, 3))
    assert caught.value.op == "tileops::SoftmaxFwdOp"


def test_a_target_without_builder_and_a_wrong_return_name_the_target(tileops_registry):
    register_detector("lazy", lambda device: device.type == "cpu")
    with pytest.raises(OpNotAvailableError, match="registered no kernel builder") as caught:
        SoftmaxFwdOp()(torch.randn(2, 3))
    assert (caught.value.target, caught.value.source) == ("lazy", HERE)
    register_kernel_builder(SoftmaxFwdOp, "lazy", lambda x, dim: lambda x, **out: 42)
    with pytest.raises(BackendError, match="returned int 42") as caught:
        SoftmaxFwdOp()(torch.randn(2, 3))
    error = caught.value
    assert (error.op, error.target, error.source) == ("tileops::SoftmaxFwdOp", "lazy", HERE)


def test_operator_controls_name_what_they_could_not_find(tileops_registry):
    with pytest.raises(ControlError, match="has no kernel 'nope'") as caught:
        prefer(SoftmaxFwdOp, "softmax", "nope", "reference")
    assert (caught.value.op, caught.value.interface, caught.value.key) == (
        "tileops::SoftmaxFwdOp",
        "softmax",
        "nope",
    )
    with pytest.raises(ControlError, match="has no interface 'soft'") as caught:
        with pinned(SoftmaxFwdOp, "soft", "reference"):
            pass
    assert caught.value.interface == "soft" and caught.value.key is None


def test_fields_survive_pickling_and_unknown_fields_are_refused(sm80):
    op_cls = make_op({"a": kernel("a", refuse=lambda c: "no")})
    with pytest.raises(NoImplementationError) as caught:
        op_cls().kernel_for(INTERFACE, call())
    copy = pickle.loads(pickle.dumps(caught.value))
    assert str(copy) == str(caught.value)
    assert (copy.op, copy.call, statuses(copy)) == (op_cls.op_name, call(), {"a": "refused"})
    with pytest.raises(TypeError, match="BackendError has no field 'kernel'"):
        BackendError("message", kernel="a")
